//! Phase two: reading the rank logs in parallel and folding every record into its run.
//!
//! Work is cut into byte ranges of at most `chunk_bytes` (see [`crate::lines`] for how ranges
//! own lines), so one large log keeps every core busy as well as many small ones. Each range is
//! folded into its own small accumulator, which is merged into the run's under a lock once the
//! range is done. When a run's last range is merged, the run is finished there and then (turned
//! into its report) and its accumulator dropped. Ranges are listed run by run and rayon works
//! through the list roughly in order, so only a few runs are open at a time: memory holds their
//! per-step slots plus one accumulator per range in flight, whatever the size of the input.
//!
//! Line numbers in problems are counted per range while reading and made absolute at the end,
//! from the number of lines each earlier range of the same file had.
//!
//! A log's `start` records are noted by every range with their line: the file's first is its
//! own (read in phase one), and every later one (a run restarted into its old log, another
//! run's log appended) is reported once the ranges of the file are put in order, so which
//! start is the first does not depend on where the file was cut.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fs::File;
use std::ops::ControlFlow;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use rayon::prelude::*;
use zerobench_schema::log::{parse_line, LineError, Record};

use crate::acc::{EndInfo, ErrorInfo, RankAcc, StepSet, StepSlot, StepSlots};
use crate::fastpath;
use crate::lines::{for_each_line_in, Line, Window, BLOCK, MAX_LINE};
use crate::plan::RunPlan;
use crate::problem::{classify_bad_line, Problem, ProblemKind};
use crate::record::{MemLine, StepLine, STEP_PREFIX};

/// Problems listed per file; the rest are counted.
pub const MAX_PROBLEMS_PER_FILE: usize = 20;

/// Steps beyond this are refused whatever the configuration says, so a hostile step number
/// cannot make the per-step table of a run large.
pub const MAX_STEPS: u32 = 1 << 22;

/// What phase two needs to know.
#[derive(Debug, Clone, Copy)]
pub struct ReadOptions {
    /// Steps with a lower index are warmup: not measured.
    pub warmup: Option<u32>,
    /// Largest byte range read as one piece of work.
    pub chunk_bytes: u64,
}

/// Everything read about one run.
#[derive(Debug, Default)]
pub struct RunAcc {
    pub slots: StepSlots,
    pub ranks: BTreeMap<u32, RankAcc>,
    /// The steps each rank logged: a step's slot counts a rank once, however often it logged it.
    pub seen: BTreeMap<u32, StepSet>,
}

/// Counts over all logs read.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ReadStats {
    pub files: u64,
    pub bytes: u64,
    pub lines: u64,
    pub bad_lines: u64,
}

impl ReadStats {
    pub fn add(&mut self, o: &ReadStats) {
        self.files += o.files;
        self.bytes += o.bytes;
        self.lines += o.lines;
        self.bad_lines += o.bad_lines;
    }
}

struct Chunk {
    run: usize,
    file: usize,
    start: u64,
    end: u64,
}

/// What a range leaves once merged: its line count, its problems (with lines counted from the
/// range's start) and an I/O error.
struct RangeReport {
    lines: u64,
    problems: Vec<(u64, ProblemKind)>,
    problems_total: u64,
    starts: Vec<StartSeen>,
    starts_total: u64,
    io_error: Option<String>,
}

/// A `start` record seen in a range: its line (from the range's start) and its run id where
/// that differs from the run's.
type StartSeen = (u64, Option<String>);

#[derive(Default)]
struct ChunkOut {
    rank: RankAcc,
    slots: Vec<(u32, StepSlot)>,
    problems: Vec<(u64, ProblemKind)>,
    problems_total: u64,
    /// The range's first start records (one more than the problems listed per file: the file's
    /// own start may be among them), and how many there were.
    starts: Vec<StartSeen>,
    starts_total: u64,
    lines: u64,
    io_error: Option<String>,
}

