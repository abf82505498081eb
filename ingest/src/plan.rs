//! Phase one: who is who. Reads the `start` record at the top of every rank log and groups the
//! logs of a folder into runs by `run_id`, checking that their ranks agree.
//!
//! A run's identity (configuration, world size, nodes) comes from the start record of its lowest
//! rank. A rank log whose start record is unreadable still joins its folder's run when the folder
//! holds only one run; a log that disagrees with the run (another world size or configuration)
//! or repeats a rank is reported and left out.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use zerobench_schema::log::{parse_line, Record, Start};

use crate::discover::{RankFile, RunDir};
use crate::lines::{for_each_line, Line, MAX_LINE};
use crate::problem::{classify_bad_line, Problem, ProblemKind};
use crate::side::{job_state, JobState};
use std::ops::ControlFlow;

/// Where the start record is looked for: it is the first line the worker writes.
const START_WINDOW: u64 = 1 << 20;

/// A run to read: its identity and its rank logs.
#[derive(Debug, Clone)]
pub struct RunPlan {
    pub dir: PathBuf,
    /// The start record of the lowest rank that has one.
    pub start: Start,
    pub files: Vec<PlannedFile>,
    /// Ranks below the world size with no log, as inclusive ranges ([`missing_ranges`]).
    pub missing_ranks: Vec<(u32, u32)>,
    pub job_state: Option<JobState>,
}

/// One rank log of a run.
#[derive(Debug, Clone)]
pub struct PlannedFile {
    pub path: PathBuf,
    pub rank: u32,
    pub len: u64,
}

/// Groups the rank logs of every folder into runs.
pub fn plan(dirs: &[RunDir], problems: &mut Vec<Problem>) -> Vec<RunPlan> {
    let starts: Vec<(usize, usize, Result<Option<Start>, Problem>)> = dirs
        .par_iter()
        .enumerate()
        .flat_map_iter(|(d, dir)| dir.rank_files.iter().enumerate().map(move |(f, rf)| (d, f, read_start(&rf.path))))
        .collect();
    let mut by_dir: Vec<Vec<(&RankFile, StartRead)>> = dirs.iter().map(|_| Vec::new()).collect();
    for (d, f, res) in starts {
        let start = match res {
            Ok(Some(s)) => StartRead::Found(Box::new(s)),
            Ok(None) => StartRead::Absent,
            Err(p) => {
                problems.push(p);
                StartRead::Reported
            }
        };
        by_dir[d].push((&dirs[d].rank_files[f], start));
    }
    let mut plans = Vec::new();
    for (dir, files) in dirs.iter().zip(by_dir) {
        plans.extend(plan_dir(&dir.dir, files, problems));
    }
    plans
}

/// What phase one found at the top of a rank log.
enum StartRead {
    Found(Box<Start>),
    /// No start record.
    Absent,
    /// A start record that could not be read, already reported.
    Reported,
}

fn plan_dir(dir: &Path, files: Vec<(&RankFile, StartRead)>, problems: &mut Vec<Problem>) -> Vec<RunPlan> {
    // Runs of this folder by run id, each with the start of its lowest rank.
    let mut runs: BTreeMap<String, Start> = BTreeMap::new();
    for (_, s) in &files {
        if let StartRead::Found(s) = s {
            let e = runs.entry(s.run_id.clone()).or_insert_with(|| (**s).clone());
            if s.rank < e.rank {
                *e = (**s).clone();
            }
        }
    }
    let only_run = if runs.len() == 1 { runs.keys().next().cloned() } else { None };
    let mut members: BTreeMap<String, BTreeMap<u32, PlannedFile>> = BTreeMap::new();
    for (rf, read) in files {
        let no_start = |problems: &mut Vec<Problem>| {
            if matches!(read, StartRead::Absent) {
                problems.push(Problem::file(&rf.path, ProblemKind::NoStart));
            }
        };
        let (run_id, rank) = match (&read, &only_run) {
            (StartRead::Found(s), _) => (s.run_id.clone(), s.rank),
            (_, Some(only)) => (only.clone(), rf.name_rank),
            (_, None) => {
                no_start(problems);
                continue;
            }
        };
        let Some(reference) = runs.get(&run_id) else { continue };
        if let StartRead::Found(s) = &read {
            if let Some(what) = disagreement(reference, s) {
                problems
                    .push(Problem::file(&rf.path, ProblemKind::Inconsistent { reference_rank: reference.rank, what }));
                continue;
            }
        } else {
            no_start(problems);
        }
        if rank >= reference.world_size {
            // A file without a start record was reported as such above: its name's rank is no
            // record's to disagree with.
            if matches!(read, StartRead::Found(_)) {
                let what = format!("rank {rank} is not below world size {}", reference.world_size);
                problems
                    .push(Problem::file(&rf.path, ProblemKind::Inconsistent { reference_rank: reference.rank, what }));
            }
            continue;
        }
        let ranks = members.entry(run_id).or_default();
        if let Some(other) = ranks.get(&rank) {
            problems.push(Problem::file(
                &rf.path,
                ProblemKind::DuplicateRank { rank, other: other.path.display().to_string() },
            ));
            continue;
        }
        ranks.insert(rank, PlannedFile { path: rf.path.clone(), rank, len: rf.len });
    }
    // The side files are the folder's, shared by every run in it: read once.
    let job_state = if runs.is_empty() { None } else { job_state(dir, problems) };
    let mut plans = Vec::new();
    for (run_id, start) in runs {
        let files: Vec<PlannedFile> = members.remove(&run_id).map(|m| m.into_values().collect()).unwrap_or_default();
        let missing_ranks = missing_ranges(start.world_size, files.iter().map(|f| f.rank));
        if !missing_ranks.is_empty() {
            problems.push(Problem::file(
                dir,
                ProblemKind::MissingRanks {
                    run_id: run_id.clone(),
                    count: range_count(&missing_ranks),
                    world_size: start.world_size,
                    ranks: describe_ranges(&missing_ranks),
                },
            ));
        }
        plans.push(RunPlan { dir: dir.to_path_buf(), start, files, missing_ranks, job_state });
    }
    plans
}

