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
//! * `local.json`, which `zerobench local` writes: `timed_out`, else a `signal` (killed:
//!   cancelled), else the `exit_code`;
//! * the job's output, any `*.out` (the launcher's `<run-id>-<job-id>.out`, Slurm's default
//!   `slurm-<job-id>.out`): the lines slurmstepd writes when it ends a job,
//!   `*** JOB 42 ON node1 CANCELLED AT 2026-01-01T00:00:00 ***` (optionally `DUE TO TIME LIMIT`
//!   or `DUE TO PREEMPTION`), and `Detected 1 oom_kill event`.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::problem::{Problem, ProblemKind};

/// How the scheduler says a job ended, as far as ingest cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Completed,
    Cancelled,
    Timeout,
    /// The job was killed for exceeding its host memory.
    OutOfMemory,
    /// The job or a node failed.
    Failed,
}

impl JobState {
    /// Reads a Slurm state name (`CANCELLED by 1000` and `CANCELLED+` included).
    pub fn from_slurm(s: &str) -> Option<Self> {
        let word = s.trim().split(|c: char| c.is_whitespace() || c == '+').next()?.to_ascii_uppercase();
        Some(match word.as_str() {
            "COMPLETED" => JobState::Completed,
            "CANCELLED" | "PREEMPTED" => JobState::Cancelled,
            "TIMEOUT" | "DEADLINE" => JobState::Timeout,
            "OUT_OF_MEMORY" => JobState::OutOfMemory,
            "FAILED" | "NODE_FAIL" | "BOOT_FAIL" => JobState::Failed,
            _ => return None,
        })
    }
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
            match read_tail(&path, OUT_TAIL) {
                Ok(text) => {
                    if let Some(s) = state_in_slurm_out(&text) {
                        return Some(s);
                    }
                }
                Err(message) => problems.push(Problem::file(&path, ProblemKind::SideFile { message })),
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
            serde_json::Value::String(s) => JobState::from_slurm(s),
            serde_json::Value::Array(a) => a.iter().filter_map(|x| x.as_str()).find_map(JobState::from_slurm),
            serde_json::Value::Object(_) => state_in_json(&serde_json::json!({ "state": s.get("current") })),
            _ => None,
        };
        if found.is_some() {
            return found;
        }
    }
    None
}

/// The state in `zerobench local`'s record.
fn state_in_local_json(v: &serde_json::Value) -> Option<JobState> {
    if v.get("timed_out").and_then(serde_json::Value::as_bool) == Some(true) {
        return Some(JobState::Timeout);
    }
    if v.get("signal").is_some_and(|s| !s.is_null()) {
        return Some(JobState::Cancelled);
    }
    match v.get("exit_code").and_then(serde_json::Value::as_i64) {
        Some(0) => Some(JobState::Completed),
        Some(_) => Some(JobState::Failed),
        None => None,
    }
}

/// The state slurmstepd wrote into a job's output.
fn state_in_slurm_out(text: &str) -> Option<JobState> {
    let mut state = None;
    for line in text.lines() {
        if line.contains("oom_kill event") || line.contains("OUT_OF_MEMORY") {
            return Some(JobState::OutOfMemory);
        }
        if let Some(rest) =
            line.split_once("*** JOB ").map(|(_, r)| r).or_else(|| line.split_once("*** STEP ").map(|(_, r)| r))
        {
            if rest.contains("DUE TO TIME LIMIT") {
                state = Some(JobState::Timeout);
            } else if rest.contains("CANCELLED") && state.is_none() {
                state = Some(JobState::Cancelled);
            } else if rest.contains("NODE FAIL") || rest.contains("NODE_FAIL") {
                state = Some(JobState::Failed);
            }
        }
    }
    state
}

/// Side files are small; anything over this is not read.
const MAX_SIDE_FILE: u64 = 16 << 20;

/// How much of the end of a job's output is read: slurmstepd writes its verdict last, and the
/// output of a chatty job may be large.
const OUT_TAIL: u64 = 1 << 20;

/// The last `n` bytes of a file, as text.
fn read_tail(path: &Path, n: u64) -> Result<String, String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let len = f.metadata().map_err(|e| e.to_string())?.len();
    f.seek(SeekFrom::Start(len.saturating_sub(n))).map_err(|e| e.to_string())?;
    let mut bytes = Vec::new();
    f.take(n).read_to_end(&mut bytes).map_err(|e| e.to_string())?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

fn read_small(path: &Path) -> Result<String, String> {
    let len = std::fs::metadata(path).map_err(|e| e.to_string())?.len();
    if len > MAX_SIDE_FILE {
        return Err(format!("{len} bytes is more than a side file may have ({MAX_SIDE_FILE})"));
    }
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The launcher's `run.json` next to a run's logs, as JSON, if present and readable.
pub fn run_json(log_dir: &Path, problems: &mut Vec<Problem>) -> Option<serde_json::Value> {
    for dir in side_dirs(log_dir) {
        match side_json(&dir, "run.json", problems) {
            Some(v) if v.is_object() => return Some(v),
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
        assert_eq!(JobState::from_slurm("CANCELLED by 1000"), Some(JobState::Cancelled));
        assert_eq!(JobState::from_slurm("TIMEOUT"), Some(JobState::Timeout));
        assert_eq!(JobState::from_slurm("cancelled+"), Some(JobState::Cancelled));
        assert_eq!(JobState::from_slurm("RUNNING"), None);
        let v = serde_json::json!({"state": {"current": ["OUT_OF_MEMORY"]}});
        assert_eq!(state_in_json(&v), Some(JobState::OutOfMemory));
        assert_eq!(state_in_json(&serde_json::json!({"job_state": ["NODE_FAIL"]})), Some(JobState::Failed));
    }

    #[test]
    fn local_records() {
        let s = |v: serde_json::Value| state_in_local_json(&v);
        assert_eq!(
            s(serde_json::json!({"timed_out": true, "seconds": 60.0, "finished_at": 1})),
            Some(JobState::Timeout)
        );
        assert_eq!(s(serde_json::json!({"signal": 9, "timed_out": false})), Some(JobState::Cancelled));
        assert_eq!(s(serde_json::json!({"exit_code": 3, "timed_out": false})), Some(JobState::Failed));
        assert_eq!(s(serde_json::json!({"exit_code": 0, "timed_out": false})), Some(JobState::Completed));
    }

    #[test]
    fn slurmstepd_lines() {
        let t = "step 3\nslurmstepd: error: *** JOB 123 ON n1 CANCELLED AT 2026-01-01T00:00:00 DUE TO TIME LIMIT ***\n";
        assert_eq!(state_in_slurm_out(t), Some(JobState::Timeout));
        let t = "slurmstepd: error: *** STEP 123.0 ON n1 CANCELLED AT 2026-01-01T00:00:00 ***\n";
        assert_eq!(state_in_slurm_out(t), Some(JobState::Cancelled));
        assert_eq!(state_in_slurm_out("all fine\n"), None);
    }
}