/// Reads every run's logs and turns each into `R` with `finish` as soon as all of it is read;
/// `progress` is called with the bytes of each range when it is done.
pub fn read_runs<R: Send>(
    plans: &[RunPlan],
    opts: ReadOptions,
    progress: &(dyn Fn(u64) + Sync),
    finish: &(dyn Fn(&RunPlan, RunAcc) -> R + Sync),
) -> (Vec<R>, Vec<Problem>, ReadStats) {
    let chunk_bytes = opts.chunk_bytes.max(1);
    let mut chunks = Vec::new();
    for (r, plan) in plans.iter().enumerate() {
        for (f, file) in plan.files.iter().enumerate() {
            let mut start = 0;
            loop {
                let end = if file.len.saturating_sub(start) > chunk_bytes { start + chunk_bytes } else { u64::MAX };
                chunks.push(Chunk { run: r, file: f, start, end });
                if end == u64::MAX {
                    break;
                }
                start = end;
            }
        }
    }
    let runs: Vec<Mutex<RunAcc>> = plans.iter().map(|_| Mutex::new(RunAcc::default())).collect();
    let mut remaining: Vec<AtomicUsize> = plans.iter().map(|_| AtomicUsize::new(0)).collect();
    for c in &chunks {
        *remaining[c.run].get_mut() += 1;
    }
    let finished: Vec<Mutex<Option<R>>> = plans.iter().map(|_| Mutex::new(None)).collect();
    // A poisoned lock means another range panicked; its run is lost either way.
    let take = |run: usize| std::mem::take(&mut *runs[run].lock().unwrap_or_else(|p| p.into_inner()));
    let done = |run: usize, r: R| *finished[run].lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
    let outs: Vec<RangeReport> = chunks
        .par_iter()
        .map(|c| {
            let plan = &plans[c.run];
            let file = &plan.files[c.file];
            let max_steps = plan.start.config.steps.min(MAX_STEPS);
            let warmup = opts.warmup.unwrap_or(plan.start.config.warmup);
            let ctx = RangeCtx { rank: file.rank, run_id: &plan.start.run_id, warmup, max_steps };
            let out = read_chunk(&file.path, (c.start, c.end.min(file.len)), ctx);
            {
                let mut run = runs[c.run].lock().unwrap_or_else(|p| p.into_inner());
                run.ranks.entry(file.rank).or_default().merge(&out.rank);
                let run = &mut *run;
                let seen = run.seen.entry(file.rank).or_default();
                for (step, slot) in &out.slots {
                    // A record of a step this rank already logged adds its times, not a rank.
                    let ranks = u32::from(seen.insert(*step));
                    run.slots.merge_at(*step, &StepSlot { ranks, ..*slot });
                }
            }
            // The last range of a run finishes it; every other range merged before counting down.
            if remaining[c.run].fetch_sub(1, Ordering::AcqRel) == 1 {
                done(c.run, finish(plan, take(c.run)));
            }
            let bytes = c.end.min(file.len).saturating_sub(c.start);
            progress(bytes);
            RangeReport {
                lines: out.lines,
                problems: out.problems,
                problems_total: out.problems_total,
                starts: out.starts,
                starts_total: out.starts_total,
                io_error: out.io_error,
            }
        })
        .collect();

    let mut stats = ReadStats::default();
    let mut problems = Vec::new();
    // Make line numbers absolute, file by file; ranges of a file are consecutive in `chunks`.
    let mut i = 0;
    while i < chunks.len() {
        let (run, file) = (chunks[i].run, chunks[i].file);
        let path = &plans[run].files[file].path;
        let mut offset = 0u64;
        let mut listed: Vec<Problem> = Vec::new();
        let mut total = 0u64;
        // Start records after the file's first: problems, but not bad lines (their records are read).
        let mut starts_total = 0u64;
        while i < chunks.len() && chunks[i].run == run && chunks[i].file == file {
            let out = &outs[i];
            for (line, kind) in &out.problems {
                listed.push(Problem::at_line(path, offset + line, kind.clone()));
            }
            total += out.problems_total;
            // The file's own start is the first of its first range that saw one.
            let own = usize::from(starts_total == 0 && out.starts_total > 0);
            starts_total += out.starts_total;
            for (line, other_run) in out.starts.iter().skip(own) {
                let kind = ProblemKind::AnotherStart { other_run: other_run.clone() };
                listed.push(Problem::at_line(path, offset + line, kind));
            }
            if let Some(message) = &out.io_error {
                listed.push(Problem::file(path, ProblemKind::Io { message: message.clone() }));
                total += 1;
            }
            offset += out.lines;
            i += 1;
        }
        stats.files += 1;
        stats.lines += offset;
        stats.bytes += plans[run].files[file].len;
        stats.bad_lines += total;
        total += starts_total.saturating_sub(1);
        listed.sort();
        listed.truncate(MAX_PROBLEMS_PER_FILE);
        let more = total.saturating_sub(listed.len() as u64);
        problems.extend(listed);
        if more > 0 {
            problems.push(Problem::file(path, ProblemKind::More { count: more }));
        }
    }
    // Runs without any log to read (every rank log refused) are finished with what is known.
    let reports = finished
        .into_iter()
        .enumerate()
        .map(|(i, m)| m.into_inner().unwrap_or_else(|p| p.into_inner()).unwrap_or_else(|| finish(&plans[i], take(i))))
        .collect();
    (reports, problems, stats)
}

