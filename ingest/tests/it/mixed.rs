//! Mixed folders as people keep them: several DeepSpeed runs' logs flat in one folder (one file
//! per configuration), a Trainer log and a shared nvidia-smi CSV beside them; zerobench sweeps that
//! differ only in an axis a table cell does not show (gradient accumulation, hpZ); the same run id
//! in two input folders. Each run must come out alone, with its own identity and figures, and no
//! table may pool runs of different configurations.

use std::path::Path;

use zerobench_ingest::report::plot::breakdown_bars;
use zerobench_ingest::tables::{Cell, Tables};
use zerobench_ingest::{ProblemKind, RunRow, Source};
use zerobench_schema::{ModelPreset, Offload, Precision, ZeroStage};

use crate::common::{read, run};

const MIB: u64 = 1 << 20;

fn gib(v: f64) -> Option<u64> {
    Some((v * (1u64 << 30) as f64) as u64)
}

fn by_id<'a>(rows: &'a [RunRow], id: &str) -> &'a RunRow {
    rows.iter().find(|r| r.run_id == id).unwrap_or_else(|| {
        panic!("no run {id}: {:?}", rows.iter().map(|r| &r.run_id).collect::<Vec<_>>());
    })
}

fn copy_mixed(to: &Path) {
    let from = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mixed/gpt2-medium-flat");
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(&from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// Two DeepSpeed logs, a Trainer log and one nvidia-smi CSV in one folder: three runs, each with
/// the identity its own log gives and its own figures; the CSV's samples split by when each
/// DeepSpeed run ran.
#[test]
fn flat_folder_of_foreign_logs_is_one_run_per_configuration() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("logs");
    copy_mixed(&root.join("mixed-gpt2-medium-flat"));
    let got = read(&root);
    let rows = Tables::build(&got.runs).runs;
    assert_eq!(rows.len(), 3, "{rows:#?}");
    assert!(rows.iter().all(|r| r.source == Source::Foreign));

    let z2 = by_id(&rows, "mixed-gpt2-medium-flat/ds_engine_z2_mbs8");
    let z3 = by_id(&rows, "mixed-gpt2-medium-flat/ds_engine_z3_mbs8");
    let hf = by_id(&rows, "mixed-gpt2-medium-flat/hf_trainer_gpt2");
    // Identity from DeepSpeed's printed configuration, the model from the folder's name.
    let identity = |r: &RunRow| (r.model.clone(), r.stage, r.offload, r.precision, r.micro_batch, r.grad_accum, r.gpus);
    assert_eq!(
        identity(z2),
        (
            "gpt2-medium".into(),
            Some(ZeroStage::Z2),
            Some(Offload::None),
            Some(Precision::Bf16),
            Some(8),
            Some(1),
            Some(2)
        )
    );
    assert_eq!(
        identity(z3),
        (
            "gpt2-medium".into(),
            Some(ZeroStage::Z3),
            Some(Offload::None),
            Some(Precision::Bf16),
            Some(8),
            Some(1),
            Some(2)
        )
    );
    // The Trainer log says nothing but its model (in its name): the rest stays unknown.
    assert_eq!(identity(hf), ("gpt2".into(), None, None, None, None, None, None));

    // Each run's own figures: the median of its forward times after two warmup lines, its peak
    // Max_MA, its own throughput.
    assert_eq!((z2.forward_ms_median, z3.forward_ms_median), (Some(41.2), Some(52.1)));
    assert_eq!((z2.peak_allocated_bytes, z3.peak_allocated_bytes), (gib(10.4), gib(7.9)));
    assert_eq!((z2.ds_running_avg_samples_per_s, z3.ds_running_avg_samples_per_s), (Some(118.3), Some(87.6)));
    assert_eq!(z2.samples_per_s, Some(118.3));
    assert_eq!((hf.samples_per_s, hf.hf_train_samples_per_s), (Some(62.47), Some(62.47)));
    assert_eq!((hf.hf_train_runtime_s, hf.hf_train_steps_per_s), (Some(512.25), Some(7.809)));
    assert_eq!((hf.final_loss, hf.hf_train_loss), (Some(3.6325), Some(3.6325)));
    assert_eq!(hf.eval_loss, Some(3.2189), "the last evaluation");
    assert_eq!(hf.perplexity, Some(25.0006), "exp(3.2189), to 6 significant digits");
    assert_eq!((hf.peak_allocated_bytes, hf.step_ms_median), (None, Some(128.057)), "1 / steps per second");

    // The nvidia-smi samples taken while each DeepSpeed run ran are that run's, the idle ones
    // between them nobody's; the Trainer run has no time stamps and gets none (reported).
    assert_eq!(z2.peak_nvml_used_bytes, Some(12800 * MIB));
    assert_eq!(z3.peak_nvml_used_bytes, Some(9472 * MIB));
    assert_eq!(hf.peak_nvml_used_bytes, None);
    assert_eq!((z2.gpu.as_deref(), z2.formats.as_str()), (Some("NVIDIA H200"), "deepspeed+nvidia-smi"));
    assert_eq!(hf.formats, "hf-trainer");
    let unplaced: Vec<&ProblemKind> =
        got.problems.iter().map(|p| &p.kind).filter(|k| matches!(k, ProblemKind::Ambiguous { .. })).collect();
    assert_eq!(unplaced.len(), 1, "{:?}", got.problems);
    assert!(unplaced[0].to_string().contains("hf_trainer_gpt2"), "{}", unplaced[0]);

    // The see_memory_usage progression, by phase, per run.
    let tables = Tables::build(&got.runs);
    let z2_phases: Vec<(&str, f64)> = tables
        .memory_phases
        .iter()
        .filter(|m| m.run_id == z2.run_id)
        .map(|m| (m.phase.as_str(), m.max_allocated_gib))
        .collect();
    assert_eq!(
        z2_phases,
        [
            ("Engine before forward", 2.1),
            ("Engine after forward", 10.4),
            ("Engine after backward", 10.4),
            ("Engine after step", 2.4)
        ]
    );

    // Two stages, two blocks of the latency table, each with its own cell.
    let latency = &tables.latency;
    let cells: Vec<(String, Vec<Cell>)> =
        latency.blocks.iter().flat_map(|b| b.rows.iter().map(|r| (b.label.clone(), r.cells.clone()))).collect();
    assert_eq!(cells.len(), 2, "{cells:#?}");
    for (label, row) in &cells {
        let n: Vec<u32> =
            row.iter().filter_map(|c| if let Cell::Value { runs, .. } = c { Some(*runs) } else { None }).collect();
        assert_eq!(n, [1], "{label}: {row:?}");
    }
}

/// The nvidia-smi log alone in a folder with two runs whose time spans overlap cannot be split:
/// it is reported, and given to neither.
#[test]
fn shared_nvidia_smi_with_overlapping_runs_is_ambiguous() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("logs/flat");
    copy_mixed(&dir);
    std::fs::remove_file(dir.join("hf_trainer_gpt2.log")).unwrap();
    // The stage-3 run moved onto the stage-2 run's minute.
    let z3 = std::fs::read_to_string(dir.join("ds_engine_z3_mbs8.log")).unwrap();
    std::fs::write(dir.join("ds_engine_z3_mbs8.log"), z3.replace("10:02:", "10:00:")).unwrap();
    let got = read(&tmp.path().join("logs"));
    let rows = Tables::build(&got.runs).runs;
    assert_eq!(rows.len(), 2);
    assert!(rows.iter().all(|r| r.peak_nvml_used_bytes.is_none()), "{rows:#?}");
    assert!(
        got.problems
            .iter()
            .any(|p| matches!(&p.kind, ProblemKind::Ambiguous { message } if message.contains("overlap"))),
        "{:?}",
        got.problems
    );
}

