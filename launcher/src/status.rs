//! The state of each run of a rendered sweep: pending, running, done, failed, cancelled or
//! timeout, from whichever source knows.
//!
//! Slurm forgets a finished job after `MinJobAge` (300 s by default) unless an accounting
//! database keeps it, and many small clusters (and the local test cluster) have none, where
//! `sacct` fails outright. So the sources are tried in order, each for the runs the previous
//! ones could not place:
//!
//! 1. `squeue`: pending and running jobs;
//! 2. `sacct`: finished jobs, where accounting is enabled;
//! 3. `scontrol show job`: finished jobs still in the controller's memory;
//! 4. the run folder: the job's output file (Slurm writes "CANCELLED" and "DUE TO TIME LIMIT"
//!    there), the ranks' `end`/`error` log records, and `local.json` from `zerobench local`.
//!
//! Log records add detail (which rank failed, and why) whatever source gave the state.

use std::borrow::Borrow;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::Serialize;
use zerobench_schema::job::JobState;
use zerobench_schema::log::{parse_line, rank_from_name, Record, RunStatus};

use crate::error::Error;
use crate::render::{read_record, RunRecord, LOG_DIR};
use crate::slurm;
use crate::submit::{mark_of, SlurmRecord, SLURM_RECORD, SUBMITTING};
use zerobench_schema::job::{LocalRecord, LOCAL_RECORD};

/// Where a run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Rendered, never submitted or run.
    Unsubmitted,
    Pending,
    Running,
    Done,
    /// Out of memory: Slurm's `OUT_OF_MEMORY`, an oom_kill in the job's output, or a rank's `end`
    /// record (ingest's `oom` too).
    Oom,
    Failed,
    Cancelled,
    Timeout,
    /// Submitted, but no source knows what became of it.
    Unknown,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Unsubmitted => "unsubmitted",
            State::Pending => "pending",
            State::Running => "running",
            State::Done => "done",
            State::Oom => "oom",
            State::Failed => "failed",
            State::Cancelled => "cancelled",
            State::Timeout => "timeout",
            State::Unknown => "unknown",
        }
    }

    /// Slurm's job state names (squeue `%T`, sacct `State`, scontrol `JobState`), read as ingest
    /// reads them (`zerobench_schema::job`).
    pub fn from_slurm(s: &str) -> State {
        JobState::from_slurm(s).map_or(State::Unknown, State::from)
    }
}

