//! A run folder's records and a batch job's state as the scheduler reports it, read one way for
//! every reader: what `run.json` says every reader can rely on ([`PlannedRun`]), how a local run
//! ended (`local.json`, [`LocalRecord`]), Slurm's state names (squeue `%T`, sacct `State`,
//! scontrol `JobState`, `sacct --json`) and the verdict slurmstepd writes into a job's output when
//! it ends one. `zerobench status` and `zerobench ingest` both read a run folder through here, so
//! they cannot disagree on what a run is or what it became.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use serde::{Deserialize, Serialize};

/// Where a job stands or how it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Queued, held, requeued or suspended.
    Pending,
    /// Running or finishing (completing, staging out).
    Running,
    Completed,
    /// The job, its node or its launch failed.
    Failed,
    /// Killed for exceeding its memory (Slurm's `OUT_OF_MEMORY`, or an oom_kill event).
    OutOfMemory,
    /// Cancelled by a user or an administrator, or preempted.
    Cancelled,
    /// Hit its time limit or its deadline.
    Timeout,
}

impl JobState {
    /// A Slurm state name (`CANCELLED by 1000` and `CANCELLED+` included, any case); `None` for a
    /// name Slurm 22.05 does not use.
    pub fn from_slurm(name: &str) -> Option<JobState> {
        let word = name.trim().split(|c: char| c.is_whitespace() || c == '+').next()?.to_ascii_uppercase();
        Some(match word.as_str() {
            "PENDING" | "CONFIGURING" | "REQUEUED" | "REQUEUE_HOLD" | "REQUEUE_FED" | "RESV_DEL_HOLD" | "SUSPENDED" => {
                JobState::Pending
            }
            "RUNNING" | "COMPLETING" | "STAGE_OUT" | "SIGNALING" | "RESIZING" => JobState::Running,
            "COMPLETED" => JobState::Completed,
            "FAILED" | "NODE_FAIL" | "BOOT_FAIL" | "SPECIAL_EXIT" => JobState::Failed,
            "OUT_OF_MEMORY" => JobState::OutOfMemory,
            "CANCELLED" | "PREEMPTED" | "REVOKED" => JobState::Cancelled,
            "TIMEOUT" | "DEADLINE" => JobState::Timeout,
            _ => return None,
        })
    }

    /// Whether the job has ended.
    pub fn is_final(self) -> bool {
        !matches!(self, JobState::Pending | JobState::Running)
    }

    /// The verdict slurmstepd wrote into a job's output: `*** JOB 42 ON n1 CANCELLED AT … ***`
    /// (or `*** STEP 42.0 …`), with `DUE TO TIME LIMIT` for a timeout, `DUE TO NODE FAILURE` or
    /// `NODE FAIL`, and `Detected 1 oom_kill event` for a job killed for its memory (which wins:
    /// the cancellation that follows it is its consequence).
    pub fn from_job_output(text: &str) -> Option<JobState> {
        let mut state = None;
        for line in text.lines() {
            state = JobState::then_output_line(state, line);
            if state == Some(JobState::OutOfMemory) {
                break;
            }
        }
        state
    }

    /// The verdict after one more line of a job's output, `state` the verdict of the lines before
    /// it ([`JobState::from_job_output`]'s rule: an OOM kill wins, a later timeout or node failure
    /// replaces an earlier verdict, a cancellation counts only where nothing else was said).
    pub fn then_output_line(state: Option<JobState>, line: &str) -> Option<JobState> {
        if state == Some(JobState::OutOfMemory) {
            return state;
        }
        if line.contains("oom_kill event") || line.contains("OUT_OF_MEMORY") {
            return Some(JobState::OutOfMemory);
        }
        let Some((_, rest)) = line.split_once("*** JOB ").or_else(|| line.split_once("*** STEP ")) else {
            return state;
        };
        if rest.contains("DUE TO TIME LIMIT") {
            Some(JobState::Timeout)
        } else if rest.contains("NODE FAIL") || rest.contains("NODE_FAIL") || rest.contains("DUE TO NODE FAILURE") {
            Some(JobState::Failed)
        } else if rest.contains("CANCELLED") && state.is_none() {
            Some(JobState::Cancelled)
        } else {
            state
        }
    }
}

/// How much of the end of a job's output is read: slurmstepd writes its verdict last, and a
/// chatty job's output may be large.
pub const OUTPUT_TAIL_BYTES: u64 = 1 << 20;

/// The verdict in the job output file `path` (its last [`OUTPUT_TAIL_BYTES`]).
pub fn output_verdict(path: &Path) -> std::io::Result<Option<JobState>> {
    Ok(JobState::from_job_output(&read_tail(path, OUTPUT_TAIL_BYTES)?))
}

