//! Borrowed views of worker log lines that keep only what ingest aggregates.
//!
//! Most of a log is `step` records, so they get a fast path: the writer serialises the
//! internally tagged `Record` enum, which puts `{"event":"step","v":2,` first on every step line.
//! A line with that exact prefix is scanned straight into [`StepLine`] by [`crate::fastpath`],
//! whose fields borrow from the line. Any other line, and any step line the scanner does not take,
//! goes through the schema crate's own parser, and its steps are turned into a [`StepLine`] with
//! `From<&Step>`: the schema alone decides which lines are valid.

use zerobench_schema::collective::CommKey;
use zerobench_schema::log::{MemorySample, Step};

/// The first bytes of every step line of the current schema version.
pub const STEP_PREFIX: &[u8] = b"{\"event\":\"step\",\"v\":2,";

/// The fields of a `step` record that ingest uses.
#[derive(Debug)]
pub struct StepLine<'a> {
    pub rank: u32,
    pub step: u32,
    pub skipped: bool,
    /// `None` where the record's loss was `null` (not a finite number).
    pub loss: Option<f64>,
    pub tokens: u64,
    pub samples: u64,
    pub step_ms: f64,
    pub forward_ms: f64,
    pub backward_ms: f64,
    pub optimizer_ms: f64,
    pub comm_ms: f64,
    pub exposed_comm_ms: f64,
    /// Version 2: the rest of the step, and the loop's cost before it (0 in version 1 logs).
    pub other_ms: f64,
    pub overhead_ms: f64,
    pub comm: CommLines<'a>,
    pub memory: MemLine,
    pub energy_j: Option<f64>,
    /// NVML's GPU utilisation at the end of the step, percent.
    pub gpu_util_pct: Option<u32>,
}

impl StepLine<'_> {
    /// Times must be finite, not negative and below [`MAX_MS`]; JSON already excludes NaN and
    /// infinities.
    pub fn check(&self) -> Result<(), String> {
        let times = [
            ("step_ms", self.step_ms),
            ("forward_ms", self.forward_ms),
            ("backward_ms", self.backward_ms),
            ("optimizer_ms", self.optimizer_ms),
            ("comm_ms", self.comm_ms),
            ("exposed_comm_ms", self.exposed_comm_ms),
            ("other_ms", self.other_ms),
            ("overhead_ms", self.overhead_ms),
        ];
        for (name, v) in times {
            plausible(v).map_err(|why| format!("{name} {why}"))?;
        }
        for (kind, c) in self.comm.iter() {
            // The name is only formatted for the message.
            plausible(c.ms).map_err(|why| format!("comm.{kind}.ms {why}"))?;
        }
        Ok(())
    }
}

/// The longest duration accepted, in ms (a million seconds, over 11 days): anything longer in a
/// step record is a corrupt value, and would swamp every sum it entered.
pub const MAX_MS: f64 = 1e9;

/// Why a duration is refused, if it is.
fn plausible(v: f64) -> Result<(), String> {
    if v < 0.0 {
        return Err(format!("is negative ({v})"));
    }
    if v > MAX_MS {
        return Err(format!("of {v} ms is implausible (over {MAX_MS} ms)"));
    }
    Ok(())
}

impl<'a> From<&'a Step> for StepLine<'a> {
    fn from(s: &'a Step) -> Self {
        let mut comm = CommLines::default();
        // The keys of a map are distinct: every push adds.
        for (k, c) in &s.comm {
            comm.push(k, CommLine { calls: c.calls, bytes: c.bytes, ms: c.ms });
        }
        StepLine {
            rank: s.rank,
            step: s.step,
            skipped: s.skipped,
            loss: s.loss,
            tokens: s.tokens,
            samples: s.samples,
            step_ms: s.step_ms,
            forward_ms: s.forward_ms,
            backward_ms: s.backward_ms,
            optimizer_ms: s.optimizer_ms,
            comm_ms: s.comm_ms,
            exposed_comm_ms: s.exposed_comm_ms,
            other_ms: s.other_ms,
            overhead_ms: s.overhead_ms,
            comm,
            memory: MemLine::from(&s.memory),
            energy_j: s.energy_j,
            gpu_util_pct: s.gpu_util_pct,
        }
    }
}

/// One collective kind within a step.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CommLine {
    pub calls: u64,
    pub bytes: u64,
    pub ms: f64,
}

/// The `comm` map of a step: every kind the schema defines in a fixed slot, so that the worker's
/// lines allocate nothing, and any other name (a newer writer's) in a list.
#[derive(Debug, Default)]
pub struct CommLines<'a> {
    pub known: [Option<CommLine>; CommKey::COUNT],
    /// Sorted by name.
    pub other: Vec<(&'a str, CommLine)>,
}

impl<'a> CommLines<'a> {
    /// Adds a kind; `false`, changing nothing, if the step already has it. Other names are kept
    /// sorted, as the schema's map keeps them, so that the order of a line's keys never shows.
    pub(crate) fn push(&mut self, name: &'a str, c: CommLine) -> bool {
        match CommKey::from_name(name.as_bytes()) {
            Some(k) => self.push_known(k, c),
            None => match self.other.binary_search_by(|(n, _)| (*n).cmp(name)) {
                Ok(_) => false,
                Err(at) => {
                    self.other.insert(at, (name, c));
                    true
                }
            },
        }
    }

    /// [`Self::push`] of a kind the schema names.
    pub(crate) fn push_known(&mut self, k: CommKey, c: CommLine) -> bool {
        let slot = &mut self.known[k.index()];
        if slot.is_some() {
            return false;
        }
        *slot = Some(c);
        true
    }

    /// Every entry with its name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &CommLine)> {
        let known = CommKey::ALL.iter().zip(&self.known).filter_map(|(k, c)| c.as_ref().map(|c| (k.name(), c)));
        known.chain(self.other.iter().map(|(n, c)| (*n, c)))
    }
}

/// The memory figures of a step that ingest takes peaks of.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemLine {
    pub allocated_bytes: Option<u64>,
    pub peak_allocated_bytes: Option<u64>,
    pub reserved_bytes: Option<u64>,
    pub peak_reserved_bytes: Option<u64>,
    pub nvml_used_bytes: Option<u64>,
    pub rss_bytes: u64,
}

impl From<&MemorySample> for MemLine {
    fn from(m: &MemorySample) -> Self {
        MemLine {
            allocated_bytes: m.allocated_bytes,
            peak_allocated_bytes: m.peak_allocated_bytes,
            reserved_bytes: m.reserved_bytes,
            peak_reserved_bytes: m.peak_reserved_bytes,
            nvml_used_bytes: m.nvml_used_bytes,
            rss_bytes: m.rss_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Durations from 0 to the bound itself are plausible; below 0 or past it they are not.
    #[test]
    fn the_bound_itself_is_plausible() {
        assert!(plausible(0.0).is_ok() && plausible(MAX_MS).is_ok());
        assert!(plausible(-1e-9).is_err() && plausible(MAX_MS * (1.0 + 1e-12)).is_err());
    }
}
