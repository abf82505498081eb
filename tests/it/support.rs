//! Helpers shared by the end-to-end tests: where the binaries are, how to start ranks and the
//! `zerobench` command, how to read rank logs, and when a test whose environment is missing is
//! skipped or fails.

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use zerobench_schema::log::{validate_line, Record, Setup, Step};
use zerobench_schema::ZeroStage;

/// The repository root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

/// A file under the repository root.
pub fn repo(rel: &str) -> PathBuf {
    root().join(rel)
}

/// A binary or example (`examples/NAME`) of the profile these tests were built with, from the
/// same target folder: `scripts/test.sh` (`make test`) builds the release binaries, then runs the
/// release tests. The test binary is `target/<profile>/deps/e2e-<hash>`.
pub fn bin(rel: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>/deps/<test>");
    let p = profile_dir.join(rel);
    assert!(
        p.is_file(),
        "{} is missing: run `cargo build --release --workspace --bins` first (`make test` does)",
        p.display()
    );
    p
}

pub fn worker() -> PathBuf {
    bin("zerobench-worker")
}

/// `zerobench`, with the diagnostic level left at its default.
pub fn zerobench_cmd() -> Command {
    let mut c = Command::new(bin("zerobench"));
    c.env_remove("RUST_LOG");
    c
}

/// Runs `zerobench ARGS`.
pub fn zerobench(args: &[&str]) -> Output {
    run(zerobench_cmd().args(args))
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Writes an executable bash script: `#!/bin/bash`, then `body`.
pub fn write_script(path: &Path, body: &str) {
    std::fs::write(path, format!("#!/bin/bash\n{body}\n")).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Skips a test whose environment is missing, with a message; fails it instead where
/// `ZEROBENCH_REQUIRE_SLURM` says the environment is complete (`scripts/test.sh` as root, after
/// `scripts/setup-system.sh` installed Slurm and pdsh), so a broken setup cannot pass silently.
pub fn skip(missing: &str) {
    assert!(std::env::var_os("ZEROBENCH_REQUIRE_SLURM").is_none(), "ZEROBENCH_REQUIRE_SLURM is set but {missing}");
    eprintln!("SKIPPED: {missing}");
}

/// The local test cluster's `SLURM_CONF`, when `scripts/test.sh` started one (see [`skip`]).
pub fn slurm_conf() -> Option<PathBuf> {
    let conf = std::env::var_os("ZEROBENCH_SLURM_CONF").map(PathBuf::from);
    if conf.is_none() {
        skip("ZEROBENCH_SLURM_CONF is not (scripts/test.sh starts slurm/local-cluster.sh and sets it)");
    }
    conf
}

/// Whether the program of `probe` (a harmless call such as `--version`) can be started (see
/// [`skip`]).
pub fn installed(probe: &mut Command) -> bool {
    let ok = probe.output().is_ok();
    if !ok {
        skip(&format!("{} is not installed", probe.get_program().to_string_lossy()));
    }
    ok
}

/// A TCP port nobody listens on now (the OS's choice; free again once the probe closes).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `mpirun` for `n` ranks on this host, allowed to run as root and to put more ranks than cores.
pub fn mpirun(n: usize) -> Command {
    let mut c = Command::new("mpirun");
    c.args(["--oversubscribe", "--allow-run-as-root", "-np", &n.to_string()]);
    // Containers often forbid cross-memory attach; the shared-memory transport then falls back.
    c.env("OMPI_MCA_btl_vader_single_copy_mechanism", "none");
    c
}

/// Runs a command, returning its output; panics if it cannot start.
pub fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// Panics with the command's output unless it succeeded.
pub fn assert_ok(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        stdout(out),
        stderr(out)
    );
}

/// Every record of a rank log, each line validated strictly against the schema.
pub fn records(path: &Path) -> Vec<Record> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .enumerate()
        .map(|(i, line)| {
            validate_line(line.as_bytes()).unwrap_or_else(|e| panic!("{}:{}: {e}\n{line}", path.display(), i + 1))
        })
        .collect()
}

/// The `setup` record of a rank log.
pub fn setup(recs: &[Record]) -> &Setup {
    recs.iter().find_map(|r| if let Record::Setup(s) = r { Some(s) } else { None }).expect("a setup record")
}

/// The `step` records, in order.
pub fn steps(recs: &[Record]) -> Vec<&Step> {
    recs.iter().filter_map(|r| if let Record::Step(s) = r { Some(s) } else { None }).collect()
}

/// The losses of the `step` records, in order (every one finite).
pub fn losses(recs: &[Record]) -> Vec<f64> {
    steps(recs).iter().map(|s| s.loss.expect("a finite loss")).collect()
}

/// Tiny GPT-2 in fp32 for 20 steps: with [`on_text`] the loss falls fast enough to show learning,
/// and the learning rate is below the regime where Adam amplifies last-bit rounding differences.
pub const TINY_FP32: &[&str] =
    &["--model", "tiny", "--seq-len", "64", "--precision", "fp32", "--lr", "1e-3", "--steps", "20", "--threads", "1"];

