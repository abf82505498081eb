//! Helpers shared by the end-to-end tests: where the binaries are, how to start ranks, how to read
//! their logs.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use zerobench_schema::log::{validate_line, Record};

/// The repository root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

/// A release binary or example, which `make test` builds before running the tests.
pub fn release_bin(rel: &str) -> PathBuf {
    let p = root().join("target/release").join(rel);
    assert!(p.exists(), "{} is missing: run the tests with `make test` (it builds the binaries first)", p.display());
    p
}

pub fn worker() -> PathBuf {
    release_bin("zerobench-worker")
}

/// `mpirun` for `n` ranks on this host, allowed to run as root and to put more ranks than cores.
pub fn mpirun(n: usize) -> Command {
    let mut c = Command::new("mpirun");
    c.args(["--oversubscribe", "--allow-run-as-root", "-np", &n.to_string()]);
    // Containers often forbid cross-memory attach; the shared-memory transport then falls back.
    c.env("OMPI_MCA_btl_vader_single_copy_mechanism", "none");
    c
}

/// Runs a command, returning its output; panics with stdout and stderr if it cannot start.
pub fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// Panics with the command's output unless it succeeded.
pub fn assert_ok(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every record of a rank log, each line validated strictly against the schema.
pub fn records(path: &Path) -> Vec<Record> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .enumerate()
        .map(|(i, line)| validate_line(line.as_bytes()).unwrap_or_else(|e| panic!("{}:{}: {e}\n{line}", path.display(), i + 1)))
        .collect()
}

/// The shipped public-domain text the tests train on.
pub fn text() -> String {
    root().join("tests/data/declaration-of-independence.txt").display().to_string()
}

/// Runs `n` ranks of the worker with `args` into `dir`, and returns each rank's records.
pub fn train(n: usize, dir: &Path, args: &[&str]) -> Vec<Vec<Record>> {
    let out = run(mpirun(n).arg(worker()).args(args).arg("--log-dir").arg(dir));
    assert_ok(&out, &format!("{n} ranks {args:?}"));
    (0..n).map(|r| records(&dir.join(format!("rank{r}.jsonl")))).collect()
}

/// The largest relative difference between two equally long series.
pub fn max_rel_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| ((x - y) / y).abs()).fold(0.0, f64::max)
}

/// The losses of the `step` records, in order.
pub fn losses(recs: &[Record]) -> Vec<f64> {
    recs.iter()
        .filter_map(|r| match r {
            Record::Step(s) => Some(s.loss),
            _ => None,
        })
        .collect()
}
