//! Fitting the coefficients of [`crate::terms`] from measured runs of one GPU kind and precision,
//! on relative errors (each run's row divided by its measurement, so a 10 ms run counts as much as
//! a 1 s one, as the targets are stated in percent; a remainder's, what a run adds beyond the terms
//! fitted before, by the run's step: `RelativeTo`). Step times are fitted by non-negative least
//! absolute deviations ([`nnls_l1`]): the targets are mean absolute errors, and launch-bound runs
//! repeat with one run in three or so far slower than the others (a busy host), which squared
//! errors let pull the prediction for all of them. Memory, which repeats exactly, by least squares.
//!
//! A micro-step's time is the longer of its host and device bounds plus a share of the shorter,
//! which is not linear: for each share on a grid, the fit alternates between assigning each run to
//! the bound that sets its time and fitting both bounds' coefficients on the runs assigned to them,
//! from a start that takes a run as launch-bound when its time per micro-step is within 10% of the
//! fastest of its model, stage and GPU count (more work did not cost more time), and keeps the
//! assignment and share with the smallest error. A family none of whose runs kept the GPU busy gets
//! no device terms of its own (`fit_micro`), and no FLOP rate is fitted faster than the GPU's
//! peak (`rate_floors`).

use std::collections::{BTreeMap, BTreeSet};

use crate::nnls::{nnls, nnls_l1};
use crate::observation::Observation;
use crate::price::{
    eval, exposed_offload_ms, micro_ms, offload_step_ms, offload_window_ms, peak_allocated, step_parts, Bound,
    DeviceDonor, GIB, OFFLOAD_HIDDEN, OFFLOAD_SHARING, UNHIDDEN,
};
use crate::terms::{family_of, memory_terms, reserved_terms, step_terms, Part, Term};
use crate::work::{Query, Work};
use zerobench_schema::config::Offload;

/// Coefficients of one fit, before validation.
#[derive(Debug, Clone)]
pub(crate) struct Coefficients {
    pub step: BTreeMap<String, f64>,
    /// Whose device terms a family without its own borrows ([`fit_micro`]).
    pub device_donor: Option<DeviceDonor>,
    pub memory: BTreeMap<String, f64>,
    pub reserved: BTreeMap<String, f64>,
    /// The AdamW rate of the hosts offload's terms are fitted at ([`host_reference`]).
    pub host_reference: Option<f64>,
}

/// The coefficients for runs of one GPU kind and precision, and each run's work as they were
/// fitted on it (at the host rate they are fitted at), for whatever else the fit reads from them.
pub(crate) fn fit_coefficients(runs: &[&Observation]) -> (Coefficients, Vec<Work>) {
    let host_reference = host_reference(runs);
    let works: Vec<Work> = runs.iter().map(|o| Work::of(&o.query, host_reference)).collect();
    let (step, device_donor) = fit_step(runs, &works);
    let coef = Coefficients {
        step,
        device_donor,
        memory: fit_memory(runs, &works),
        reserved: fit_reserved(runs),
        host_reference,
    };
    (coef, works)
}

/// The host AdamW rate offload's terms are fitted at: the geometric mean of the rates of the hosts
/// of the offloaded runs of one rank per host, where any is known. A run of known host is then
/// fitted as if its update had run at that rate, and one of unknown host as if its host had it.
pub(crate) fn host_reference(runs: &[&Observation]) -> Option<f64> {
    let logs: Vec<f64> = runs
        .iter()
        .filter(|o| o.query.config.offload != Offload::None)
        .filter_map(|o| o.query.rate_priced())
        .map(f64::ln)
        .collect();
    (!logs.is_empty()).then(|| (logs.iter().sum::<f64>() / logs.len() as f64).exp())
}

