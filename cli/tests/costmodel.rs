//! `zerobench fit` and `zerobench predict` as a user runs them: the shipped model from a fresh
//! build, a fit from logs and its model read back, and every bad input with its message.

use std::path::Path;
use std::process::{Command, Output};

use zerobench_ingest::synth::SynthRun;
use zerobench_schema::{ModelPreset, Offload, RunConfig, ZeroStage};

fn zerobench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zerobench")).args(args).output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The query of [`predict_gpt2`]: gpt2 at stage 0, micro-batch 1.
const GPT2_Z0: [&str; 6] = ["--model", "gpt2", "--stage", "0", "--micro-batch", "1"];

/// `zerobench predict` of gpt2 at stage 0, micro-batch 1, on GPU kind `gpu` with the model file
/// `model`.
fn predict_gpt2(model: &str, gpu: &str) -> Output {
    zerobench(&[&["predict", "--cost-model", model, "--gpu", gpu], &GPT2_Z0[..]].concat())
}

/// A finished synthetic run: `mb` micro-batch of `model` at `stage` on `gpus` GPUs of kind `gpu`.
fn run(dir: &Path, model: ModelPreset, stage: ZeroStage, mb: u32, gpus: u32, gpu: &str, step_ms: f64) {
    let mut cfg = RunConfig::new(model, stage);
    (cfg.steps, cfg.warmup, cfg.micro_batch, cfg.seq_len) = (6, 1, mb, 512);
    let id = format!("{model}-z{}-mb{mb}-{gpus}-{}", stage.index(), gpu.replace(' ', "_"));
    let mut r = SynthRun::new(&id, cfg, gpus, step_ms);
    r.gpu = gpu.to_string();
    r.write(&dir.join(&id)).unwrap();
}

/// A sweep the fit accepts: three models, three micro-batches, stages 0 and 3, step time growing
/// with the work.
fn sweep(dir: &Path, gpu: &str) {
    for (m, base) in [(ModelPreset::Gpt2, 20.0), (ModelPreset::Gpt2Medium, 40.0), (ModelPreset::Gpt2Xl, 90.0)] {
        for mb in [1, 4, 8] {
            for stage in [ZeroStage::Z0, ZeroStage::Z3] {
                run(dir, m, stage, mb, 1, gpu, base * (1.0 + f64::from(mb) / 4.0));
            }
        }
    }
}

