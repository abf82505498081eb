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