/// The step coefficients, fitted in stages so that each is fitted on the measurement that isolates
/// it: the optimizer on the logged optimizer phase; the micro-step's bounds on one-GPU runs without
/// offload (their step less the optimizer); offload's terms on one-GPU offloaded runs and
/// communication's on runs of several GPUs without offload, on what their runs add to the step
/// beyond the compute and optimizer already fitted; last, how ranks sharing a host slow each
/// other's updates, on the offloaded runs of several ranks per host.
fn fit_step(runs: &[&Observation], works: &[Work]) -> (BTreeMap<String, f64>, Option<DeviceDonor>) {
    let all: Vec<usize> = (0..runs.len()).collect();
    let mut coef = BTreeMap::new();
    // 1. The optimizer on the GPU, on runs without offload: an offloaded run's optimizer phase
    // also holds its waits for the host's update.
    let opt: Vec<usize> =
        all.iter().copied().filter(|&i| works[i].offload == Offload::None && runs[i].optimizer_ms.is_some()).collect();
    coef.extend(fit_terms(
        &opt,
        works,
        &|w| only(step_terms(w), "optimizer."),
        &|i| runs[i].optimizer_ms.unwrap_or(0.0),
        RelativeTo::Itself,
    ));
    let optimizer = |coef: &BTreeMap<String, f64>, w: &Work| {
        let mut f = Vec::new();
        let t = only(step_terms(w), "optimizer.");
        eval(coef, None, &t, Part::Step, &mut f)
    };
    // 2. The micro-step: one GPU, no offload.
    let single: Vec<usize> =
        all.iter().copied().filter(|&i| works[i].gpus == 1 && works[i].offload == Offload::None).collect();
    let micro_target: Vec<f64> = single
        .iter()
        .map(|&i| ((runs[i].step_ms - optimizer(&coef, &works[i])) / works[i].micro_steps).max(0.0))
        .collect();
    let (micro, device_donor) = fit_micro(&single, runs, works, &micro_target);
    coef.extend(micro);
    let donor = device_donor.as_ref();
    // 3. Offload and 4. communication, on what their runs add.
    let compute_and_optimizer = |coef: &BTreeMap<String, f64>, i: usize| {
        let mut f = Vec::new();
        let w = &works[i];
        let (micro, _) = micro_ms(coef, donor, &step_terms(w), &mut f);
        (w.micro_steps * micro, optimizer(coef, w))
    };
    let offloaded: Vec<usize> =
        all.iter().copied().filter(|&i| works[i].offload != Offload::None && works[i].gpus == 1).collect();
    let fitted = coef.clone();
    let offload_run = |i: usize| {
        let (compute, optimizer) = compute_and_optimizer(&fitted, i);
        OffloadRun {
            extra: runs[i].step_ms - compute - optimizer,
            // One GPU: no communication.
            window: offload_window_ms(&works[i], compute, optimizer, 0.0),
            step: runs[i].step_ms,
        }
    };
    let offload_runs: Vec<OffloadRun> = offloaded.iter().map(|&i| offload_run(i)).collect();
    coef.extend(fit_offload(&offloaded, works, &offload_runs));
    // 4. Communication, on what the runs of several GPUs add beyond compute, optimizer and the
    // exposed host update (offload's terms are fitted already): on those without offload where
    // there are any, since an offloaded run's host update on a shared host is priced by a term
    // fitted after.
    let fitted = coef.clone();
    // Only where every run of several GPUs is offloaded does this price a host update, its window
    // then without the communication being fitted.
    let offload_done = |i: usize| {
        let mut f = Vec::new();
        let (compute, optimizer) = compute_and_optimizer(&fitted, i);
        let parts = (compute, optimizer, 0.0);
        let (exposed, _) = offload_step_ms(&fitted, donor, &works[i], &step_terms(&works[i]), parts, &mut f);
        runs[i].step_ms - compute - optimizer - exposed
    };
    let step = |i: usize| runs[i].step_ms;
    coef.extend(fit_terms(
        &communication_runs(works),
        works,
        &|w| only(step_terms(w), "comm."),
        &offload_done,
        RelativeTo::Step(&step),
    ));
    // 5. How much ranks sharing a host slow each other's updates (`OFFLOAD_SHARING`), on the
    // offloaded runs of several ranks per host: not linear, so the exponent on a grid with the
    // smallest summed relative error of their steps.
    let shared: Vec<usize> =
        all.iter().copied().filter(|&i| works[i].offload != Offload::None && works[i].ranks_per_host > 1.0).collect();
    if !shared.is_empty() {
        let error = |e: f64| {
            let mut c = coef.clone();
            c.insert(OFFLOAD_SHARING.to_string(), e);
            let err: f64 = shared
                .iter()
                .map(|&i| (step_parts(&c, donor, &works[i], &mut Vec::new()).step_ms / runs[i].step_ms - 1.0).abs())
                .sum();
            (err, e)
        };
        let grid = (0..=SHARING_STEPS).map(|k| f64::from(k) / f64::from(SHARING_STEPS));
        if let Some((_, e)) = grid.map(error).min_by(|a, b| a.0.total_cmp(&b.0)) {
            coef.insert(OFFLOAD_SHARING.to_string(), e);
        }
    }
    (coef, device_donor)
}