/// The last `n` bytes of a file, as text (lossily: a cut may split a character).
pub fn read_tail(path: &Path, n: u64) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    f.seek(SeekFrom::Start(len.saturating_sub(n)))?;
    let mut buf = Vec::new();
    f.take(n).read_to_end(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// The file in a run folder that records how `zerobench local` last ran it.
pub const LOCAL_RECORD: &str = "local.json";

/// `run.json`'s format version: a reader refuses another (the launcher with both versions named).
pub const RUN_RECORD_VERSION: u32 = 1;

/// What every reader takes from a run folder's `run.json`, which `zerobench render` writes: the
/// run's id and configuration and where it runs. The launcher's record holds this at its top
/// level and more beside it (the plan's byte counts, the cluster, the argv), which other readers
/// leave alone.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub struct PlannedRun {
    pub format: u32,
    pub id: String,
    pub config: crate::RunConfig,
    pub nodes: u32,
    pub world_size: u32,
}

impl PlannedRun {
    /// A `run.json` value as the launcher wrote it, if it is one of [`RUN_RECORD_VERSION`].
    pub fn from_json(v: &serde_json::Value) -> Option<PlannedRun> {
        PlannedRun::deserialize(v).ok().filter(|r| r.format == RUN_RECORD_VERSION)
    }
}

/// `local.json`: how a run under `zerobench local` ended. `status` and `ingest` both take its
/// state from [`LocalRecord::job_state`].
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LocalRecord {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal that ended the run's script.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    #[serde(default)]
    pub timed_out: bool,
    /// The signal that interrupted `zerobench local` while this run went (`SIGINT`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupted_by: Option<String>,
    #[serde(default)]
    pub seconds: f64,
    /// Unix seconds.
    #[serde(default)]
    pub finished_at: u64,
}

impl LocalRecord {
    /// Interrupted (`zerobench local` got a signal and stopped it): cancelled; over its time
    /// limit: timeout; its script killed by a signal nobody sent through zerobench (the kernel's
    /// OOM killer, a stray `kill`): failed; else by its exit code. `None` for a record that says
    /// none of these.
    pub fn job_state(&self) -> Option<JobState> {
        if self.interrupted_by.is_some() {
            return Some(JobState::Cancelled);
        }
        if self.timed_out {
            return Some(JobState::Timeout);
        }
        if self.signal.is_some() {
            return Some(JobState::Failed);
        }
        match self.exit_code {
            Some(0) => Some(JobState::Completed),
            Some(_) => Some(JobState::Failed),
            None => None,
        }
    }

