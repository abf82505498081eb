//! Running a rendered sweep on this host, one run after the other, without Slurm.
//!
//! Each run's `job.sbatch` (rendered with the `local` method: `mpirun --oversubscribe --bind-to none -np N`) is
//! run with bash, exactly as written, in its own process group. A failed run is recorded and the
//! sweep goes on.
//!
//! A run over its time limit, and the run going when `zerobench local` gets SIGINT, SIGTERM or
//! SIGHUP, is stopped with every process under it ([`crate::proctree`]: mpirun's ranks may sit in
//! process groups of their own): SIGTERM, then SIGKILL `GRACE` later to what is left. The
//! worker answers SIGTERM by writing `error` and `end` records. An interrupted run is recorded as
//! cancelled, and no further run starts.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::Error;
use crate::interrupts::Held;
use crate::status::{local_state, State};
use crate::time::unix_now;

pub use zerobench_schema::job::{LocalRecord, LOCAL_RECORD};

/// Where a local run's output goes, in its run folder.
pub const LOCAL_OUTPUT: &str = "local.out";

/// How to run.
#[derive(Debug, Clone, Default)]
pub struct LocalOptions {
    /// Per run; `None` runs without a limit.
    pub timeout: Option<Duration>,
}

/// One finished run.
#[derive(Debug, Clone)]
pub struct LocalResult {
    pub id: String,
    pub record: LocalRecord,
    /// For a run that did not end well, what its rank logs say went wrong, if they say.
    pub failure: Option<String>,
}

/// What `run_local` did.
#[derive(Debug, Clone)]
pub struct LocalRun {
    /// The runs that ran, in order; an interrupted one last.
    pub results: Vec<LocalResult>,
    /// The signal that stopped the sweep, if one did: the runs after the last result never started.
    pub interrupted_by: Option<String>,
}

/// What a sweep reports as it goes. The library only calls it; the front end draws it (a bar on
/// a terminal, a line per finished run in a log).
pub trait SweepProgress {
    /// Run `index` (from 0) of `total`, named `id`, starts.
    fn started(&mut self, index: usize, total: usize, id: &str);
    /// It ended in `state`, `elapsed` after the sweep started.
    fn finished(&mut self, index: usize, total: usize, id: &str, state: State, elapsed: Duration);
}

/// No progress reporting.
pub struct NoProgress;

impl SweepProgress for NoProgress {
    fn started(&mut self, _: usize, _: usize, _: &str) {}
    fn finished(&mut self, _: usize, _: usize, _: &str, _: State, _: Duration) {}
}

/// Runs each run folder's `job.sbatch` with bash, in order, telling `progress` as runs start and
/// end. `runs` pairs each run id with its folder.
pub fn run_local(
    runs: &[(String, PathBuf)],
    opts: &LocalOptions,
    progress: &mut dyn SweepProgress,
) -> Result<LocalRun, Error> {
    let held = Held::hold()?;
    let signal = &held.signal;
    let started = Instant::now();
    let mut results = Vec::with_capacity(runs.len());
    let mut interrupted_by = None;
    for (i, (id, dir)) in runs.iter().enumerate() {
        progress.started(i, runs.len(), id);
        let record = run_one(dir, opts.timeout, signal)?;
        let p = dir.join(LOCAL_RECORD);
        zerobench_files::replace(&p, (serde_json::to_string_pretty(&record).unwrap_or_default() + "\n").as_bytes())?;
        let mut failure = None;
        if local_state(&record) == State::Done {
            tracing::info!(run = %id, "{}", record.describe());
        } else {
            failure = crate::status::log_failure(dir);
            let why = failure.as_ref().map(|f| format!("; {f}")).unwrap_or_default();
            tracing::warn!(run = %id, "{}{why}; output in {}", record.describe(), dir.join(LOCAL_OUTPUT).display());
        }
        progress.finished(i, runs.len(), id, local_state(&record), started.elapsed());
        interrupted_by.clone_from(&record.interrupted_by);
        results.push(LocalResult { id: id.clone(), record, failure });
        if interrupted_by.is_some() {
            break;
        }
    }
    drop(held);
    Ok(LocalRun { results, interrupted_by })
}

fn run_one(dir: &Path, timeout: Option<Duration>, signal: &AtomicUsize) -> Result<LocalRecord, Error> {
    let out_path = dir.join(LOCAL_OUTPUT);
    let out = zerobench_files::create(&out_path)?;
    let err = out.try_clone().map_err(|e| Error::io(&out_path, e))?;
    let started = Instant::now();
    let mut child = Command::new("bash")
        .arg(dir.join("job.sbatch"))
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        // Its own process group: a Ctrl-C at the terminal reaches zerobench, which stops the
        // run's whole tree itself, after recording why.
        .process_group(0)
        .spawn()
        .map_err(|e| Error::Command { command: "bash job.sbatch".into(), message: format!("cannot start: {e}") })?;
    let (status, ending) = wait(&mut child, timeout, signal).map_err(|e| Error::io(dir, e))?;
    use std::os::unix::process::ExitStatusExt as _;
    Ok(LocalRecord {
        exit_code: status.code(),
        signal: status.signal(),
        timed_out: ending == Ending::TimedOut,
        interrupted_by: match ending {
            Ending::Interrupted(sig) => Some(crate::interrupts::name(sig)),
            _ => None,
        },
        seconds: started.elapsed().as_secs_f64(),
        finished_at: unix_now(),
    })
}