/// The runs communication's terms are fitted on: those of several GPUs without offload, or, where
/// there are none, those of several GPUs (indices into `works`). Their GPU and node counts are
/// the range communication is fitted over (`Range::cover_communication`).
pub(crate) fn communication_runs(works: &[Work]) -> Vec<usize> {
    let several: Vec<usize> = (0..works.len()).filter(|&i| works[i].gpus > 1).collect();
    let plain: Vec<usize> = several.iter().copied().filter(|&i| works[i].offload == Offload::None).collect();
    if plain.is_empty() {
        several
    } else {
        plain
    }
}

/// Grid steps of the sharing exponent (`OFFLOAD_SHARING`) between 0 and 1.
const SHARING_STEPS: u32 = 20;

/// The terms whose names start with `prefix`.
pub(crate) fn only(terms: Vec<Term>, prefix: &str) -> Vec<Term> {
    terms.into_iter().filter(|t| t.name.starts_with(prefix)).collect()
}

/// An offloaded run as offload's fit takes it: what its step adds beyond the fitted compute and
/// optimizer (`extra`), the GPU's window its host update can hide behind, and its step.
struct OffloadRun {
    extra: f64,
    window: f64,
    step: f64,
}

/// Grid steps of offload's hidden share between 0 (the host's update after the GPU's work) and 1
/// (beside all of its window).
const HIDDEN_STEPS: u32 = 20;

/// Offload's terms and hidden share (`OFFLOAD_HIDDEN`): the step waits for the host's update less
/// the hidden share of the GPU's window, never below 0, which is not linear. For each share on a
/// grid the fit alternates between taking the runs whose host update outlasts that share (the
/// others wait for nothing, whatever the terms) and fitting the terms on them, and keeps the share
/// and terms with the smallest summed relative error of the step.
fn fit_offload(idx: &[usize], works: &[Work], runs: &[OffloadRun]) -> BTreeMap<String, f64> {
    if idx.is_empty() {
        return BTreeMap::new();
    }
    let terms = |w: &Work| only(step_terms(w), "offload");
    let by_work: BTreeMap<usize, &OffloadRun> = idx.iter().copied().zip(runs).collect();
    let step = |i: usize| by_work[&i].step;
    let mut best: Option<(f64, BTreeMap<String, f64>)> = None;
    for k in 0..=HIDDEN_STEPS {
        let share = f64::from(k) / f64::from(HIDDEN_STEPS);
        let mut waits = vec![true; idx.len()];
        for _ in 0..30 {
            let waiting: Vec<usize> = idx.iter().zip(&waits).filter(|(_, &w)| w).map(|(&i, _)| i).collect();
            let target = |i: usize| by_work[&i].extra + share * by_work[&i].window;
            let mut coef = fit_terms(&waiting, works, &terms, &target, RelativeTo::Step(&step));
            coef.insert(OFFLOAD_HIDDEN.to_string(), share);
            let mut f = Vec::new();
            let host: Vec<f64> =
                idx.iter().map(|&i| eval(&coef, None, &terms(&works[i]), Part::Step, &mut f)).collect();
            let err: f64 = runs
                .iter()
                .zip(&host)
                .map(|(r, &h)| {
                    let priced = r.step - r.extra + exposed_offload_ms(&coef, h, r.window);
                    (priced / r.step - 1.0).abs()
                })
                .sum();
            if best.as_ref().is_none_or(|(e, _)| err < *e) {
                best = Some((err, coef));
            }
            let next: Vec<bool> = runs.iter().zip(&host).map(|(r, &h)| h > share * r.window).collect();
            if next == waits || !next.iter().any(|&w| w) {
                break;
            }
            waits = next;
        }
    }
    best.map(|(_, c)| c).unwrap_or_default()
}