    pub fn describe(&self) -> String {
        if let Some(sig) = &self.interrupted_by {
            return format!("stopped after {:.1} s: zerobench local got {sig}", self.seconds);
        }
        match (self.timed_out, self.exit_code, self.signal) {
            (true, _, _) => format!("stopped at the time limit after {:.0} s", self.seconds),
            (false, Some(c), _) => format!("exit {c} after {:.1} s", self.seconds),
            (false, None, Some(s)) => format!("killed by signal {s} after {:.1} s", self.seconds),
            _ => format!("ended after {:.1} s", self.seconds),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A launcher record of this format is read whole; another format, or a hand-written file
    /// without the record's fields, is not taken for one.
    #[test]
    fn planned_runs_are_read_only_in_their_own_format() {
        let config = crate::RunConfig::new(crate::ModelPreset::Tiny, crate::config::ZeroStage::Z2);
        let mut v = serde_json::json!({
            "format": RUN_RECORD_VERSION, "id": "tiny_z2", "config": config, "nodes": 2, "world_size": 4,
            "cluster": {"partition": "gpu"},
        });
        let r = PlannedRun::from_json(&v).expect("the launcher's record");
        assert_eq!((r.id.as_str(), r.config, r.nodes, r.world_size), ("tiny_z2", config, 2, 4));
        v["format"] = serde_json::json!(RUN_RECORD_VERSION + 1);
        assert_eq!(PlannedRun::from_json(&v), None);
        assert_eq!(PlannedRun::from_json(&serde_json::json!({"model": "gpt2", "stage": 1})), None);
    }

    #[test]
    fn slurm_names() {
        use JobState::*;
        let cases = [
            ("PENDING", Pending),
            ("REQUEUE_HOLD", Pending),
            ("SUSPENDED", Pending),
            ("RUNNING", Running),
            ("COMPLETING", Running),
            ("COMPLETED", Completed),
            ("FAILED", Failed),
            ("NODE_FAIL", Failed),
            ("BOOT_FAIL", Failed),
            ("OUT_OF_MEMORY", OutOfMemory),
            ("CANCELLED by 1000", Cancelled),
            ("CANCELLED+", Cancelled),
            ("cancelled", Cancelled),
            ("PREEMPTED", Cancelled),
            ("TIMEOUT", Timeout),
            ("DEADLINE", Timeout),
        ];
        for (name, want) in cases {
            assert_eq!(JobState::from_slurm(name), Some(want), "{name}");
        }
        assert_eq!(JobState::from_slurm("NOT_A_STATE"), None);
        assert_eq!(JobState::from_slurm(""), None);
        assert!(!Pending.is_final() && !Running.is_final() && Completed.is_final() && OutOfMemory.is_final());
    }

    #[test]
    fn slurmstepd_verdicts() {
        let out = |s: &str| JobState::from_job_output(s);
        let at = "ON n1 CANCELLED AT 2026-01-01T00:00:00";
        assert_eq!(
            out(&format!("step 3\nslurmstepd: error: *** JOB 12 {at} DUE TO TIME LIMIT ***\n")),
            Some(JobState::Timeout)
        );
        assert_eq!(out(&format!("slurmstepd: error: *** STEP 12.0 {at} ***\n")), Some(JobState::Cancelled));
        assert_eq!(out(&format!("*** JOB 12 {at} DUE TO NODE FAILURE ***")), Some(JobState::Failed));
        // An oom_kill is what happened, whatever follows.
        let oom = format!("slurmstepd: error: Detected 1 oom_kill event in StepId=12.0.\n*** JOB 12 {at} ***\n");
        assert_eq!(out(&oom), Some(JobState::OutOfMemory));
        // A timeout seen after a plain cancellation line (the step's, then the job's) is kept.
        assert_eq!(
            out(&format!("*** STEP 12.0 {at} ***\n*** JOB 12 {at} DUE TO TIME LIMIT ***")),
            Some(JobState::Timeout)
        );
        assert_eq!(out("training...\nall done\n"), None);
    }

    #[test]
    fn the_tail_of_a_large_output_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("job-12.out");
        let mut text = "x".repeat(3 << 20);
        text.push_str("\n*** JOB 12 ON n1 CANCELLED AT 2026-01-01T00:00:00 DUE TO TIME LIMIT ***\n");
        std::fs::write(&p, text).unwrap();
        assert_eq!(output_verdict(&p).unwrap(), Some(JobState::Timeout));
        assert_eq!(read_tail(&p, 10).unwrap().len(), 10);
        assert!(output_verdict(&dir.path().join("missing.out")).is_err());
    }

    /// A node failure in either spelling is a failure, not the cancellation the line also states.
    #[test]
    fn node_failures_in_either_spelling_are_failures() {
        let at = "ON n1 CANCELLED AT 2026-01-01T00:00:00";
        for why in ["NODE FAIL", "NODE_FAIL", "NODE FAILURE"] {
            let line = format!("slurmstepd: error: *** JOB 12 {at} DUE TO {why} ***\n");
            assert_eq!(JobState::from_job_output(&line), Some(JobState::Failed), "{why}");
        }
    }

    /// The job's timeout, then its step's plain cancellation (which the timeout caused): a timeout.
    #[test]
    fn a_cancellation_after_a_timeout_keeps_the_timeout() {
        let at = "ON n1 CANCELLED AT 2026-01-01T00:00:00";
        let text = format!("*** JOB 12 {at} DUE TO TIME LIMIT ***\n*** STEP 12.0 {at} ***\n");
        assert_eq!(JobState::from_job_output(&text), Some(JobState::Timeout));
    }

    fn local(
        exit_code: Option<i32>,
        signal: Option<i32>,
        timed_out: bool,
        interrupted_by: Option<&str>,
    ) -> LocalRecord {
        LocalRecord {
            exit_code,
            signal,
            timed_out,
            interrupted_by: interrupted_by.map(String::from),
            seconds: 2.5,
            finished_at: 1_700_000_000,
        }
    }

    /// An interruption wins over everything, then the time limit, then a signal, then the exit code.
    #[test]
    fn local_records_map_to_job_states() {
        use JobState::*;
        let cases = [
            (local(Some(0), None, true, Some("SIGINT")), Some(Cancelled)),
            (local(Some(0), Some(9), true, None), Some(Timeout)),
            (local(Some(0), Some(9), false, None), Some(Failed)),
            (local(Some(0), None, false, None), Some(Completed)),
            (local(Some(1), None, false, None), Some(Failed)),
            (local(None, None, false, None), None),
        ];
        for (record, want) in cases {
            assert_eq!(record.job_state(), want, "{record:?}");
        }
    }

    /// What `zerobench local` and `zerobench status` print for how a local run ended.
    #[test]
    fn local_records_describe_how_the_run_ended() {
        let cases = [
            (
                LocalRecord { seconds: 12.34, ..local(Some(130), None, false, Some("SIGINT")) },
                "stopped after 12.3 s: zerobench local got SIGINT",
            ),
            (
                LocalRecord { seconds: 600.4, ..local(Some(143), None, true, None) },
                "stopped at the time limit after 600 s",
            ),
            (local(Some(1), None, false, None), "exit 1 after 2.5 s"),
            (local(None, Some(9), false, None), "killed by signal 9 after 2.5 s"),
            (local(None, None, false, None), "ended after 2.5 s"),
        ];
        for (record, want) in cases {
            assert_eq!(record.describe(), want);
        }
    }
}