/// Per-rank logs of one run (names that differ in digits alone) are joined; a folder whose logs
/// say nothing about themselves is one run, named by the folder.
#[test]
fn per_rank_logs_are_joined_and_anonymous_folders_are_one_run() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("logs");
    let line = |ms: f64| format!("time (ms) | fwd_microstep: {ms} | bwd_microstep: 20.0 | step_microstep: 1.0\n");
    let named = root.join("named");
    std::fs::create_dir_all(&named).unwrap();
    std::fs::write(named.join("ds_z1_rank0.log"), line(5.0).repeat(4)).unwrap();
    std::fs::write(named.join("ds_z1_rank1.log"), line(7.0).repeat(4)).unwrap();
    std::fs::write(named.join("ds_z2.log"), line(9.0).repeat(4)).unwrap();
    let plain = root.join("plain-run");
    std::fs::create_dir_all(&plain).unwrap();
    std::fs::write(plain.join("stdout.log"), line(3.0).repeat(4)).unwrap();
    std::fs::write(plain.join("stderr.log"), "RunningAvgSamplesPerSec=10.0, CurrSamplesPerSec=11.0\n").unwrap();
    let rows = Tables::build(&read(&root).runs).runs;
    let ids: Vec<&str> = rows.iter().map(|r| r.run_id.as_str()).collect();
    assert_eq!(rows.len(), 3, "{ids:?}");
    let z1 = by_id(&rows, "named/ds_z1_rank0");
    assert_eq!((z1.stage, z1.steps_measured), (Some(ZeroStage::Z1), 6), "two ranks' 4 lines, the first 2 warmup");
    assert_eq!(by_id(&rows, "named/ds_z2").stage, Some(ZeroStage::Z2));
    let p = by_id(&rows, "plain-run");
    assert_eq!((p.forward_ms_median, p.samples_per_s), (Some(3.0), Some(10.0)));
}