/// What a fitted quantity's errors are taken relative to, run by run.
#[derive(Clone, Copy)]
enum RelativeTo<'a> {
    /// The quantity itself (floored, so that a near-zero one does not dominate): a measured phase,
    /// the optimizer's.
    Itself,
    /// The run's measured step. For a remainder, what a run adds beyond the terms fitted before
    /// (communication, a host's update), which is near zero or below where those terms priced the
    /// run long: relative to itself such a run outweighs every other. On an H200, 2-GPU gpt2-large
    /// at stage 3, 0.3 ms under its priced compute and optimizer, held stage 3's communication at
    /// zero against gpt2-xl's 9.6 ms.
    Step(&'a dyn Fn(usize) -> f64),
}

/// NNLS of `target(i)` on the (per-step) terms of the runs `idx`, on errors relative to `relative`.
fn fit_terms(
    idx: &[usize],
    works: &[Work],
    terms: &dyn Fn(&Work) -> Vec<Term>,
    target: &dyn Fn(usize) -> f64,
    relative: RelativeTo,
) -> BTreeMap<String, f64> {
    let ts: Vec<Vec<Term>> = idx.iter().map(|&i| terms(&works[i])).collect();
    let names = names_of(&ts);
    let mut rows = Vec::new();
    let mut b = Vec::new();
    for (t, &i) in ts.iter().zip(idx) {
        let y = target(i);
        let scale = match relative {
            RelativeTo::Itself => y.abs(),
            RelativeTo::Step(step) => step(i),
        }
        .max(1e-3);
        let mut row = vec![0.0; names.len()];
        for term in t {
            row[names.binary_search(&term.name).unwrap_or_default()] += term.x / scale;
        }
        rows.push(row);
        b.push(y / scale);
    }
    if rows.is_empty() {
        return BTreeMap::new();
    }
    names.into_iter().zip(nnls_l1(&rows, &b)).collect()
}

/// The micro-step's host and device bounds (see the module documentation). A family none of whose
/// runs kept the GPU busy (NVML utilisation under [`DEVICE_BOUND_UTIL_PCT`](crate::observation::DEVICE_BOUND_UTIL_PCT) in every one) has no
/// measurement of its device bound: its device terms are left unfitted, rather than let the host's
/// noise set them (tiny-llama's steps of 5-9 ms on an H100 fitted 80 µs per GFLOP, 50 times gpt2's,
/// and predicted its largest batch at twice its time). Prediction prices them as the donor's
/// (flagged): the family with the most configurations that kept the GPU busy among those the bounds
/// are fitted on (one GPU, no offload), whose device terms are the best measured, named with that
/// count in the fit's [`DeviceDonor`] (none when every family has its own). Configurations, not
/// runs: repeats of one configuration measure no more of the device's rates. Counted in runs, the
/// H100's six T5 configurations that keep the GPU busy, run three times each on two hosts,
/// outweighed gpt2's 15, run once each, and lent T5's device terms (which put next to nothing on
/// the dense products) to tiny-llama. Not the fitted families'
/// mean: once T5's device terms were fitted (a fixed 25 ms per micro-step against gpt2's 6), the
/// mean priced tiny-llama's 6 ms steps at 16. Its host terms are fitted with its device bound at
/// zero; in prediction the borrowed device bound adds its unhidden share, which the validation's
/// errors include.
fn fit_micro(
    idx: &[usize],
    runs: &[&Observation],
    works: &[Work],
    target: &[f64],
) -> (BTreeMap<String, f64>, Option<DeviceDonor>) {
    let sub_runs: Vec<&Observation> = idx.iter().map(|&i| runs[i]).collect();
    let sub_works: Vec<Work> = idx.iter().map(|&i| works[i].clone()).collect();
    let busy: BTreeSet<&str> = sub_runs
        .iter()
        .zip(&sub_works)
        // A run that does not say counts as busy: the family keeps its terms.
        .filter(|(o, _)| o.kept_gpu_busy().unwrap_or(true))
        .map(|(_, w)| w.family)
        .collect();
    let terms: Vec<Vec<Term>> = sub_works
        .iter()
        .map(|w| {
            step_terms(w)
                .into_iter()
                .filter(|t| match t.part {
                    Part::Step => false,
                    Part::Device => family_of(&t.name).is_none_or(|f| busy.contains(f)),
                    Part::Host | Part::Micro => true,
                })
                .collect()
        })
        .collect();
    let start = initial_bounds(&sub_runs, &sub_works);
    let floors = rate_floors(&terms, sub_runs.iter().find_map(|o| o.peak_tflops));
    // The unhidden share is searched on a grid; for each, the bounds' coefficients by alternation.
    let coef = (0..=UNHIDDEN_STEPS)
        .map(|k| fit_bounds(&terms, target, &start, f64::from(k) / f64::from(UNHIDDEN_STEPS), &floors))
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
        .unwrap_or_default();
    let donor = if sub_works.iter().any(|w| !busy.contains(w.family)) {
        device_donor(&sub_runs, &sub_works)
            .map(|(family, n)| DeviceDonor { family: family.to_string(), busy_configurations: n as u32 })
    } else {
        None
    };
    (coef, donor)
}

