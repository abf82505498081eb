//! The status rules: from what every rank wrote and what the scheduler recorded, one status.
//!
//! The ranks' own records come first; the scheduler only explains a run they did not finish.
//! In order, the first that applies:
//! 1. `oom` if any rank wrote an `error` of class `oom` or ended with status `oom`;
//! 2. `failed` if any rank wrote another `error` or ended `failed`;
//! 3. `ok` if every rank of the world size has a log and ended `ok`;
//! 4. the scheduler's word, if it has one: `oom` (killed for its host memory), `failed` (the job
//!    or a node failed), `cancelled`, `timeout`;
//! 5. `incomplete` otherwise: some rank has no `end` record (killed, or still running) or some
//!    rank's log is missing.

use std::collections::BTreeMap;

use zerobench_schema::log::{ErrorClass, RunStatus};
use zerobench_schema::ranges::ranges;

use crate::acc::RankAcc;
use crate::plan::{describe_ranges, missing_ranges};
use crate::run::Status;
use crate::side::JobState;

/// The status of a run and a short reason for any status but `ok`.
pub fn decide(ranks: &BTreeMap<u32, RankAcc>, world_size: u32, job: Option<JobState>) -> (Status, Option<String>) {
    let first_error = |oom: bool| {
        ranks.iter().find_map(|(r, a)| {
            a.errors.iter().find(|e| (e.class == ErrorClass::Oom) == oom).map(|e| {
                let step = e.step.map(|s| format!(" at step {s}")).unwrap_or_default();
                let req = e.requested_bytes.map(|b| format!(" (requested {b} bytes)")).unwrap_or_default();
                format!("rank {r}{step}: {}: {}{req}", e.class.as_str(), e.message)
            })
        })
    };
    let ended = |s: RunStatus| ranks.iter().find(|(_, a)| a.end.is_some_and(|e| e.status == s)).map(|(r, _)| *r);

    if let Some(why) = first_error(true) {
        return (Status::Oom, Some(why));
    }
    if let Some(r) = ended(RunStatus::Oom) {
        return (Status::Oom, Some(format!("rank {r} ended with status oom")));
    }
    if let Some(why) = first_error(false) {
        return (Status::Failed, Some(why));
    }
    if let Some(r) = ended(RunStatus::Failed) {
        return (Status::Failed, Some(format!("rank {r} ended with status failed")));
    }
    let missing = missing_ranges(world_size, ranks.keys().copied());
    let unended: Vec<u32> = ranks.iter().filter(|(_, a)| a.end.is_none()).map(|(r, _)| *r).collect();
    if missing.is_empty() && unended.is_empty() {
        return (Status::Ok, None);
    }
    let why = match (missing.is_empty(), unended.is_empty()) {
        (false, true) => format!("no log for ranks {}", describe_ranges(&missing)),
        (true, false) => format!("no end record from ranks {}", ranges(&unended)),
        _ => format!("no log for ranks {}; no end record from ranks {}", describe_ranges(&missing), ranges(&unended)),
    };
    match job {
        Some(JobState::OutOfMemory) => (Status::Oom, Some(format!("the job was killed for its memory; {why}"))),
        Some(JobState::Failed) => (Status::Failed, Some(format!("the job failed; {why}"))),
        Some(JobState::Cancelled) => (Status::Cancelled, Some(format!("job cancelled; {why}"))),
        Some(JobState::Timeout) => (Status::Timeout, Some(format!("job hit its time limit; {why}"))),
        Some(JobState::Completed | JobState::Pending | JobState::Running) | None => (Status::Incomplete, Some(why)),
    }
}