/// zerobench sweeps that differ only in gradient accumulation, or only in hpZ, are distinct rows
/// and cells: no median of a 12 ms and a 24 ms step.
#[test]
fn runs_differing_in_grad_accum_or_hpz_are_never_pooled() {
    use ModelPreset::Gpt2;
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("logs");
    for (id, ga, hpz, ms) in
        [("ga1", 1, None, 12.5), ("ga2", 2, None, 24.0), ("hpz-none", 1, None, 30.0), ("hpz2", 1, Some(2), 27.0)]
    {
        let stage = if id.starts_with("hpz") { ZeroStage::Z3 } else { ZeroStage::Z2 };
        let gpus = if id.starts_with("hpz") { 4 } else { 2 };
        let mut r = run(id, Gpt2, stage, 4, gpus, ms);
        r.config.grad_accum = ga;
        r.config.engine.hpz = hpz;
        r.write(&root.join(id)).unwrap();
    }
    // A repeat of ga1: the same configuration, so one cell of two runs.
    run("ga1-again", Gpt2, ZeroStage::Z2, 4, 2, 12.7).write(&root.join("ga1-again")).unwrap();
    let got = read(&root);
    assert!(got.problems.is_empty(), "{:?}", got.problems);
    let tables = Tables::build(&got.runs);
    let cells: Vec<(String, String, Cell)> = tables
        .latency
        .blocks
        .iter()
        .flat_map(|b| {
            let mbs = b.micro_batches.iter().position(|m| *m == 4).unwrap();
            b.rows.iter().map(move |r| (b.label.clone(), r.model.clone(), r.cells[mbs].clone()))
        })
        .collect();
    let runs: Vec<(&str, &str, u32)> = cells
        .iter()
        .map(|(b, m, c)| match c {
            Cell::Value { runs, .. } => (b.as_str(), m.as_str(), *runs),
            other => panic!("{b} {m}: {other:?}"),
        })
        .collect();
    assert_eq!(
        runs,
        [
            ("zero2 gpus=2 bf16 seq=1024", "gpt2", 2),
            ("zero2 gpus=2 bf16 seq=1024 grad_accum=2", "gpt2", 1),
            ("zero3 gpus=4 bf16 seq=1024", "gpt2", 1),
            ("zero3 gpus=4 bf16 seq=1024", "gpt2 [hpz=2]", 1),
        ]
    );
    // The repeat's cell says how many runs and their range.
    assert!(cells[0].2.text().contains("(n=2 "), "{}", cells[0].2.text());
    // The scaling table keeps them apart too.
    let scaling: Vec<(Option<u32>, String)> =
        tables.scaling.iter().map(|s| (s.group.grad_accum, s.group.variant.clone())).collect();
    assert_eq!(
        scaling,
        [(Some(1), String::new()), (Some(2), String::new()), (Some(1), String::new()), (Some(1), "hpz=2".into())]
    );
}

