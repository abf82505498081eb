//! Accumulators that fold records as they are read, so memory grows with the number of steps of
//! a run, not with the number of ranks or lines.
//!
//! Every merge here is associative and commutative, and exact: maxima, integer sums, and choices
//! by a total order (the lowest step, the highest step, the lowest rank on ties, then the values
//! themselves, so that two records alike in all but those still give one result). Durations are
//! summed as integer nanoseconds for that reason; floating-point sums, whose result depends on
//! their order, are only formed at the end, in step or rank order. So the result is the same
//! whatever order files and byte ranges are read in, and however the files are cut.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use zerobench_schema::collective::CommKey;
use zerobench_schema::log::{ErrorClass, RunStatus};

use crate::record::{MemLine, StepLine};

/// A duration in whole nanoseconds, from milliseconds.
pub fn ms_to_ns(ms: f64) -> u64 {
    // Saturates at both ends; inputs are checked finite and non-negative before.
    (ms * 1e6).round() as u64
}

/// One step over all ranks: maxima of the times (the step is barrier-bound, so the slowest rank
/// sets its pace), the largest token and sample counts (every rank reports the global batch) and
/// which rank was slowest.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepSlot {
    /// Ranks that reported this step.
    pub ranks: u32,
    pub step_ms: f64,
    pub slowest_rank: u32,
    pub forward_ms: f64,
    pub backward_ms: f64,
    pub optimizer_ms: f64,
    pub comm_ms: f64,
    pub exposed_comm_ms: f64,
    pub tokens: u64,
    pub samples: u64,
}

impl Default for StepSlot {
    fn default() -> Self {
        StepSlot {
            ranks: 0,
            step_ms: f64::NEG_INFINITY,
            slowest_rank: u32::MAX,
            forward_ms: f64::NEG_INFINITY,
            backward_ms: f64::NEG_INFINITY,
            optimizer_ms: f64::NEG_INFINITY,
            comm_ms: f64::NEG_INFINITY,
            exposed_comm_ms: f64::NEG_INFINITY,
            tokens: 0,
            samples: 0,
        }
    }
}

impl StepSlot {
    pub fn from_line(s: &StepLine<'_>) -> Self {
        StepSlot {
            ranks: 1,
            step_ms: s.step_ms,
            slowest_rank: s.rank,
            forward_ms: s.forward_ms,
            backward_ms: s.backward_ms,
            optimizer_ms: s.optimizer_ms,
            comm_ms: s.comm_ms,
            exposed_comm_ms: s.exposed_comm_ms,
            tokens: s.tokens,
            samples: s.samples,
        }
    }

    /// The order in which a record takes a step: the longer step, the lower rank on ties, and then
    /// (one rank's step logged twice with one time, as in a log appended to itself with other
    /// phases) the phase times by `f64::total_cmp`, so that the step and its phases come from one
    /// record whatever the order records are merged in. `total_cmp` also tells −0 from +0.
    fn precedence(&self, o: &StepSlot) -> Ordering {
        self.step_ms
            .total_cmp(&o.step_ms)
            .then(o.slowest_rank.cmp(&self.slowest_rank))
            .then(self.forward_ms.total_cmp(&o.forward_ms))
            .then(self.backward_ms.total_cmp(&o.backward_ms))
            .then(self.optimizer_ms.total_cmp(&o.optimizer_ms))
            .then(self.comm_ms.total_cmp(&o.comm_ms))
            .then(self.exposed_comm_ms.total_cmp(&o.exposed_comm_ms))
    }

