//! Running a run folder again: a finished run is left as it is, a failed one runs again only
//! when asked, with what its earlier attempt left moved aside (never deleted). `local` and
//! `submit` both decide here.

use std::path::{Path, PathBuf};

use crate::error::Error;
use crate::local::{LOCAL_OUTPUT, LOCAL_RECORD};
use crate::render::{has_results, move_aside, LOG_DIR};
use crate::status::{RunState, State};
use crate::submit::SLURM_RECORD;

/// Where a run folder keeps the logs and records of earlier attempts (hidden: `status` and
/// `ingest` read the current attempt).
pub const ATTEMPTS_DIR: &str = ".attempts";

/// Moves what a run's earlier attempt left (its logs, `local.json`, `local.out`, `slurm.json` and
/// the job's `.out`/`.err` files) into `.attempts/attempt-<unix time>/` in its folder, so that it
/// can run again without a byte of the earlier attempt lost; returns that folder.
pub fn set_aside_attempt(dir: &Path) -> Result<PathBuf, Error> {
    let keep = dir.join(ATTEMPTS_DIR);
    let stage = dir.join(".attempt-in-progress");
    std::fs::create_dir_all(&stage).map_err(|e| Error::io(&stage, e))?;
    let mut names: Vec<std::ffi::OsString> = [LOG_DIR, LOCAL_RECORD, LOCAL_OUTPUT, SLURM_RECORD].map(Into::into).into();
    for e in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?.flatten() {
        let n = e.file_name();
        let text = n.to_string_lossy();
        if (text.ends_with(".out") || text.ends_with(".err")) && !names.contains(&n) {
            names.push(n);
        }
    }
    for name in names {
        let from = dir.join(&name);
        if std::fs::symlink_metadata(&from).is_ok() {
            std::fs::rename(&from, stage.join(&name)).map_err(|e| Error::io(&from, e))?;
        }
    }
    move_aside(&stage, &keep, "attempt")
}

/// What to do with a run folder before running or submitting it again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rerun {
    /// Run it (its earlier attempt, if any, moved aside).
    Run,
    /// It finished earlier: kept as it is.
    Finished,
    /// Slurm has it pending or running.
    WithSlurm { job_id: Option<String> },
    /// It ended failed, out of memory, cancelled or timed out, and was not asked to run again.
    Ended(State),
}

impl std::fmt::Display for Rerun {
    /// Why a run is left alone (empty for [`Rerun::Run`]).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rerun::Run => Ok(()),
            Rerun::Finished => f.write_str("finished earlier; kept as it is"),
            Rerun::WithSlurm { job_id } => {
                write!(f, "submitted to Slurm (job {}); left to it", job_id.as_deref().unwrap_or("?"))
            }
            Rerun::Ended(st) => write!(f, "ended {st} earlier; --retry-failed runs it again"),
        }
    }
}

/// Decides from the state a run folder's records and logs give; with `retry_failed`, a run that
/// ended badly has its earlier attempt set aside and runs again.
pub fn rerun_decision(dir: &Path, prior: &RunState, retry_failed: bool) -> Result<Rerun, Error> {
    Ok(match prior.state {
        State::Unsubmitted if !has_results(dir) => Rerun::Run,
        State::Done => Rerun::Finished,
        State::Pending | State::Running => Rerun::WithSlurm { job_id: prior.job_id.clone() },
        _ if retry_failed => {
            let kept = set_aside_attempt(dir)?;
            tracing::info!(run = %prior.id, "running again; the earlier attempt is in {}", kept.display());
            Rerun::Run
        }
        st => Rerun::Ended(st),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An attempt's logs, records and job output move into `.attempts/attempt-*/`, contents
    /// intact; the rendered files and anything else stay.
    #[test]
    fn an_attempt_is_set_aside_whole_and_nothing_else() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        std::fs::create_dir(dir.join(LOG_DIR)).unwrap();
        std::fs::write(dir.join(LOG_DIR).join("rank0.jsonl"), "{}\n").unwrap();
        let moved = [LOCAL_RECORD, LOCAL_OUTPUT, SLURM_RECORD, "run-123.out", "run-123.err"];
        let kept = ["run.json", "job.sbatch", "notes.txt", "out.txt"];
        for name in moved.iter().chain(&kept) {
            std::fs::write(dir.join(name), name).unwrap();
        }
        let attempt = set_aside_attempt(dir).unwrap();
        assert!(attempt.starts_with(dir.join(ATTEMPTS_DIR)) && attempt.is_dir(), "{}", attempt.display());
        assert_eq!(std::fs::read_to_string(attempt.join(LOG_DIR).join("rank0.jsonl")).unwrap(), "{}\n");
        for name in moved {
            assert_eq!(std::fs::read_to_string(attempt.join(name)).unwrap(), name);
            assert!(!dir.join(name).exists(), "{name} left behind");
        }
        for name in kept {
            assert_eq!(std::fs::read_to_string(dir.join(name)).unwrap(), name, "{name} moved");
        }
        assert!(!dir.join(LOG_DIR).exists() && !dir.join(".attempt-in-progress").exists());
    }

    fn state(dir: &Path, state: State) -> RunState {
        let job_id = Some("42".to_string());
        RunState { id: "r".into(), dir: dir.to_path_buf(), state, job_id, source: "none", detail: String::new() }
    }

    /// Never run: run. Finished or with Slurm: left alone. Ended badly: left alone, unless asked,
    /// and then run with the earlier attempt set aside. A folder that was never submitted but
    /// holds logs ran outside zerobench's records: it counts as ended.
    #[test]
    fn a_run_folder_runs_again_only_when_it_should() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let decide = |st: State, retry: bool| rerun_decision(dir, &state(dir, st), retry).unwrap();
        assert_eq!(decide(State::Unsubmitted, false), Rerun::Run);
        assert_eq!(decide(State::Done, true), Rerun::Finished);
        assert_eq!(decide(State::Pending, true), Rerun::WithSlurm { job_id: Some("42".into()) });
        assert_eq!(decide(State::Running, true), Rerun::WithSlurm { job_id: Some("42".into()) });
        for st in [State::Failed, State::Oom, State::Cancelled, State::Timeout, State::Unknown] {
            assert_eq!(decide(st, false), Rerun::Ended(st));
        }
        std::fs::write(dir.join(LOCAL_RECORD), "{}").unwrap();
        assert_eq!(decide(State::Unsubmitted, false), Rerun::Ended(State::Unsubmitted));
        assert_eq!(decide(State::Failed, true), Rerun::Run);
        assert!(!dir.join(LOCAL_RECORD).exists(), "the earlier attempt was set aside");
        assert_eq!(std::fs::read_dir(dir.join(ATTEMPTS_DIR)).unwrap().count(), 1);
    }

    #[test]
    fn why_a_run_is_left_alone_is_said() {
        assert_eq!(Rerun::Run.to_string(), "");
        assert_eq!(Rerun::Finished.to_string(), "finished earlier; kept as it is");
        assert_eq!(Rerun::WithSlurm { job_id: None }.to_string(), "submitted to Slurm (job ?); left to it");
        assert_eq!(
            Rerun::Ended(State::Oom).to_string(),
            format!("ended {} earlier; --retry-failed runs it again", State::Oom)
        );
    }
}
