//! Fitting: the coefficients of [`crate::terms`] from measured runs, by non-negative least squares
//! on relative errors (each run's row divided by its measurement, so a 10 ms run counts as much as
//! a 1 s one, as the targets are stated in percent).
//!
//! A micro-step's time is the larger of its host and device bounds, which is not linear: the fit
//! alternates between assigning each run to the bound that sets its time and fitting both bounds'
//! coefficients on the runs assigned to them, from a start that takes a run as launch-bound when
//! its time per micro-step is within 10% of the fastest of its model, stage and GPU count (more
//! work did not cost more time), and keeps the assignment with the smallest error.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use zerobench_schema::config::Precision;

use crate::model::{
    micro_ms, peak_allocated, step_parts, Bound, CostModel, Fit, FittedRun, Range, FORMAT, UNHIDDEN, VERSION,
};
use crate::nnls::nnls;
use crate::terms::{memory_terms, reserved_terms, step_terms, Part, Term};
use crate::validate::validate;
use crate::work::{Query, Work};

const GIB: f64 = (1u64 << 30) as f64;

/// Fewest distinct configurations a fit accepts: with fewer, every term would be fitted to one
/// point.
pub const MIN_CONFIGURATIONS: usize = 3;

/// One measured run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    pub run_id: String,
    pub gpu: String,
    pub query: Query,
    /// Median step time by the wall-time definition (log schema version 2).
    pub step_ms: f64,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: Option<u64>,
    pub device_memory_bytes: Option<u64>,
    pub peak_tflops: Option<f64>,
    /// Median of the logged optimizer phase (the update on the GPU, or offload's on the host).
    pub optimizer_ms: Option<f64>,
    /// Mean GPU utilisation over the measured steps (NVML), when logged: at 90% or more the run
    /// was bound by the device, below it by the host issuing kernels, whose repeats vary far more.
    pub gpu_util_pct: Option<f64>,
}

/// GPU utilisation from which a run counts as device-bound in the validation report.
pub const DEVICE_BOUND_UTIL_PCT: f64 = 90.0;

impl Observation {
    /// The configuration this run is one repeat of.
    pub fn config_key(&self) -> String {
        format!("{} z{}", self.stage_group_key(), self.query.config.stage.index())
    }