    pub fn merge(&mut self, o: &StepSlot) {
        // The step is the slowest rank's, and so are its phases: taken from one rank, they add up
        // to its step time (maxima taken field by field from different ranks would not).
        if o.precedence(self) == Ordering::Greater {
            self.step_ms = o.step_ms;
            self.slowest_rank = o.slowest_rank;
            self.forward_ms = o.forward_ms;
            self.backward_ms = o.backward_ms;
            self.optimizer_ms = o.optimizer_ms;
            self.comm_ms = o.comm_ms;
            self.exposed_comm_ms = o.exposed_comm_ms;
        }
        self.ranks += o.ranks;
        self.tokens = self.tokens.max(o.tokens);
        self.samples = self.samples.max(o.samples);
    }
}

/// One collective kind summed over a rank's measured steps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KindAcc {
    pub calls: u64,
    pub bytes: u128,
    pub ns: u64,
    /// Measured steps in which the kind appeared.
    pub steps: u64,
}

impl KindAcc {
    // Saturating: hostile counts must not wrap (or panic) the sums.
    fn add(&mut self, calls: u64, bytes: u64, ms: f64) {
        self.calls = self.calls.saturating_add(calls);
        self.bytes = self.bytes.saturating_add(u128::from(bytes));
        self.ns = self.ns.saturating_add(ms_to_ns(ms));
        self.steps += 1;
    }
    pub fn merge(&mut self, o: &KindAcc) {
        self.calls = self.calls.saturating_add(o.calls);
        self.bytes = self.bytes.saturating_add(o.bytes);
        self.ns = self.ns.saturating_add(o.ns);
        self.steps += o.steps;
    }
}

/// Collectives of one rank: the schema's kinds in fixed slots (indexed by `CommKey::index`),
/// others by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommAcc {
    pub known: [KindAcc; CommKey::COUNT],
    pub other: BTreeMap<String, KindAcc>,
}

impl CommAcc {
    pub fn merge(&mut self, o: &CommAcc) {
        for (a, b) in self.known.iter_mut().zip(o.known.iter()) {
            a.merge(b);
        }
        for (k, v) in &o.other {
            self.other.entry(k.clone()).or_default().merge(v);
        }
    }
}

/// Peaks of one rank's memory figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemPeaks {
    pub allocated: Option<u64>,
    pub reserved: Option<u64>,
    pub nvml: Option<u64>,
    pub rss: Option<u64>,
}

fn max_opt(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

impl MemPeaks {
    pub fn add(&mut self, m: &MemLine) {
        self.allocated = max_opt(self.allocated, max_opt(m.peak_allocated_bytes, m.allocated_bytes));
        self.reserved = max_opt(self.reserved, max_opt(m.peak_reserved_bytes, m.reserved_bytes));
        self.nvml = max_opt(self.nvml, m.nvml_used_bytes);
        self.rss = max_opt(self.rss, Some(m.rss_bytes));
    }
    pub fn merge(&mut self, o: &MemPeaks) {
        self.allocated = max_opt(self.allocated, o.allocated);
        self.reserved = max_opt(self.reserved, o.reserved);
        self.nvml = max_opt(self.nvml, o.nvml);
        self.rss = max_opt(self.rss, o.rss);
    }
}

/// A rank's `end` record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndInfo {
    pub status: RunStatus,
    pub steps_completed: u32,
    pub exit_code: i32,
}

impl EndInfo {
    /// A total order used to pick one end record when a file has several: the worst status wins.
    fn rank_key(&self) -> (u8, u32, i32) {
        let s = match self.status {
            RunStatus::Ok => 0,
            RunStatus::Failed => 1,
            RunStatus::Oom => 2,
        };
        (s, self.steps_completed, self.exit_code)
    }
}

/// A rank's `error` record, shortened.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ErrorInfo {
    pub step: Option<u32>,
    pub class: ErrorClass,
    pub message: String,
    pub requested_bytes: Option<u64>,
}

/// Errors kept per rank; more are counted only (a log flooded with errors must not fill memory).
const MAX_ERRORS: usize = 8;
/// Characters of an error message kept.
const MAX_MESSAGE: usize = 300;