impl From<JobState> for State {
    fn from(s: JobState) -> State {
        match s {
            JobState::Pending => State::Pending,
            JobState::Running => State::Running,
            JobState::Completed => State::Done,
            JobState::Failed => State::Failed,
            JobState::OutOfMemory => State::Oom,
            JobState::Cancelled => State::Cancelled,
            JobState::Timeout => State::Timeout,
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One row of `zerobench status`.
#[derive(Debug, Clone, Serialize)]
pub struct RunState {
    pub id: String,
    pub dir: PathBuf,
    pub state: State,
    pub job_id: Option<String>,
    /// `squeue`, `sacct`, `scontrol`, `output`, `logs`, `local`, `pids` (ranks alive on this
    /// host) or `none`.
    pub source: &'static str,
    /// Why it failed, or how far it got.
    pub detail: String,
}

/// The source of a state read from ranks alive on this host (whatever Slurm says of the job).
pub const FROM_PIDS: &str = "pids";

/// The states of run folders. Slurm commands that fail or are missing are skipped with a
/// diagnostic; the run folders still answer.
pub fn status(dirs: &[PathBuf]) -> Result<Vec<RunState>, Error> {
    let runs: Vec<(PathBuf, RunRecord)> =
        dirs.iter().map(|d| read_record(d).map(|r| (d.clone(), r))).collect::<Result<_, _>>()?;
    Ok(status_of(&runs))
}

/// [`status`] of run folders whose records were read already (each folder with its `run.json`),
/// owned or borrowed.
pub fn status_of<D: AsRef<Path>, R: Borrow<RunRecord>>(runs: &[(D, R)]) -> Vec<RunState> {
    let mut rows = Vec::with_capacity(runs.len());
    let mut jobs: Vec<(usize, String)> = Vec::new();
    for (dir, rec) in runs {
        let (dir, rec) = (dir.as_ref(), rec.borrow());
        let slurm = read_json::<SlurmRecord>(&dir.join(SLURM_RECORD));
        // A submission whose record could not be written: its mark may name the job.
        let mark = if slurm.is_none() { mark_of(dir) } else { None };
        let job_id = slurm.as_ref().map(|s| s.job_id.clone()).or_else(|| mark.clone().flatten());
        if let Some(j) = &job_id {
            jobs.push((rows.len(), j.clone()));
        }
        let (state, source, detail) = match mark {
            Some(None) => (
                State::Unknown,
                "submit",
                format!("{SUBMITTING} without {SLURM_RECORD}: a submission may have reached Slurm (look in squeue)"),
            ),
            _ => (State::Unsubmitted, "none", String::new()),
        };
        rows.push(RunState { id: rec.run.id.clone(), dir: dir.to_path_buf(), state, job_id, source, detail });
    }
    if !jobs.is_empty() {
        let ids: Vec<&str> = jobs.iter().map(|(_, j)| j.as_str()).collect();
        // Job id → its state and the source that knew it.
        let tag = |from: HashMap<String, State>, source: &'static str| {
            from.into_iter().map(move |(job, st)| (job, (st, source)))
        };
        let missing = |known: &HashMap<String, (State, &'static str)>| {
            ids.iter().filter(|j| !known.contains_key(**j)).map(|j| j.to_string()).collect::<Vec<_>>()
        };
        let mut known: HashMap<String, (State, &'static str)> = tag(squeue(&ids), "squeue").collect();
        known.extend(tag(sacct(&missing(&known)), "sacct"));
        known.extend(tag(scontrol(&missing(&known)), "scontrol"));
        for (row, job) in &jobs {
            let (state, source) = known.get(job).copied().unwrap_or((State::Unknown, "none"));
            rows[*row].state = state;
            rows[*row].source = source;
        }
    }
    let mut outputs = Outputs::default();
    for (row, (_, rec)) in rows.iter_mut().zip(runs) {
        from_run_folder(row, rec.borrow(), &mut outputs);
    }
    rows
}

/// The record in the JSON file `p`; none where it is missing or unreadable (a malformed one is
/// named in a warning).
pub(crate) fn read_json<T: serde::de::DeserializeOwned>(p: &Path) -> Option<T> {
    let text = std::fs::read_to_string(p).ok()?;
    match serde_json::from_str(&text) {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::warn!("{}: {e}; ignored", p.display());
            None
        }
    }
}

const QUERY_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs a query; a failure is a diagnostic, not an error (the next source may know).
fn query(cmd: &mut Command) -> Option<String> {
    match slurm::run(cmd, QUERY_TIMEOUT) {
        Ok(out) if out.ok() => Some(out.stdout),
        Ok(out) => {
            tracing::info!("{} exited with {}: {}", slurm::describe(cmd), out.code, out.stderr.trim());
            None
        }
        Err(e) => {
            tracing::info!("{e}");
            None
        }
    }
}

/// `squeue` knows pending and running jobs. Array tasks that have not started yet are listed
/// together as `123_[0-3%2]`.
fn squeue(ids: &[&str]) -> HashMap<String, State> {
    let mut known = HashMap::new();
    // Ask for every job the controller lists rather than `-j`, which fails as a whole when any
    // id is no longer known.
    let Some(out) = query(Command::new("squeue").args(["-h", "-o", "%i|%T"])) else { return known };
    for line in out.lines() {
        let Some((id, st)) = line.split_once('|') else { continue };
        for id in expand_array_id(id.trim()) {
            if ids.contains(&id.as_str()) {
                known.insert(id, State::from_slurm(st));
            }
        }
    }
    known
}

/// `123_[0-3,7%2]` to `123_0 … 123_3, 123_7`; other ids as they are.
fn expand_array_id(id: &str) -> Vec<String> {
    let Some((job, rest)) = id.split_once("_[") else { return vec![id.to_string()] };
    let body = rest.trim_end_matches(']');
    let body = body.split('%').next().unwrap_or_default();
    let mut out = Vec::new();
    for part in body.split(',') {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        if let (Ok(lo), Ok(hi)) = (lo.parse::<u32>(), hi.parse::<u32>()) {
            // Bounded: an array is at most MaxArraySize (default 1001) tasks.
            out.extend((lo..=hi.min(lo.saturating_add(100_000))).map(|t| format!("{job}_{t}")));
        }
    }
    out
}

/// `sacct` knows finished jobs when accounting is on; without it, it fails and says so.
fn sacct(ids: &[String]) -> HashMap<String, State> {
    let mut known = HashMap::new();
    if ids.is_empty() {
        return known;
    }
    let Some(out) = query(Command::new("sacct").args(["-n", "-P", "-X", "-o", "JobID,State", "-j", &ids.join(",")]))
    else {
        return known;
    };
    for line in out.lines() {
        if let Some((id, st)) = line.split_once('|') {
            if ids.iter().any(|i| i == id) {
                known.insert(id.to_string(), State::from_slurm(st));
            }
        }
    }
    known
}

/// `scontrol show job` knows jobs the controller still holds (`MinJobAge` after they end).
fn scontrol(ids: &[String]) -> HashMap<String, State> {
    let mut known = HashMap::new();
    for id in ids {
        let Some(out) = query(Command::new("scontrol").args(["-o", "show", "job", id])) else { continue };
        // One line per job; an array id gives its one task.
        if let Some(st) = out.split_whitespace().find_map(|kv| kv.strip_prefix("JobState=")) {
            known.insert(id.clone(), State::from_slurm(st));
        }
    }
    known
}

/// Fills in what the run folder says: final states Slurm no longer remembers, and details.
fn from_run_folder(row: &mut RunState, rec: &RunRecord, outputs: &mut Outputs) {
    let logs = read_logs(&row.dir.join(LOG_DIR));
    if let Some(detail) = logs.failure.clone() {
        row.detail = detail;
    }
    match row.state {
        State::Unknown => {
            if let Some(st) = row.job_id.as_deref().and_then(|j| output_verdict(&row.dir, j, outputs)) {
                row.state = st;
                row.source = "output";
            } else if let Some(st) = logs.verdict(rec.run.world_size()) {
                row.state = st;
                row.source = "logs";
            }
        }
        State::Unsubmitted => {
            if let Some(local) = read_json::<LocalRecord>(&row.dir.join(LOCAL_RECORD)) {
                row.state = local_state(&local);
                row.source = "local";
                // The logs say more about a run that went well, the record about one that did not.
                if row.detail.is_empty() && row.state != State::Done {
                    row.detail = local.describe();
                }
            } else if let Some(st) = logs.verdict(rec.run.world_size()) {
                // Run outside the launcher (`bash job.sbatch`, or a `local` that was stopped
                // before it wrote its record): the ranks' logs say how it ended.
                row.state = st;
                row.source = "logs";
            } else if logs.ranks_seen > 0 {
                // Its ranks started and did not all end, and nothing recorded how: killed with
                // its launcher (SIGKILL), or a `local` that could not write its record (a full
                // disk). Not a run that never began, which `local` would skip as such; ranks
                // still alive here make it running below.
                row.state = State::Unknown;
                row.source = "logs";
                row.detail = format!("started, and no record of how it ended: {}", logs.progress(rec.run.world_size()));
            }
        }
        _ => {}
    }
    // Ranks still running here are a run under way, whatever else says it ended or never began
    // (`local` running it, or killed and leaving its ranks behind): nothing may start it again.
    if !logs.alive.is_empty() && !matches!(row.state, State::Pending | State::Running) {
        row.state = State::Running;
        row.source = FROM_PIDS;
        let pids: Vec<String> = logs.alive.iter().map(|(r, p)| format!("rank {r} pid {p}")).collect();
        row.detail = format!("alive on this host: {}; {}", pids.join(", "), logs.progress(rec.run.world_size()));
    }
    // Slurm and `local` know only that the job failed (the worker's exit 3); a rank's `end`
    // record says it ran out of memory, as ingest reads it.
    if row.state == State::Failed && logs.verdict(rec.run.world_size()) == Some(State::Oom) {
        row.state = State::Oom;
    }
    if row.detail.is_empty() {
        row.detail = logs.progress(rec.run.world_size());
    }
}

/// A local run's state as `status` shows it (the same as ingest's: [`LocalRecord::job_state`]);
/// a record that says nothing is a failure.
pub fn local_state(r: &LocalRecord) -> State {
    r.job_state().map_or(State::Failed, State::from)
}

/// What the logs of a run folder say went wrong, if anything: the rank that stopped without an
/// `end`, or the first `error` (`rank N: class: message`).
pub fn log_failure(run_dir: &Path) -> Option<String> {
    read_logs(&run_dir.join(LOG_DIR)).failure
}

/// What the ranks' logs say.
#[derive(Debug, Default)]
struct Logs {
    /// Rank → its `end` status.
    ends: BTreeMap<u32, RunStatus>,
    /// Rank → its last step, for every rank that wrote `start`.
    started: BTreeMap<u32, Option<u32>>,
    /// The first error (`rank N: class: message`), else the first `end` that was not ok.
    failure: Option<String>,
    ranks_seen: usize,
    last_step: Option<u32>,
    /// Rank 0's `end` summary, for finished runs.
    summary: Option<String>,
    /// Ranks without an `end` whose process is alive on this host: (rank, pid).
    alive: Vec<(u32, u32)>,
}

impl Logs {
    fn verdict(&self, world: u32) -> Option<State> {
        if self.ends.values().any(|s| *s == RunStatus::Oom) {
            return Some(State::Oom);
        }
        if self.failure.is_some() || self.ends.values().any(|s| *s != RunStatus::Ok) {
            return Some(State::Failed);
        }
        (self.ends.len() == world as usize).then_some(State::Done)
    }

    fn progress(&self, world: u32) -> String {
        if let (Some(s), true) = (&self.summary, self.ends.len() == world as usize) {
            return s.clone();
        }
        match (self.ranks_seen, self.last_step) {
            (0, _) => String::new(),
            (n, Some(s)) => format!("{n}/{world} rank logs, {} ended, step {s}", self.ends.len()),
            (n, None) => format!("{n}/{world} rank logs, {} ended", self.ends.len()),
        }
    }
}

/// Bytes of a rank log read from its start (the `start` record) and from its end (the last
/// steps, `error` and `end`): what status needs, in bounded memory and time whatever the size.
const LOG_HEAD: u64 = 1 << 20;
const LOG_TAIL: u64 = 4 << 20;

/// A rank log's first [`LOG_HEAD`] and last [`LOG_TAIL`] bytes (all of a smaller file), joined at
/// a line break; `None` for anything but a regular file (a FIFO would block the read forever, a
/// device would never end) or one that cannot be read.
fn head_and_tail(path: &Path) -> Option<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() {
        tracing::warn!("{}: not a regular file; skipped", path.display());
        return None;
    }
    let mut f = std::fs::File::open(path).ok()?;
    let len = meta.len();
    if len <= LOG_HEAD + LOG_TAIL {
        let mut all = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
        f.take(LOG_HEAD + LOG_TAIL).read_to_end(&mut all).ok()?;
        return Some(all);
    }
    let mut head = Vec::new();
    (&mut f).take(LOG_HEAD).read_to_end(&mut head).ok()?;
    f.seek(SeekFrom::Start(len - LOG_TAIL)).ok()?;
    let mut tail = Vec::new();
    f.take(LOG_TAIL).read_to_end(&mut tail).ok()?;
    // Cut both at line breaks, so that no half line is parsed.
    let head_end = head.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let tail_start = tail.iter().position(|&b| b == b'\n').map_or(tail.len(), |i| i + 1);
    head.truncate(head_end);
    head.extend_from_slice(&tail[tail_start..]);
    Some(head)
}

fn read_logs(dir: &Path) -> Logs {
    let mut logs = Logs::default();
    let Ok(entries) = std::fs::read_dir(dir) else { return logs };
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).and_then(rank_from_name).is_some())
        .collect();
    files.sort();
    // A rank's error says why; a failed `end` only that it ended so (the ranks a failure stopped
    // end failed too, and a lower rank's log is read first), so it is the detail only without one.
    let mut bad_end = None;
    // The ranks started on this host, (rank, pid, the `start` record's time): those without an
    // `end` may still be running.
    let (host, mut spawned) = (crate::proctree::this_host(), Vec::new());
    for f in files {
        let Some(text) = head_and_tail(&f) else { continue };
        logs.ranks_seen += 1;
        for line in text.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            // A line being written, or from elsewhere, is skipped: status only needs the records.
            let Ok(rec) = parse_line(line) else { continue };
            match rec {
                Record::Start(s) => {
                    logs.started.entry(s.rank).or_insert(None);
                    if Some(s.host.as_str()) == host {
                        spawned.push((s.rank, s.pid, s.ts));
                    }
                }
                Record::Step(s) => {
                    logs.last_step = logs.last_step.max(Some(s.step));
                    let last = logs.started.entry(s.rank).or_insert(None);
                    *last = (*last).max(Some(s.step));
                }
                Record::End(e) => {
                    logs.ends.insert(e.rank, e.status);
                    if let (0, Some(s)) = (e.rank, e.summary) {
                        logs.summary = Some(format!(
                            "median step {:.1} ms, {:.0} tokens/s, final loss {}",
                            s.step_ms_median,
                            s.tokens_per_s,
                            s.final_loss_text()
                        ));
                    }
                    if e.status != RunStatus::Ok && bad_end.is_none() {
                        bad_end = Some(format!("rank {}: ended {} (exit {})", e.rank, e.status, e.exit_code));
                    }
                }
                Record::Error(e) if logs.failure.is_none() => {
                    logs.failure = Some(format!("rank {}: {}: {}", e.rank, e.class, e.message));
                }
                _ => {}
            }
        }
    }
    logs.failure = logs.failure.or(bad_end);
    logs.alive = spawned
        .into_iter()
        .filter(|&(rank, pid, ts)| !logs.ends.contains_key(&rank) && crate::proctree::alive_since(pid, ts))
        .map(|(rank, pid, _)| (rank, pid))
        .collect();
    // A rank that stopped without an `end` while others ended is the one that died (killed,
    // crashed or lost with its node): the others' errors only say they were stopped.
    let dead: Vec<String> = logs
        .started
        .iter()
        .filter(|(r, _)| !logs.ends.contains_key(r))
        .map(|(r, step)| match step {
            Some(s) => format!("rank {r} (after step {s})"),
            None => format!("rank {r} (before its first step)"),
        })
        .collect();
    if !dead.is_empty() && !logs.ends.is_empty() {
        let then = logs.failure.take().map(|f| format!("; then {f}")).unwrap_or_default();
        logs.failure = Some(format!("{} stopped without an end record{then}", dead.join(", ")));
    }
    logs
}