/// A console capture kept beside its run's folder (`runs/X.out` next to `runs/X/`) belongs to that
/// run: an out-of-memory message in it makes no foreign run of its own. A DeepSpeed log beside
/// the runs, named after none of them, is still a run.
#[test]
fn console_captures_beside_run_folders_are_not_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("runs");
    let mut oom = run("gpt2-xl_z0_mb64", ModelPreset::Gpt2Xl, ZeroStage::Z0, 64, 1, 100.0);
    oom.fate = zerobench_ingest::synth::Fate::Oom { rank: 0, step: 1 };
    oom.write(&root.join("gpt2-xl_z0_mb64")).unwrap();
    run("gpt2_z1_mb4", ModelPreset::Gpt2, ZeroStage::Z1, 4, 1, 10.0).write(&root.join("gpt2_z1_mb4")).unwrap();
    let oom_text = "zerobench-worker: out of memory: CUDA out of memory. Tried to allocate 224.00 MiB.\n";
    std::fs::write(root.join("gpt2-xl_z0_mb64.out"), oom_text).unwrap();
    std::fs::write(root.join("gpt2_z1_mb4.out"), "zerobench-worker: gpt2 stage 1 on 1 rank(s): 10.0 ms/step\n")
        .unwrap();
    let rows = Tables::build(&read(&root).runs).runs;
    let ids: Vec<&str> = rows.iter().map(|r| r.run_id.as_str()).collect();
    assert_eq!(ids, ["gpt2_z1_mb4", "gpt2-xl_z0_mb64"], "{ids:?}");
    // The same capture under a name no run folder has is read as what it looks like.
    std::fs::write(root.join("ds_z2.log"), oom_text).unwrap();
    let rows = Tables::build(&read(&root).runs).runs;
    assert_eq!(rows.len(), 3, "{:?}", rows.iter().map(|r| &r.run_id).collect::<Vec<_>>());
    // The launcher's layout (`runs/X/logs/rank0.jsonl`): `runs/X.out` names the run folder
    // above the logs.
    let launcher = tmp.path().join("launcher");
    oom.write(&launcher.join("gpt2-xl_z0_mb64/logs")).unwrap();
    std::fs::write(launcher.join("gpt2-xl_z0_mb64.out"), oom_text).unwrap();
    let rows = Tables::build(&read(&launcher).runs).runs;
    assert_eq!(rows.iter().map(|r| r.run_id.as_str()).collect::<Vec<_>>(), ["gpt2-xl_z0_mb64"]);
}

/// One run id in two input folders: both runs are kept, named with their folders, and the clash
/// is reported.
#[test]
fn duplicate_run_ids_are_reported_and_told_apart() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    run("same", ModelPreset::Gpt2, ZeroStage::Z1, 4, 2, 10.0).write(&a.join("same")).unwrap();
    run("same", ModelPreset::Gpt2, ZeroStage::Z2, 4, 2, 11.0).write(&b.join("same")).unwrap();
    let got = zerobench_ingest::ingest(&[a.clone(), b.clone()], &Default::default(), &zerobench_ingest::NoProgress);
    let rows = Tables::build(&got.runs).runs;
    let ids: Vec<String> = rows.iter().map(|r| r.run_id.clone()).collect();
    assert_eq!(ids, [format!("same@{}", a.join("same").display()), format!("same@{}", b.join("same").display())]);
    // Each folder's problem names the other folder.
    let dups: Vec<(String, String)> = got
        .problems
        .iter()
        .filter_map(|p| match &p.kind {
            ProblemKind::DuplicateRunId { other, .. } => Some((p.path.display().to_string(), other.clone())),
            _ => None,
        })
        .collect();
    let (da, db) = (a.join("same").display().to_string(), b.join("same").display().to_string());
    assert_eq!(dups.len(), 2, "{:?}", got.problems);
    assert!(dups.contains(&(da.clone(), db.clone())) && dups.contains(&(db, da)), "{dups:?}");
}

/// Every bar of the step breakdown adds up to its run's median step within 1%: zerobench runs,
/// whose phases are disjoint (exposed communication drawn apart), and DeepSpeed runs, whose
/// backward contains its reductions (not drawn twice).
#[test]
fn every_breakdown_bar_is_its_median_step() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("logs");
    crate::common::golden_set(&root);
    copy_mixed(&root.join("mixed"));
    let rows = Tables::build(&read(&root).runs).runs;
    let with_steps: Vec<&RunRow> = rows.iter().filter(|r| r.step_ms_median.is_some()).collect();
    let bars = breakdown_bars(&rows);
    assert_eq!(bars.len(), with_steps.len());
    assert!(bars.len() >= 20, "{}", bars.len());
    for ((label, parts), row) in bars.iter().zip(&with_steps) {
        let step = row.step_ms_median.unwrap();
        let sum: f64 = parts.iter().sum();
        assert!((sum - step).abs() <= 0.01 * step, "{label}: bar {sum} for a {step} ms step ({parts:?})");
        assert!(parts.iter().all(|p| *p >= 0.0), "{label}: {parts:?}");
    }
    // A DeepSpeed run: forward, backward (with its all-reduce), optimizer; nothing drawn as
    // exposed communication.
    let ds = rows.iter().position(|r| r.run_id == "mixed/ds_engine_z2_mbs8").unwrap();
    let (_, ds_parts) = &bars[with_steps.iter().position(|r| r.run_id == rows[ds].run_id).unwrap()];
    assert_eq!(ds_parts[2], 0.0);
    assert!((ds_parts[0] - 41.2).abs() < 0.5, "{ds_parts:?}");
}

