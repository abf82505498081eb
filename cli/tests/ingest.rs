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
    assert!(text(&o.stderr).contains("error: writing the tables"), "{}", text(&o.stderr));
    let o = zerobench(&["ingest", tmp.path().to_str().unwrap(), "--out", "x", "--peak-tflops", "fast"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("invalid peak 'fast'"), "{}", text(&o.stderr));
}