/// What slurmstepd wrote into the job's output file (`*** JOB 12 ON n1 CANCELLED AT … DUE TO
/// TIME LIMIT ***`, an oom_kill event), read as ingest reads it: in the run folder `dir`, then in
/// the output folder above it, where an array task's own output goes (`#SBATCH --output` of the
/// array script; the run folder gets only its script's output, which has slurmstepd's line only
/// where an `srun` step was cancelled).
fn output_verdict(dir: &Path, job_id: &str, outputs: &mut Outputs) -> Option<State> {
    // `%x-%j.out` for a job, and the array script's `<name>-%A_%a.out`, which is the task's id.
    let suffix = format!("-{job_id}.out");
    let mut found = |folder: &Path| {
        outputs
            .of(folder)
            .iter()
            .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().ends_with(&suffix)))
            .find_map(|p| zerobench_schema::job::output_verdict(p).ok().flatten())
            .map(State::from)
    };
    found(dir).or_else(|| dir.parent().and_then(found))
}

/// The `.out` files of the folders `status` has looked in, each folder listed once: the output
/// folder above thousands of run folders is where every array task's output is looked for.
#[derive(Default)]
struct Outputs(HashMap<PathBuf, Vec<PathBuf>>);

impl Outputs {
    fn of(&mut self, folder: &Path) -> &[PathBuf] {
        self.0.entry(folder.to_path_buf()).or_insert_with(|| {
            std::fs::read_dir(folder)
                .map(|entries| {
                    entries
                        .filter_map(Result::ok)
                        .map(|e| e.path())
                        .filter(|p| p.extension().is_some_and(|x| x == "out"))
                        .collect()
                })
                .unwrap_or_default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{first_on_path, render_sweep, stub, submitted};
    use rusty_fork::rusty_fork_test;
    use zerobench_schema::log::Summary;

    /// A state's text (the table's column, `Display`) is its name in status's JSON.
    #[test]
    fn states_read_the_same_in_the_table_and_the_json() {
        use State::*;
        for st in [Unsubmitted, Pending, Running, Done, Oom, Failed, Cancelled, Timeout, Unknown] {
            let json = serde_json::to_value(st).unwrap();
            assert_eq!(json.as_str(), Some(st.as_str()));
            assert_eq!(st.to_string(), st.as_str());
        }
        assert_eq!(Unsubmitted.as_str(), "unsubmitted");
    }

    /// A record that is not JSON is passed over (with a warning); a readable one is read.
    #[test]
    fn records_are_read_when_they_parse() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("r.json");
        std::fs::write(&p, "{\"a\": 1}").unwrap();
        assert_eq!(read_json::<serde_json::Value>(&p), Some(serde_json::json!({"a": 1})));
        std::fs::write(&p, "{not json").unwrap();
        assert_eq!(read_json::<serde_json::Value>(&p), None);
        assert_eq!(read_json::<serde_json::Value>(&d.path().join("none.json")), None);
    }

    /// A FIFO under a rank log's name is skipped (reading it would wait forever), and a large
    /// log is read at its head and tail only.
    #[test]
    fn fifos_are_skipped_and_large_logs_read_in_part() {
        let d = tempfile::tempdir().unwrap();
        let c = std::ffi::CString::new(d.path().join("rank0.jsonl").to_str().unwrap()).unwrap();
        // SAFETY: mkfifo(3) with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert_eq!(read_logs(d.path()).ranks_seen, 0);
        // Numbered lines of 21 bytes, which do not divide the head or the tail: the part must be
        // whole lines, the file's first ones and then its last ones, and no more than both sizes.
        let big = d.path().join("rank1.jsonl");
        let line = |i: usize| format!("{{\"n\": {i:013}}}\n");
        let n = (LOG_HEAD + LOG_TAIL) as usize * 2 / line(0).len();
        std::fs::write(&big, (0..n).map(line).collect::<String>()).unwrap();
        let part = String::from_utf8(head_and_tail(&big).unwrap()).unwrap();
        assert!(part.len() as u64 <= LOG_HEAD + LOG_TAIL, "{}", part.len());
        let numbers: Vec<usize> = part
            .lines()
            .map(|l| l.strip_prefix("{\"n\": ").and_then(|r| r.strip_suffix('}')).unwrap().parse().unwrap())
            .collect();
        let head = numbers.iter().take_while(|&&k| k < n / 2).count();
        assert_eq!(numbers[..head], (0..head).collect::<Vec<_>>()[..], "the head is the first lines");
        assert_eq!(
            numbers[head..],
            (n - (numbers.len() - head)..n).collect::<Vec<_>>()[..],
            "the tail is the last lines"
        );
        assert!(head as u64 * 21 > LOG_HEAD - 21 && (numbers.len() - head) as u64 * 21 > LOG_TAIL - 42);
        // A file within both sizes is read whole.
        let small = d.path().join("rank2.jsonl");
        std::fs::write(&small, (0..1000).map(line).collect::<String>()).unwrap();
        assert_eq!(head_and_tail(&small).unwrap().len(), 1000 * 21);
    }

    /// Rank logs of `run` for the run folder `dir`, rank 0's `end` carrying `summary` when given.
    fn write_logs(dir: &Path, run: &zerobench_ingest::synth::SynthRun, summary: Option<Summary>, extra: &[Record]) {
        let logs = dir.join(LOG_DIR);
        run.write(&logs).unwrap();
        if summary.is_none() && extra.is_empty() {
            return;
        }
        for rank in 0..run.world_size {
            let mut recs = run.records(rank);
            for r in &mut recs {
                if let (Record::End(e), 0) = (r, rank) {
                    e.summary = summary;
                }
            }
            recs.extend(extra.iter().filter(|r| r.rank() == rank).cloned());
            let text: String = recs.iter().map(|r| serde_json::to_string(r).unwrap() + "\n").collect();
            std::fs::write(logs.join(format!("rank{rank}.jsonl")), text).unwrap();
        }
    }

    // In a process of its own: it puts stub `squeue`, `sacct` and `scontrol` first on PATH.
    rusty_fork_test! {
        /// Each source places the runs the earlier ones could not: squeue (an array task listed
        /// as a range), then sacct (asked only about the rest; a job it was not asked about is
        /// ignored), then scontrol (whose output counts only when it succeeds), then the run
        /// folder: the job's output file, the ranks' logs, `local.json`. Details come from the
        /// logs (the first failure, progress, rank 0's summary) or the local record.
        #[test]
        fn each_source_places_the_runs_the_earlier_ones_could_not() {
            use zerobench_ingest::synth::{Fate, SynthRun};
            use zerobench_schema::job::LocalRecord;
            use zerobench_schema::log::{ErrorClass, ErrorRecord, SCHEMA_VERSION};
            let tmp = tempfile::tempdir().unwrap();
            let bin = tmp.path().join("bin");
            std::fs::create_dir(&bin).unwrap();
            let asked = tmp.path().join("asked");
            stub(&bin, "squeue", "echo '101|RUNNING'; echo '102_[3-4%1]|PENDING'; echo '555|RUNNING'");
            stub(&bin, "sacct", &format!("echo \"$*\" >> {}\nprintf '103|COMPLETED\\n999|FAILED\\n'", asked.display()));
            stub(
                &bin,
                "scontrol",
                "case $4 in\n  104) echo 'JobId=104 JobName=r JobState=TIMEOUT Reason=TimeLimit' ;;\n  \
                 105) echo 'JobId=105 JobState=COMPLETED'; exit 1 ;;\n  \
                 *) echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1 ;;\nesac",
            );
            first_on_path(&bin);

            let (plan, dirs) = render_sweep(
                "cluster: {gpus_per_node: 2, gpu_memory: 16GiB}\nsweep:\n  models: tiny\n  stages: [0, 1, 2, 3]\n  micro_batches: [1, 2, 4]\n",
                &tmp.path().join("out"),
            );
            assert_eq!(dirs.len(), 12);
            let synth = |i: usize, fate: Fate| {
                let r = &plan.runs[i];
                SynthRun { fate, ..SynthRun::new(&r.id, r.config.clone(), r.world_size(), 12.5) }
            };
            let steps = plan.runs[0].config.steps;
            let job = |i: usize, id: &str| submitted(&dirs[i], id);
            let summary =
                Summary { steps, step_ms_median: 12.5, tokens_per_s: 4096.0, final_loss: Some(2.25), peak_allocated_bytes: None };
            let said = "median step 12.5 ms, 4096 tokens/s, final loss 2.2500";
            let local = |i: usize, code: i32| {
                let rec: LocalRecord =
                    serde_json::from_value(serde_json::json!({"exit_code": code, "seconds": 3.0})).unwrap();
                std::fs::write(dirs[i].join(LOCAL_RECORD), serde_json::to_string(&rec).unwrap()).unwrap();
                rec.describe()
            };
            job(0, "101");
            write_logs(&dirs[0], &synth(0, Fate::Killed { after: 3 }), None, &[]);
            job(1, "102_3");
            job(2, "103");
            write_logs(&dirs[2], &synth(2, Fate::Ok), Some(summary), &[]);
            job(3, "104");
            job(4, "105");
            std::fs::write(dirs[4].join("r-105.out"), "slurmstepd: error: *** JOB 105 ON vm CANCELLED AT 2026-01-01T00:00:00 ***\n")
                .unwrap();
            job(5, "106");
            write_logs(&dirs[5], &synth(5, Fate::Oom { rank: 1, step: 2 }), None, &[]);
            job(6, "107");
            write_logs(&dirs[7], &synth(7, Fate::Ok), Some(summary), &[]);
            let exited_0 = local(7, 0);
            let exited_1 = local(8, 1);
            // Two ranks report errors: the first rank's is the one shown.
            let second = Record::Error(ErrorRecord {
                v: SCHEMA_VERSION,
                ts: 9.0,
                rank: 1,
                class: ErrorClass::Terminated,
                message: "stopped".into(),
                step: None,
                requested_bytes: None,
                memory: None,
            });
            write_logs(&dirs[9], &synth(9, Fate::Failed { rank: 0, step: 2 }), None, &[second]);
            write_logs(&dirs[10], &synth(10, Fate::Ok), None, &[]);

            let rows = status(&dirs).unwrap();
            let got: Vec<(State, &str, &str)> = rows.iter().map(|r| (r.state, r.source, r.detail.as_str())).collect();
            let after = format!("2/2 rank logs, 2 ended, step {}", steps - 1);
            assert_eq!(
                got,
                [
                    (State::Running, "squeue", "2/2 rank logs, 0 ended, step 2"),
                    (State::Pending, "squeue", ""),
                    (State::Done, "sacct", said),
                    (State::Timeout, "scontrol", ""),
                    (State::Cancelled, "output", ""),
                    (State::Oom, "logs", "rank 1: oom: CUDA out of memory. Tried to allocate 2.00 GiB"),
                    (State::Unknown, "none", ""),
                    (State::Done, "local", said),
                    (State::Failed, "local", exited_1.as_str()),
                    (State::Failed, "logs", "rank 0: comm: NCCL error: remote process exited"),
                    (State::Done, "logs", after.as_str()),
                    (State::Unsubmitted, "none", ""),
                ]
            );
            // The run that went well shows its summary, not its record's "exit 0".
            assert_ne!(exited_0, said);
            let ids: Vec<Option<&str>> = rows.iter().map(|r| r.job_id.as_deref()).collect();
            let listed = ["101", "102_3", "103", "104", "105", "106", "107"].map(Some);
            assert_eq!((&ids[..7], ids[7]), (&listed[..], None));
            // sacct was asked once, about the jobs squeue did not know.
            assert_eq!(std::fs::read_to_string(&asked).unwrap(), "-n -P -X -o JobID,State -j 103,104,105,106,107\n");
            // Asked about one job, sacct's line for it is taken and the other job's is not.
            let one = status(&dirs[2..3]).unwrap();
            assert_eq!((one[0].state, one[0].source), (State::Done, "sacct"));
            // A submission whose slurm.json could not be written: its mark's job is asked about,
            // and a mark with no job is a run that may be in Slurm, not one never submitted.
            std::fs::write(dirs[11].join(crate::submit::SUBMITTING), "555\n").unwrap();
            let marked = status(&dirs[11..]).unwrap();
            assert_eq!((marked[0].state, marked[0].source, marked[0].job_id.as_deref()), (State::Running, "squeue", Some("555")));
            std::fs::write(dirs[11].join(crate::submit::SUBMITTING), "").unwrap();
            let marked = status(&dirs[11..]).unwrap();
            assert_eq!((marked[0].state, marked[0].source), (State::Unknown, "submit"));
            assert!(marked[0].detail.contains("may have reached Slurm"), "{}", marked[0].detail);
        }
    }

    // In a process of its own: it puts a stub `sacct` first on PATH.
    rusty_fork_test! {
        /// A run whose job failed (exit 3) by `local`'s record or by Slurm, and whose rank's `end`
        /// says oom, is `oom`, as ingest shows it; it was `failed` until Slurm forgot the job.
        #[test]
        fn a_failed_job_whose_rank_ended_oom_is_oom() {
            use zerobench_ingest::synth::{Fate, SynthRun};
            use zerobench_schema::job::LocalRecord;
            let tmp = tempfile::tempdir().unwrap();
            let bin = tmp.path().join("bin");
            std::fs::create_dir(&bin).unwrap();
            stub(&bin, "squeue", "true");
            stub(&bin, "sacct", "printf '201|FAILED\\n'");
            first_on_path(&bin);
            let (plan, dirs) =
                render_sweep("sweep:\n  models: tiny\n  stages: [0, 3]\n", &tmp.path().join("out"));
            for (i, r) in plan.runs.iter().enumerate() {
                let oom = SynthRun { fate: Fate::Oom { rank: 0, step: 1 }, ..SynthRun::new(&r.id, r.config.clone(), r.world_size(), 5.0) };
                write_logs(&dirs[i], &oom, None, &[]);
            }
            let rec: LocalRecord = serde_json::from_value(serde_json::json!({"exit_code": 3, "seconds": 2.0})).unwrap();
            std::fs::write(dirs[0].join(LOCAL_RECORD), serde_json::to_string(&rec).unwrap()).unwrap();
            submitted(&dirs[1], "201");
            let rows = status(&dirs).unwrap();
            let got: Vec<(State, &str)> = rows.iter().map(|r| (r.state, r.source)).collect();
            assert_eq!(got, [(State::Oom, "local"), (State::Oom, "sacct")]);
            assert!(rows[1].detail.contains("oom"), "{}", rows[1].detail);
        }
    }

    /// A run whose rank 1 started and stopped without an `end` while rank 0 ended is reported with
    /// that rank, even when rank 1's `start` sits in a log too large to read whole (its head) and
    /// rank 0's `end` at the end of one (its tail).
    #[test]
    fn a_rank_that_stopped_is_found_at_either_end_of_a_large_log() {
        let d = tempfile::tempdir().unwrap();
        let config =
            zerobench_schema::RunConfig::new(zerobench_schema::ModelPreset::Tiny, zerobench_schema::ZeroStage::Z0);
        let run = zerobench_ingest::synth::SynthRun::new("r", config, 2, 1.0);
        let start = |rank: u32| serde_json::to_string(&run.records(rank)[0]).unwrap() + "\n";
        let end = |rank: u32| {
            format!(
                "{{\"event\":\"end\",\"v\":1,\"ts\":1.0,\"rank\":{rank},\"status\":\"ok\",\"steps_completed\":0,\"exit_code\":0}}\n"
            )
        };
        // Lines that are not records (skipped) pad each log past what is read whole.
        let pad = "x".repeat(1023) + "\n";
        let padding = pad.repeat(((LOG_HEAD + LOG_TAIL) / 1024 + 16) as usize);
        std::fs::write(d.path().join("rank0.jsonl"), start(0) + &padding + &end(0)).unwrap();
        std::fs::write(d.path().join("rank1.jsonl"), start(1) + &padding).unwrap();
        let logs = read_logs(d.path());
        assert_eq!(logs.ends.keys().copied().collect::<Vec<_>>(), [0]);
        assert_eq!(logs.failure.as_deref(), Some("rank 1 (before its first step) stopped without an end record"));
        assert_eq!(logs.verdict(2), Some(State::Failed));
    }

    #[test]
    fn slurm_states_map_to_ours() {
        assert_eq!(State::from_slurm("PENDING"), State::Pending);
        assert_eq!(State::from_slurm("COMPLETING"), State::Running);
        assert_eq!(State::from_slurm("COMPLETED"), State::Done);
        assert_eq!(State::from_slurm("OUT_OF_MEMORY"), State::Oom);
        assert_eq!(State::from_slurm("DEADLINE"), State::Timeout);
        assert_eq!(State::from_slurm("NOT_A_STATE"), State::Unknown);
        assert_eq!(State::from_slurm("CANCELLED by 0"), State::Cancelled);
        assert_eq!(State::from_slurm("CANCELLED+"), State::Cancelled);
        assert_eq!(State::from_slurm("TIMEOUT"), State::Timeout);
        assert_eq!(State::from_slurm("WHATEVER"), State::Unknown);
    }

    #[test]
    fn array_ids_expand() {
        assert_eq!(expand_array_id("12_[0-2,5%2]"), ["12_0", "12_1", "12_2", "12_5"]);
        assert_eq!(expand_array_id("12_3"), ["12_3"]);
        assert_eq!(expand_array_id("12"), ["12"]);
    }

    #[test]
    fn only_rank_logs_count_as_ranks() {
        let d = tempfile::tempdir().unwrap();
        let end = |rank: u32| {
            format!(
                "{{\"event\":\"end\",\"v\":1,\"ts\":1.0,\"rank\":{rank},\"status\":\"oom\",\"steps_completed\":0,\"exit_code\":3}}\n"
            )
        };
        std::fs::write(d.path().join("rank0.jsonl"), end(0)).unwrap();
        // Not rank logs, though they look like them at either end.
        std::fs::write(d.path().join("rankx.jsonl"), end(1)).unwrap();
        std::fs::write(d.path().join("rank.jsonl"), end(2)).unwrap();
        let logs = read_logs(d.path());
        assert_eq!(logs.ranks_seen, 1);
        assert_eq!(logs.ends.keys().copied().collect::<Vec<_>>(), [0]);
        assert_eq!(logs.failure.as_deref(), Some("rank 0: ended oom (exit 3)"));
    }

    #[test]
    fn output_files_tell_timeouts_and_cancellations() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(
            d.path().join("r-12.out"),
            "x\nslurmstepd: error: *** JOB 12 ON vm CANCELLED AT 2026-01-01T00:00:00 DUE TO TIME LIMIT ***\n",
        )
        .unwrap();
        std::fs::write(
            d.path().join("r-13.out"),
            "slurmstepd: error: *** JOB 13 ON vm CANCELLED AT 2026-01-01T00:00:00 ***\n",
        )
        .unwrap();
        std::fs::write(d.path().join("a-14_1.out"), "fine\n").unwrap();
        assert_eq!(output_verdict(d.path(), "12", &mut Outputs::default()), Some(State::Timeout));
        assert_eq!(output_verdict(d.path(), "13", &mut Outputs::default()), Some(State::Cancelled));
        assert_eq!(output_verdict(d.path(), "14_1", &mut Outputs::default()), None);
        assert_eq!(output_verdict(d.path(), "99", &mut Outputs::default()), None);
        // An array task of the mpirun or pdsh method: slurmstepd's line is in the task's own
        // output, in the output folder above the run folder (it was `unknown` once Slurm forgot).
        let run = d.path().join("run-a");
        std::fs::create_dir(&run).unwrap();
        std::fs::write(run.join("zerobench-array-0-8_0.out"), "the script's output\n").unwrap();
        std::fs::write(
            d.path().join("zerobench-array-0-8_0.out"),
            "slurmstepd: error: *** JOB 9 ON vm CANCELLED AT 2026-01-01T00:00:00 DUE TO TIME LIMIT ***\n",
        )
        .unwrap();
        assert_eq!(output_verdict(&run, "8_0", &mut Outputs::default()), Some(State::Timeout));
        assert_eq!(output_verdict(&run, "8_1", &mut Outputs::default()), None);
    }
}