/// The least value of each FLOP rate's coefficient (`ms_per_gflop`, `ms_per_gflop_attn`): the time
/// a GFLOP takes at the GPU's data-sheet peak, `peak_tflops`, where the runs give it. Non-negative
/// coefficients alone let a family's products run faster than the GPU can: fitted on three busy
/// shapes, T5's dense products came out at 1,150 TFLOP/s on an H200 and 6,100 on an H100 (the rest
/// put on its activations), and k-fold folds put gpt2's below the peak too. Held at it, both
/// models' k-fold errors fell (H200 10.4% to 9.8%, H100 10.2% to 10.0%) and no held-out
/// configuration moved by more than 4 points.
fn rate_floors(terms: &[Vec<Term>], peak_tflops: Option<f64>) -> BTreeMap<String, f64> {
    let Some(peak) = peak_tflops.filter(|p| *p > 0.0) else { return BTreeMap::new() };
    names_of(terms)
        .into_iter()
        .filter(|n| n.ends_with(".ms_per_gflop") || n.ends_with(".ms_per_gflop_attn"))
        // ms per GFLOP at `peak` TFLOP/s.
        .map(|n| (n, 1.0 / peak))
        .collect()
}

/// The family with the most configurations of which a run kept the GPU busy (or does not say), and
/// how many; ties go to the first name. None when no run did.
fn device_donor<'a>(runs: &[&Observation], works: &'a [Work]) -> Option<(&'a str, usize)> {
    let mut configurations: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for (o, w) in runs.iter().zip(works) {
        if o.kept_gpu_busy().unwrap_or(true) {
            configurations.entry(w.family).or_default().insert(o.config_key());
        }
    }
    // max_by_key keeps the last of equals: reversed, the first name wins a tie.
    configurations.into_iter().map(|(f, c)| (f, c.len())).rev().max_by_key(|&(_, n)| n)
}

/// Grid steps of the unhidden share between 0 (the longer bound alone) and 1 (both added).
const UNHIDDEN_STEPS: u32 = 10;

/// The bounds' coefficients for one unhidden share, and their summed absolute relative error.
fn fit_bounds(
    terms: &[Vec<Term>],
    target: &[f64],
    start: &[bool],
    unhidden: f64,
    floors: &BTreeMap<String, f64>,
) -> (f64, BTreeMap<String, f64>) {
    let names = names_of(terms);
    let floor = |name: &str| floors.get(name).copied().unwrap_or(0.0);
    let mut launch_bound = start.to_vec();
    let mut best: Option<(f64, BTreeMap<String, f64>)> = None;
    for _ in 0..30 {
        // Each coefficient is its floor plus a non-negative part, the one fitted: the floors' share
        // of each run's time comes off its target.
        let mut rows = Vec::with_capacity(terms.len());
        let mut rest = Vec::with_capacity(terms.len());
        for ((ts, host), y) in terms.iter().zip(&launch_bound).zip(target) {
            let mut row = vec![0.0; names.len()];
            let mut b = 1.0;
            for t in ts {
                let weight = match t.part {
                    Part::Host if *host => 1.0,
                    Part::Device if !*host => 1.0,
                    Part::Host | Part::Device => unhidden,
                    _ => 1.0,
                };
                let x = weight * t.x / y.max(1e-3);
                row[names.binary_search(&t.name).unwrap_or_default()] += x;
                b -= x * floor(&t.name);
            }
            rows.push(row);
            rest.push(b);
        }
        let fitted = nnls_l1(&rows, &rest);
        let mut coef: BTreeMap<String, f64> =
            names.iter().zip(fitted).map(|(n, c)| (n.clone(), c + floor(n))).collect();
        coef.insert(UNHIDDEN.to_string(), unhidden);
        let mut f = Vec::new();
        // No donor: a family without busy runs has no device terms here at all.
        let micro: Vec<(f64, Bound)> = terms.iter().map(|ts| micro_ms(&coef, None, ts, &mut f)).collect();
        let err: f64 = micro.iter().zip(target).map(|((m, _), y)| (m / y.max(1e-3) - 1.0).abs()).sum();
        let next: Vec<bool> = micro.iter().map(|(_, b)| *b == Bound::Launch).collect();
        if best.as_ref().is_none_or(|(e, _)| err < *e) {
            best = Some((err, coef));
        }
        if next == launch_bound {
            break;
        }
        launch_bound = next;
    }
    best.unwrap_or((f64::INFINITY, BTreeMap::new()))
}