    /// The configurations a user chooses a stage among: this run's but for its stage.
    pub fn stage_group_key(&self) -> String {
        let c = &self.query.config;
        format!(
            "{} {} {} {} mb{} ga{} seq{} tgt{} {}gpu {}node {}",
            self.gpu,
            c.model,
            c.offload,
            c.precision,
            c.micro_batch,
            c.grad_accum,
            c.seq_len,
            c.target_len_or_default(),
            self.query.gpus,
            self.query.nodes,
            c.variant()
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FitError {
    #[error("no runs to fit on: none of the folders holds a finished zerobench run with step times and peak memory")]
    NoRuns,
    #[error(
        "{gpu} {precision}: {configurations} distinct configuration(s) ({runs} runs); a fit needs at least \
         {MIN_CONFIGURATIONS} that differ in model, batch, sequence, stage or GPU count"
    )]
    TooFewConfigurations { gpu: String, precision: Precision, configurations: usize, runs: usize },
}

/// Coefficients of one fit, before validation.
#[derive(Debug, Clone)]
pub(crate) struct Coefficients {
    pub step: BTreeMap<String, f64>,
    pub memory: BTreeMap<String, f64>,
    pub reserved: BTreeMap<String, f64>,
}

/// Fits one model per GPU kind and precision found in `obs`.
pub fn fit(obs: &[Observation]) -> Result<CostModel, FitError> {
    if obs.is_empty() {
        return Err(FitError::NoRuns);
    }
    let mut kinds: BTreeMap<(String, Precision), Vec<&Observation>> = BTreeMap::new();
    for o in obs {
        kinds.entry((o.gpu.clone(), o.query.config.precision)).or_default().push(o);
    }
    let mut fits = Vec::new();
    for ((gpu, precision), runs) in kinds {
        let configurations = runs.iter().map(|o| o.config_key()).collect::<std::collections::BTreeSet<_>>().len();
        if configurations < MIN_CONFIGURATIONS {
            return Err(FitError::TooFewConfigurations { gpu, precision, configurations, runs: runs.len() });
        }
        let coef = fit_coefficients(&runs);
        let (validation, step_interval, memory_interval) = validate(&runs);
        let mut range = Range::default();
        for o in &runs {
            range.cover(&Work::of(&o.query), &o.query);
        }
        fits.push(Fit {
            gpu,
            precision,
            device_memory_bytes: runs.iter().filter_map(|o| o.device_memory_bytes).min(),
            peak_tflops: runs.iter().find_map(|o| o.peak_tflops),
            step: coef.step,
            memory: coef.memory,
            reserved: coef.reserved,
            range,
            step_interval,
            memory_interval,
            validation,
            runs: runs
                .iter()
                .map(|o| FittedRun {
                    run_id: o.run_id.clone(),
                    query: o.query.clone(),
                    step_ms: o.step_ms,
                    peak_allocated_bytes: o.peak_allocated_bytes,
                })
                .collect(),
        });
    }
    Ok(CostModel { format: FORMAT.to_string(), version: VERSION, fits })
}

/// The coefficients for runs of one GPU kind and precision.
pub(crate) fn fit_coefficients(runs: &[&Observation]) -> Coefficients {
    let works: Vec<Work> = runs.iter().map(|o| Work::of(&o.query)).collect();
    Coefficients { step: fit_step(runs, &works), memory: fit_memory(runs, &works), reserved: fit_reserved(runs) }
}

/// The step coefficients, fitted in stages so that each is fitted on the measurement that isolates
/// it: the optimizer on the logged optimizer phase; the micro-step's bounds on one-GPU runs without
/// offload (their step less the optimizer); offload's and communication's terms on what their runs
/// add to the step beyond the compute and optimizer already fitted.
fn fit_step(runs: &[&Observation], works: &[Work]) -> BTreeMap<String, f64> {
    let all: Vec<usize> = (0..runs.len()).collect();
    let mut coef = BTreeMap::new();
    // 1. The optimizer on the GPU.
    let opt: Vec<usize> =
        all.iter().copied().filter(|&i| works[i].gparams_device > 0.0 && runs[i].optimizer_ms.is_some()).collect();
    coef.extend(fit_terms(&opt, works, &|w| only(step_terms(w), "optimizer."), &|i| {
        runs[i].optimizer_ms.unwrap_or(0.0)
    }));
    let optimizer = |coef: &BTreeMap<String, f64>, w: &Work| {
        let mut f = Vec::new();
        let t = only(step_terms(w), "optimizer.");
        crate::model::eval(coef, &t, Part::Step, &mut f)
    };
    // 2. The micro-step: one GPU, no offload.
    let single: Vec<usize> = all
        .iter()
        .copied()
        .filter(|&i| works[i].gpus == 1 && works[i].offload == zerobench_schema::config::Offload::None)
        .collect();
    let micro_target: Vec<f64> = single
        .iter()
        .map(|&i| ((runs[i].step_ms - optimizer(&coef, &works[i])) / works[i].micro_steps).max(0.0))
        .collect();
    coef.extend(fit_micro(&single, runs, works, &micro_target));
    // 3. Offload and 4. communication, on what their runs add.
    let extra = |coef: &BTreeMap<String, f64>, i: usize| {
        let mut f = Vec::new();
        let w = &works[i];
        let (micro, _) = micro_ms(coef, &step_terms(w), &mut f);
        runs[i].step_ms - w.micro_steps * micro - optimizer(coef, w)
    };
    let offloaded: Vec<usize> = all
        .iter()
        .copied()
        .filter(|&i| works[i].offload != zerobench_schema::config::Offload::None && works[i].gpus == 1)
        .collect();
    let fitted = coef.clone();
    coef.extend(fit_terms(&offloaded, works, &|w| only(step_terms(w), "offload"), &|i| extra(&fitted, i)));
    let several: Vec<usize> = all.iter().copied().filter(|&i| works[i].gpus > 1).collect();
    let fitted = coef.clone();
    let comm_and_offload = |w: &Work| {
        step_terms(w)
            .into_iter()
            .filter(|t| t.name.starts_with("comm.") || t.name.starts_with("offload"))
            .collect::<Vec<_>>()
    };
    // Offload's terms are fitted already; on several GPUs only communication's are new.
    let offload_done = |i: usize| {
        let mut f = Vec::new();
        extra(&fitted, i) - crate::model::eval(&fitted, &only(step_terms(&works[i]), "offload"), Part::Step, &mut f)
    };
    coef.extend(fit_terms(&several, works, &|w| only(comm_and_offload(w), "comm."), &offload_done));
    coef
}

/// The terms whose names start with `prefix`.
fn only(terms: Vec<Term>, prefix: &str) -> Vec<Term> {
    terms.into_iter().filter(|t| t.name.starts_with(prefix)).collect()
}

/// NNLS of `target(i)` on the (per-step) terms of the runs `idx`, on relative errors.
fn fit_terms(
    idx: &[usize],
    works: &[Work],
    terms: &dyn Fn(&Work) -> Vec<Term>,
    target: &dyn Fn(usize) -> f64,
) -> BTreeMap<String, f64> {
    let ts: Vec<Vec<Term>> = idx.iter().map(|&i| terms(&works[i])).collect();
    let names = names_of(&ts);
    let mut rows = Vec::new();
    let mut b = Vec::new();
    for (t, &i) in ts.iter().zip(idx) {
        let y = target(i);
        // Relative to the quantity fitted, floored so a near-zero target does not dominate.
        let scale = y.abs().max(1e-3);
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
    names.into_iter().zip(nnls(&rows, &b)).collect()
}

/// The micro-step's host and device bounds (see the module documentation).
fn fit_micro(idx: &[usize], runs: &[&Observation], works: &[Work], target: &[f64]) -> BTreeMap<String, f64> {
    let sub_runs: Vec<&Observation> = idx.iter().map(|&i| runs[i]).collect();
    let sub_works: Vec<Work> = idx.iter().map(|&i| works[i].clone()).collect();
    let terms: Vec<Vec<Term>> =
        sub_works.iter().map(|w| step_terms(w).into_iter().filter(|t| t.part != Part::Step).collect()).collect();
    let start = initial_bounds(&sub_runs, &sub_works);
    // The unhidden share is searched on a grid; for each, the bounds' coefficients by alternation.
    (0..=UNHIDDEN_STEPS)
        .map(|k| fit_bounds(&terms, target, &start, f64::from(k) / f64::from(UNHIDDEN_STEPS)))
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
        .unwrap_or_default()
}

/// Grid steps of the unhidden share between 0 (the longer bound alone) and 1 (both added).
const UNHIDDEN_STEPS: u32 = 10;

/// The bounds' coefficients for one unhidden share, and their squared relative error.
fn fit_bounds(terms: &[Vec<Term>], target: &[f64], start: &[bool], unhidden: f64) -> (f64, BTreeMap<String, f64>) {
    let names = names_of(terms);
    let mut launch_bound = start.to_vec();
    let mut best: Option<(f64, BTreeMap<String, f64>)> = None;
    for _ in 0..30 {
        let rows: Vec<Vec<f64>> = terms
            .iter()
            .zip(&launch_bound)
            .zip(target)
            .map(|((ts, host), y)| {
                let mut row = vec![0.0; names.len()];
                for t in ts {
                    let weight = match t.part {
                        Part::Host if *host => 1.0,
                        Part::Device if !*host => 1.0,
                        Part::Host | Part::Device => unhidden,
                        _ => 1.0,
                    };
                    row[names.binary_search(&t.name).unwrap_or_default()] += weight * t.x / y.max(1e-3);
                }
                row
            })
            .collect();
        let ones = vec![1.0; rows.len()];
        let mut coef: BTreeMap<String, f64> = names.iter().cloned().zip(nnls(&rows, &ones)).collect();
        coef.insert(UNHIDDEN.to_string(), unhidden);
        let mut f = Vec::new();
        let micro: Vec<(f64, Bound)> = terms.iter().map(|ts| micro_ms(&coef, ts, &mut f)).collect();
        let err: f64 = micro.iter().zip(target).map(|((m, _), y)| (m / y.max(1e-3) - 1.0).powi(2)).sum();
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

/// Predicted step ms and peak allocated bytes of a query from bare coefficients (validation).
pub(crate) fn predict_with(c: &Coefficients, q: &Query) -> (f64, f64) {
    let w = Work::of(q);
    let mut flags = Vec::new();
    (step_parts(&c.step, &w, &mut flags).step_ms, peak_allocated(&c.memory, &w, &mut flags))
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerobench_schema::config::{Offload, RunConfig, ZeroStage};
    use zerobench_schema::models::ModelPreset;

    /// Coefficients to generate runs from: launch-bound small models, device-bound large ones.
    fn truth() -> BTreeMap<String, f64> {
        [
            ("gpt2.launch_ms", 1.0),
            ("gpt2.launch_ms_per_unit", 0.9),
            ("gpt2.device_ms", 2.0),
            ("gpt2.ms_per_gflop", 0.0019),
            ("gpt2.ms_per_gact", 4.0),
            ("t5.launch_ms", 3.0),
            ("t5.launch_ms_per_unit", 1.5),
            ("t5.device_ms", 4.0),
            ("t5.ms_per_gflop", 0.0025),
            ("t5.ms_per_gact", 2.0),
            ("stage3.ms_per_gparam_gathered", 1.5),
            ("optimizer.ms_per_gparam", 8.8),
            ("offload.ms_per_gparam", 150.0),
            ("comm.ms", 1.0),
            ("comm.stage0.ms_per_gb", 2.0),
            ("comm.stage1.ms_per_gb", 3.0),
            ("comm.stage2.ms_per_gb", 3.0),
            ("comm.stage3.ms_per_gb", 1.0),
            (UNHIDDEN, 0.2),
            ("launch_ms_per_unit_kd", 0.0),
            ("head.ms_per_gvocab", 0.0),
            ("stage3.launch_ms_per_unit", 0.0),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    fn memory_truth() -> BTreeMap<String, f64> {
        [
            ("gpt2.mem_gib", 0.5),
            ("gpt2.mem_gib_per_gact", 20.0),
            ("t5.mem_gib", 0.3),
            ("t5.mem_gib_per_gact", 30.0),
            ("mem_gib_per_gparam_largest", 0.0),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    fn observe(model: ModelPreset, stage: ZeroStage, mb: u32, seq: u32, gpus: u32, offload: Offload) -> Observation {
        let mut c = RunConfig::new(model, stage);
        (c.micro_batch, c.seq_len, c.offload) = (mb, seq, offload);
        let query = Query { config: c, gpus, nodes: 1 };
        let w = Work::of(&query);
        let mut flags = Vec::new();
        let step = step_parts(&truth(), &w, &mut flags).step_ms;
        let peak = peak_allocated(&memory_truth(), &w, &mut flags);
        assert!(flags.is_empty(), "{flags:?}");
        let mut f = Vec::new();
        let optimizer = crate::model::eval(&truth(), &step_terms(&w), Part::Step, &mut f)
            - crate::model::eval(&truth(), &only(step_terms(&w), "comm."), Part::Step, &mut f)
            - crate::model::eval(&truth(), &only(step_terms(&w), "offload"), Part::Step, &mut f);
        Observation {
            run_id: format!("{model}-z{}-mb{mb}-s{seq}-{gpus}-{offload}", stage.index()),
            gpu: "GPU".into(),
            query,
            step_ms: step,
            peak_allocated_bytes: peak.round() as u64,
            peak_reserved_bytes: Some(peak.round() as u64 + (1 << 28)),
            device_memory_bytes: Some(141 << 30),
            peak_tflops: Some(989.0),
            optimizer_ms: Some(if offload == Offload::None { optimizer } else { 0.0 }),
            gpu_util_pct: Some(95.0),
        }
    }

    fn sweep() -> Vec<Observation> {
        let mut v = Vec::new();
        let models = [
            (ModelPreset::Gpt2, 1024),
            (ModelPreset::Gpt2Medium, 1024),
            (ModelPreset::Gpt2Xl, 1024),
            (ModelPreset::T5Small, 512),
            (ModelPreset::T5Large, 512),
        ];
        for (m, long) in models {
            for mb in [1, 4, 16] {
                for seq in [256, long] {
                    for stage in [ZeroStage::Z0, ZeroStage::Z3] {
                        v.push(observe(m, stage, mb, seq, 1, Offload::None));
                    }
                }
            }
            for stage in ZeroStage::ALL {
                v.push(observe(m, stage, 4, long, 2, Offload::None));
            }
            v.push(observe(m, ZeroStage::Z2, 4, long, 1, Offload::Optimizer));
        }
        v
    }

    #[test]
    fn the_fit_recovers_what_generated_the_runs() {
        let runs = sweep();
        let model = fit(&runs).unwrap();
        let f = &model.fits[0];
        // The terms each stage of the fit isolates come back exactly.
        for name in ["optimizer.ms_per_gparam", "offload.ms_per_gparam", UNHIDDEN] {
            let (got, want) = (f.step[name], truth()[name]);
            assert!((got - want).abs() <= 1e-6 * want.max(1.0), "{name}: {got} vs {want}");
        }
        // Every run, and configurations never generated, are predicted as the truth prices them.
        let unseen = [
            observe(ModelPreset::Gpt2Large, ZeroStage::Z1, 8, 512, 1, Offload::None),
            observe(ModelPreset::T5Base, ZeroStage::Z3, 2, 384, 2, Offload::None),
            observe(ModelPreset::Gpt2Large, ZeroStage::Z2, 4, 1024, 1, Offload::Optimizer),
        ];
        for o in runs.iter().chain(&unseen) {
            let p = f.predict(&o.query);
            assert!((p.step_ms / o.step_ms - 1.0).abs() < 0.01, "{}: {} vs {}", o.run_id, p.step_ms, o.step_ms);
            let mem = p.peak_allocated_bytes as f64 / o.peak_allocated_bytes as f64 - 1.0;
            assert!(mem.abs() < 0.005, "{}: memory off by {mem}", o.run_id);
        }
        // Held out, the same: k-fold errors near zero, and the stage choice always right.
        assert!(f.validation.step_mape_pct < 1.0, "{}", f.validation.step_mape_pct);
        assert!(f.validation.memory_mape_pct < 0.5, "{}", f.validation.memory_mape_pct);
        let c = &f.validation.stage_choice.all;
        assert_eq!((c.right_within_tie, c.groups > 10), (c.groups, true), "{c:?}");
    }

    #[test]
    fn too_few_configurations_and_no_runs_are_errors() {
        assert!(matches!(fit(&[]), Err(FitError::NoRuns)));
        let one = observe(ModelPreset::Gpt2, ZeroStage::Z0, 4, 1024, 1, Offload::None);
        let repeats = vec![one.clone(), one.clone(), one];
        let err = fit(&repeats).unwrap_err();
        assert!(matches!(err, FitError::TooFewConfigurations { configurations: 1, runs: 3, .. }), "{err}");
        assert!(err.to_string().contains("1 distinct configuration"), "{err}");
    }

    #[test]
    fn each_gpu_kind_gets_its_own_fit() {
        let mut runs = sweep();
        let mut other = sweep();
        for o in &mut other {
            o.gpu = "Other GPU".into();
            o.step_ms *= 2.0;
        }
        runs.extend(other);
        let model = fit(&runs).unwrap();
        assert_eq!(model.fits.len(), 2);
        let q = &runs[5].query;
        let a = model.fit_for("GPU", q.config.precision).unwrap().predict(q).step_ms;
        let b = model.fit_for("other", q.config.precision).unwrap().predict(q).step_ms;
        assert!((b / a - 2.0).abs() < 0.02, "{a} {b}");
    }
}
