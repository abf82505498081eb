//! Faults on CPU over MPI, with real processes: a rank killed outright, a rank frozen, a rank
//! told to stop, a configuration that does not fit. Nothing may hang: every wait has a deadline,
//! and every rank's log stays valid up to where it stopped.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use zerobench_schema::log::{ErrorClass, Record, RunStatus};

use crate::support::{mpirun, records, stderr, stdout, steps, worker, zerobench, zerobench_cmd};

/// How long the survivors of a killed rank may take to stop. `mpirun` sends them SIGTERM as soon
/// as it sees the rank die (about a second, see docs/reliability.md); if it did not, they would sit
/// in a collective until the stall watchdog stops them after its default 30 s. Well below that,
/// and far above a second, so a loaded CI host cannot fail it by being slow.
const STOPPED_BY_MPIRUN: Duration = Duration::from_secs(20);

/// A long tiny-model run on `n` ranks into `dir`, in the background.
fn start_long_run(n: usize, dir: &Path, extra: &[&str]) -> Child {
    mpirun(n)
        .arg(worker())
        .args([
            "--model",
            "tiny",
            "--stage",
            "2",
            "--steps",
            "1000000",
            "--seq-len",
            "32",
            "--threads",
            "1",
            "--log-dir",
        ])
        .arg(dir)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mpirun starts")
}

