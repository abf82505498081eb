//! Running a rendered sweep on this host, one run after the other, without Slurm.
//!
//! Each run's `job.sbatch` (rendered with the `local` method: `mpirun --oversubscribe --bind-to none -np N`) is
//! run with bash, exactly as written, in its own process group so that a run over its time limit
//! is stopped with all its ranks. A failed run is recorded and the sweep goes on.

use std::fs::File;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::slurm::wait_until;
use crate::status::State;
use crate::submit::unix_now;

/// The file in a run folder that records its latest local run.
pub const LOCAL_RECORD: &str = "local.json";
/// Where a local run's output goes, in its run folder.
pub const LOCAL_OUTPUT: &str = "local.out";

/// How a local run ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LocalRecord {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub seconds: f64,
    /// Unix seconds.
    pub finished_at: u64,
}

impl LocalRecord {
    pub fn state(&self) -> State {
        match (self.timed_out, self.exit_code) {
            (true, _) => State::Timeout,
            (false, Some(0)) => State::Done,
            _ => State::Failed,
        }
    }

    pub fn describe(&self) -> String {
        match (self.timed_out, self.exit_code, self.signal) {
            (true, _, _) => format!("stopped at the time limit after {:.0} s", self.seconds),
            (false, Some(c), _) => format!("exit {c} after {:.1} s", self.seconds),
            (false, None, Some(s)) => format!("killed by signal {s} after {:.1} s", self.seconds),
            _ => format!("ended after {:.1} s", self.seconds),
        }
    }
}

/// How to run.
#[derive(Debug, Clone, Default)]
pub struct LocalOptions {
    /// Per run; `None` runs without a limit.
    pub timeout: Option<Duration>,
    /// Draw a progress bar on stderr (hidden anyway when stderr is not a terminal).
    pub progress: bool,
}

/// One finished run.
#[derive(Debug, Clone)]
pub struct LocalResult {
    pub id: String,
    pub record: LocalRecord,
    /// For a run that did not end well, what its rank logs say went wrong, if they say.
    pub failure: Option<String>,
}

/// Runs each run folder's `job.sbatch` with bash, in order. `runs` pairs each run id with its
/// folder.
pub fn run_local(runs: &[(String, PathBuf)], opts: &LocalOptions) -> Result<Vec<LocalResult>, Error> {
    let bar = if opts.progress { ProgressBar::new(runs.len() as u64) } else { ProgressBar::hidden() };
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let mut results = Vec::with_capacity(runs.len());
    for (id, dir) in runs {
        bar.set_message(id.clone());
        let record = run_one(dir, opts.timeout)?;
        let p = dir.join(LOCAL_RECORD);
        std::fs::write(&p, serde_json::to_string_pretty(&record).unwrap_or_default() + "\n")
            .map_err(|e| Error::io(&p, e))?;
        let mut failure = None;
        if record.state() == State::Done {
            tracing::info!(run = %id, "{}", record.describe());
        } else {
            failure = crate::status::log_failure(dir);
            let why = failure.as_ref().map(|f| format!("; {f}")).unwrap_or_default();
            tracing::warn!(run = %id, "{}{why}; output in {}", record.describe(), dir.join(LOCAL_OUTPUT).display());
        }
        bar.inc(1);
        results.push(LocalResult { id: id.clone(), record, failure });
    }
    bar.finish_and_clear();
    Ok(results)
}

fn run_one(dir: &Path, timeout: Option<Duration>) -> Result<LocalRecord, Error> {
    let out_path = dir.join(LOCAL_OUTPUT);
    let out = File::create(&out_path).map_err(|e| Error::io(&out_path, e))?;
    let err = out.try_clone().map_err(|e| Error::io(&out_path, e))?;
    let started = Instant::now();
    let mut child = Command::new("bash")
        .arg(dir.join("job.sbatch"))
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        // Its own process group: a time limit stops the script and every rank under it.
        .process_group(0)
        .spawn()
        .map_err(|e| Error::Command { command: "bash job.sbatch".into(), message: format!("cannot start: {e}") })?;
    let (status, timed_out) = wait(&mut child, timeout).map_err(|e| Error::io(dir, e))?;
    use std::os::unix::process::ExitStatusExt as _;
    Ok(LocalRecord {
        exit_code: status.code(),
        signal: status.signal(),
        timed_out,
        seconds: started.elapsed().as_secs_f64(),
        finished_at: unix_now(),
    })
}

/// How often a running child is checked on.
const POLL: Duration = Duration::from_millis(50);
/// How long a run stopped at its time limit has between SIGTERM and SIGKILL.
const GRACE: Duration = Duration::from_secs(10);

/// Waits for the child; past the deadline its group gets SIGTERM, then SIGKILL [`GRACE`] later.
fn wait(child: &mut Child, timeout: Option<Duration>) -> std::io::Result<(ExitStatus, bool)> {
    if let Some(st) = wait_until(child, timeout.map(|t| Instant::now() + t), POLL)? {
        return Ok((st, false));
    }
    let pgid = child.id() as libc::pid_t;
    signal_group(pgid, libc::SIGTERM);
    let ended = wait_until(child, Some(Instant::now() + GRACE), POLL)?;
    // Ranks that ignored SIGTERM may outlive the script, and past the grace time so may the script.
    signal_group(pgid, libc::SIGKILL);
    let st = match ended {
        Some(st) => st,
        None => child.wait()?,
    };
    Ok((st, true))
}

fn signal_group(pgid: libc::pid_t, sig: libc::c_int) {
    // SAFETY: kill(2) with a negative pid signals the process group we created for this child;
    // it has no memory-safety preconditions.
    unsafe {
        libc::kill(-pgid, sig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_from_records() {
        let r =
            |exit_code, signal, timed_out| LocalRecord { exit_code, signal, timed_out, seconds: 1.0, finished_at: 0 };
        assert_eq!(r(Some(0), None, false).state(), State::Done);
        assert_eq!(r(Some(1), None, false).state(), State::Failed);
        assert_eq!(r(None, Some(9), false).state(), State::Failed);
        assert_eq!(r(None, Some(15), true).state(), State::Timeout);
        assert!(r(None, Some(9), false).describe().contains("signal 9"));
    }

    #[test]
    fn a_run_over_its_limit_is_stopped_with_its_children() {
        let d = tempfile::tempdir().unwrap();
        let marker = d.path().join("survived");
        // A script whose child ignores nothing but would write the marker after 3 s.
        std::fs::write(d.path().join("job.sbatch"), format!("(sleep 3; touch '{}') &\nsleep 30\n", marker.display()))
            .unwrap();
        let t = Instant::now();
        let rec = run_one(d.path(), Some(Duration::from_millis(300))).unwrap();
        assert!(rec.timed_out && rec.state() == State::Timeout, "{rec:?}");
        assert!(t.elapsed() < Duration::from_secs(5));
        std::thread::sleep(Duration::from_secs(4));
        assert!(!marker.exists(), "a child of the run outlived its time limit");
    }
}