/// Offload runs that differ in their offload ratio or in the delayed update are distinct rows;
/// an explicit ratio of 1 is the plain offload run's configuration, so they share a cell.
#[test]
fn runs_differing_in_offload_ratio_or_delayed_update_are_never_pooled() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("logs");
    for (id, ratio, delayed, ms) in [
        ("all-host", None, None, 300.0),
        ("ratio1", Some(1.0), None, 302.0),
        ("ratio-half", Some(0.5), None, 150.0),
        ("delayed", None, Some(3), 120.0),
    ] {
        let mut r = run(id, ModelPreset::Gpt2, ZeroStage::Z2, 4, 1, ms);
        r.config.offload = Offload::Optimizer;
        r.config.offload_ratio = ratio;
        r.config.delayed_update_after = delayed;
        r.write(&root.join(id)).unwrap();
    }
    let got = read(&root);
    assert!(got.problems.is_empty(), "{:?}", got.problems);
    let tables = Tables::build(&got.runs);
    let mut rows: Vec<(String, u32)> = tables
        .latency
        .blocks
        .iter()
        .flat_map(|b| {
            let mb = b.micro_batches.iter().position(|m| *m == 4).unwrap();
            b.rows.iter().map(move |r| match &r.cells[mb] {
                Cell::Value { runs, .. } => (r.model.clone(), *runs),
                other => panic!("{}: {other:?}", r.model),
            })
        })
        .collect();
    rows.sort();
    assert_eq!(
        rows,
        [
            ("gpt2".to_string(), 2),
            ("gpt2 [delayed_update_after=3]".to_string(), 1),
            ("gpt2 [offload_ratio=0.5]".to_string(), 1)
        ]
    );
}

/// Logs whose names and contents say nothing of their configuration, beside a DeepSpeed log that
/// does, are grouped by their names without digits: `trainer0.log` and `trainer1.log` (two
/// ranks' consoles) are one run, `eval.log` another.
#[test]
fn unnamed_logs_group_by_their_names_without_digits() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("logs/f");
    std::fs::create_dir_all(&dir).unwrap();
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mixed/gpt2-medium-flat");
    std::fs::copy(fixtures.join("ds_engine_z2_mbs8.log"), dir.join("ds_engine_z2_mbs8.log")).unwrap();
    for name in ["trainer0.log", "trainer1.log", "eval.log"] {
        std::fs::write(dir.join(name), crate::common::trainer_summary(7.119)).unwrap();
    }
    let got = read(&tmp.path().join("logs"));
    let mut ids: Vec<&str> = got.runs.iter().map(|r| r.row.run_id.as_str()).collect();
    ids.sort();
    assert_eq!(ids, ["f/ds_engine_z2_mbs8", "f/eval", "f/trainer0"]);
}

/// A folder with a run.json is one run, whatever its logs' names say: the DeepSpeed logs of two
/// configurations beside it are read as that run's.
#[test]
fn a_run_json_makes_its_folder_one_run() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("logs/f");
    copy_mixed(&dir);
    std::fs::remove_file(dir.join("hf_trainer_gpt2.log")).unwrap();
    std::fs::write(dir.join("run.json"), r#"{"run_id": "declared", "model": "gpt2-medium", "stage": 2}"#).unwrap();
    let got = read(&tmp.path().join("logs"));
    let ids: Vec<&str> = got.runs.iter().map(|r| r.row.run_id.as_str()).collect();
    assert_eq!(ids, ["declared"]);
}