/// What a range's reader knows of its file and run.
struct RangeCtx<'p> {
    rank: u32,
    run_id: &'p str,
    warmup: u32,
    max_steps: u32,
}

fn read_chunk(path: &Path, (start, end): (u64, u64), range: RangeCtx<'_>) -> ChunkOut {
    let mut out = ChunkOut::default();
    // Step records are 500-1000 bytes: sized once instead of grown by copying.
    out.slots.reserve(usize::try_from(end.saturating_sub(start) / 450).unwrap_or(0));
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) => {
            out.io_error = Some(e.to_string());
            return out;
        }
    };
    thread_local! {
        // One read buffer per worker thread, reused by every range it reads.
        static WINDOW: RefCell<Window> = RefCell::new(Window::new(2 * BLOCK));
    }
    let RangeCtx { rank, run_id, warmup, max_steps } = range;
    let mut ctx = LineCtx { rank, run_id, warmup, max_steps, out: &mut out };
    let res = WINDOW.with_borrow_mut(|win| {
        for_each_line_in(win, file, start, end, MAX_LINE, BLOCK, |n, line| {
            ctx.line(n, line);
            ControlFlow::Continue(())
        })
    });
    match res {
        Ok(lines) => out.lines = lines,
        Err(e) => out.io_error = Some(e.to_string()),
    }
    out
}

struct LineCtx<'o> {
    rank: u32,
    run_id: &'o str,
    warmup: u32,
    max_steps: u32,
    out: &'o mut ChunkOut,
}

/// Why a line was not taken: a problem already named, or a line the schema's parser refused,
/// explained (which costs further parses) only if it is among the problems kept.
enum Refused {
    Problem(ProblemKind),
    Unparsed(LineError),
}

impl From<ProblemKind> for Refused {
    fn from(kind: ProblemKind) -> Self {
        Refused::Problem(kind)
    }
}