/// Waits until rank `r`'s log shows `steps` steps; returns its pid.
fn wait_for_steps(dir: &Path, r: usize, steps: usize, deadline: Duration) -> u32 {
    let t0 = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(dir.join(format!("rank{r}.jsonl"))) {
            let done = text.lines().filter(|l| l.starts_with(r#"{"event":"step""#)).count();
            if done >= steps {
                let start: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
                return start["pid"].as_u64().unwrap() as u32;
            }
        }
        assert!(t0.elapsed() < deadline, "rank {r} did not reach {steps} steps in {deadline:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits for the launcher to exit; kills everything and fails the test past the deadline.
fn wait_exit(child: &mut Child, deadline: Duration, dir: &Path) -> (std::process::ExitStatus, Duration) {
    let t0 = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return (status, t0.elapsed());
        }
        if t0.elapsed() > deadline {
            let _ = child.kill();
            let _ = Command::new("pkill").args(["-9", "-f"]).arg(dir).status();
            panic!("ranks still running {deadline:?} after the fault");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Prints how long a fault took to handle, for `bench/reliability/run.sh` (which runs these tests
/// with `--nocapture`) to record in `bench/results/reliability-cpu.json`.
fn report(what: &str, took: Duration) {
    eprintln!("reliability-timing {what} {:.3}", took.as_secs_f64());
}

fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill").args([sig, &pid.to_string()]).status().unwrap().success();
    assert!(ok, "kill {sig} {pid}");
}

fn last_two(recs: &[Record]) -> (&Record, &Record) {
    (&recs[recs.len() - 2], &recs[recs.len() - 1])
}

#[test]
fn a_killed_rank_stops_the_others_with_a_logged_cause() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut run = start_long_run(3, dir, &[]);
    let pid = wait_for_steps(dir, 1, 5, Duration::from_secs(60));
    wait_for_steps(dir, 0, 5, Duration::from_secs(60));
    wait_for_steps(dir, 2, 5, Duration::from_secs(60));
    signal(pid, "-KILL");
    let (status, took) = wait_exit(&mut run, Duration::from_secs(60), dir);
    assert!(!status.success());
    report("killed_rank_to_launcher_exit", took);
    assert!(took < STOPPED_BY_MPIRUN, "the survivors stopped only {took:?} after the kill");
    // The killed rank's log is intact up to its last step, without an end.
    let dead = records(&dir.join("rank1.jsonl"));
    assert!(steps(&dead).len() >= 5);
    assert!(!dead.iter().any(|r| matches!(r, Record::End(_))));
    // Every other rank says why it stopped, then ends.
    for r in [0, 2] {
        let recs = records(&dir.join(format!("rank{r}.jsonl")));
        match last_two(&recs) {
            (Record::Error(e), Record::End(end)) => {
                assert!(matches!(e.class, ErrorClass::Terminated | ErrorClass::Comm), "{e:?}");
                assert_eq!(end.status, RunStatus::Failed);
                assert_ne!(end.exit_code, 0);
            }
            other => panic!("rank {r} ended with {other:?}"),
        }
    }
}

/// `sbatch --signal=USR1@T` sends SIGUSR1 to the job step's launcher ahead of the time limit;
/// `mpirun` forwards it, and every rank stops with its records (the signal's default action
/// ended them with none).
#[test]
fn sigusr1_to_mpirun_stops_every_rank_with_its_records() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut run = start_long_run(2, dir, &[]);
    wait_for_steps(dir, 0, 3, Duration::from_secs(60));
    wait_for_steps(dir, 1, 3, Duration::from_secs(60));
    signal(run.id(), "-USR1");
    let (status, took) = wait_exit(&mut run, Duration::from_secs(30), dir);
    report("sigusr1_to_mpirun_exit", took);
    assert!(!status.success());
    for r in [0, 1] {
        let recs = records(&dir.join(format!("rank{r}.jsonl")));
        match last_two(&recs) {
            (Record::Error(e), Record::End(end)) => {
                assert_eq!(e.class, ErrorClass::Terminated, "rank {r}: {e:?}");
                assert!(e.message.contains("SIGUSR1"), "rank {r}: {}", e.message);
                assert_eq!(end.exit_code, 138, "rank {r}");
            }
            other => panic!("rank {r} ended with {other:?}"),
        }
    }
}

/// A rank that dies of SIGSEGV says so on stderr, with its rank and native frames, before the
/// signal ends it (Rust's own SIGSEGV handler keeps Open MPI's crash report away).
#[test]
fn a_crashed_rank_says_which_rank_and_where() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut run = start_long_run(2, dir, &[]);
    let pid = wait_for_steps(dir, 1, 3, Duration::from_secs(60));
    wait_for_steps(dir, 0, 3, Duration::from_secs(60));
    signal(pid, "-SEGV");
    let (status, _) = wait_exit(&mut run, Duration::from_secs(60), dir);
    assert!(!status.success());
    let mut err = String::new();
    std::io::Read::read_to_string(&mut run.stderr.take().unwrap(), &mut err).unwrap();
    let report = format!("zerobench-worker: rank 1 (pid {pid}): fatal SIGSEGV sent by pid ");
    assert!(err.contains(&report), "{err}");
    assert!(err.contains("zerobench-worker: native frames"), "{err}");
    assert!(err.contains("zerobench-worker(+0x"), "the worker's own frames: {err}");
    // The crashed rank's log is intact up to its last step, without an end.
    let dead = records(&dir.join("rank1.jsonl"));
    assert!(steps(&dead).len() >= 3);
    assert!(!dead.iter().any(|r| matches!(r, Record::End(_))));
}

#[test]
fn a_frozen_rank_is_noticed_by_the_stall_watchdog() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut run = start_long_run(2, dir, &["--stall-timeout-s", "3"]);
    let pid = wait_for_steps(dir, 1, 5, Duration::from_secs(60));
    wait_for_steps(dir, 0, 5, Duration::from_secs(60));
    signal(pid, "-STOP");
    let (status, took) = wait_exit(&mut run, Duration::from_secs(60), dir);
    let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
    report("frozen_rank_to_launcher_exit", took);
    assert!(!status.success());
    // The 3 s limit (or ten times the longest step, if a loaded host made one slow), not the
    // default 30 s: the flag took effect.
    assert!(took < Duration::from_secs(30), "{took:?}");
    let recs = records(&dir.join("rank0.jsonl"));
    match last_two(&recs) {
        (Record::Error(e), Record::End(end)) => {
            assert_eq!(e.class, ErrorClass::Comm, "{e:?}");
            assert!(e.message.contains("no progress"), "{}", e.message);
            assert_eq!(end.exit_code, 4);
        }
        other => panic!("rank 0 ended with {other:?}"),
    }
    // The frozen rank's log is valid up to where it stopped.
    records(&dir.join("rank1.jsonl"));
}

/// A rank that gets `sig` (as `kill` names it) after its third step writes `error` (terminated,
/// naming the signal) and `end`, and exits 128 + `number`.
fn a_signal_leaves_an_error_and_an_end(sig: &str, number: i32) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut one = Command::new(worker())
        .args([
            "--model",
            "tiny",
            "--stage",
            "0",
            "--steps",
            "1000000",
            "--seq-len",
            "32",
            "--threads",
            "1",
            "--log-dir",
        ])
        .arg(dir)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = wait_for_steps(dir, 0, 3, Duration::from_secs(60));
    signal(pid, &format!("-{sig}"));
    let (status, took) = wait_exit(&mut one, Duration::from_secs(30), dir);
    report(&format!("sig{}_to_exit", sig.to_lowercase()), took);
    assert_eq!(status.code(), Some(128 + number), "SIG{sig}");
    let recs = records(&dir.join("rank0.jsonl"));
    match last_two(&recs) {
        (Record::Error(e), Record::End(end)) => {
            assert_eq!(e.class, ErrorClass::Terminated);
            assert!(e.message.contains(&format!("SIG{sig}")), "{}", e.message);
            assert_eq!(end.exit_code, 128 + number);
        }
        other => panic!("SIG{sig}: {other:?}"),
    }
}

#[test]
fn sigterm_leaves_an_error_and_an_end() {
    a_signal_leaves_an_error_and_an_end("TERM", 15);
}

/// `sbatch --signal=USR1@60` warns of the time limit with SIGUSR1 (and `mpirun` forwards
/// it); SIGQUIT's default would dump core. Neither may end a rank without its records.
#[test]
fn sigusr1_and_sigquit_leave_an_error_and_an_end() {
    a_signal_leaves_an_error_and_an_end("USR1", 10);
    a_signal_leaves_an_error_and_an_end("QUIT", 3);
}