/// Two DeepSpeed runs of one folder whose time spans touch (one ends the second the other
/// starts) overlap: a shared nvidia-smi log's sample at that second could be either's, so the log
/// is given to neither and that is reported.
#[test]
fn runs_whose_spans_touch_share_no_gpu_samples() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("logs/f");
    std::fs::create_dir_all(&dir).unwrap();
    let config = |at: &str, key: &str, value: u32| {
        format!("[2024-01-01 {at},000] [INFO] [config.py:1000:print]   {key} ....... {value}\n")
    };
    for (name, stage, from, to) in [("ds_a.log", 2, "10:00:00", "10:05:00"), ("ds_b.log", 3, "10:05:00", "10:10:00")] {
        let text = config(from, "zero_optimization_stage", stage) + &config(to, "train_micro_batch_size_per_gpu", 8);
        std::fs::write(dir.join(name), text).unwrap();
    }
    std::fs::write(
        dir.join("nvidia-smi.csv"),
        "timestamp, index, memory.used [MiB], power.draw [W]\n\
         2024/01/01 10:02:00.000, 0, 1000 MiB, 100.0 W\n\
         2024/01/01 10:07:00.000, 0, 2000 MiB, 200.0 W\n",
    )
    .unwrap();
    let got = read(&tmp.path().join("logs"));
    assert_eq!(got.runs.len(), 2, "{:?}", got.runs.iter().map(|r| &r.row.run_id).collect::<Vec<_>>());
    let ambiguous = got.problems.iter().filter(|p| matches!(p.kind, ProblemKind::Ambiguous { .. })).count();
    assert_eq!(ambiguous, 1, "{:#?}", got.problems);
    // A second apart, the spans are disjoint and each run gets its own sample.
    std::fs::write(
        dir.join("ds_b.log"),
        config("10:05:01", "zero_optimization_stage", 3) + &config("10:10:00", "train_micro_batch_size_per_gpu", 8),
    )
    .unwrap();
    let got = read(&tmp.path().join("logs"));
    assert!(got.problems.iter().all(|p| !matches!(p.kind, ProblemKind::Ambiguous { .. })), "{:#?}", got.problems);
}

/// Slurm's `--output X.out --error X.err` of one DeepSpeed run: the `.out` holds the printed
/// configuration and the breakdown lines, the `.err` the traceback of the out-of-memory error.
/// They are one run (one row, under one id, `oom`), with the configuration the `.out` printed; an
/// `oom` run's steps before the error are no latency: its cell is `OOM`, as a zerobench run's is.
/// Another run's log beside them stays a run of its own.
#[test]
fn a_slurm_out_and_err_of_one_stem_are_one_run() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("split");
    let dir = root.join("sweep");
    std::fs::create_dir_all(&dir).unwrap();
    let stamp = "[2026-11-20 10:00:00,000] [INFO]";
    let mut out = String::new();
    for (k, v) in [
        ("bfloat16_enabled", "True"),
        ("fp16_enabled", "False"),
        ("gradient_accumulation_steps", "1"),
        ("train_micro_batch_size_per_gpu", "16"),
        ("world_size", "2"),
        ("zero_config", "stage=2 offload_param=None offload_optimizer=None"),
        ("zero_optimization_stage", "2"),
    ] {
        out.push_str(&format!("{stamp} [config.py:1007:print]   {k} .......... {v}\n"));
    }
    let breakdown = format!(
        "{stamp} [logging.py:128:log_dist] [Rank 0] time (ms) | fwd_microstep: 50.00 | bwd_microstep: 110.00 \
         | bwd_allreduce_microstep: 30.00 | step_microstep: 10.00\n"
    );
    out.push_str(&breakdown.repeat(5));
    std::fs::write(dir.join("gpt2_z2_mbs16.out"), &out).unwrap();
    std::fs::write(
        dir.join("gpt2_z2_mbs16.err"),
        "Traceback (most recent call last):\n  File \"train.py\", line 88, in <module>\n    loss.backward()\n\
         torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 6.14 GiB. GPU 0 has a total capacity of \
         79.19 GiB of which 2.10 GiB is free.\n",
    )
    .unwrap();
    let got = read(&root);
    assert!(got.problems.is_empty(), "{:#?}", got.problems);
    let tables = Tables::build(&got.runs);
    let ids: Vec<&str> = tables.runs.iter().map(|r| r.run_id.as_str()).collect();
    assert_eq!(ids, ["sweep"], "one run, named by its folder");
    let r = &tables.runs[0];
    assert_eq!(r.status, zerobench_ingest::Status::Oom);
    assert!(r.status_detail.as_deref().unwrap_or("").contains("CUDA out of memory"), "{:?}", r.status_detail);
    assert_eq!(
        (r.model.as_str(), r.stage, r.offload, r.micro_batch, r.gpus, r.precision),
        ("gpt2", Some(ZeroStage::Z2), Some(Offload::None), Some(16), Some(2), Some(Precision::Bf16))
    );
    // One block, the printed configuration's, whose one cell says the run ran out of memory.
    let cells: Vec<(String, Vec<String>)> = tables
        .latency
        .blocks
        .iter()
        .flat_map(|b| b.rows.iter().map(|r| (b.label.clone(), r.cells.iter().map(Cell::text).collect())))
        .collect();
    assert_eq!(cells, [("zero2 gpus=2 bf16".to_string(), vec!["OOM".to_string()])]);
    assert!(tables.scaling.is_empty(), "{:?}", tables.scaling);

    // A second run's log in the folder: two runs, each named by its file's stem.
    std::fs::write(
        dir.join("gpt2_z3_mbs16.log"),
        out.replace("stage=2", "stage=3").replace("stage .......... 2", "stage .......... 3"),
    )
    .unwrap();
    let rows = Tables::build(&read(&root).runs).runs;
    let runs: Vec<(&str, zerobench_ingest::Status)> = rows.iter().map(|r| (r.run_id.as_str(), r.status)).collect();
    assert_eq!(
        runs,
        [("sweep/gpt2_z2_mbs16", zerobench_ingest::Status::Oom), ("sweep/gpt2_z3_mbs16", zerobench_ingest::Status::Ok)]
    );
}