/// Everything kept about one rank: a fixed amount, whatever the length of its log.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RankAcc {
    /// Measured (post-warmup) step records.
    pub measured: u64,
    /// The lowest and highest measured step: more records than steps between them is steps
    /// logged twice.
    pub measured_span: Option<(u32, u32)>,
    /// The rank's own step times over its measured steps, in whole nanoseconds so that sums do not
    /// depend on the order lines are read in. Steps end with a synchronisation of all ranks, so a
    /// rank's sum is the wall time of its measured steps.
    pub measured_ns: u128,
    pub skipped: u64,
    /// (step, loss) of the highest step; no loss where the record's was `null` (not a finite
    /// number), which is then the run's last loss: none.
    pub last_loss: Option<StepLoss>,
    /// (step, loss) of the evaluation after the highest step (`--eval-every`), likewise.
    pub last_eval: Option<StepLoss>,
    /// (step, cumulative energy in J) at the lowest and highest measured step that has it.
    pub energy_first: Option<(u32, f64)>,
    pub energy_last: Option<(u32, f64)>,
    pub comm: CommAcc,
    pub mem: MemPeaks,
    /// The model states the rank's setup record holds.
    pub states: Option<StateBytes>,
    /// Measured steps by NVML GPU utilisation, 0..=100 percent (a histogram: bounded whatever
    /// the number of steps, and merged by adding).
    pub util: Option<Box<[u64; 101]>>,
    pub end: Option<EndInfo>,
    /// The first errors, in (step, class, message) order; more are dropped.
    pub errors: Vec<ErrorInfo>,
}

/// A step and its loss, if the record held a finite one.
pub type StepLoss = (u32, Option<f64>);

/// A rank's model states as its setup record gives them, and the engine's persistent buffers
/// beside them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateBytes {
    pub device: zerobench_schema::memory::ModelStateBytes,
    pub host_bytes: u64,
    pub buffer_bytes: u64,
    /// How the engine kept its parameters: sharded (the gather slots among the buffers) or whole.
    pub param_path: zerobench_schema::memory::ParamPath,
}

impl StateBytes {
    /// Every byte of the states, then each part, then the buffers: a total order, so that merges
    /// do not depend on read order.
    pub fn key(&self) -> (u64, u64, u64, u64, u64, u64, zerobench_schema::memory::ParamPath) {
        let d = &self.device;
        (
            d.total().saturating_add(self.host_bytes),
            d.params_bytes,
            d.grads_bytes,
            d.optimizer_bytes,
            self.host_bytes,
            self.buffer_bytes,
            self.param_path,
        )
    }
}

impl RankAcc {
    pub fn add_step(&mut self, s: &StepLine<'_>, warmup: u32) {
        if s.skipped {
            self.skipped += 1;
        }
        keep_latest(&mut self.last_loss, (s.step, s.loss));
        self.mem.add(&s.memory);
        if s.step < warmup {
            return;
        }
        self.measured += 1;
        self.measured_ns += (s.step_ms * 1e6).round() as u128;
        self.measured_span = widen(self.measured_span, (s.step, s.step));
        if let Some(u) = s.gpu_util_pct {
            self.util.get_or_insert_with(|| Box::new([0; 101]))[u.min(100) as usize] += 1;
        }
        if let Some(e) = s.energy_j {
            let at = (s.step, e);
            if self.energy_first.is_none_or(|f| key(at) < key(f)) {
                self.energy_first = Some(at);
            }
            if self.energy_last.is_none_or(|l| key(at) > key(l)) {
                self.energy_last = Some(at);
            }
        }
        for (i, c) in s.comm.known.iter().enumerate() {
            if let Some(c) = c {
                self.comm.known[i].add(c.calls, c.bytes, c.ms);
            }
        }
        for (name, c) in &s.comm.other {
            // The name is copied only the first time it is seen, not on every step.
            match self.comm.other.get_mut(*name) {
                Some(acc) => acc.add(c.calls, c.bytes, c.ms),
                None => self.comm.other.entry(name.to_string()).or_default().add(c.calls, c.bytes, c.ms),
            }
        }
    }