#[test]
fn a_configuration_that_does_not_fit_is_an_oom_result() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // 2.5 GB of address space cannot hold gpt2's 2 GB of fp32 model states and libtorch.
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "ulimit -v 2500000; exec {} --model gpt2 --stage 0 --precision fp32 --steps 2 --warmup 1 --seq-len 64 --threads 1 --log-dir {}",
            worker().display(),
            dir.display()
        ))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let recs = records(&dir.join("rank0.jsonl"));
    match last_two(&recs) {
        (Record::Error(e), Record::End(end)) => {
            assert_eq!(e.class, ErrorClass::Oom);
            assert!(e.requested_bytes.unwrap_or(0) > 0, "{e:?}");
            assert!(e.memory.is_some());
            assert_eq!(end.status, RunStatus::Oom);
            assert_eq!(end.exit_code, 3);
        }
        other => panic!("{other:?}"),
    }
}

/// Offloaded states larger than the host are refused before any is allocated: t5-11b with its
/// optimizer offloaded keeps 16 bytes per parameter (181 GB) in host memory, more than a CI host
/// has. (Without the check the rank pinned memory for minutes until the kernel killed it.)
#[test]
fn offloaded_states_larger_than_the_host_are_an_oom_result_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let t0 = Instant::now();
    let out = Command::new(worker())
        .args(["--model", "t5-11b", "--stage", "2", "--offload", "optimizer", "--steps", "2", "--warmup", "1"])
        .args(["--seq-len", "64", "--threads", "1", "--log-dir"])
        .arg(dir)
        .output()
        .unwrap();
    let took = t0.elapsed();
    report("oversized_offload_start_to_exit", took);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("host memory") && err.contains("GiB is available"), "{err}");
    assert!(took < Duration::from_secs(30), "refused only after {took:?}");
    let recs = records(&dir.join("rank0.jsonl"));
    match last_two(&recs) {
        (Record::Error(e), Record::End(end)) => {
            assert_eq!(e.class, ErrorClass::Oom);
            // 16 B per (padded) parameter offloaded, 2 B for the bf16 parameters on the CPU device.
            assert!(e.requested_bytes.unwrap_or(0) >= 18 * 11_307_321_344, "{e:?}");
            assert_eq!(end.status, RunStatus::Oom);
            assert_eq!(end.exit_code, 3);
        }
        other => panic!("{other:?}"),
    }
}

/// The sweep tools on top: `zerobench local` runs a sweep, a rank is killed in the middle;
/// `local` and `status` name the rank that died, the logs up to the kill are intact, and ingest
/// marks the run failed.
#[test]
fn the_launcher_and_ingest_report_a_killed_rank() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = tmp.path().join("kill.yaml");
    std::fs::write(
        &spec,
        format!(
            "cluster:\n  partition: debug\n  env:\n    OMP_NUM_THREADS: \"1\"\nlaunch:\n  method: local\n  worker: {}\n\
             worker:\n  device: cpu\n  steps: 1000000\n  seq_len: 32\n\
             sweep:\n  models: tiny\n  stages: 2\n  micro_batches: 2\n  ranks_per_node: 3\n",
            worker().display()
        ),
    )
    .unwrap();
    let out = tmp.path().join("runs");
    let mut local = zerobench_cmd()
        .args(["local", spec.to_str().unwrap(), "--out", out.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The one run's log folder.
    let t0 = Instant::now();
    let logs = loop {
        let found = std::fs::read_dir(&out).ok().and_then(|d| {
            d.filter_map(Result::ok).map(|e| e.path().join("logs")).find(|p| p.join("rank1.jsonl").exists())
        });
        if let Some(l) = found {
            break l;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "the run did not start");
        std::thread::sleep(Duration::from_millis(100));
    };
    let pid = wait_for_steps(&logs, 1, 5, Duration::from_secs(60));
    signal(pid, "-KILL");
    let (status, took) = wait_exit(&mut local, Duration::from_secs(60), &out);
    report("killed_rank_to_local_exit", took);
    assert_eq!(status.code(), Some(1), "local reports a failed run");
    assert!(took < STOPPED_BY_MPIRUN, "`local` returned only {took:?} after the kill");
    let mut said = String::new();
    use std::io::Read;
    local.stdout.take().unwrap().read_to_string(&mut said).unwrap();
    local.stderr.take().unwrap().read_to_string(&mut said).unwrap();
    // `local` says which rank died.
    assert!(said.contains("rank 1 ("), "{said}");
    // `status`: the run failed because rank 1 stopped without an end record.
    let st = zerobench(&["status", out.to_str().unwrap()]);
    let text = stdout(&st) + &stderr(&st);
    assert!(text.contains("failed"), "{text}");
    assert!(text.contains("rank 1 (after step"), "{text}");
    // Ingest: a failed run, with the killed rank's log read up to its last line.
    let tables = tmp.path().join("tables");
    let ing = zerobench(&["ingest", out.to_str().unwrap(), "--out", tables.to_str().unwrap(), "--format", "json"]);
    let runs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(tables.join("runs.json")).unwrap()).unwrap();
    let row = &runs["rows"][0];
    assert_eq!(row["status"], "failed", "{row}\n{}", stderr(&ing));
    assert_eq!(row["ranks_read"], 3);
}
