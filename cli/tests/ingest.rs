//! `zerobench ingest` as a user runs it: exit codes, data on stdout, diagnostics on stderr.

use std::path::Path;
use std::process::{Command, Output};

use zerobench_ingest::synth::SynthRun;
use zerobench_schema::{ModelPreset, RunConfig, ZeroStage};

fn zerobench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zerobench")).args(args).output().unwrap()
}

fn logs(dir: &Path) {
    let mut cfg = RunConfig::new(ModelPreset::Gpt2, ZeroStage::Z2);
    cfg.steps = 5;
    SynthRun::new("cli-run", cfg, 2, 50.0).write(&dir.join("cli-run/logs")).unwrap();
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn complete_logs_exit_0_with_tables_on_stdout() {
    let tmp = tempfile::tempdir().unwrap();
    logs(&tmp.path().join("in"));
    let out = tmp.path().join("out");
    let o = zerobench(&["ingest", tmp.path().join("in").to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let stdout = text(&o.stdout);
    assert!(stdout.starts_with("run "), "{stdout}");
    assert!(stdout.contains("cli-run") && stdout.contains("Median step time (ms)"), "{stdout}");
    assert!(text(&o.stderr).contains("zerobench: read 2 files"), "{}", text(&o.stderr));
    for f in ["latency.csv", "mem.md", "runs.json", "summary.json", "step-breakdown.svg"] {
        assert!(out.join(f).is_file(), "{f}");
    }
}

/// Tables written inside the folder they came from (`ingest runs --out runs/tables`) are not read
/// back as input on the next ingest: the same files, the same runs.
#[test]
fn an_output_folder_inside_the_input_is_not_read() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    logs(&input);
    let out = input.join("tables");
    for _ in 0..2 {
        let o = zerobench(&["ingest", input.to_str().unwrap(), "--out", out.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
        let err = text(&o.stderr);
        assert!(err.contains("zerobench: read 2 files") && err.contains("1 runs (1 ok"), "{err}");
    }
    assert!(out.join("latency.csv").is_file());
}

/// An output folder that is the folder to read, or holds it, is refused (exit 2), naming both,
/// and nothing is written: its tables would be read back as a foreign run next time, and leaving
/// it out would leave the runs out.
#[test]
fn an_output_folder_that_is_the_input_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    logs(&input);
    let o = zerobench(&["ingest", input.to_str().unwrap(), "--out", input.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert!(
        err.contains(&format!("the output folder {} is the folder to read {}", input.display(), input.display())),
        "{err}"
    );
    assert!(!input.join("latency.csv").exists() && !input.join("summary.json").exists());
    // The folder above the input (`ingest runs --out .`): this ingest does not read it.
    let o = zerobench(&["ingest", input.to_str().unwrap(), "--out", tmp.path().to_str().unwrap(), "-q"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
}

#[test]
fn a_bad_line_exits_1_and_is_named_on_stderr() {
    let tmp = tempfile::tempdir().unwrap();
    logs(tmp.path());
    let rank1 = tmp.path().join("cli-run/logs/rank1.jsonl");
    let mut t = std::fs::read_to_string(&rank1).unwrap();
    t.push_str("{broken\n");
    std::fs::write(&rank1, t).unwrap();
    let out = tmp.path().join("out");
    let o = zerobench(&[
        "ingest",
        tmp.path().to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--quiet",
        "--format",
        "csv",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(o.stdout.is_empty());
    let stderr = text(&o.stderr);
    assert!(stderr.contains("rank1.jsonl:9: not a valid record"), "{stderr}");
    assert!(stderr.contains("1 problems"), "{stderr}");
    assert!(out.join("runs.csv").is_file() && !out.join("runs.md").exists());
}

#[test]
fn unwritable_output_and_bad_flags_exit_2() {
    let tmp = tempfile::tempdir().unwrap();
    logs(tmp.path());
    let file = tmp.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let o = zerobench(&["ingest", tmp.path().to_str().unwrap(), "--out", file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains("cannot create the output folder") && text(&o.stderr).contains("a-file"),
        "{}",
        text(&o.stderr)
    );
    let o = zerobench(&["ingest", tmp.path().to_str().unwrap(), "--out", "x", "--peak-tflops", "fast"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("invalid peak 'fast'"), "{}", text(&o.stderr));
}

/// A 2.5 KB rank log whose `start` record claims 2³² − 1 ranks: ingest's memory follows what the
/// files hold, not what they claim. Under a 100 MiB address-space limit it writes its tables and
/// names the missing ranks as ranges (the earlier build tried to list 4 billion ranks and
/// aborted).
#[test]
fn a_log_claiming_four_billion_ranks_costs_what_it_holds() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = RunConfig::new(ModelPreset::Gpt2, ZeroStage::Z2);
    cfg.steps = 3;
    let logs = tmp.path().join("in/hostile/logs");
    SynthRun::new("hostile", cfg, 1, 50.0).write(&logs).unwrap();
    let rank0 = logs.join("rank0.jsonl");
    let log = std::fs::read_to_string(&rank0).unwrap().replacen("\"world_size\":1,", "\"world_size\":4294967295,", 1);
    assert!(log.contains("4294967295") && log.len() < 8 << 10, "a small hostile log");
    std::fs::write(&rank0, log).unwrap();
    let out = tmp.path().join("out");
    let o = Command::new("bash")
        .arg("-c")
        .arg("ulimit -v 102400 && exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_zerobench"))
        .args(["ingest", tmp.path().join("in").to_str().unwrap(), "--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    // 1: the result is incomplete (ranks are missing), not a crash.
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("4294967294 of 4294967295 rank logs of run hostile missing (ranks 1-4294967294)"),
        "{}",
        text(&o.stderr)
    );
    assert!(out.join("runs.csv").is_file());
}

#[test]
fn a_folder_that_is_not_there_exits_2_and_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    logs(&tmp.path().join("in"));
    let missing = tmp.path().join("nonexistent");
    let out = tmp.path().join("out");
    let o = zerobench(&[
        "ingest",
        tmp.path().join("in").to_str().unwrap(),
        missing.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains(&format!("cannot read {}", missing.display())), "{}", text(&o.stderr));
    assert!(!out.exists(), "nothing is written");
}

/// A symbolic link planted in the output folder under a table's name is no table of an earlier
/// ingest: kept (exit 2, nothing written, its target untouched) unless `--overwrite` is given; then
/// it is replaced, not written through.
#[test]
fn a_link_planted_in_the_output_folder_is_replaced_not_followed() {
    let tmp = tempfile::tempdir().unwrap();
    logs(&tmp.path().join("in"));
    let out = tmp.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    let victim = tmp.path().join("someone-elses-file");
    std::fs::write(&victim, "precious\n").unwrap();
    let planted = ["latency.csv", "runs.json", "mem.md", "step-breakdown.svg"];
    for name in planted {
        std::os::unix::fs::symlink(&victim, out.join(name)).unwrap();
    }
    let input = tmp.path().join("in");
    let o = zerobench(&["ingest", input.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert!(err.contains("latency.csv") && err.contains("--overwrite"), "{err}");
    for name in planted {
        assert!(std::fs::symlink_metadata(out.join(name)).unwrap().file_type().is_symlink(), "{name} was replaced");
    }
    assert!(!out.join("summary.json").exists(), "a table was written beside the refusal");
    let o = zerobench(&["ingest", input.to_str().unwrap(), "--out", out.to_str().unwrap(), "--overwrite"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    for name in planted {
        let meta = std::fs::symlink_metadata(out.join(name)).unwrap();
        assert!(meta.file_type().is_file(), "{name} is now a file of ingest's");
    }
    // No private folder is left behind (the output folder's lock file stays, as it always does).
    let left: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            let name = e.file_name();
            name.to_string_lossy().starts_with('.')
                && name != ".zerobench.lock"
                && name != zerobench_ingest::report::MANIFEST
        })
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// A file of the user's under a table's name (`runs.csv` of their own) is never replaced without
/// `--overwrite`: nothing is written, the error names it, exit 2. An ingest's own tables are
/// replaced by the next ingest without asking; the user's file beside them under another name
/// stays.
#[test]
fn a_file_no_ingest_wrote_is_not_replaced_without_overwrite() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    logs(&input);
    let out = tmp.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("runs.csv"), "my own notes\n").unwrap();
    let ingest = |extra: &[&str]| {
        let mut args = vec!["ingest", input.to_str().unwrap(), "--out", out.to_str().unwrap(), "-q"];
        args.extend_from_slice(extra);
        zerobench(&args)
    };
    let o = ingest(&[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert!(err.contains(&format!("{} already holds runs.csv", out.display())) && err.contains("--overwrite"), "{err}");
    assert_eq!(std::fs::read_to_string(out.join("runs.csv")).unwrap(), "my own notes\n");
    assert!(!out.join("latency.csv").exists() && !out.join(zerobench_ingest::report::MANIFEST).exists());
    // Asked, it replaces the file; the next ingest replaces its own tables without asking.
    assert_eq!(ingest(&["--overwrite"]).status.code(), Some(0));
    assert!(std::fs::read_to_string(out.join("runs.csv")).unwrap().contains("cli-run"));
    std::fs::write(out.join("notes.md"), "mine\n").unwrap();
    let o = ingest(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(std::fs::read_to_string(out.join("notes.md")).unwrap(), "mine\n");
}

/// Ingest into a folder an earlier ingest wrote: the files it writes again are replaced, those of
/// the earlier ingest it does not write (the plots of a model no longer read) are removed, and
/// nothing else there is touched. The earlier plots stayed beside the new tables.
#[test]
fn a_second_ingest_into_a_folder_leaves_no_stale_files_of_the_first() {
    let tmp = tempfile::tempdir().unwrap();
    let (first, second) = (tmp.path().join("first"), tmp.path().join("second"));
    logs(&first);
    let mut cfg = RunConfig::new(ModelPreset::Gpt2Medium, ZeroStage::Z1);
    cfg.steps = 5;
    SynthRun::new("other-run", cfg, 2, 80.0).write(&second.join("other-run/logs")).unwrap();
    let out = tmp.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("notes.md"), "mine\n").unwrap();
    let ingest = |input: &Path| zerobench(&["ingest", input.to_str().unwrap(), "--out", out.to_str().unwrap(), "-q"]);
    assert_eq!(ingest(&first).status.code(), Some(0));
    assert!(out.join("throughput-gpt2.svg").is_file());
    // The list names the file, and a hand-edited one naming a path outside is not followed.
    let listed = std::fs::read_to_string(out.join(zerobench_ingest::report::MANIFEST)).unwrap();
    assert!(listed.lines().any(|l| l == "throughput-gpt2.svg"), "{listed}");
    let outside = tmp.path().join("outside.txt");
    std::fs::write(&outside, "keep\n").unwrap();
    std::fs::write(out.join(zerobench_ingest::report::MANIFEST), format!("{listed}../outside.txt\nnotes.md.link\n"))
        .unwrap();
    std::os::unix::fs::symlink(&outside, out.join("notes.md.link")).unwrap();
    let o = ingest(&second);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(!out.join("throughput-gpt2.svg").exists(), "the first ingest's plot is left");
    assert!(out.join("throughput-gpt2-medium.svg").is_file());
    let runs = std::fs::read_to_string(out.join("runs.csv")).unwrap();
    assert!(runs.contains("other-run") && !runs.contains("cli-run"), "{runs}");
    assert_eq!(std::fs::read_to_string(out.join("notes.md")).unwrap(), "mine\n");
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "keep\n");
    assert!(std::fs::symlink_metadata(out.join("notes.md.link")).is_ok(), "a link under a listed name was removed");
}

/// A foreign run whose model name is 300 characters long: its plots get a shortened file name
/// (told apart by a hash) instead of failing the whole command with "File name too long".
#[test]
fn a_run_with_a_very_long_model_name_is_plotted_like_the_others() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("in/long");
    std::fs::create_dir_all(&run).unwrap();
    let model = "m".repeat(300);
    std::fs::write(
        run.join("run.json"),
        format!(r#"{{"model": "{model}", "stage": 2, "micro_batch": 4, "world_size": 2, "seq_len": 128}}"#),
    )
    .unwrap();
    std::fs::write(run.join("ds.log"), "RunningAvgSamplesPerSec=10.0, CurrSamplesPerSec=11.0, MemAllocated=1.0GB\n")
        .unwrap();
    let out = tmp.path().join("out");
    let o = zerobench(&["ingest", tmp.path().join("in").to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let plots: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("throughput-"))
        .collect();
    assert_eq!(plots.len(), 1, "{plots:?}");
    assert!(plots[0].len() < 120, "{}", plots[0]);
}

/// A hand-written `run.json` that says 0 GPUs: the GPUs stay unknown (no per-GPU figure divided
/// by 0, no `inf` in the tables), the file and key are named, and the result is incomplete (exit 1).
#[test]
fn a_run_json_counting_zero_gpus_is_named_and_not_divided_by() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("in/zero");
    std::fs::create_dir_all(&run).unwrap();
    std::fs::write(
        run.join("run.json"),
        r#"{"model": "gpt2", "stage": 2, "micro_batch": 4, "world_size": 0, "seq_len": 128}"#,
    )
    .unwrap();
    std::fs::write(run.join("ds.log"), "RunningAvgSamplesPerSec=10.0, CurrSamplesPerSec=11.0, MemAllocated=1.0GB\n")
        .unwrap();
    let out = tmp.path().join("out");
    let o = zerobench(&["ingest", tmp.path().join("in").to_str().unwrap(), "--out", out.to_str().unwrap(), "-q"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert!(err.contains(&run.join("run.json").display().to_string()) && err.contains("`world_size` is 0"), "{err}");
    let runs = std::fs::read_to_string(out.join("runs.csv")).unwrap();
    assert!(runs.contains("zero") && !runs.contains("inf") && !runs.contains("NaN"), "{runs}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("runs.json")).unwrap()).unwrap();
    assert!(json.to_string().contains("\"samples_per_s\":10.0"), "{json}");
}

/// `zerobench` with a file-size limit of `kib` KiB (`ulimit -f`): a write past it fails as any
/// failed write does (the signal the kernel sends then is ignored), never killing the process
/// before it says so.
fn zerobench_limited(kib: u32, args: &[&str]) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -f {kib} && exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_zerobench"))
        .args(args)
        .output()
        .unwrap()
}

/// Plots that cannot be written (over a file-size limit, as on a full disk) leave the tables
/// written, exit 1, and `summary.json` says the result is not complete and names them.
#[test]
fn plots_that_cannot_be_written_make_the_summary_incomplete() {
    let tmp = tempfile::tempdir().unwrap();
    logs(&tmp.path().join("in"));
    let out = tmp.path().join("out");
    // The plots are tens of KiB; every table of one run is under 8 KiB.
    let o = zerobench_limited(8, &["ingest", tmp.path().join("in").to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("File too large"), "{}", text(&o.stderr));
    let summary: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["complete"], false, "{summary}");
    let unwritten = summary["unwritten"].as_array().unwrap();
    assert!(!unwritten.is_empty() && unwritten.iter().all(|u| u.as_str().unwrap().contains(".svg")), "{summary}");
    assert!(out.join("runs.csv").is_file() && !out.join("throughput-gpt2.svg").exists());
}

/// An ingest stopped while writing (killed, or a write of its file list failing) leaves its
/// private folder and, maybe, some of its tables moved in: the next ingest removes the folder,
/// knows the tables as its own (the list names them before they move), and finishes.
#[test]
fn an_ingest_stopped_while_writing_leaves_nothing_the_next_one_refuses() {
    let tmp = tempfile::tempdir().unwrap();
    logs(&tmp.path().join("in"));
    let (input, out) = (tmp.path().join("in"), tmp.path().join("out"));
    let ingest = |extra: &[&str]| {
        let mut args = vec!["ingest", input.to_str().unwrap(), "--out", out.to_str().unwrap(), "-q"];
        args.extend(extra);
        zerobench(&args)
    };
    // The first writes JSON only: the tables the later ones write in other formats are new names.
    assert_eq!(ingest(&["--format", "json"]).status.code(), Some(0));
    // What a killed ingest leaves: its private folder with a partial table in it.
    let stale = out.join(".zerobench-ingest-4194000");
    std::fs::create_dir(&stale).unwrap();
    std::fs::write(stale.join("latency.csv"), "model,").unwrap();
    // A rename that fails midway (a folder under a table's name, replaced only with --overwrite):
    // the plots, CSV and Markdown tables, renamed before it, are in place, the rest are not.
    std::fs::remove_file(out.join("runs.json")).unwrap();
    std::fs::create_dir_all(out.join("runs.json/x")).unwrap();
    let o = ingest(&["--overwrite"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert!(!stale.exists(), "the killed ingest's folder is left");
    std::fs::remove_dir_all(out.join("runs.json")).unwrap();
    // The list still names every table, those moved and those not: the next ingest is not refused.
    let o = ingest(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".zerobench-ingest"))
        .collect();
    assert_eq!(names, [".zerobench-ingest-files"]);
}