    /// An evaluation's loss after `step`.
    pub fn add_eval(&mut self, step: u32, loss: Option<f64>) {
        keep_latest(&mut self.last_eval, (step, loss));
    }

    pub fn add_end(&mut self, e: EndInfo) {
        if self.end.is_none_or(|old| e.rank_key() > old.rank_key()) {
            self.end = Some(e);
        }
    }

    pub fn add_error(&mut self, mut e: ErrorInfo) {
        if e.message.chars().count() > MAX_MESSAGE {
            e.message = e.message.chars().take(MAX_MESSAGE).collect::<String>() + "…";
        }
        self.errors.push(e);
        self.trim_errors();
    }

    fn trim_errors(&mut self) {
        self.errors.sort();
        self.errors.dedup();
        self.errors.truncate(MAX_ERRORS);
    }

    pub fn merge(&mut self, o: &RankAcc) {
        self.measured += o.measured;
        self.measured_ns += o.measured_ns;
        if let Some(span) = o.measured_span {
            self.measured_span = widen(self.measured_span, span);
        }
        self.skipped += o.skipped;
        if let Some(at) = o.last_loss {
            keep_latest(&mut self.last_loss, at);
        }
        if let Some(at) = o.last_eval {
            keep_latest(&mut self.last_eval, at);
        }
        if let Some(f) = o.energy_first {
            if self.energy_first.is_none_or(|g| key(f) < key(g)) {
                self.energy_first = Some(f);
            }
        }
        if let Some(l) = o.energy_last {
            if self.energy_last.is_none_or(|g| key(l) > key(g)) {
                self.energy_last = Some(l);
            }
        }
        self.comm.merge(&o.comm);
        self.mem.merge(&o.mem);
        if let Some(theirs) = &o.util {
            let mine = self.util.get_or_insert_with(|| Box::new([0; 101]));
            for (m, t) in mine.iter_mut().zip(theirs.iter()) {
                *m += t;
            }
        }
        // One setup record per rank; should a log hold two, the larger, whatever the order read.
        self.states = self.states.into_iter().chain(o.states).max_by_key(StateBytes::key);
        if let Some(e) = o.end {
            self.add_end(e);
        }
        self.errors.extend(o.errors.iter().cloned());
        self.trim_errors();
    }
}

/// The span that holds both.
fn widen(span: Option<(u32, u32)>, (lo, hi): (u32, u32)) -> Option<(u32, u32)> {
    Some(span.map_or((lo, hi), |(a, b)| (a.min(lo), b.max(hi))))
}

/// A total order on (step, value) pairs, so ties between equal steps are broken the same way
/// whatever the reading order.
fn key((step, v): (u32, f64)) -> (u32, u64) {
    (step, v.to_bits())
}

/// [`key`] for a value that may be absent (an absent one first among equal steps).
fn loss_key((step, v): StepLoss) -> (u32, Option<u64>) {
    (step, v.map(f64::to_bits))
}

/// Keeps in `slot` whichever of it and `at` is later by [`loss_key`].
fn keep_latest(slot: &mut Option<StepLoss>, at: StepLoss) {
    if slot.is_none_or(|old| loss_key(at) > loss_key(old)) {
        *slot = Some(at);
    }
}

/// The steps one rank logged, so that a step logged twice by a rank (a log appended to itself)
/// counts that rank once in the step's slot.
#[derive(Debug, Clone, Default)]
pub struct StepSet(StepMap<bool>);

impl StepSet {
    /// Adds `step`; whether it was not there before.
    pub fn insert(&mut self, step: u32) -> bool {
        !std::mem::replace(self.0.entry(step), true)
    }
}