/// `flags`, then `--data` and the shipped public-domain text.
pub fn on_text(flags: &[&str]) -> Vec<String> {
    let text = repo("tests/data/declaration-of-independence.txt");
    flags.iter().map(|s| s.to_string()).chain(["--data".into(), text.display().to_string()]).collect()
}

/// Runs `n` ranks of the worker with `args` into `dir`, and returns each rank's records.
pub fn train<S: AsRef<OsStr> + std::fmt::Debug>(n: usize, dir: &Path, args: &[S]) -> Vec<Vec<Record>> {
    let out = run(mpirun(n).arg(worker()).args(args).arg("--log-dir").arg(dir));
    assert_ok(&out, &format!("{n} ranks {args:?}"));
    (0..n).map(|r| records(&dir.join(format!("rank{r}.jsonl")))).collect()
}

/// The largest relative difference between two equally long series.
pub fn max_rel_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "series of different lengths");
    a.iter().zip(b).map(|(x, y)| ((x - y) / y).abs()).fold(0.0, f64::max)
}

/// What a Slurm job printed: every `*.out` file of its run folder, in name order.
pub fn job_output(run_dir: &Path) -> String {
    let mut outs: Vec<PathBuf> = std::fs::read_dir(run_dir)
        .unwrap_or_else(|e| panic!("{}: {e}", run_dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "out"))
        .collect();
    outs.sort();
    outs.iter().map(|p| std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))).collect()
}

/// The last lines of each rank log of a run folder, for a failure message: where each rank got to.
pub fn log_tails(run_dir: &Path) -> String {
    let mut logs: Vec<PathBuf> = std::fs::read_dir(run_dir.join("logs"))
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|e| e == "jsonl")).collect()
        })
        .unwrap_or_default();
    logs.sort();
    let mut out = String::new();
    for log in logs {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        out += &format!("{} ({} records), last:\n", log.display(), lines.len());
        for l in &lines[lines.len().saturating_sub(2)..] {
            out += &format!("  {}\n", l.chars().take(400).collect::<String>());
        }
    }
    out
}

/// Every step of a rank log moves, to the byte, the collectives `zerobench_schema::traffic` gives
/// for its run. Copies (offload's `d2h`/`h2d`, hpZ's `d2d`) are not collectives and not compared.
/// The all-gathers that refresh the parameters after a stage 1-2 step are logged by the step in
/// which they complete (docs/log-schema.md): on a GPU they overlap the next step's forward, and
/// with offload they follow the host's update, which finishes during the next step (or when the
/// engine settles after warm-up and after the last step). So by the end of step k all of step
/// k−1's have been logged, and some of step k's may have. Over MPI on CPUs without offload they
/// complete in their own step.
pub fn assert_traffic(recs: &[Record]) {
    use zerobench_schema::collective::{CollectiveKind, CommKey};
    let Some(Record::Start(start)) = recs.first() else { panic!("a log starts with its start record") };
    let (c, world) = (&start.config, start.world_size);
    // The closed form of the way the run kept its parameters, as its buffers say: builds before
    // 96d5287 gathered stage 3's on one rank too, and the committed GPU logs of those builds are
    // held to what they did. (The CPU tests hold a log's way to `ParamPath::of`.)
    let params = zerobench_schema::memory::ParamPath::logged(&setup(recs).buffers_bytes);
    let want = zerobench_schema::traffic::step_traffic_as(c, world, params).bytes;
    let deferred = (start.device.kind == "cuda" || c.offload != zerobench_schema::Offload::None)
        && matches!(c.stage, ZeroStage::Z1 | ZeroStage::Z2);
    let is_refresh = |k: &CommKey| deferred && k.kind == CollectiveKind::AllGather;
    let refresh: u64 = want.iter().filter(|(k, _)| is_refresh(k)).map(|(_, b)| b).sum();
    let what = format!(
        "{} stage {} offload {} on {world} {} ranks, accumulation {}",
        c.model, c.stage, c.offload, start.device.kind, c.grad_accum
    );
    let measured = steps(recs);
    assert!(!measured.is_empty(), "{what}: no steps");
    let mut refreshed = 0;
    for s in measured {
        let mut got: Vec<(CommKey, u64)> = s
            .comm
            .iter()
            .map(|(n, c)| (CommKey::from_name(n.as_bytes()).expect("a schema key"), c.bytes))
            .filter(|(k, _)| !k.kind.is_copy())
            .collect();
        got.sort_by_key(|(k, _)| k.index());
        refreshed += got.iter().filter(|(k, _)| is_refresh(k)).map(|(_, b)| b).sum::<u64>();
        got.retain(|(k, _)| !is_refresh(k));
        let exact: Vec<(CommKey, u64)> = want.iter().filter(|(k, _)| !is_refresh(k)).copied().collect();
        assert_eq!(got, exact, "{what}, step {}", s.step);
        let k = u64::from(s.step);
        assert!(
            (k * refresh..=(k + 1) * refresh).contains(&refreshed),
            "{what}, step {}: {refreshed} bytes of refresh gathers by its end, not within [{}, {}]",
            s.step,
            k * refresh,
            (k + 1) * refresh
        );
    }
}
