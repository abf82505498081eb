//! Side files of a run folder: how the scheduler says the job ended, and the launcher's resolved
//! configuration (`run.json`).
//!
//! Both are optional; ingest takes a run's identity from its logs. The launcher puts a run in
//! `<out>/<run-id>/` with the worker's logs under `logs/`, so side files are looked for in the
//! folder of the logs and, when that folder is called `logs`, in its parent.
//!
//! Job state, in order of preference:
//! * `job.json`: a JSON object whose `state`, `job_state` or `slurm_state` is a Slurm state
//!   (`COMPLETED`, `CANCELLED`, `CANCELLED by 1000`, `TIMEOUT`, `OUT_OF_MEMORY`, `NODE_FAIL`,
//!   `FAILED`, `PREEMPTED`), a list of them, or `{"current": [...]}` as `sacct --json` writes it;
//! * `local.json`, which `zerobench local` writes, read as `status` reads it
//!   (`zerobench_schema::job::LocalRecord::job_state`): interrupted, cancelled; `timed_out`,
//!   timeout; killed by a signal, failed; else the `exit_code`;
//! * the job's output, any `*.out` (the launcher's `<run-id>-<job-id>.out`, Slurm's default
//!   `slurm-<job-id>.out`): the lines slurmstepd writes when it ends a job,
//!   `*** JOB 42 ON node1 CANCELLED AT 2026-01-01T00:00:00 ***` (optionally `DUE TO TIME LIMIT`
//!   or `DUE TO PREEMPTION`), and `Detected 1 oom_kill event`.
//!
//! State names and slurmstepd's lines are read by `zerobench_schema::job`, as `zerobench status`
//! reads them.

use std::path::{Path, PathBuf};

use serde::Deserialize as _;

use crate::problem::{Problem, ProblemKind};

// The scheduler's states and slurmstepd's verdicts are read as `zerobench status` reads them.
pub use zerobench_schema::job::JobState;

/// A Slurm state name that says how a job ended (`None` for one still pending or running).
fn ended(name: &str) -> Option<JobState> {
    JobState::from_slurm(name).filter(|s| s.is_final())
}

/// The folders that may hold a run's side files.
pub fn side_dirs(log_dir: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![log_dir.to_path_buf()];
    if log_dir.file_name().is_some_and(|n| n == "logs") {
        if let Some(parent) = log_dir.parent() {
            dirs.push(parent.to_path_buf());
        }
    }
    dirs
}

/// The job state recorded next to a run's logs, if any.
pub fn job_state(log_dir: &Path, problems: &mut Vec<Problem>) -> Option<JobState> {
    let dirs = side_dirs(log_dir);
    type StateIn = fn(&serde_json::Value) -> Option<JobState>;
    let json_files: [(&str, StateIn); 2] = [("job.json", state_in_json), ("local.json", state_in_local_json)];
    for (name, state) in json_files {
        for dir in &dirs {
            if let Some(s) = side_json(dir, name, problems).and_then(|v| state(&v)) {
                return Some(s);
            }
        }
    }
    for dir in &dirs {
        let Ok(entries) = std::fs::read_dir(dir) else { continue };
        let mut outs: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "out"))
            .collect();
        outs.sort();
        for path in outs {
            match zerobench_schema::job::output_verdict(&path) {
                Ok(Some(s)) => return Some(s),
                Ok(None) => {}
                Err(e) => problems.push(Problem::file(&path, ProblemKind::SideFile { message: e.to_string() })),
            }
        }
    }
    None
}

/// The state in a `job.json` value.
fn state_in_json(v: &serde_json::Value) -> Option<JobState> {
    for key in ["state", "job_state", "slurm_state"] {
        let Some(s) = v.get(key) else { continue };
        let found = match s {
            serde_json::Value::String(s) => ended(s),
            serde_json::Value::Array(a) => a.iter().filter_map(|x| x.as_str()).find_map(ended),
            serde_json::Value::Object(_) => state_in_json(&serde_json::json!({ "state": s.get("current") })),
            _ => None,
        };
        if found.is_some() {
            return found;
        }
    }
    None
}