/// A run starts launch-bound when its time per micro-step is within 10% of the fastest run of the
/// same model, stage, offload and GPU count, and that group has runs of different sizes.
fn initial_bounds(runs: &[&Observation], works: &[Work]) -> Vec<bool> {
    let key = |o: &Observation| {
        let c = &o.query.config;
        format!("{} {} {} {}", c.model, c.stage.index(), c.offload, o.query.gpus)
    };
    let mut fastest: BTreeMap<String, (f64, f64, f64)> = BTreeMap::new();
    for (o, w) in runs.iter().zip(works) {
        let per_micro = o.step_ms / w.micro_steps;
        let e = fastest.entry(key(o)).or_insert((f64::INFINITY, f64::INFINITY, 0.0));
        e.0 = e.0.min(per_micro);
        e.1 = e.1.min(w.micro_tokens);
        e.2 = e.2.max(w.micro_tokens);
    }
    runs.iter()
        .zip(works)
        .map(|(o, w)| {
            let (min, lo, hi) = fastest[&key(o)];
            hi > lo && o.step_ms / w.micro_steps <= 1.1 * min
        })
        .collect()
}

fn fit_memory(runs: &[&Observation], works: &[Work]) -> BTreeMap<String, f64> {
    let terms: Vec<Vec<Term>> = works.iter().map(memory_terms).collect();
    let names = names_of(&terms);
    let mut rows = Vec::new();
    let mut b = Vec::new();
    for ((ts, w), o) in terms.iter().zip(works).zip(runs) {
        let total = o.peak_allocated_bytes as f64 / GIB;
        if total <= 0.0 {
            continue;
        }
        let mut row = vec![0.0; names.len()];
        for t in ts {
            row[names.binary_search(&t.name).unwrap_or_default()] += t.x / total;
        }
        rows.push(row);
        b.push((o.peak_allocated_bytes as f64 - w.device_state_bytes as f64) / GIB / total);
    }
    names.into_iter().zip(nnls(&rows, &b)).collect()
}

fn fit_reserved(runs: &[&Observation]) -> BTreeMap<String, f64> {
    let mut rows = Vec::new();
    let mut b = Vec::new();
    let mut names = Vec::new();
    for o in runs {
        let Some(reserved) = o.peak_reserved_bytes else { continue };
        let alloc = o.peak_allocated_bytes as f64 / GIB;
        let total = reserved as f64 / GIB;
        if total <= 0.0 {
            continue;
        }
        let ts = reserved_terms(alloc);
        names = ts.iter().map(|t| t.name.clone()).collect();
        rows.push(ts.iter().map(|t| t.x / total).collect());
        b.push((total - alloc) / total);
    }
    names.into_iter().zip(nnls(&rows, &b)).collect()
}

fn names_of(terms: &[Vec<Term>]) -> Vec<String> {
    let mut names: Vec<String> = terms.iter().flatten().map(|t| t.name.clone()).collect();
    names.sort();
    names.dedup();
    names
}