/// Values by step: a vector indexed by step for the steps a run makes one after another, and a
/// map for a step far beyond them. A step number is the log's to choose: a hostile one (4,194,303
/// where the run made ten) would otherwise make every run's vector millions of slots long, and
/// the readers hold a run each at once (4 GB at 16 threads).
#[derive(Debug, Clone, Default)]
struct StepMap<T> {
    dense: Vec<T>,
    /// Steps beyond the vector's reach when they came; moved into it when it grows over them.
    sparse: BTreeMap<u32, T>,
}

/// How far beyond the vector's length a step may lie and still grow it (to twice its length and
/// this many more): a run's steps come in order, a little out of it where ranges meet.
const DENSE_REACH: usize = 4096;

impl<T: Default + Clone> StepMap<T> {
    /// The value of `step`, a default one where the step had none.
    fn entry(&mut self, step: u32) -> &mut T {
        let i = step as usize;
        if i >= self.dense.len() {
            if i > 2 * self.dense.len() + DENSE_REACH {
                return self.sparse.entry(step).or_default();
            }
            self.dense.resize(i + 1, T::default());
            // The map's steps the vector now reaches move into it (their slots there are new).
            let beyond = self.sparse.split_off(&u32::try_from(self.dense.len()).unwrap_or(u32::MAX));
            for (s, moved) in std::mem::replace(&mut self.sparse, beyond) {
                self.dense[s as usize] = moved;
            }
        }
        &mut self.dense[i]
    }
}

/// Per-step slots of one run, in a `StepMap`: what the ranks reported of each step.
#[derive(Debug, Clone, Default)]
pub struct StepSlots(StepMap<StepSlot>);

impl StepSlots {
    pub fn merge_at(&mut self, step: u32, slot: &StepSlot) {
        self.0.entry(step).merge(slot);
    }

    /// The steps some rank reported, in order of step.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &StepSlot)> {
        self.range(0..=u32::MAX)
    }

    /// The steps some rank reported of `steps`, in order.
    pub fn range(&self, steps: std::ops::RangeInclusive<u32>) -> impl Iterator<Item = (u32, &StepSlot)> {
        let (lo, hi) = (*steps.start() as usize, *steps.end() as usize);
        let StepMap { dense, sparse } = &self.0;
        let end = hi.saturating_add(1).min(dense.len());
        let dense = dense.get(lo.min(end)..end).unwrap_or_default();
        let dense = dense.iter().enumerate().map(move |(k, s)| ((lo + k) as u32, s));
        dense.chain(sparse.range(steps).map(|(i, s)| (*i, s))).filter(|(_, s)| s.ranks > 0)
    }
}

/// Equal where the same steps hold the same slots, however they are kept.
impl PartialEq for StepSlots {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each step is new once, whether it lies in the vector's reach, beyond it, or beyond it
    /// first and inside it later; a hostile step does not grow the vector.
    #[test]
    fn a_step_set_says_new_once_per_step() {
        let mut set = StepSet::default();
        assert!(set.insert(3) && !set.insert(3));
        assert!(set.insert(4_000_000) && !set.insert(4_000_000));
        assert!(set.0.dense.len() < 1000, "{}", set.0.dense.len());
        for step in (0..20_000).step_by(7) {
            assert!(set.insert(step) || step == 3, "{step}");
        }
        let far = 70_000;
        assert!(set.insert(far));
        for step in 20_000..far {
            set.insert(step);
        }
        assert!(!set.insert(far) && !set.insert(3) && !set.insert(4_000_000));
    }
    use zerobench_schema::memory::ModelStateBytes;

    /// A log with several `end` records (a rank that ended, was restarted into the same file
    /// and ended again) keeps the worst, whichever comes first.
    #[test]
    fn the_worst_end_of_a_rank_is_kept_in_either_order() {
        let end = |status, steps_completed| EndInfo { status, steps_completed, exit_code: 0 };
        for (a, b) in
            [(end(RunStatus::Ok, 10), end(RunStatus::Oom, 3)), (end(RunStatus::Oom, 3), end(RunStatus::Ok, 10))]
        {
            let mut r = RankAcc::default();
            r.add_end(a);
            r.add_end(b);
            assert_eq!(r.end.map(|e| e.status), Some(RunStatus::Oom), "{a:?} then {b:?}");
        }
    }