impl LineCtx<'_> {
    fn problem(&mut self, line: u64, kind: ProblemKind) {
        self.refused(line, Refused::Problem(kind), &[], false);
    }

    /// Counts a refused line; names it only while this chunk keeps problems.
    fn refused(&mut self, line: u64, why: Refused, bytes: &[u8], unterminated: bool) {
        self.out.problems_total += 1;
        if self.out.problems.len() >= MAX_PROBLEMS_PER_FILE {
            return;
        }
        let kind = match why {
            Refused::Problem(kind) => kind,
            Refused::Unparsed(e) => classify_bad_line(bytes, e),
        };
        let kind = match kind {
            ProblemKind::BadLine { message } if unterminated => ProblemKind::Truncated { message },
            k => k,
        };
        self.out.problems.push((line, kind));
    }

    fn line(&mut self, n: u64, line: Line<'_>) {
        let (bytes, unterminated) = match line {
            Line::Full(b) => (b, false),
            Line::Unterminated(b) => (b, true),
            Line::TooLong(len) => {
                self.problem(n, ProblemKind::LineTooLong { bytes: len, limit: MAX_LINE as u64 });
                return;
            }
        };
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        if let Err(why) = self.record(n, bytes) {
            self.refused(n, why, bytes, unterminated);
        }
    }

    fn record(&mut self, n: u64, bytes: &[u8]) -> Result<(), Refused> {
        if bytes.starts_with(STEP_PREFIX) {
            // A step line the scanner does not take is judged by the schema's parser below, like
            // every other line: one rule decides what is valid.
            if let Some(s) = fastpath::parse_step(bytes) {
                return Ok(self.step(&s)?);
            }
        } else if bytes.starts_with(b"{\"event\":\"start\",") {
            // Read in phase one, which reports the first if it cannot be read; here only noted
            // (one line a log, or a few where runs were restarted into it).
            if let Ok(Record::Start(s)) = parse_line(bytes) {
                self.start(n, &s.run_id);
            }
            return Ok(());
        }
        let rec = parse_line(bytes).map_err(Refused::Unparsed)?;
        if let Record::Start(s) = &rec {
            self.start(n, &s.run_id);
            return Ok(());
        }
        if rec.rank() != self.rank {
            return Err(ProblemKind::WrongRank { expected: self.rank, found: rec.rank() }.into());
        }
        match rec {
            // The per-module profile of one step is for people reading the log; no table uses it.
            Record::Start(_) | Record::Profile(_) => {}
            Record::Setup(s) => {
                self.out.rank.mem.add(&MemLine::from(&s.memory));
                self.out.rank.states = Some(crate::acc::StateBytes {
                    device: s.model_state,
                    host_bytes: s.host_state_bytes,
                    buffer_bytes: s.buffers_bytes.values().sum(),
                    param_path: zerobench_schema::memory::ParamPath::logged(&s.buffers_bytes),
                });
            }
            Record::Step(s) => self.step(&StepLine::from(&s))?,
            Record::Eval(e) => self.out.rank.add_eval(e.step, e.loss),
            Record::End(e) => self.out.rank.add_end(EndInfo {
                status: e.status,
                steps_completed: e.steps_completed,
                exit_code: e.exit_code,
            }),
            Record::Error(e) => {
                if let Some(m) = &e.memory {
                    self.out.rank.mem.add(&MemLine::from(m));
                }
                self.out.rank.add_error(ErrorInfo {
                    step: e.step,
                    class: e.class,
                    message: e.message,
                    requested_bytes: e.requested_bytes,
                });
            }
        }
        Ok(())
    }

    /// Notes a start record on line `n`; whether it is the file's own is decided once every range
    /// of the file is read.
    fn start(&mut self, n: u64, run_id: &str) {
        self.out.starts_total += 1;
        if self.out.starts.len() <= MAX_PROBLEMS_PER_FILE {
            let other_run = (run_id != self.run_id).then(|| run_id.to_string());
            self.out.starts.push((n, other_run));
        }
    }

    fn step(&mut self, s: &StepLine<'_>) -> Result<(), ProblemKind> {
        if s.rank != self.rank {
            return Err(ProblemKind::WrongRank { expected: self.rank, found: s.rank });
        }
        if s.step >= self.max_steps {
            return Err(ProblemKind::StepOutOfRange { step: s.step, steps: self.max_steps });
        }
        s.check().map_err(|message| ProblemKind::BadLine { message })?;
        self.out.rank.add_step(s, self.warmup);
        self.out.slots.push((s.step, StepSlot::from_line(s)));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The statistics of several files or ranges add field by field.
    #[test]
    fn read_stats_add_up() {
        let mut a = ReadStats { files: 1, bytes: 100, lines: 10, bad_lines: 1 };
        a.add(&ReadStats { files: 2, bytes: 50, lines: 5, bad_lines: 3 });
        assert_eq!(a, ReadStats { files: 3, bytes: 150, lines: 15, bad_lines: 4 });
    }
}