/// What makes a rank's start record incompatible with the run's reference, if anything.
fn disagreement(reference: &Start, s: &Start) -> Option<String> {
    if s.world_size != reference.world_size {
        return Some(format!("world size {} instead of {}", s.world_size, reference.world_size));
    }
    if s.config != reference.config {
        return Some("another run configuration".into());
    }
    None
}

/// Ranks as ranges: `[0, 1, 2, 5]` → `0-2,5`.
/// The ranks below `world` that are not in `present`, as inclusive ranges. Their number is at
/// most one more than the ranks present, so a log that claims a world of 2³² − 1 ranks costs what
/// its files hold, not what it claims.
pub fn missing_ranges(world: u32, present: impl IntoIterator<Item = u32>) -> Vec<(u32, u32)> {
    let present: std::collections::BTreeSet<u32> = present.into_iter().filter(|r| *r < world).collect();
    let mut out = Vec::with_capacity(present.len() + 1);
    let mut next = 0u32;
    for r in present {
        if r > next {
            out.push((next, r - 1));
        }
        next = r + 1;
    }
    if next < world {
        out.push((next, world - 1));
    }
    out
}

/// How many ranks `ranges` ([`missing_ranges`]) hold.
pub fn range_count(ranges: &[(u32, u32)]) -> u64 {
    ranges.iter().map(|(a, b)| u64::from(b - a) + 1).sum()
}

/// Ranges written as `0-3,5`, the first `LISTED_RANGES` of them and then how many more.
pub fn describe_ranges(ranges: &[(u32, u32)]) -> String {
    let mut parts: Vec<String> = ranges
        .iter()
        .take(LISTED_RANGES)
        .map(|&(a, b)| if a == b { a.to_string() } else { format!("{a}-{b}") })
        .collect();
    if ranges.len() > LISTED_RANGES {
        parts.push(format!("and {} more ranges", ranges.len() - LISTED_RANGES));
    }
    parts.join(",")
}

/// Ranges of missing ranks named in a message or a table cell; the rest are counted.
const LISTED_RANGES: usize = 8;

/// The first start record near the top of a rank log. A start-looking line that cannot be read
/// is reported here (phase two skips start records).
fn read_start(path: &Path) -> Result<Option<Start>, Problem> {
    let file = File::open(path).map_err(|e| Problem::file(path, ProblemKind::Io { message: e.to_string() }))?;
    let mut found: Option<Start> = None;
    let mut bad: Option<Problem> = None;
    // Small reads: the record wanted is the first line.
    for_each_line(file, 0, START_WINDOW, MAX_LINE, 16 << 10, |n, line| {
        let bytes = match line {
            Line::Full(b) | Line::Unterminated(b) => b,
            Line::TooLong(_) => return ControlFlow::Continue(()),
        };
        if memchr::memmem::find(bytes, b"\"start\"").is_none() {
            return ControlFlow::Continue(());
        }
        match parse_line(bytes) {
            Ok(Record::Start(s)) => {
                found = Some(s);
                return ControlFlow::Break(());
            }
            Ok(_) => {}
            Err(e) => {
                if bad.is_none() {
                    bad = Some(Problem::at_line(path, n, classify_bad_line(bytes, e)));
                }
            }
        }
        ControlFlow::Continue(())
    })
    .map_err(|e| Problem::file(path, ProblemKind::Io { message: e.to_string() }))?;
    match (found, bad) {
        (Some(s), _) => Ok(Some(s)),
        (None, Some(p)) => Err(p),
        (None, None) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_ranks_are_ranges_bounded_by_the_ranks_present() {
        assert_eq!(missing_ranges(8, [0, 3, 4, 7]), [(1, 2), (5, 6)]);
        assert_eq!(missing_ranges(3, []), [(0, 2)]);
        assert_eq!(missing_ranges(3, [0, 1, 2]), []);
        // Ranks at or past the world size are not holes (plan reports them on their own).
        assert_eq!(missing_ranges(2, [5]), [(0, 1)]);
        // The largest rank a log can claim, with the largest world: still past it.
        assert_eq!(missing_ranges(u32::MAX, [u32::MAX]), [(0, u32::MAX - 1)]);
        let huge = missing_ranges(u32::MAX, [0, 2]);
        assert_eq!(huge, [(1, 1), (3, u32::MAX - 1)]);
        assert_eq!(range_count(&huge), u64::from(u32::MAX) - 2);
        assert_eq!(describe_ranges(&huge), "1,3-4294967294");
        let eight: Vec<(u32, u32)> = (0..8).map(|i| (2 * i, 2 * i)).collect();
        assert_eq!(describe_ranges(&eight), "0,2,4,6,8,10,12,14");
        let many: Vec<(u32, u32)> = (0..10).map(|i| (2 * i, 2 * i)).collect();
        assert_eq!(describe_ranges(&many), "0,2,4,6,8,10,12,14,and 2 more ranges");
    }
}