/// Writes a synthetic run whose ranks ran on the CPU with `threads` intra-op threads each.
fn cpu_run(root: &Path, id: &str, threads: u32, step_ms: f64) {
    let dir = root.join(id);
    run(id, ModelPreset::Gpt2, ZeroStage::Z1, 4, 1, step_ms).write(&dir).unwrap();
    let mut changed = 0;
    for e in walkdir::WalkDir::new(&dir).into_iter().map(Result::unwrap) {
        if e.path().extension().is_some_and(|x| x == "jsonl") {
            let text = std::fs::read_to_string(e.path()).unwrap();
            let cpu = text.replacen("\"kind\":\"cuda\"", "\"kind\":\"cpu\"", 1);
            let new = cpu.replacen("\"threads\":4}", &format!("\"threads\":{threads}}}"), 1);
            changed += usize::from(new != cpu);
            std::fs::write(e.path(), new).unwrap();
        }
    }
    assert_eq!(changed, 1, "the start record of {id}");
}

/// CPU runs on 1 and on 2 threads per rank are no repeats of each other: two rows of the latency
/// table, each naming its threads, and runs on as many threads pool. The runs table says each
/// run's threads.
#[test]
fn runs_differing_in_threads_are_never_pooled() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("logs");
    cpu_run(&root, "t1", 1, 2.83);
    cpu_run(&root, "t1-again", 1, 2.79);
    cpu_run(&root, "t2", 2, 1.92);
    let got = read(&root);
    assert!(got.problems.is_empty(), "{:?}", got.problems);
    let tables = Tables::build(&got.runs);
    let threads: Vec<(&str, Option<u32>)> = tables.runs.iter().map(|r| (r.run_id.as_str(), r.threads)).collect();
    assert_eq!(threads, [("t1", Some(1)), ("t1-again", Some(1)), ("t2", Some(2))]);
    let block = &tables.latency.blocks[..];
    assert_eq!(block.len(), 1, "{block:#?}");
    let rows: Vec<(&str, u32)> = block[0]
        .rows
        .iter()
        .map(|r| match &r.cells[..] {
            [Cell::Value { runs, .. }] => (r.model.as_str(), *runs),
            other => panic!("{}: {other:?}", r.model),
        })
        .collect();
    assert_eq!(rows, [("gpt2 [threads=1]", 2), ("gpt2 [threads=2]", 1)]);
    // Without the 2-thread run nothing needs telling apart: the row is the model's.
    std::fs::remove_dir_all(root.join("t2")).unwrap();
    let tables = Tables::build(&read(&root).runs);
    assert_eq!(tables.latency.blocks[0].rows[0].model, "gpt2");
    assert!(tables.latency.blocks[0].rows[0].cells[0].text().contains("(n=2 "));
}