/// The state in `zerobench local`'s record, as `status` reads it ([`LocalRecord::job_state`]).
fn state_in_local_json(v: &serde_json::Value) -> Option<JobState> {
    zerobench_schema::job::LocalRecord::deserialize(v).ok()?.job_state()
}

/// Side files are small; anything over this is not read.
const MAX_SIDE_FILE: u64 = 16 << 20;

fn read_small(path: &Path) -> Result<String, String> {
    let len = std::fs::metadata(path).map_err(|e| e.to_string())?.len();
    if len > MAX_SIDE_FILE {
        return Err(format!("{len} bytes is more than a side file may have ({MAX_SIDE_FILE})"));
    }
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The launcher's `run.json` next to a run's logs, as its path and JSON, if present and readable.
pub fn run_json(log_dir: &Path, problems: &mut Vec<Problem>) -> Option<(PathBuf, serde_json::Value)> {
    for dir in side_dirs(log_dir) {
        match side_json(&dir, "run.json", problems) {
            Some(v) if v.is_object() => return Some((dir.join("run.json"), v)),
            Some(_) => problems.push(Problem::file(
                dir.join("run.json"),
                ProblemKind::SideFile { message: "run.json is not a JSON object".into() },
            )),
            None => {}
        }
    }
    None
}

/// The side file `name` in `dir` as JSON, if it is there; one that cannot be read or is not
/// JSON is reported and passed over.
fn side_json(dir: &Path, name: &str, problems: &mut Vec<Problem>) -> Option<serde_json::Value> {
    let path = dir.join(name);
    if !path.is_file() {
        return None;
    }
    let parsed =
        read_small(&path).and_then(|text| serde_json::from_str(&text).map_err(|e| format!("{name} is not JSON: {e}")));
    match parsed {
        Ok(v) => Some(v),
        Err(message) => {
            problems.push(Problem::file(&path, ProblemKind::SideFile { message }));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_states() {
        // A job still queued or running has not ended: the next source is asked.
        assert_eq!(ended("RUNNING"), None);
        assert_eq!(state_in_json(&serde_json::json!({"state": ["RUNNING", "TIMEOUT"]})), Some(JobState::Timeout));
        let v = serde_json::json!({"state": {"current": ["OUT_OF_MEMORY"]}});
        assert_eq!(state_in_json(&v), Some(JobState::OutOfMemory));
        assert_eq!(state_in_json(&serde_json::json!({"job_state": ["NODE_FAIL"]})), Some(JobState::Failed));
    }

    /// A side file over [`MAX_SIDE_FILE`] is refused unread (a sparse file: nothing is written);
    /// one of exactly that size is read.
    #[test]
    fn side_files_over_the_limit_are_not_read() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("run.json");
        let f = std::fs::File::create(&p).unwrap();
        f.set_len(MAX_SIDE_FILE + 1).unwrap();
        let e = read_small(&p).unwrap_err();
        assert!(e.contains(&format!("{} bytes is more than a side file may have", MAX_SIDE_FILE + 1)), "{e}");
        f.set_len(MAX_SIDE_FILE).unwrap();
        assert_eq!(read_small(&p).unwrap().len() as u64, MAX_SIDE_FILE);
    }

    #[test]
    fn local_records() {
        let s = |v: serde_json::Value| state_in_local_json(&v);
        assert_eq!(
            s(serde_json::json!({"timed_out": true, "seconds": 60.0, "finished_at": 1})),
            Some(JobState::Timeout)
        );
        assert_eq!(s(serde_json::json!({"signal": 9, "timed_out": false})), Some(JobState::Failed));
        assert_eq!(s(serde_json::json!({"signal": 15, "interrupted_by": "SIGINT"})), Some(JobState::Cancelled));
        assert_eq!(s(serde_json::json!({"exit_code": 3, "timed_out": false})), Some(JobState::Failed));
        assert_eq!(s(serde_json::json!({"exit_code": 0, "timed_out": false})), Some(JobState::Completed));
    }
}
