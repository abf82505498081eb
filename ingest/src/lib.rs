//! Log folders to tables: per-stage latency and memory, scaling efficiency, communication share
//! and plots, from zerobench's worker logs and, beside them, DeepSpeed, Hugging Face Trainer and
//! nvidia-smi logs.
//!
//! The pipeline, one module per step:
//! 1. [`discover`]: walk the folders, group `rank<N>.jsonl` files by folder, find foreign logs;
//! 2. [`plan`]: read each rank's `start` record, group ranks into runs and check they agree;
//! 3. [`read`]: parse every log in parallel byte ranges, folding records into per-run
//!    accumulators ([`acc`]) as they stream by;
//! 4. [`aggregate`] and [`status`]: turn each run's sums into its row; [`foreign`] does the same
//!    for foreign logs;
//! 5. [`tables`] and [`scaling`]: the latency, memory, scaling, comm and runs tables;
//!    [`report`] writes them as CSV, Markdown, JSON, SVG plots and a terminal summary.
//!
//! Nothing stops on bad input: every problem is kept as a [`Problem`] with its file and line and
//! the rest is read. `docs/ingest.md` defines every column.

pub mod acc;
pub mod aggregate;
pub mod discover;
pub mod fastpath;
pub mod foreign;
pub mod lines;
pub mod peak;
pub mod plan;
pub mod predicted;
pub mod problem;
pub mod read;
pub mod record;
pub mod report;
pub mod run;
pub mod scaling;
pub mod side;
pub mod stats;
pub mod status;
#[cfg(feature = "synth")]
pub mod synth;
pub mod tables;

use std::path::PathBuf;

pub use aggregate::Settings;
pub use peak::PeakTable;
pub use problem::{Problem, ProblemKind};
pub use read::ReadStats;
pub use run::{CollectiveRow, RunReport, RunRow, Source, Status};

/// How to read.
#[derive(Debug, Clone)]
pub struct Options {
    /// Steps with an index below this are warmup and left out of every figure.
    pub warmup: Option<u32>,
    pub peaks: PeakTable,
    /// Largest byte range of a log parsed as one piece of parallel work.
    pub chunk_bytes: u64,
    /// Folders not to read even when inside an input folder: the output folder, whose earlier
    /// tables (CSV) would otherwise be read as candidate foreign logs.
    pub skip: Vec<PathBuf>,
}

impl Default for Options {
    fn default() -> Self {
        Options { warmup: None, peaks: PeakTable::default(), chunk_bytes: 32 << 20, skip: Vec::new() }
    }
}

/// Told how far reading has got (the front end draws a progress bar from it).
pub trait Progress: Sync {
    /// Called once, before reading, with the bytes to read.
    fn start(&self, total_bytes: u64);
    /// Called as byte ranges are done.
    fn advance(&self, bytes: u64);
}

/// No progress reporting.
pub struct NoProgress;

impl Progress for NoProgress {
    fn start(&self, _: u64) {}
    fn advance(&self, _: u64) {}
}

/// Everything read from the folders.
#[derive(Debug, Clone)]
pub struct Ingested {
    /// Every run, sorted by model, stage, offload, micro-batch, GPUs and run id, with its figures
    /// at full precision ([`tables::Tables`] rounds them for output).
    pub runs: Vec<RunReport>,
    /// Everything that could not be read, sorted by file and line.
    pub problems: Vec<Problem>,
    pub stats: ReadStats,
}

impl Ingested {
    /// Whether everything was read.
    pub fn complete(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Reads every log under `roots`.
pub fn ingest(roots: &[PathBuf], opts: &Options, progress: &dyn Progress) -> Ingested {
    let found = discover::discover(roots, &opts.skip);
    let mut problems = found.problems;
    let plans = plan::plan(&found.run_dirs, &mut problems);
    let foreign_bytes: u64 = found
        .foreign_dirs
        .iter()
        .flat_map(|d| &d.files)
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum();
    let log_bytes: u64 = plans.iter().flat_map(|p| &p.files).map(|f| f.len).sum();
    progress.start(log_bytes + foreign_bytes);
    let read_opts = read::ReadOptions { warmup: opts.warmup, chunk_bytes: opts.chunk_bytes };
    let settings = Settings { warmup: opts.warmup, peaks: opts.peaks.clone() };
    let (finished, read_problems, mut stats) = read::read_runs(&plans, read_opts, &|b| progress.advance(b), &|p, a| {
        (aggregate::finish(p, &a, &settings), aggregate::run_problems(p, &a, &settings))
    });
    problems.extend(read_problems);
    let (mut runs, run_problems): (Vec<RunReport>, Vec<Vec<Problem>>) = finished.into_iter().unzip();
    problems.extend(run_problems.into_iter().flatten());
    let (foreign_runs, foreign_problems, foreign_stats) = foreign::read_dirs(&found.foreign_dirs, &settings);
    progress.advance(foreign_bytes);
    runs.extend(foreign_runs);
    problems.extend(foreign_problems);
    stats.add(&foreign_stats);
    distinct_run_ids(&mut runs, &mut problems);
    runs.sort_by(|a, b| run_order(&a.row).cmp(&run_order(&b.row)));
    // By file and line, a file's "more problems" note after its listed lines.
    problems.sort_by(|a, b| {
        let key = |p: &Problem| (p.path.clone(), matches!(p.kind, ProblemKind::More { .. }), p.line, p.kind.clone());
        key(a).cmp(&key(b))
    });
    // A missing root given twice is reported twice, and roots that overlap through a link walk
    // the same folders: discover reads each file once but meets their problems on every walk.
    problems.dedup();
    Ingested { runs, problems, stats }
}

type RunKey<'a> = (&'a str, Option<u8>, &'a str, Option<u32>, Option<u32>, &'a str, &'a str);

fn run_order(r: &RunRow) -> RunKey<'_> {
    let offload = r.offload.map_or("?", |o| o.as_str());
    (&r.model, r.stage.map(|s| s.index()), offload, r.micro_batch, r.gpus, &r.run_id, &r.dir)
}

/// Names apart the runs that share a run id (two sweeps copied side by side, a run read twice
/// through two roots that overlap is not one: it has one folder): each keeps its row, its id
/// qualified by its folder, and the clash is reported.
fn distinct_run_ids(runs: &mut [RunReport], problems: &mut Vec<Problem>) {
    let mut by_id: std::collections::BTreeMap<String, Vec<usize>> = std::collections::BTreeMap::new();
    for (i, r) in runs.iter().enumerate() {
        by_id.entry(r.row.run_id.clone()).or_default().push(i);
    }
    for (id, idx) in by_id.into_iter().filter(|(_, v)| v.len() > 1) {
        for (k, &i) in idx.iter().enumerate() {
            let other = &runs[idx[if k == 0 { 1 } else { 0 }]].row.dir;
            problems.push(Problem::file(
                &runs[i].row.dir,
                ProblemKind::DuplicateRunId { run_id: id.clone(), other: other.clone() },
            ));
        }
        for &i in &idx {
            let r = &mut runs[i];
            r.row.run_id = format!("{id}@{}", r.row.dir);
            for c in &mut r.collectives {
                c.run_id.clone_from(&r.row.run_id);
            }
            for m in &mut r.memory_phases {
                m.run_id.clone_from(&r.row.run_id);
            }
        }
    }
}