    /// Merging two ranges of a rank's log keeps the larger model states, in either order.
    #[test]
    fn merged_states_do_not_depend_on_the_order() {
        let states = |params_bytes, host_bytes| StateBytes {
            device: ModelStateBytes { params_bytes, grads_bytes: 2, optimizer_bytes: 3 },
            host_bytes,
            buffer_bytes: 7,
            param_path: zerobench_schema::memory::ParamPath::Whole,
        };
        // Ordered by every byte: 100 on the device alone is more than 10 there and 5 on the host.
        let (small, large) = (states(10, 0), states(10, 5));
        let (spread, device_only) = (states(5, 5), states(95, 0));
        for (a, b, large) in [
            (small, large, large),
            (large, small, large),
            (spread, device_only, device_only),
            (device_only, spread, device_only),
        ] {
            let mut x = RankAcc { states: Some(a), ..RankAcc::default() };
            x.merge(&RankAcc { states: Some(b), ..RankAcc::default() });
            assert_eq!(x.states, Some(large), "{a:?} with {b:?}");
        }
        // Counts as large as they go (a hostile log) are the largest, not wrapped to small ones.
        let (huge, large) = (states(u64::MAX, 2), states(10, 5));
        for (a, b) in [(huge, large), (large, huge)] {
            let mut x = RankAcc { states: Some(a), ..RankAcc::default() };
            x.merge(&RankAcc { states: Some(b), ..RankAcc::default() });
            assert_eq!(x.states, Some(huge), "{a:?} with {b:?}");
        }
    }

    /// Messages longer than [`MAX_MESSAGE`] characters are cut there (and marked); shorter ones
    /// are kept whole.
    #[test]
    fn long_error_messages_are_cut() {
        let error =
            |message: String| ErrorInfo { step: None, class: ErrorClass::Internal, message, requested_bytes: None };
        let mut r = RankAcc::default();
        r.add_error(error("é".repeat(MAX_MESSAGE)));
        r.add_error(error("x".repeat(MAX_MESSAGE + 1)));
        let kept: Vec<&str> = r.errors.iter().map(|e| e.message.as_str()).collect();
        assert_eq!(kept, ["x".repeat(MAX_MESSAGE) + "…", "é".repeat(MAX_MESSAGE)]);
    }

    /// Two ranks with the same step time: the lower one is the slowest, and its phases are kept,
    /// whichever slot is merged into the other.
    #[test]
    fn equal_step_times_name_the_lower_rank_in_either_order() {
        let slot = |rank, forward_ms| StepSlot {
            ranks: 1,
            step_ms: 10.0,
            slowest_rank: rank,
            forward_ms,
            ..StepSlot::default()
        };
        for (a, b) in [(slot(0, 3.0), slot(1, 4.0)), (slot(1, 4.0), slot(0, 3.0))] {
            let mut m = a;
            m.merge(&b);
            assert_eq!((m.ranks, m.slowest_rank, m.forward_ms), (2, 0, 3.0), "{a:?} with {b:?}");
        }
    }

