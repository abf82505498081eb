//! Problems: what could not be read, where, and why.
//!
//! A problem never stops ingest: the line, file or run it concerns is left out (or counted as
//! incomplete) and everything else goes on. Every problem is kept with its file and, where it
//! concerns one line, the 1-based line number, so a user can open the file at that line.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use zerobench_schema::log::{version_supported, LineError, SCHEMA_VERSION};

/// One thing that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Problem {
    pub path: PathBuf,
    /// 1-based line number, when the problem is about one line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u64>,
    pub kind: ProblemKind,
}

impl Problem {
    pub fn file(path: impl Into<PathBuf>, kind: ProblemKind) -> Self {
        Self { path: path.into(), line: None, kind }
    }
    pub fn at_line(path: impl Into<PathBuf>, line: u64, kind: ProblemKind) -> Self {
        Self { path: path.into(), line: Some(line), kind }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(l) => write!(f, "{}:{}: {}", self.path.display(), l, self.kind),
            None => write!(f, "{}: {}", self.path.display(), self.kind),
        }
    }
}

/// Why something could not be read. The text of each variant is what the user sees.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, thiserror::Error)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ProblemKind {
    /// A compressed log (`rank0.jsonl.gz`, `slurm-1.out.zst`): ingest reads logs as written.
    #[error("compressed log, not read: decompress it to {inner} and ingest again")]
    Compressed { inner: String },

    /// Opening, reading or listing failed (permissions, vanished file, I/O error).
    #[error("cannot read: {message}")]
    Io { message: String },
    /// The folder walk found a symbolic link that leads back to one of its own ancestors.
    #[error("symbolic link loop, not followed: {message}")]
    SymlinkLoop { message: String },
    /// A symbolic link under an input folder leads outside every folder given: not followed
    /// (`ln -s / everything` would otherwise read the whole machine).
    #[error("symbolic link to {target}, outside the folders given: not followed")]
    LinkOutside { target: String },
    /// The line is not a JSON object of a record this build knows.
    #[error("not a valid record: {message}")]
    BadLine { message: String },
    /// The record claims a schema version this build does not read (`supported` is the newest it
    /// does; it reads back to `zerobench_schema::log::OLDEST_READ_VERSION`).
    #[error(
        "schema version {found} is not supported (this build reads versions {} to {supported})",
        zerobench_schema::log::OLDEST_READ_VERSION
    )]
    Version { found: u64, supported: u32 },
    /// The record has no `v` field at all.
    #[error("record has no schema version (`v`)")]
    NoVersion,
    /// The line is longer than the limit; it is skipped without being held in memory.
    #[error("line of {bytes} bytes or more exceeds the {limit}-byte limit; skipped")]
    LineTooLong { bytes: u64, limit: u64 },
    /// The file ends in the middle of a line that is not valid on its own (a killed writer).
    #[error("truncated last line (no newline): {message}")]
    Truncated { message: String },
    /// No `start` record in the first part of a rank file, so the file cannot be attributed.
    #[error("no start record found; the file's rank and run are unknown")]
    NoStart,
    /// A record's rank differs from the rank of the file it is in.
    #[error("record of rank {found} in the log of rank {expected}; skipped")]
    WrongRank { expected: u32, found: u32 },
    /// Two files claim the same rank of one run; the second is skipped.
    #[error("rank {rank} already read from {other}; skipped")]
    DuplicateRank { rank: u32, other: String },
    /// A rank's start record disagrees with the run's (different world size or configuration).
    #[error("start record disagrees with rank {reference_rank}: {what}; skipped")]
    Inconsistent { reference_rank: u32, what: String },
    /// A step number beyond the run's configured number of steps.
    #[error("step {step} is beyond the {steps} steps the run was configured for; skipped")]
    StepOutOfRange { step: u32, steps: u32 },
    /// A rank log holds more measured step records than there are steps between its first and
    /// last: steps logged twice (a log appended to itself, a run restarted into its old log).
    #[error(
        "{records} measured step records for the {steps} steps {first}-{last}: steps logged more than once \
         (a log appended to itself, or a run restarted into its old log)"
    )]
    RepeatedSteps { records: u64, steps: u64, first: u32, last: u32 },
    /// A `start` record after the first of a rank log: a run restarted into its old log, or
    /// another run's log appended (`other_run` names that run where its id differs). The records
    /// after it are read as the first start's run.
    #[error(
        "another start record{}: a run restarted into this log, or another run's log appended; \
         its records are read as this run's",
        other_run.as_ref().map(|id| format!(" (run {id})")).unwrap_or_default()
    )]
    AnotherStart {
        #[serde(skip_serializing_if = "Option::is_none")]
        other_run: Option<String>,
    },
    /// `--warmup` at or past the run's configured steps: none is measured, so the run has no
    /// time, throughput or communication figure.
    #[error("--warmup {warmup} leaves none of the run's {steps} steps measured: no time figure")]
    NothingMeasured { warmup: u32, steps: u32 },
    /// Rank files that the run's world size says should exist are absent.
    #[error("{count} of {world_size} rank logs of run {run_id} missing (ranks {ranks})")]
    MissingRanks { run_id: String, count: u64, world_size: u32, ranks: String },
    /// A file's own `run.json`, `job.json` or similar side file is unreadable.
    #[error("side file ignored: {message}")]
    SideFile { message: String },
    /// A log could belong to several runs and is attributed to none.
    #[error("{message}")]
    Ambiguous { message: String },
    /// Two runs of the input carry one run id; both are kept, each named with its folder.
    #[error("run id {run_id} is also the id of the run in {other}; both kept, named with their folders")]
    DuplicateRunId { run_id: String, other: String },
    /// More problems in this file than are listed; they are counted, not kept.
    #[error("{count} more problems in this file not listed")]
    More { count: u64 },
}

/// The version of any record: enough to tell an unknown version from a broken line.
#[derive(Debug, Deserialize)]
struct Envelope {
    #[serde(default)]
    v: Option<u64>,
}

/// Why `bytes`, which the schema's parser refused with `err`, is not a record: an unknown
/// version, a missing version, or something else, with serde's message.
pub fn classify_bad_line(bytes: &[u8], err: LineError) -> ProblemKind {
    let e = match err {
        LineError::Version { found } => {
            return ProblemKind::Version { found: u64::from(found), supported: SCHEMA_VERSION };
        }
        LineError::Json(e) => e,
        other => return ProblemKind::BadLine { message: other.to_string() },
    };
    // A record of another version may not fit this version's types, so its version is read on
    // its own; a line that has none of this shape is reported with the parser's message.
    match serde_json::from_slice::<Envelope>(bytes) {
        Ok(Envelope { v: None }) => ProblemKind::NoVersion,
        Ok(Envelope { v: Some(v) }) if !version_supported(v) => {
            ProblemKind::Version { found: v, supported: SCHEMA_VERSION }
        }
        _ => ProblemKind::BadLine { message: zerobench_schema::log::explain(bytes).unwrap_or_else(|| e.to_string()) },
    }
}