#[test]
fn the_shipped_model_predicts_from_a_fresh_build() {
    let o = zerobench(&[
        "predict",
        "--gpu",
        "h200",
        "--model",
        "gpt2-medium",
        "--stage",
        "2",
        "--micro-batch",
        "8",
        "--seq-len",
        "1024",
        "--gpus",
        "1",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let p: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for key in ["step_ms", "tokens_per_s_per_gpu", "peak_allocated_bytes", "peak_reserved_bytes", "fits"] {
        assert!(p.get(key).is_some(), "{key} missing: {p}");
    }
    // Measured on an H200 for this configuration (held out of the fit; bench/results/
    // costmodel-h200.json): 46.9 ms, 10.3 GiB allocated.
    let step = p["step_ms"].as_f64().unwrap();
    assert!((40.0..60.0).contains(&step), "{p}");
    let lo_hi = p["step_ms_interval"].as_array().unwrap();
    assert!(lo_hi[0].as_f64().unwrap() <= step && step <= lo_hi[1].as_f64().unwrap(), "{p}");
    // Device-bound, so the interval is the device-bound held-out runs' (46.9 ms measured lies in it).
    assert_eq!(p["step_ms_interval_of"], "device_bound", "{p}");
    assert!(lo_hi[0].as_f64().unwrap() <= 46.9 && 46.9 <= lo_hi[1].as_f64().unwrap(), "{p}");
    let gib = p["peak_allocated_bytes"].as_f64().unwrap() / f64::from(1u32 << 30);
    assert!((9.5..11.0).contains(&gib), "{p}");
    assert_eq!(p["fits"], true);
    assert_eq!(p["extrapolated"].as_array().unwrap().len(), 0, "{p}");
    // The text form says the same.
    let o = zerobench(&["predict", "--gpu", "h200", "--model", "gpt2-medium", "--stage", "2", "--micro-batch", "8"]);
    assert!(text(&o.stdout).starts_with("step "), "{}", text(&o.stdout));
    assert!(text(&o.stdout).contains("of held-out device-bound runs"), "{}", text(&o.stdout));
}

#[test]
fn what_lies_outside_the_fit_is_flagged_and_what_cannot_fit_says_so() {
    let o = zerobench(&[
        "predict",
        "--gpu",
        "h200",
        "--model",
        "t5-11b",
        "--stage",
        "0",
        "--micro-batch",
        "4",
        "--gpus",
        "16",
        "--nodes",
        "2",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let p: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let flags = p["extrapolated"].to_string();
    for want in ["16 GPUs", "2 nodes", "parameters"] {
        assert!(flags.contains(want), "{want}: {flags}");
    }
    // 11B parameters at stage 0: 176 GB of model states on every GPU.
    assert_eq!(p["fits"], false, "{p}");
}

#[test]
fn bad_queries_are_refused_naming_the_flag() {
    let cases: &[(&[&str], &str)] = &[
        (&["--gpu", "a100", "--model", "gpt2", "--stage", "0", "--micro-batch", "1"], "no fit for GPU \"a100\""),
        (&["--gpu", "h200", "--model", "gpt5", "--stage", "0", "--micro-batch", "1"], "--model"),
        (
            &[
                "--gpu",
                "h200",
                "--model",
                "gpt2",
                "--stage",
                "2",
                "--micro-batch",
                "1",
                "--offload",
                "optimizer+params",
            ],
            "offload",
        ),
        (
            &["--gpu", "h200", "--model", "gpt2", "--stage", "0", "--micro-batch", "1", "--gpus", "3", "--nodes", "2"],
            "--nodes",
        ),
        (&["--gpu", "h200", "--model", "gpt2", "--stage", "0", "--micro-batch", "1", "--gpus", "0"], "--gpus: must be"),
        (
            &["--gpu", "h100", "--model", "gpt2", "--stage", "2", "--micro-batch", "1", "--delayed-update"],
            "--delayed-update: delays the host's update; it needs --offload",
        ),
        (
            &["--gpu", "h100", "--model", "gpt2", "--stage", "2", "--micro-batch", "1", "--host-adamw-rate", "5"],
            "--host-adamw-rate: prices the host's update of the optimizer; it needs --offload",
        ),
        // Rates no host has (1e-300 priced the update at 1e293 years, flagged only "extrapolated").
        (
            &["--gpu", "h200", "--model", "gpt2", "--stage", "2", "--micro-batch", "1", "--offload", "optimizer", "--host-adamw-rate", "1e-300"],
            "--host-adamw-rate <GPARAMS_PER_S>': expected a host's AdamW rate between 0.01 and 1000 (1e9 parameters per second), got \"1e-300\"",
        ),
        (
            &["--gpu", "h200", "--model", "gpt2", "--stage", "2", "--micro-batch", "1", "--offload", "optimizer", "--host-adamw-rate", "5e4"],
            "between 0.01 and 1000",
        ),
    ];
    for (args, want) in cases {
        let o = zerobench(&[&["predict"], *args].concat());
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o.stdout));
        assert!(text(&o.stderr).contains(want), "{args:?}: {}", text(&o.stderr));
    }
}

#[test]
fn a_fit_from_logs_is_written_once_and_read_back() {
    let tmp = tempfile::tempdir().unwrap();
    sweep(&tmp.path().join("logs"), "NVIDIA H100 80GB HBM3");
    let model = tmp.path().join("model.json");
    let (logs, m) = (tmp.path().join("logs"), model.to_str().unwrap().to_string());
    let o = zerobench(&["fit", logs.to_str().unwrap(), "--out", &m, "--validate"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let stdout = text(&o.stdout);
    assert!(stdout.contains("NVIDIA H100 80GB HBM3 bf16: 18 runs of 18 configurations"), "{stdout}");
    assert!(stdout.contains("| family | stage |"), "{stdout}");
    let o = zerobench(&[
        "predict",
        "--cost-model",
        &m,
        "--gpu",
        "h100",
        "--model",
        "gpt2-large",
        "--stage",
        "0",
        "--micro-batch",
        "4",
        "--seq-len",
        "512",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let p: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    // Between gpt2-medium's and gpt2-xl's measured times at micro-batch 4 (80 and 180 ms).
    let step = p["step_ms"].as_f64().unwrap();
    assert!((60.0..200.0).contains(&step), "{p}");
    // A second fit into the same file is refused and leaves it as it was; --overwrite replaces it.
    let before = std::fs::read(&model).unwrap();
    let o = zerobench(&["fit", logs.to_str().unwrap(), "--out", &m]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("--overwrite"), "{}", text(&o.stderr));
    assert_eq!(std::fs::read(&model).unwrap(), before);
    let o = zerobench(&["fit", logs.to_str().unwrap(), "--out", &m, "--overwrite"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    // A model that cannot be written whole (a file-size limit, as a full disk) leaves no file,
    // not half of one that a rerun would refuse to replace and predict could not read; a model
    // already there keeps its bytes; no temporary file stays.
    let limited = |out: &str, extra: &[&str]| {
        Command::new("sh")
            .arg("-c")
            .arg("ulimit -f 1 && exec \"$0\" \"$@\"")
            .arg(env!("CARGO_BIN_EXE_zerobench"))
            .args([&["fit", logs.to_str().unwrap(), "--out", out][..], extra].concat())
            .output()
            .unwrap()
    };
    let fresh = tmp.path().join("fresh.json");
    let o = limited(fresh.to_str().unwrap(), &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("fresh.json: File too large"), "{}", text(&o.stderr));
    assert!(!fresh.exists());
    let before = std::fs::read(&model).unwrap();
    assert_eq!(limited(&m, &["--overwrite"]).status.code(), Some(2));
    assert_eq!(std::fs::read(&model).unwrap(), before);
    let o = zerobench(&["fit", logs.to_str().unwrap(), "--out", fresh.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left.len(), 3, "logs, model.json, fresh.json: {left:?}");
}

/// A model says which engine it measured: a fit records the build its logs name (the synthetic
/// runs name one) and those `--build` gives where some of its runs' logs name none (here the
/// H200 runs but those at micro-batch 8; every H100 run names its build); `predict` prints them,
/// and this zerobench's own build where it is not one of them; `--json` lists them. The shipped
/// H200 model names the build of its sweep.
#[test]
fn a_model_names_the_builds_it_measured() {
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    sweep(&logs, "NVIDIA H200");
    for run in std::fs::read_dir(&logs).unwrap().map(|e| e.unwrap().path()) {
        if run.to_string_lossy().contains("-mb8-") {
            continue;
        }
        for log in std::fs::read_dir(&run).unwrap().map(|e| e.unwrap().path()) {
            let named = std::fs::read_to_string(&log).unwrap();
            let unnamed = named.replace(r#""commit":"5e1f0c0ffee0ddba11cafe0000000000deadbeef""#, r#""commit":null"#);
            assert_ne!(named, unnamed, "{}", log.display());
            std::fs::write(&log, unnamed).unwrap();
        }
    }
    sweep(&logs, "NVIDIA H100 80GB HBM3");
    let model = tmp.path().join("m.json");
    let m = model.to_str().unwrap();
    let o = zerobench(&["fit", logs.to_str().unwrap(), "--out", m, "--build", "0e1fab4aaaa", "--build", "0e1fab4"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let fitted: serde_json::Value = serde_json::from_slice(&std::fs::read(&model).unwrap()).unwrap();
    let builds =
        |gpu: &str| fitted["fits"].as_array().unwrap().iter().find(|f| f["gpu"] == gpu).unwrap()["builds"].clone();
    assert_eq!(builds("NVIDIA H200"), serde_json::json!(["0e1fab4", "5e1f0c0"]));
    assert_eq!(builds("NVIDIA H100 80GB HBM3"), serde_json::json!(["5e1f0c0"]));
    let o = predict_gpt2(m, "h200");
    let line = text(&o.stdout).lines().last().unwrap_or_default().to_string();
    let head = "model: NVIDIA H200 bf16, fitted on runs of builds 0e1fab4, 5e1f0c0";
    match zerobench_build_info::COMMIT {
        Some(c) => assert_eq!(
            line,
            format!("{head}; this zerobench is {}, an engine the model has not measured (docs/cost-model.md)", &c[..7])
        ),
        None => assert_eq!(line, head),
    }
    let o = zerobench(&[&["predict", "--cost-model", m, "--gpu", "h200", "--json"], &GPT2_Z0[..]].concat());
    let p: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(p["fitted_builds"], serde_json::json!(["0e1fab4", "5e1f0c0"]), "{p}");
    let o = zerobench(&[&["predict", "--gpu", "h200"], &GPT2_Z0[..]].concat());
    assert!(text(&o.stdout).contains("fitted on runs of build 41cf013;"), "{}", text(&o.stdout));
}

#[test]
fn bad_inputs_to_fit_are_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("m.json");
    let m = out.to_str().unwrap();
    // An empty folder.
    std::fs::create_dir_all(tmp.path().join("empty")).unwrap();
    let o = zerobench(&["fit", tmp.path().join("empty").to_str().unwrap(), "--out", m]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("no runs to fit on"), "{}", text(&o.stderr));
    // A folder that is not there.
    let o = zerobench(&["fit", tmp.path().join("nope").to_str().unwrap(), "--out", m]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("cannot read"), "{}", text(&o.stderr));
    // Runs of one configuration only (three repeats).
    let one = tmp.path().join("one");
    for i in 0..3 {
        let mut cfg = RunConfig::new(ModelPreset::Gpt2, ZeroStage::Z0);
        cfg.steps = 6;
        let mut r = SynthRun::new(&format!("rep{i}"), cfg, 1, 30.0);
        r.gpu = "NVIDIA H200".into();
        r.write(&one.join(format!("rep{i}"))).unwrap();
    }
    let o = zerobench(&["fit", one.to_str().unwrap(), "--out", m]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("1 distinct configuration(s) (3 runs)"), "{}", text(&o.stderr));
    // Two GPU kinds: --gpu picks one, a name matching both or neither is refused.
    let two = tmp.path().join("two");
    sweep(&two, "NVIDIA H100 80GB HBM3");
    sweep(&two, "NVIDIA H200");
    let o = zerobench(&["fit", two.to_str().unwrap(), "--out", m, "--gpu", "nvidia h"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("names several GPU kinds"), "{}", text(&o.stderr));
    let o = zerobench(&["fit", two.to_str().unwrap(), "--out", m, "--gpu", "a100"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("the runs are on NVIDIA H100 80GB HBM3, NVIDIA H200"), "{}", text(&o.stderr));
    assert!(!out.exists());
    let o = zerobench(&["fit", two.to_str().unwrap(), "--out", m, "--gpu", "h200"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    // Without --gpu each kind gets its own fit; a name matching both is then ambiguous to predict.
    let o = zerobench(&["fit", two.to_str().unwrap(), "--out", m, "--overwrite"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let predict = predict_gpt2;
    let o = predict(m, "nvidia");
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("matches several fits"), "{}", text(&o.stderr));
    // A file that is not a model, and models of earlier versions (before attention was priced
    // apart; before the device donor had a field of its own) and of a later one: all refused, the
    // others naming the versions this build reads.
    let x = tmp.path().join("x.json");
    std::fs::write(&x, r#"{"format":"other","version":7}"#).unwrap();
    let o = predict(x.to_str().unwrap(), "h200");
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("not a zerobench cost model"), "{}", text(&o.stderr));
    for other in [1, 2, 5] {
        let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(m).unwrap()).unwrap();
        v["version"] = other.into();
        std::fs::write(&x, v.to_string()).unwrap();
        let o = predict(x.to_str().unwrap(), "h200");
        assert_eq!(o.status.code(), Some(2));
        let err = text(&o.stderr);
        assert!(err.contains(&format!("version {other};")) && err.contains("versions 3-4"), "{err}");
    }
}

/// Runs the worker could not have made (a step time of 0, a configuration it refuses) are left
/// out of the fit by name, not fitted: a zero step made the validation's errors infinite and
/// the file unreadable, a refused configuration moved the terms.
#[test]
fn runs_the_worker_could_not_have_made_are_left_out() {
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    sweep(&logs, "NVIDIA H200");
    let clean = tmp.path().join("clean.json");
    let o = zerobench(&["fit", logs.to_str().unwrap(), "--out", clean.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    run(&logs, ModelPreset::Gpt2, ZeroStage::Z0, 2, 1, "NVIDIA H200", 0.0);
    let mut cfg = RunConfig::new(ModelPreset::Gpt2, ZeroStage::Z0);
    (cfg.steps, cfg.warmup, cfg.seq_len, cfg.offload) = (6, 1, 512, Offload::Optimizer);
    let mut r = SynthRun::new("refused", cfg, 1, 25.0);
    r.gpu = "NVIDIA H200".into();
    r.write(&logs.join("refused")).unwrap();
    let m = tmp.path().join("m.json");
    let o = zerobench(&["fit", logs.to_str().unwrap(), "--out", m.to_str().unwrap(), "--validate"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert!(
        err.contains("left out 1 run(s) (gpt2-z0-mb2-1-NVIDIA_H200): step time 0 ms, not a positive number"),
        "{err}"
    );
    assert!(err.contains("left out 1 run(s) (refused): a configuration the worker refuses (invalid --offload: optimizer offload needs ZeRO stage 1, 2 or 3)"), "{err}");
    // What was fitted is the clean sweep's model, and it reads back.
    let fitted = |p: &Path| {
        let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
        v["fits"][0]["step"].take()
    };
    assert_eq!(fitted(&m), fitted(&clean));
    let o = predict_gpt2(m.to_str().unwrap(), "h200");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
}

/// A fit of folders part of which could not be read writes its model from the rest, names each
/// file and line it could not read, and exits 1: the result is incomplete (it exited 0, the
/// files named only under -v).
#[test]
fn a_fit_of_folders_partly_unreadable_names_them_and_exits_1() {
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    sweep(&logs, "NVIDIA H200");
    let garbled = logs.join("gpt2-z0-mb4-1-NVIDIA_H200/rank0.jsonl");
    let mut text_ = std::fs::read_to_string(&garbled).unwrap();
    text_.push_str("{\"this is\": not json\n");
    std::fs::write(&garbled, text_).unwrap();
    let m = tmp.path().join("m.json");
    let o = zerobench(&["fit", logs.to_str().unwrap(), "--out", m.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert!(err.contains(&format!("{}:", garbled.display())) && err.contains("not a valid record"), "{err}");
    assert!(text(&o.stdout).contains("from what could be read: 1 problem(s) above"), "{}", text(&o.stdout));
    assert_eq!(predict_gpt2(m.to_str().unwrap(), "h200").status.code(), Some(0));
}

/// A model file edited into values no fit gives (a negative coefficient, a share
/// above 1, a rate of 0, an inverted interval) is refused naming the field; it priced negative
/// steps and memory, and "fit" anything.
#[test]
fn a_model_file_with_impossible_values_is_refused_naming_the_field() {
    let tmp = tempfile::tempdir().unwrap();
    let shipped: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../costmodel/models/h200.json")).unwrap(),
    )
    .unwrap();
    let edits: &[(&str, serde_json::Value, &str)] = &[
        ("/fits/0/step/gpt2.ms_per_gflop", (-1.0).into(), "fits[0].step.gpt2.ms_per_gflop is -1"),
        ("/fits/0/memory/gpt2.mem_gib_per_gact", (-1000.0).into(), "fits[0].memory.gpt2.mem_gib_per_gact is -1000"),
        ("/fits/0/step/micro.unhidden_share", 5.0.into(), "a share is at most 1"),
        ("/fits/0/peak_tflops", 0.0.into(), "fits[0].peak_tflops is 0"),
        ("/fits/0/step_interval", serde_json::json!([0.2, -0.1]), "fits[0].step_interval[0] is 0.2"),
        // A relative error of -1 would put a run's memory at nothing at all.
        ("/fits/0/memory_interval", serde_json::json!([-1.0, 0.1]), "fits[0].memory_interval[0] is -1"),
    ];
    let file = tmp.path().join("edited.json");
    for (pointer, value, want) in edits {
        let mut m = shipped.clone();
        let slot = m.pointer_mut(pointer).unwrap_or_else(|| panic!("{pointer} is not in the shipped model"));
        *slot = value.clone();
        std::fs::write(&file, m.to_string()).unwrap();
        let o = predict_gpt2(file.to_str().unwrap(), "h200");
        assert_eq!(o.status.code(), Some(2), "{pointer}: {}", text(&o.stdout));
        assert!(text(&o.stderr).contains(want), "{pointer}: {}", text(&o.stderr));
    }
    // A fit that records no device memory (its logs gave none) does not claim that a run fits.
    let mut m = shipped.clone();
    m["fits"][0].as_object_mut().unwrap().remove("device_memory_bytes").expect("the shipped model records it");
    std::fs::write(&file, m.to_string()).unwrap();
    let o = zerobench(&[&["predict", "--cost-model", file.to_str().unwrap(), "--gpu", "h200"], &GPT2_Z0[..]].concat());
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(text(&o.stdout).contains("fits unknown (the model records no device memory"), "{}", text(&o.stdout));
    let o = zerobench(
        &[&["predict", "--cost-model", file.to_str().unwrap(), "--gpu", "h200", "--json"], &GPT2_Z0[..]].concat(),
    );
    let p: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((&p["fits"], &p["device_memory_bytes"]), (&serde_json::Value::Null, &serde_json::Value::Null), "{p}");
    // A model of no fits says so.
    let mut m = shipped.clone();
    m["fits"] = serde_json::json!([]);
    std::fs::write(&file, m.to_string()).unwrap();
    assert!(text(&predict_gpt2(file.to_str().unwrap(), "h200").stderr).contains("the model has no fits"));
    // A file far larger than any model (a log or a device named by mistake) is not read whole.
    let big = tmp.path().join("big.json");
    std::fs::File::create(&big).unwrap().set_len(65 << 20).unwrap();
    let o = predict_gpt2(big.to_str().unwrap(), "h200");
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("more than 64 MiB; not a cost model"), "{}", text(&o.stderr));
    // ingest refuses the model before it reads the logs or makes its output folder.
    let out = tmp.path().join("tables");
    let o = zerobench(&[
        "ingest",
        tmp.path().to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--cost-model",
        big.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert!(!out.exists());
    // The shipped file itself passes.
    std::fs::write(&file, shipped.to_string()).unwrap();
    assert_eq!(predict_gpt2(file.to_str().unwrap(), "h200").status.code(), Some(0));
}

/// A version-3 file, whose donor's count was of runs (`busy_runs`), is read: it names the same
/// donor and prices the same as the version-4 file it was made from.
#[test]
fn a_version_3_model_file_is_read_and_prices_the_same() {
    let tmp = tempfile::tempdir().unwrap();
    let shipped = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../costmodel/models/h100.json"));
    let mut v: serde_json::Value = serde_json::from_str(shipped).unwrap();
    assert_eq!(v["version"], 4);
    let donor = v["fits"][0]["device_donor"].as_object_mut().unwrap();
    let count = donor.remove("busy_configurations").unwrap();
    donor.insert("busy_runs".into(), count);
    v["version"] = 3.into();
    let (v3, v4) = (tmp.path().join("v3.json"), tmp.path().join("v4.json"));
    std::fs::write(&v3, v.to_string()).unwrap();
    std::fs::write(&v4, shipped).unwrap();
    // tiny-llama never kept the GPU busy: its device bound is the donor's.
    let predict = |m: &Path| -> serde_json::Value {
        let m = m.to_str().unwrap();
        let q = ["predict", "--cost-model", m, "--gpu", "h100", "--model", "tiny-llama", "--stage", "0"];
        let o = zerobench(&[&q[..], &["--micro-batch", "8", "--seq-len", "2048", "--json"]].concat());
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let (old, new) = (predict(&v3), predict(&v4));
    assert_eq!(old["step_ms"], new["step_ms"], "{old} {new}");
    assert_eq!(old["extrapolated"], new["extrapolated"]);
    let flagged = new["extrapolated"].to_string();
    assert!(flagged.contains("the family with the most busy configurations"), "{flagged}");
}

#[test]
fn plan_adds_predictions_and_marks_the_fastest_run_that_fits() {
    let spec = concat!(env!("CARGO_MANIFEST_DIR"), "/../slurm/examples/gpu-cluster.yaml");
    let o = zerobench(&["plan", spec, "--gpu", "h200"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let stdout = text(&o.stdout);
    assert!(stdout.contains("pred step ms") && stdout.contains("best (*)"), "{stdout}");
    // Which engine the predictions describe: the shipped model's build, once (one precision).
    assert_eq!(stdout.matches("model: NVIDIA H200 bf16, fitted on runs of build 41cf013").count(), 1, "{stdout}");
    let o = zerobench(&["plan", spec, "--gpu", "h200", "--json"]);
    let runs: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).unwrap();
    // One best run per model (gpt2 and gpt2-xl), each the fitting run with the most tokens/s per GPU.
    let best: Vec<&serde_json::Value> = runs.iter().filter(|r| r["fastest_that_fits"] == true).collect();
    assert_eq!(best.len(), 2, "{best:?}");
    for b in best {
        let model = &b["config"]["model"];
        let tps = |r: &serde_json::Value| r["prediction"]["tokens_per_s_per_gpu"].as_f64().unwrap();
        let top = runs.iter().filter(|r| &r["config"]["model"] == model && r["prediction"]["fits"] == true).map(tps);
        assert_eq!(top.fold(0.0, f64::max), tps(b));
    }
    // The spec's 80GB is what a prediction must fit, not the H200's 141 GB.
    assert!(runs.iter().all(|r| r["prediction"]["device_memory_bytes"] == 80_000_000_000u64), "{runs:?}");
    assert!(runs.iter().all(|r| r["prediction"]["fitted_builds"] == serde_json::json!(["41cf013"])), "{runs:?}");
    // A cost model needs a GPU to pick its fit.
    let o = zerobench(&["plan", spec, "--cost-model", "costmodel/models/h200.json"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("--gpu"), "{}", text(&o.stderr));
}

#[test]
fn ingest_with_a_cost_model_writes_the_predicted_table_and_plot() {
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    run(&logs, ModelPreset::Gpt2Medium, ZeroStage::Z2, 8, 2, "NVIDIA H200", 48.0);
    run(&logs, ModelPreset::Gpt2, ZeroStage::Z0, 4, 1, "NVIDIA A100-SXM4-80GB", 30.0);
    // The same configuration at stage 3, measured fastest: a group of two stages to choose among
    // (on two GPUs, where stage 3 gathers; on one it would be priced as stage 2).
    run(&logs, ModelPreset::Gpt2Medium, ZeroStage::Z3, 8, 2, "NVIDIA H200", 40.0);
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/../costmodel/models/h200.json");
    let out = tmp.path().join("out");
    let o = zerobench(&["ingest", logs.to_str().unwrap(), "--out", out.to_str().unwrap(), "--cost-model", model, "-q"]);
    // The A100 run, which the model has no fit for, is named and leaves the result incomplete.
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("1 of 3 run(s) not predicted: no fit for GPU \"NVIDIA A100-SXM4-80GB\""),
        "{}",
        text(&o.stderr)
    );
    assert!(out.join("predicted-vs-measured.svg").is_file());
    let t: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("predicted.json")).unwrap()).unwrap();
    let rows = t["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 3);
    let h200 = rows.iter().find(|r| r["model"] == "gpt2-medium" && r["stage"] == 2).unwrap();
    let err = h200["step_error_pct"].as_f64().unwrap();
    let (pred, meas) = (h200["predicted_step_ms"].as_f64().unwrap(), h200["step_ms"].as_f64().unwrap());
    assert!(((pred / meas - 1.0) * 100.0 - err).abs() < 1e-3, "{h200}");
    // A GPU the model has no fit for is named, not guessed.
    let a100 = rows.iter().find(|r| r["model"] == "gpt2").unwrap();
    assert!(a100["predicted_step_ms"].is_null(), "{a100}");
    assert!(a100["notes"].as_str().unwrap().contains("no fit for GPU"), "{a100}");
    // The stage choice over the runs it priced: gpt2-medium's two stages (the A100 run is not
    // priced, and a group of one stage chooses nothing). The model prices stage 3 longer, so it
    // chooses stage 2; stage 3 measured faster, by about 20%, with one run each: a miss the
    // repeats cannot show.
    let c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("stage-choice.json")).unwrap()).unwrap();
    let groups = c["rows"].as_array().unwrap();
    assert_eq!(groups.len(), 1, "{c}");
    let g = &groups[0];
    let list = |k: &str| -> Vec<f64> { g[k].as_str().unwrap().split(';').map(|x| x.parse().unwrap()).collect() };
    let run_of = |stage: u64| rows.iter().find(|r| r["model"] == "gpt2-medium" && r["stage"] == stage).unwrap();
    let (measured, predicted) = (list("step_ms"), list("predicted_step_ms"));
    assert_eq!((g["stages"].as_str(), g["runs"].as_str()), (Some("2;3"), Some("1;1")), "{g}");
    // Runs of one build: the build is not named, as in the other tables.
    assert_eq!(g["build"].as_str(), Some(""), "{g}");
    for (i, stage) in [2, 3].into_iter().enumerate() {
        assert_eq!(measured[i], run_of(stage)["step_ms"].as_f64().unwrap(), "{g}");
        assert_eq!(predicted[i], run_of(stage)["predicted_step_ms"].as_f64().unwrap(), "{g}");
    }
    assert!(predicted[0] < predicted[1], "{g}");
    assert_eq!((g["chosen_stage"].as_u64(), g["fastest_stage"].as_u64()), (Some(2), Some(3)), "{g}");
    assert_eq!(
        [&g["right"], &g["right_within_tie"], &g["shown_slower"], &g["decided"]].map(|v| v.as_bool()),
        [Some(false); 4],
        "{g}"
    );
    let regret = (measured[0] / measured[1] - 1.0) * 100.0;
    assert!((g["regret_pct"].as_f64().unwrap() - regret).abs() < 1e-3 && regret > 15.0, "{g}");
}

/// The shipped H100 model prices offload's ratio and delayed update: all on the host the step
/// waits for most of the host's update, and less with the delayed update, which hides it behind
/// the whole compute; at the plan's ratio next to none of it; and, fitted on both, it flags
/// neither.
#[test]
fn predict_prices_the_ratio_and_the_delayed_update() {
    let step = |extra: &[&str]| {
        let base = ["predict", "--gpu", "h100", "--model", "gpt2-xl", "--stage", "2", "--micro-batch", "4"];
        let o = zerobench(&[&base[..], &["--offload", "optimizer", "--json"], extra].concat());
        assert_eq!(o.status.code(), Some(0), "{extra:?}: {}", text(&o.stderr));
        let p: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(p["extrapolated"], serde_json::json!([]), "{extra:?}: {p}");
        (p["step_ms"].as_f64().unwrap(), p["offload_ms"].as_f64().unwrap(), p["compute_ms"].as_f64().unwrap())
    };
    let (exact, exact_offload, compute) = step(&[]);
    let (delayed, delayed_offload, _) = step(&["--delayed-update"]);
    assert!(exact_offload > compute && delayed_offload < exact_offload && delayed < exact, "{exact} {delayed}");
    let (_, at_ratio, _) = step(&["--offload-ratio", "0.18"]);
    assert!(at_ratio < 0.1 * exact_offload, "{at_ratio} against {exact_offload}");
}

/// On one GPU stage 3 keeps its parameters whole: priced as stage 1, in time and memory (their
/// states are the same bytes there), with no gathers; on two GPUs, or with its parameters on the
/// host, it gathers and is priced longer.
#[test]
fn predict_prices_one_gpu_stage_3_without_gathers() {
    let predict = |stage: &str, gpus: &str, extra: &[&str]| {
        let base = ["predict", "--gpu", "h200", "--model", "gpt2-xl", "--micro-batch", "4", "--json"];
        let o = zerobench(&[&base[..], &["--stage", stage, "--gpus", gpus], extra].concat());
        assert_eq!(o.status.code(), Some(0), "stage {stage} on {gpus}: {}", text(&o.stderr));
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    let (one, three) = (predict("1", "1", &[]), predict("3", "1", &[]));
    assert_eq!(three["param_path"], "whole", "{three}");
    for k in ["step_ms", "peak_allocated_bytes", "engine_buffer_bytes"] {
        assert_eq!(one[k], three[k], "{k}: {one} against {three}");
    }
    let (two_1, two_3) = (predict("1", "2", &[]), predict("3", "2", &[]));
    assert_eq!(two_3["param_path"], "sharded", "{two_3}");
    assert!(two_3["step_ms"].as_f64() > two_1["step_ms"].as_f64(), "{two_1} against {two_3}");
    let host = predict("3", "1", &["--offload", "optimizer+params"]);
    assert_eq!(host["param_path"], "sharded", "{host}");
}

/// Offloaded runs on two hosts whose `cpu_adamw.json` lies beside them: the fit prices the host's
/// update at the hosts' geometric mean rate, `predict --host-adamw-rate` in proportion to it, and a
/// bad rate or rate file is refused naming it.
#[test]
fn the_hosts_adamw_rate_beside_the_runs_prices_offload() {
    let tmp = tempfile::tempdir().unwrap();
    let gpu = "NVIDIA H100 80GB HBM3";
    sweep(&tmp.path().join("host-a"), gpu);
    for (host, rate) in [("host-a", 4.0e9), ("host-b", 6.25e9)] {
        let dir = tmp.path().join(host);
        for (model, params) in [(ModelPreset::Gpt2Medium, 0.35), (ModelPreset::Gpt2Xl, 1.56)] {
            let mut cfg = RunConfig::new(model, ZeroStage::Z2);
            (cfg.steps, cfg.warmup, cfg.micro_batch, cfg.seq_len) = (6, 1, 4, 512);
            cfg.offload = zerobench_schema::config::Offload::Optimizer;
            // The host's update, all exposed: parameters over the host's rate.
            let step = 40.0 + params * 1e12 / rate;
            let mut r = SynthRun::new(&format!("{model}-offload-{host}"), cfg, 1, step);
            (r.gpu, r.jitter) = (gpu.to_string(), 0.0);
            r.write(&dir.join(&r.run_id)).unwrap();
        }
        std::fs::write(
            dir.join("cpu_adamw.json"),
            format!("cpu_adamw: 16 threads\n{{\"adamw_params_per_s\":{rate}}}\n"),
        )
        .unwrap();
    }
    let (a, b) = (tmp.path().join("host-a"), tmp.path().join("host-b"));
    let m = tmp.path().join("m.json");
    let o = zerobench(&["fit", a.to_str().unwrap(), b.to_str().unwrap(), "--out", m.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let said = "offload priced at the hosts' AdamW rate 5.00G parameters/s (geometric mean of 4.00-6.25G); 4 of 4";
    assert!(text(&o.stdout).contains(said), "{}", text(&o.stdout));
    let model: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&m).unwrap()).unwrap();
    let reference = model["fits"][0]["host_adamw_gparams_per_s"].as_f64().unwrap();
    assert!((reference - 5.0).abs() < 1e-9, "{reference}");
    let predict = |rate: Option<&str>| {
        let base = ["predict", "--cost-model", m.to_str().unwrap(), "--gpu", "h100", "--model", "gpt2-large"];
        let q = ["--stage", "2", "--micro-batch", "4", "--seq-len", "512", "--offload", "optimizer", "--json"];
        let r: Vec<String> = rate.map(|r| format!("--host-adamw-rate={r}")).into_iter().collect();
        let r: Vec<&str> = r.iter().map(String::as_str).collect();
        zerobench(&[&base[..], &q[..], &r].concat())
    };
    let json = |o: Output| -> serde_json::Value {
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let (slow, fitted, fast) = (json(predict(Some("4"))), json(predict(None)), json(predict(Some("6.25"))));
    assert_eq!(slow["host_adamw_gparams_per_s"], 4.0, "{slow}");
    assert!((fitted["host_adamw_gparams_per_s"].as_f64().unwrap() - 5.0).abs() < 1e-9, "{fitted}");
    let offload = |p: &serde_json::Value| p["offload_ms"].as_f64().unwrap();
    assert!(offload(&slow) > offload(&fitted) && offload(&fitted) > offload(&fast), "{slow} {fitted} {fast}");
    // A rate outside the fitted hosts' is priced and flagged.
    let outside = json(predict(Some("3")));
    assert!(outside["extrapolated"].to_string().contains("host AdamW at 3.00G"), "{outside}");
    for bad in ["0", "-2", "fast"] {
        let o = predict(Some(bad));
        assert_eq!(o.status.code(), Some(2), "{bad}");
        assert!(text(&o.stderr).contains("--host-adamw-rate"), "{bad}: {}", text(&o.stderr));
    }
    // A rate file that cannot be read: fit stops naming it and its line; ingest prices the runs
    // below it as of an unknown host and exits 1.
    std::fs::write(b.join("cpu_adamw.json"), "{\"adamw_params_per_s\": 6e9\n").unwrap();
    let o = zerobench(&["fit", a.to_str().unwrap(), b.to_str().unwrap(), "--out", m.to_str().unwrap(), "--overwrite"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("host-b/cpu_adamw.json:1: not a JSON object"), "{}", text(&o.stderr));
    let out = tmp.path().join("tables");
    let o = zerobench(&[
        "ingest",
        b.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--cost-model",
        m.to_str().unwrap(),
        "-q",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("cpu_adamw.json:1"), "{}", text(&o.stderr));
    let t: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("predicted.json")).unwrap()).unwrap();
    for r in t["rows"].as_array().unwrap() {
        assert!((r["host_adamw_gparams_per_s"].as_f64().unwrap() - 5.0).abs() < 1e-3, "{r}");
    }
    // Without the files the fit says so.
    std::fs::remove_file(b.join("cpu_adamw.json")).unwrap();
    std::fs::remove_file(a.join("cpu_adamw.json")).unwrap();
    let o = zerobench(&["fit", a.to_str().unwrap(), b.to_str().unwrap(), "--out", m.to_str().unwrap(), "--overwrite"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(text(&o.stdout).contains("none of 4 offloaded runs had a cpu_adamw.json"), "{}", text(&o.stdout));
}

/// Offloaded runs of two ranks on one host beside runs of one: the fit says by how much ranks
/// sharing a host slow each other's host updates, and on how many runs; `predict` prices a host of
/// more ranks than fitted by that exponent and flags it.
#[test]
fn ranks_sharing_a_host_are_fitted_and_more_are_flagged() {
    let tmp = tempfile::tempdir().unwrap();
    let gpu = "NVIDIA H100 80GB HBM3";
    let dir = tmp.path().join("runs");
    sweep(&dir, gpu);
    for (ranks, ratio) in [(1, 1.0), (1, 0.5), (2, 1.0), (2, 0.5)] {
        let mut cfg = RunConfig::new(ModelPreset::Gpt2Xl, ZeroStage::Z2);
        (cfg.steps, cfg.warmup, cfg.micro_batch, cfg.seq_len) = (6, 1, 4, 512);
        (cfg.offload, cfg.offload_ratio) = (zerobench_schema::config::Offload::Optimizer, Some(ratio));
        // Each rank's share of the host's parameters at 5G/s, two ranks slowing each other by √2.
        let ranks_f = f64::from(ranks);
        let step = 60.0 + ratio * 1.56e12 / ranks_f / 5e9 * ranks_f.sqrt();
        let mut r = SynthRun::new(&format!("xl-offload-r{ratio}-{ranks}"), cfg, ranks, step);
        (r.gpu, r.jitter) = (gpu.to_string(), 0.0);
        r.write(&dir.join(&r.run_id)).unwrap();
    }
    let m = tmp.path().join("m.json");
    let o = zerobench(&["fit", dir.to_str().unwrap(), "--out", m.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    for said in ["ranks sharing a host slow each other's host updates by ranks^", "fitted on 2 offloaded runs of"] {
        assert!(out.contains(said), "{said}: {out}");
    }
    let model: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&m).unwrap()).unwrap();
    let e = model["fits"][0]["step"]["offload.sharing_exponent"].as_f64().unwrap();
    assert!(e > 0.0, "{e}");
    let predict = |gpus: &str| {
        let base = ["predict", "--cost-model", m.to_str().unwrap(), "--gpu", "h100", "--model", "gpt2-xl"];
        let q = ["--stage", "2", "--micro-batch", "4", "--seq-len", "512", "--offload", "optimizer", "--json"];
        let o = zerobench(&[&base[..], &q[..], &["--gpus", gpus]].concat());
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    let (two, four) = (predict("2"), predict("4"));
    assert!(!two["extrapolated"].to_string().contains("share a host"), "{two}");
    let flag = four["extrapolated"].to_string();
    assert!(
        flag.contains("4 ranks share a host, fitted with up to 2") && flag.contains(&format!("4^{e:.2}")),
        "{flag}"
    );
}

/// With a cost model, `plan` proposes each offloaded run's offload ratio by the model: the first
/// share of whole units whose predicted step waits for the host's update, the share before it
/// hidden; the launcher's estimate stands beside it, and without a model alone.
#[test]
fn plan_proposes_the_offload_ratio_by_the_cost_model() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = tmp.path().join("offload.yaml");
    std::fs::write(
        &spec,
        "cluster:\n  gpus_per_node: 4\n  gpu_memory: 80GiB\nworker:\n  seq_len: 1024\nsweep:\n  models: [gpt2-xl]\n  \
         stages: [2]\n  offload: [optimizer]\n  micro_batches: [4]\n  gpus_per_node: [1, 4]\n",
    )
    .unwrap();
    let spec = spec.to_str().unwrap();
    let o = zerobench(&["plan", spec, "--gpu", "h100", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let runs: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(runs.len(), 2);
    let offload_ms = |ranks: u32, ratio: f64| {
        let (ranks, ratio) = (ranks.to_string(), ratio.to_string());
        let o = zerobench(&[
            "predict",
            "--gpu",
            "h100",
            "--model",
            "gpt2-xl",
            "--stage",
            "2",
            "--micro-batch",
            "4",
            "--seq-len",
            "1024",
            "--gpus",
            &ranks,
            "--offload",
            "optimizer",
            "--offload-ratio",
            &ratio,
            "--json",
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()["offload_ms"].as_f64().unwrap()
    };
    for r in &runs {
        let ranks = r["ranks_per_node"].as_u64().unwrap() as u32;
        let x = r["cost_model_offload_ratio"].as_f64().unwrap();
        assert!(r["proposed_offload_ratio"].as_f64().is_some(), "{r}");
        let mut cfg = RunConfig::new(ModelPreset::Gpt2Xl, ZeroStage::Z2);
        cfg.offload = zerobench_schema::config::Offload::Optimizer;
        let shares: Vec<f64> =
            zerobench_launcher::plan::offload_ratio_choices(&cfg, ranks).into_iter().map(|(_, r)| r).collect();
        let k = shares.iter().position(|&s| s == x).unwrap_or_else(|| panic!("{x} not among {shares:?}"));
        assert!(k > 0 && offload_ms(ranks, x) > 0.0, "{ranks} ranks: {x} ({k} of {shares:?})");
        assert_eq!(offload_ms(ranks, shares[k - 1]), 0.0, "{ranks} ranks: {} before {x}", shares[k - 1]);
    }
    let table = |args: &[&str]| text(&zerobench(&[&["plan", spec][..], args].concat()).stdout);
    assert!(table(&["--gpu", "h100"]).contains("(cost model; estimate "), "{}", table(&["--gpu", "h100"]));
    let alone = table(&[]);
    assert!(alone.contains("steps (estimate)") && !alone.contains("cost model"), "{alone}");
}