    /// One rank's step logged twice with one step time and other phases (a duplicated step): the
    /// step keeps one record's phases, the same whichever is merged into the other, and however
    /// several are grouped; a step time of −0 and one of +0 likewise.
    #[test]
    fn a_step_logged_twice_with_one_time_merges_the_same_in_either_order() {
        let slot = |step_ms: f64, phases: [f64; 5]| StepSlot {
            ranks: 1,
            step_ms,
            slowest_rank: 3,
            forward_ms: phases[0],
            backward_ms: phases[1],
            optimizer_ms: phases[2],
            comm_ms: phases[3],
            exposed_comm_ms: phases[4],
            tokens: 8,
            samples: 2,
        };
        let bits = |s: &StepSlot| {
            [s.step_ms, s.forward_ms, s.backward_ms, s.optimizer_ms, s.comm_ms, s.exposed_comm_ms].map(f64::to_bits)
        };
        let cases = [
            [slot(10.0, [3.0, 6.0, 1.0, 0.5, 0.0]), slot(10.0, [4.0, 5.0, 1.0, 0.5, 0.0])],
            // Equal up to the last phase, and up to its sign.
            [slot(10.0, [3.0, 6.0, 1.0, 0.5, 0.25]), slot(10.0, [3.0, 6.0, 1.0, 0.5, 0.0])],
            [slot(10.0, [3.0, 6.0, 1.0, 0.5, 0.0]), slot(10.0, [3.0, 6.0, 1.0, 0.5, -0.0])],
            [slot(0.0, [0.0; 5]), slot(-0.0, [0.0; 5])],
        ];
        for [a, b] in cases {
            let mut ab = a;
            ab.merge(&b);
            let mut ba = b;
            ba.merge(&a);
            assert_eq!(bits(&ab), bits(&ba), "{a:?} with {b:?}");
            assert_eq!((ab.ranks, ab.tokens, ab.samples), (2, 8, 2));
            assert_eq!((ba.ranks, ba.tokens, ba.samples), (2, 8, 2));
            // One record's phases, not a mixture of the two.
            assert!(bits(&ab) == bits(&a) || bits(&ab) == bits(&b), "{ab:?}");
            // Three copies, merged in every grouping and order into an empty slot.
            let c = a;
            let orders = [[a, b, c], [b, a, c], [c, b, a], [b, c, a]];
            let merged: Vec<_> = orders
                .iter()
                .map(|order| {
                    let mut m = StepSlot::default();
                    order.iter().for_each(|s| m.merge(s));
                    (bits(&m), m.ranks)
                })
                .collect();
            assert!(merged.iter().all(|m| *m == (bits(&ab), 3)), "{merged:?}");
        }
    }

    /// A step far beyond the others is kept apart, not in a vector millions of slots long; the
    /// vector takes it once it grows over it; equal slots however they are kept.
    #[test]
    fn a_far_step_is_kept_apart_until_the_vector_reaches_it() {
        let one = StepSlot { ranks: 1, step_ms: 1.0, slowest_rank: 0, ..StepSlot::default() };
        let mut a = StepSlots::default();
        for step in [0, 1, 4_194_303, 2] {
            a.merge_at(step, &one);
        }
        assert!(a.0.dense.len() < 10 && a.0.sparse.len() == 1);
        assert_eq!(a.iter().map(|(i, _)| i).collect::<Vec<_>>(), [0, 1, 2, 4_194_303]);
        assert_eq!(a.range(1..=3).map(|(i, _)| i).collect::<Vec<_>>(), [1, 2]);
        let mut b = StepSlots::default();
        b.merge_at(5000, &one);
        b.merge_at(100, &one);
        assert_eq!((b.0.dense.len(), b.0.sparse.len()), (101, 1));
        b.merge_at(4200, &one);
        assert_eq!((b.0.dense.len(), b.0.sparse.len()), (4201, 1));
        b.merge_at(5001, &one);
        assert_eq!((b.0.dense.len(), b.0.sparse.len()), (5002, 0));
        assert_eq!(
            b.iter().map(|(i, s)| (i, s.ranks)).collect::<Vec<_>>(),
            [(100, 1), (4200, 1), (5000, 1), (5001, 1)]
        );
        let mut c = StepSlots::default();
        for step in [5001, 5000, 4200, 100] {
            c.merge_at(step, &one);
        }
        assert_eq!(b, c);
    }
}