/// Why a run's wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    Exited,
    TimedOut,
    /// `zerobench local` got this signal.
    Interrupted(usize),
}

/// How often a running child is checked on.
const POLL: Duration = Duration::from_millis(50);
/// How long a run stopped at its time limit has between SIGTERM and SIGKILL.
const GRACE: Duration = Duration::from_secs(10);

/// Waits for the child; past the deadline, or when `signal` is set, its whole tree gets SIGTERM,
/// then SIGKILL [`GRACE`] later.
fn wait(child: &mut Child, timeout: Option<Duration>, signal: &AtomicUsize) -> std::io::Result<(ExitStatus, Ending)> {
    let deadline = timeout.map(|t| Instant::now() + t);
    let ending = loop {
        if let Some(st) = child.try_wait()? {
            return Ok((st, Ending::Exited));
        }
        match signal.load(Ordering::SeqCst) {
            0 => {}
            sig => break Ending::Interrupted(sig),
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break Ending::TimedOut;
        }
        std::thread::sleep(POLL);
    };
    let root = i32::try_from(child.id()).unwrap_or(i32::MAX);
    let mut status = None;
    crate::proctree::stop(root, GRACE, || {
        if status.is_none() {
            status = child.try_wait().ok().flatten();
        }
        status.is_some()
    });
    let st = match status {
        Some(st) => st,
        None => child.wait()?,
    };
    Ok((st, ending))
}

#[cfg(test)]
mod tests {
    use super::*;
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

    #[test]
    fn states_from_records() {
        let r = |exit_code, signal, timed_out| LocalRecord {
            exit_code,
            signal,
            timed_out,
            interrupted_by: None,
            seconds: 1.0,
            finished_at: 0,
        };
        assert_eq!(local_state(&r(Some(0), None, false)), State::Done);
        assert_eq!(local_state(&r(Some(1), None, false)), State::Failed);
        assert_eq!(local_state(&r(None, Some(9), false)), State::Failed);
        assert_eq!(local_state(&r(None, Some(15), true)), State::Timeout);
        assert!(r(None, Some(9), false).describe().contains("signal 9"));
    }

    #[test]
    fn signals_are_named() {
        for (sig, name) in [(SIGINT, "SIGINT"), (SIGTERM, "SIGTERM"), (SIGHUP, "SIGHUP"), (9, "signal 9")] {
            assert_eq!(crate::interrupts::name(sig as usize), name);
        }
    }

    #[test]
    fn a_run_within_its_limit_ends_as_it_exits() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("job.sbatch"), "sleep 0.3\nexit 3\n").unwrap();
        let rec = run_one(d.path(), Some(Duration::from_secs(20)), &AtomicUsize::new(0)).unwrap();
        assert_eq!((rec.exit_code, rec.timed_out, rec.interrupted_by), (Some(3), false, None));
    }

    #[test]
    fn a_signal_to_zerobench_stops_the_run_and_is_recorded() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("job.sbatch"), "sleep 30\n").unwrap();
        let t = Instant::now();
        let rec = run_one(d.path(), None, &AtomicUsize::new(SIGINT as usize)).unwrap();
        assert_eq!(rec.interrupted_by.as_deref(), Some("SIGINT"), "{rec:?}");
        assert!(!rec.timed_out && t.elapsed() < Duration::from_secs(5), "{rec:?} in {:?}", t.elapsed());
    }

    #[test]
    fn a_failed_run_carries_what_its_logs_say_and_a_done_one_nothing() {
        let d = tempfile::tempdir().unwrap();
        let error = r#"{"event":"error","v":2,"ts":1.0,"rank":0,"class":"oom","message":"out of memory at step 3"}"#;
        let mut runs = Vec::new();
        for (id, code) in [("failed", 1), ("done", 0)] {
            let dir = d.path().join(id);
            std::fs::create_dir_all(dir.join(crate::render::LOG_DIR)).unwrap();
            // Both logs say the same: only the run that failed reports it.
            std::fs::write(dir.join(crate::render::LOG_DIR).join("rank0.jsonl"), format!("{error}\n")).unwrap();
            std::fs::write(dir.join("job.sbatch"), format!("exit {code}\n")).unwrap();
            runs.push((id.to_string(), dir));
        }
        let run = run_local(&runs, &LocalOptions::default(), &mut NoProgress).unwrap();
        let failure = |i: usize| run.results[i].failure.clone();
        assert!(failure(0).is_some_and(|f| f.contains("out of memory at step 3")), "{:?}", failure(0));
        assert_eq!(failure(1), None);
    }

    #[test]
    fn a_run_over_its_limit_is_stopped_with_its_children() {
        let d = tempfile::tempdir().unwrap();
        let marker = d.path().join("survived");
        // A script whose child ignores nothing but would write the marker after 3 s.
        std::fs::write(d.path().join("job.sbatch"), format!("(sleep 3; touch '{}') &\nsleep 30\n", marker.display()))
            .unwrap();
        let t = Instant::now();
        let rec = run_one(d.path(), Some(Duration::from_millis(300)), &AtomicUsize::new(0)).unwrap();
        assert!(rec.timed_out && local_state(&rec) == State::Timeout, "{rec:?}");
        assert!(t.elapsed() < Duration::from_secs(5));
        std::thread::sleep(Duration::from_secs(4));
        assert!(!marker.exists(), "a child of the run outlived its time limit");
    }
}