/// Predicted step ms, the bound that sets it, and peak allocated bytes of a query from bare
/// coefficients (validation).
pub(crate) fn predict_with(c: &Coefficients, q: &Query) -> (f64, Bound, f64) {
    let w = Work::of(q, c.host_reference);
    let mut flags = Vec::new();
    let s = step_parts(&c.step, c.device_donor.as_ref(), &w, &mut flags);
    (s.step_ms, s.bound, peak_allocated(&c.memory, &w, &mut flags))
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerobench_schema::config::{RunConfig, ZeroStage};
    use zerobench_schema::models::ModelPreset;

    fn run(model: ModelPreset, mb: u32, step_ms: f64) -> Observation {
        accumulated(model, mb, 1, step_ms)
    }

    fn accumulated(model: ModelPreset, mb: u32, micro_steps: u32, step_ms: f64) -> Observation {
        let mut c = RunConfig::new(model, ZeroStage::Z0);
        (c.micro_batch, c.seq_len, c.grad_accum) = (mb, 1024, micro_steps);
        Observation::measured(format!("{model}-mb{mb}x{micro_steps}-{step_ms}"), Query::new(c, 1, 1), step_ms)
    }

    /// A run starts launch-bound when its time per micro-step is within 10% of the fastest run of
    /// its model, stage, offload and GPU count, and that group holds runs of different sizes.
    #[test]
    fn runs_start_launch_bound_within_a_tenth_of_their_groups_fastest() {
        let runs = [
            run(ModelPreset::Gpt2, 1, 10.0),
            run(ModelPreset::Gpt2, 2, 10.9),
            run(ModelPreset::Gpt2, 4, 11.5),
            run(ModelPreset::Gpt2, 16, 40.0),
            // One size only: nothing tells the host's time from the device's.
            run(ModelPreset::Gpt2Medium, 4, 30.0),
            run(ModelPreset::Gpt2Medium, 4, 30.5),
            // Time per micro-step: two micro-steps of 9 ms are the fastest of their group, and a
            // step of one in 10 ms is not within a tenth of them.
            accumulated(ModelPreset::Gpt2Large, 4, 2, 18.0),
            run(ModelPreset::Gpt2Large, 1, 10.0),
        ];
        let refs: Vec<&Observation> = runs.iter().collect();
        let works: Vec<Work> = runs.iter().map(|o| Work::of(&o.query, None)).collect();
        assert_eq!(initial_bounds(&refs, &works), [true, true, false, false, false, false, true, false]);
    }

    /// Communication is fitted on the runs of several GPUs without offload, or, where there are
    /// none, on those of several GPUs with it; a run of one GPU is never among them.
    #[test]
    fn communication_is_fitted_on_runs_of_several_gpus() {
        let work = |gpus: u32, offload: Offload| {
            let mut c = RunConfig::new(ModelPreset::Gpt2, ZeroStage::Z2);
            c.offload = offload;
            Work::of(&Query::new(c, gpus, 1), None)
        };
        let (none, offloaded) = (Offload::None, Offload::Optimizer);
        let works = [work(1, none), work(2, none), work(2, offloaded), work(4, none), work(1, offloaded)];
        assert_eq!(communication_runs(&works), [1, 3]);
        assert_eq!(communication_runs(&[work(1, none), work(2, offloaded), work(1, offloaded)]), [1]);
        assert!(communication_runs(&[work(1, none), work(1, offloaded)]).is_empty());
    }

    /// A FLOP rate's floor is the time a GFLOP takes at the stated peak; a peak of zero (or less,
    /// or none) states nothing, and floors nothing.
    #[test]
    fn rate_floors_come_from_a_positive_peak_only() {
        let term = |name: &str| Term { name: name.into(), part: Part::Device, x: 1.0 };
        let terms = vec![vec![term("gpt2.ms_per_gflop"), term("gpt2.ms_per_gflop_attn"), term("gpt2.ms_fixed")]];
        let floors = rate_floors(&terms, Some(1000.0));
        assert_eq!(floors.keys().collect::<Vec<_>>(), ["gpt2.ms_per_gflop", "gpt2.ms_per_gflop_attn"]);
        assert!(floors.values().all(|&f| f == 1e-3), "{floors:?}");
        for peak in [Some(0.0), Some(-5.0), None] {
            assert!(rate_floors(&terms, peak).is_empty(), "{peak:?}");
        }
    }

    /// The weighted least-squares line `y ≈ c + g·x` with weights `w`, from its normal equations.
    fn weighted_line(x: &[f64], y: &[f64], w: &[f64]) -> (f64, f64) {
        let sum = |f: &dyn Fn(usize) -> f64| (0..x.len()).map(f).sum::<f64>();
        let (s, sx, sxx) = (sum(&|i| w[i]), sum(&|i| w[i] * x[i]), sum(&|i| w[i] * x[i] * x[i]));
        let (sy, sxy) = (sum(&|i| w[i] * y[i]), sum(&|i| w[i] * x[i] * y[i]));
        let g = (s * sxy - sx * sy) / (s * sxx - sx * sx);
        ((sy - g * sx) / s, g)
    }

    /// `b` GiB in bytes.
    fn gib(b: f64) -> u64 {
        (b * GIB) as u64
    }

    /// Peak allocated memory is fitted by each run's error relative to its peak: on runs of one
    /// model that no line through the activations fits, the fitted peaks are those of the line of
    /// least squared relative error, not of least squared error.
    #[test]
    fn memory_is_fitted_by_its_error_relative_to_the_peak() {
        let mut runs: Vec<Observation> = [1, 4, 16].iter().map(|&mb| run(ModelPreset::Gpt2, mb, 30.0)).collect();
        let works: Vec<Work> = runs.iter().map(|o| Work::of(&o.query, None)).collect();
        // What each run holds beyond its model states: 1 GiB and 0.5 GiB a unit of activations,
        // off the line by a different amount each.
        let beyond: Vec<f64> = works.iter().zip([0.3, -0.4, 0.2]).map(|(w, d)| 1.0 + 0.5 * w.gact_mem + d).collect();
        for ((o, w), b) in runs.iter_mut().zip(&works).zip(&beyond) {
            o.peak_allocated_bytes = w.device_state_bytes + gib(*b);
        }
        let refs: Vec<&Observation> = runs.iter().collect();
        let coef = fit_memory(&refs, &works);
        let x: Vec<f64> = works.iter().map(|w| w.gact_mem).collect();
        let peak: Vec<f64> = runs.iter().map(|o| o.peak_allocated_bytes as f64 / GIB).collect();
        let relative = weighted_line(&x, &beyond, &peak.iter().map(|p| 1.0 / (p * p)).collect::<Vec<_>>());
        let absolute = weighted_line(&x, &beyond, &[1.0; 3]);
        assert!(relative.0 > 0.0 && relative.1 > 0.0, "the line is the constrained fit's too: {relative:?}");
        assert!((relative.1 - absolute.1).abs() > 1e-3, "the data tell the two fits apart: {relative:?} {absolute:?}");
        for (w, xi) in works.iter().zip(&x) {
            let (mut flags, want) = (Vec::new(), relative.0 + relative.1 * xi);
            let beyond_states = (peak_allocated(&coef, w, &mut flags) - w.device_state_bytes as f64) / GIB;
            assert!((beyond_states - want).abs() < 1e-6 * want, "{beyond_states} against {want}: {coef:?}");
            assert!(flags.is_empty(), "{flags:?}");
        }
    }

    /// What the caching allocator reserves beyond the allocated peak is fitted as a line in the
    /// allocated GiB by each run's error relative to its reserved peak.
    #[test]
    fn reserved_memory_is_fitted_by_its_error_relative_to_the_reserved_peak() {
        let (allocated, reserved) = ([2.0, 10.0, 40.0], [3.0, 13.0, 46.0]);
        let runs: Vec<Observation> = allocated
            .iter()
            .zip(reserved)
            .map(|(&a, r)| Observation {
                peak_allocated_bytes: gib(a),
                peak_reserved_bytes: Some(gib(r)),
                ..run(ModelPreset::Gpt2, 4, 30.0)
            })
            .collect();
        let refs: Vec<&Observation> = runs.iter().collect();
        let coef = fit_reserved(&refs);
        let beyond: Vec<f64> = allocated.iter().zip(reserved).map(|(a, r)| r - a).collect();
        let relative = weighted_line(&allocated, &beyond, &reserved.map(|r| 1.0 / (r * r)));
        let absolute = weighted_line(&allocated, &beyond, &[1.0; 3]);
        assert!(relative.0 > 0.0 && relative.1 > 0.0, "{relative:?}");
        assert!((relative.1 - absolute.1).abs() > 1e-3, "{relative:?} {absolute:?}");
        let got = (coef["reserved.gib"], coef["reserved.per_allocated"]);
        assert!((got.0 - relative.0).abs() < 1e-6 && (got.1 - relative.1).abs() < 1e-6, "{got:?} against {relative:?}");
    }
}
