//! Validation by k-fold over configurations: the runs of each configuration (all its repeats) are
//! held out together, so no run's own steps, nor a repeat of it, are on both sides; every run is
//! predicted by a fit that never saw its configuration. The folds go further and hold out every
//! stage of a configuration together (same model, batch, sequence, accumulation, offload, GPUs), so
//! the stages a user chooses between are all predicted by one fit that saw none of them.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use zerobench_schema::fnv::fnv1a;

use crate::coefficients::{fit_coefficients, predict_with};
use crate::observation::Observation;
use crate::price::Bound;

/// Folds, at most (fewer when there are fewer configurations).
pub const FOLDS: usize = 5;

/// Held-out runs a bound needs before it gets an interval of its own.
pub const MIN_INTERVAL_RUNS: usize = 10;

/// The 5th-95th percentile intervals of held-out step errors (measured / predicted − 1) of the
/// runs predicted launch-bound and of those predicted device-bound: the host sets the first, whose
/// repeats and hosts differ by far more, so one interval for both would be too wide for one and too
/// narrow for the other. None for a bound with fewer than [`MIN_INTERVAL_RUNS`] held-out runs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BoundIntervals {
    pub launch: Option<[f64; 2]>,
    pub device: Option<[f64; 2]>,
}

impl BoundIntervals {
    pub fn of(&self, bound: Bound) -> Option<[f64; 2]> {
        match bound {
            Bound::Launch => self.launch,
            Bound::Device => self.device,
        }
    }
}

/// What [`validate`] gives the fit besides its report: the intervals predictions are given with.
pub struct Intervals {
    /// Over every held-out run.
    pub step: [f64; 2],
    pub step_by_bound: BoundIntervals,
    pub memory: [f64; 2],
}

/// A stage counts as the right choice when its measured time is within this of the fastest
/// stage's: closer than that, repeats of one configuration disagree (docs/cost-model.md).
pub const STAGE_TIE: f64 = 0.02;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Validation {
    pub folds: u32,
    pub configurations: u32,
    pub runs: u32,
    /// Mean absolute percentage errors over every held-out run.
    pub step_mape_pct: f64,
    pub memory_mape_pct: f64,
    /// Step-time error of the runs that kept the GPU busy ([`DEVICE_BOUND_UTIL_PCT`](crate::observation::DEVICE_BOUND_UTIL_PCT) or more) and
    /// of the rest (launch-bound; their repeats differ by ~15%), with how many runs each.
    pub device_bound: ClassError,
    pub launch_bound: ClassError,
    /// Models fitted before this figure existed read as zero.
    #[serde(default)]
    pub by_configuration: ConfigurationError,
    pub groups: Vec<GroupError>,
    pub stage_choice: StageChoice,
    pub held_out: Vec<HeldOut>,
}

/// The step-time error of a class of runs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClassError {
    pub runs: u32,
    pub step_mape_pct: f64,
}

/// Step-time error per configuration instead of per run: each configuration's median over its
/// held-out repeats against its prediction; and the repeats' own spread, the per-run error left
/// when every configuration's median is predicted exactly (the mean over runs of |run − its
/// configuration's median| / run), which no prediction of a configuration goes below.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ConfigurationError {
    pub configurations: u32,
    /// Configurations with more than one held-out run.
    pub repeated: u32,
    pub step_mape_pct: f64,
    pub repeat_floor_pct: f64,
}

/// Errors of one family, stage, offload setting and GPU count.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupError {
    pub family: String,
    pub stage: u8,
    pub offload: String,
    pub gpus: u32,
    pub runs: u32,
    pub step_mape_pct: f64,
    pub memory_mape_pct: f64,
}

/// Over groups of configurations that differ only in the stage (same model, batch, sequence,
/// accumulation, offload, GPUs): how often the stage predicted fastest is the fastest measured,
/// exactly and within [`STAGE_TIE`]; over all groups, over those whose every run kept the GPU
/// busy (device-bound: repeats agree within ~1%, so the measured order means something; in
/// launch-bound groups repeats differ by more than the stages do), and over those whose repeats
/// decide which stage is fastest ([`decides`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StageChoice {
    pub all: ChoiceCount,
    pub device_bound: ChoiceCount,
    /// Models fitted before this count existed read as none.
    #[serde(default)]
    pub decided: ChoiceCount,
}

/// Repeats each stage of a group needs before the group can count as decided.
pub const DECIDING_REPEATS: usize = 3;

/// Whether the measured repeats of a group (per stage) say which stage is fastest: each stage has
/// at least [`DECIDING_REPEATS`] runs and every run of the fastest stage (by median) is faster
/// than every run of each other stage. When two stages take the same time, three runs against
/// three separate so by chance with probability 2/20 (either stage below the other; a rank test
/// at 10%), and less often with more stages; groups whose repeats overlap are left undecided,
/// whatever their medians.
pub fn decides(measured: &[&[f64]]) -> bool {
    if measured.len() < 2 || measured.iter().any(|m| m.len() < DECIDING_REPEATS) {
        return false;
    }
    let Some(f) = (0..measured.len()).min_by(|&a, &b| median(measured[a]).total_cmp(&median(measured[b]))) else {
        return false;
    };
    let top = measured[f].iter().copied().fold(f64::NEG_INFINITY, f64::max);
    measured.iter().enumerate().filter(|(j, _)| *j != f).all(|(_, m)| m.iter().all(|&x| x > top))
}

/// How the stage a model predicts fastest fares against the measured stages of a set of groups.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChoiceCount {
    pub groups: u32,
    /// The chosen stage is the fastest measured (by the median of its runs).
    pub right: u32,
    /// Within [`STAGE_TIE`] of it.
    pub right_within_tie: u32,
    /// The chosen stage is not the fastest, and the repeats of the two say so: every run of the
    /// fastest is faster than every run of the chosen one, with [`DECIDING_REPEATS`] runs each or
    /// more ([`decides`]). The other misses are stages the repeats cannot tell apart, or have too
    /// few runs to. Models fitted before this count existed read as none.
    #[serde(default)]
    pub shown_slower: u32,
    /// What choosing by the model costs: the chosen stage's measured median over the fastest
    /// stage's, minus 1, in percent; the mean and the largest over the groups.
    #[serde(default)]
    pub regret_pct_mean: f64,
    #[serde(default)]
    pub regret_pct_max: f64,
}

impl ChoiceCount {
    /// Adds a group: the measured runs of the stage chosen and of the fastest stage (the same
    /// runs when the choice is right).
    fn add(&mut self, chosen: &[f64], fastest: &[f64]) {
        let j = Judgement::of(chosen, fastest);
        self.groups += 1;
        self.right += u32::from(j.right);
        self.right_within_tie += u32::from(j.right_within_tie);
        self.shown_slower += u32::from(j.shown_slower);
        self.regret_pct_mean += (j.regret_pct - self.regret_pct_mean) / f64::from(self.groups);
        self.regret_pct_max = self.regret_pct_max.max(j.regret_pct);
    }
}

/// How one group's choice fares ([`ChoiceCount`] counts these over groups).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Judgement {
    /// The chosen stage is the fastest measured (by the median of its runs).
    pub right: bool,
    /// Within [`STAGE_TIE`] of it.
    pub right_within_tie: bool,
    /// Not the fastest, and the repeats of the two say so ([`decides`]).
    pub shown_slower: bool,
    /// The chosen stage's measured median over the fastest's, minus 1, in percent.
    pub regret_pct: f64,
}

impl Judgement {
    /// From the measured runs of the stage chosen and of the fastest stage.
    pub fn of(chosen: &[f64], fastest: &[f64]) -> Judgement {
        let (c, f) = (median(chosen), median(fastest));
        Judgement {
            right: c <= f,
            right_within_tie: c <= f * (1.0 + STAGE_TIE),
            shown_slower: c > f && decides(&[fastest, chosen]),
            regret_pct: (c / f - 1.0) * 100.0,
        }
    }
}

/// One group of runs of one build that differ only in the stage ([`Observation::stage_choice_key`]),
/// with two stages or more: each stage's measured runs and the model's price of it, the stage the
/// model chooses (priced fastest) and the fastest measured (by the median of its runs).
#[derive(Debug, Clone, PartialEq)]
pub struct GroupChoice {
    pub key: String,
    /// In stage order.
    pub stages: Vec<StageRuns>,
    pub chosen: u8,
    pub fastest: u8,
    /// Every run of the group kept the GPU busy.
    pub device_bound: bool,
    /// The repeats say which stage is fastest ([`decides`]).
    pub decided: bool,
}

/// One stage of a [`GroupChoice`]: its runs' measured step ms and the median of their predictions.
#[derive(Debug, Clone, PartialEq)]
pub struct StageRuns {
    pub stage: u8,
    pub measured: Vec<f64>,
    pub predicted: f64,
}

impl StageRuns {
    pub fn median(&self) -> f64 {
        median(&self.measured)
    }
}

impl GroupChoice {
    /// The measured runs of `stage`.
    pub fn runs(&self, stage: u8) -> &[f64] {
        self.stages.iter().find(|s| s.stage == stage).map_or(&[], |s| s.measured.as_slice())
    }

    pub fn judgement(&self) -> Judgement {
        Judgement::of(self.runs(self.chosen), self.runs(self.fastest))
    }
}

/// The groups among `priced` runs (each with the model's predicted step), with the model's choice
/// in each; groups with one stage choose nothing and are left out. `zerobench fit --validate`
/// counts these over its k-fold predictions, `zerobench ingest --cost-model` lists them.
pub fn stage_choices(priced: &[(&Observation, f64)]) -> Vec<GroupChoice> {
    // Per group, per stage: measured and predicted step times over its repeats, and whether every
    // run of the group was device-bound.
    let mut by: BTreeMap<String, (BTreeMap<u8, Pair>, bool)> = BTreeMap::new();
    for (o, predicted) in priced {
        let g = by.entry(o.stage_choice_key()).or_insert_with(|| (BTreeMap::new(), true));
        g.1 &= o.kept_gpu_busy().unwrap_or(false);
        let e = g.0.entry(o.query.config.stage.index()).or_default();
        e.0.push(o.step_ms);
        e.1.push(*predicted);
    }
    let mut out = Vec::new();
    for (key, (stages, device_bound)) in by.into_iter().filter(|(_, (s, _))| s.len() >= 2) {
        let least = |pick: fn(&Pair) -> &Vec<f64>| {
            stages.iter().min_by(|a, b| median(pick(a.1)).total_cmp(&median(pick(b.1)))).map(|(s, _)| *s)
        };
        let (Some(chosen), Some(fastest)) = (least(|p| &p.1), least(|p| &p.0)) else { continue };
        let decided = decides(&stages.values().map(|(m, _)| m.as_slice()).collect::<Vec<_>>());
        let stages = stages
            .into_iter()
            .map(|(stage, (measured, p))| StageRuns { stage, measured, predicted: median(&p) })
            .collect();
        out.push(GroupChoice { key, stages, chosen, fastest, device_bound, decided });
    }
    out
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeldOut {
    pub run_id: String,
    pub configuration: String,
    pub step_ms: f64,
    pub predicted_step_ms: f64,
    pub peak_allocated_bytes: u64,
    pub predicted_peak_allocated_bytes: u64,
}

/// Measured and predicted values (or step and memory errors) collected side by side.
type Pair = (Vec<f64>, Vec<f64>);

/// A held-out run and what the fit that never saw it predicted: step ms, the bound that set it,
/// peak allocated bytes.
struct Held<'a> {
    run: &'a Observation,
    step: f64,
    bound: Bound,
    mem: f64,
}

/// Validates by k-fold and returns the report and the 5th-95th percentile intervals of the
/// relative errors (measured / predicted − 1) of step time and memory.
pub fn validate(runs: &[&Observation]) -> (Validation, Intervals) {
    let configs: BTreeSet<String> = runs.iter().map(|o| o.config_key()).collect();
    let groups: BTreeSet<String> = runs.iter().map(|o| o.stage_group_key()).collect();
    let k = FOLDS.min(groups.len()).max(1);
    // Folds by a hash of the group's key, so that they do not follow the sweep's order. Where
    // that leaves a fold without a group (two groups whose hashes agree modulo 2: nothing was held
    // out, and the validation reported no error over no runs), the groups are dealt to the folds
    // one after another in the order of their hashes instead, so each fold holds one at least.
    let mut dealt: Vec<(u64, &str)> = groups.iter().map(|g| (fnv1a(g.as_bytes()), g.as_str())).collect();
    dealt.sort_unstable();
    let hashed = |h: u64| (h % k as u64) as usize;
    let every_fold_held = (0..k).all(|f| dealt.iter().any(|&(h, _)| hashed(h) == f));
    let folds: BTreeMap<&str, usize> =
        dealt.iter().enumerate().map(|(i, &(h, g))| (g, if every_fold_held { hashed(h) } else { i % k })).collect();
    // Each run's fold, once (its key is built from its configuration).
    let fold_of: Vec<usize> = runs.iter().map(|o| folds[o.stage_group_key().as_str()]).collect();
    let in_fold = |fold: usize, held_out: bool| -> Vec<&Observation> {
        runs.iter().zip(&fold_of).filter(|&(_, &f)| (f == fold) == held_out).map(|(&o, _)| o).collect()
    };
    let mut held = Vec::new();
    for fold in 0..k {
        let (train, test) = (in_fold(fold, false), in_fold(fold, true));
        if train.is_empty() || test.is_empty() {
            continue;
        }
        let (coef, _) = fit_coefficients(&train);
        for o in test {
            let (step, bound, mem) = predict_with(&coef, &o.query);
            held.push(Held { run: o, step, bound, mem });
        }
    }
    let ape = |m: f64, p: f64| ((p - m) / m).abs() * 100.0;
    let mean = |v: &[f64]| if v.is_empty() { 0.0 } else { v.iter().sum::<f64>() / v.len() as f64 };
    let steps: Vec<f64> = held.iter().map(|h| ape(h.run.step_ms, h.step)).collect();
    let mems: Vec<f64> = held.iter().map(|h| ape(h.run.peak_allocated_bytes as f64, h.mem)).collect();
    let mut groups: BTreeMap<(String, u8, String, u32), Pair> = BTreeMap::new();
    for (h, (s, m)) in held.iter().zip(steps.iter().zip(&mems)) {
        let (o, c) = (h.run, &h.run.query.config);
        let g = groups
            .entry((c.model.spec().family().to_string(), c.stage.index(), c.offload.to_string(), o.query.gpus))
            .or_default();
        g.0.push(*s);
        g.1.push(*m);
    }
    let rel = |m: f64, p: f64| m / p - 1.0;
    let step_interval = percentiles(held.iter().map(|h| rel(h.run.step_ms, h.step)).collect());
    let memory_interval = percentiles(held.iter().map(|h| rel(h.run.peak_allocated_bytes as f64, h.mem)).collect());
    let bound_interval = |b: Bound| {
        let v: Vec<f64> = held.iter().filter(|h| h.bound == b).map(|h| rel(h.run.step_ms, h.step)).collect();
        (v.len() >= MIN_INTERVAL_RUNS).then(|| percentiles(v))
    };
    let step_by_bound = BoundIntervals { launch: bound_interval(Bound::Launch), device: bound_interval(Bound::Device) };
    let class = |device: bool| {
        let v: Vec<f64> = held
            .iter()
            .zip(&steps)
            .filter(|(h, _)| h.run.kept_gpu_busy().unwrap_or(false) == device)
            .map(|(_, s)| *s)
            .collect();
        ClassError { runs: v.len() as u32, step_mape_pct: mean(&v) }
    };
    let validation = Validation {
        by_configuration: by_configuration(&held),
        device_bound: class(true),
        launch_bound: class(false),
        folds: k as u32,
        configurations: configs.len() as u32,
        runs: held.len() as u32,
        step_mape_pct: mean(&steps),
        memory_mape_pct: mean(&mems),
        groups: groups
            .into_iter()
            .map(|((family, stage, offload, gpus), (s, m))| GroupError {
                family,
                stage,
                offload,
                gpus,
                runs: s.len() as u32,
                step_mape_pct: mean(&s),
                memory_mape_pct: mean(&m),
            })
            .collect(),
        stage_choice: stage_choice(&held),
        held_out: held
            .iter()
            .map(|h| HeldOut {
                run_id: h.run.run_id.clone(),
                configuration: h.run.config_key(),
                step_ms: h.run.step_ms,
                predicted_step_ms: h.step,
                peak_allocated_bytes: h.run.peak_allocated_bytes,
                predicted_peak_allocated_bytes: h.mem.round() as u64,
            })
            .collect(),
    };
    (validation, Intervals { step: step_interval, step_by_bound, memory: memory_interval })
}

fn by_configuration(held: &[Held]) -> ConfigurationError {
    // Per configuration: its runs' measured steps and their predictions. Runs of one configuration
    // on hosts of different AdamW rates are priced apart (offload): the median of the predictions
    // against the median of the measurements, not the first run's host against all of them.
    let mut by: BTreeMap<String, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    for h in held {
        let (measured, predicted) = by.entry(h.run.config_key()).or_default();
        measured.push(h.run.step_ms);
        predicted.push(h.step);
    }
    if by.is_empty() {
        return ConfigurationError::default();
    }
    let (mut config_ape, mut floor) = (0.0, 0.0);
    for (m, p) in by.values() {
        let (med, p) = (median(m), median(p));
        config_ape += ((p - med) / med).abs();
        floor += m.iter().map(|&x| ((x - med) / x).abs()).sum::<f64>();
    }
    ConfigurationError {
        configurations: by.len() as u32,
        repeated: by.values().filter(|(m, _)| m.len() > 1).count() as u32,
        step_mape_pct: config_ape / by.len() as f64 * 100.0,
        repeat_floor_pct: floor / held.len() as f64 * 100.0,
    }
}

fn stage_choice(held: &[Held]) -> StageChoice {
    let priced: Vec<(&Observation, f64)> = held.iter().map(|h| (h.run, h.step)).collect();
    let mut out = StageChoice::default();
    for g in stage_choices(&priced) {
        let (chosen, fastest) = (g.runs(g.chosen), g.runs(g.fastest));
        out.all.add(chosen, fastest);
        if g.device_bound {
            out.device_bound.add(chosen, fastest);
        }
        if g.decided {
            out.decided.add(chosen, fastest);
        }
    }
    out
}

/// The median of `v` as every part of zerobench takes it ([`zerobench_schema::stats::median`]);
/// NaN for none.
fn median(v: &[f64]) -> f64 {
    zerobench_schema::stats::median(v).unwrap_or(f64::NAN)
}

/// 5th and 95th percentiles (nearest rank); [0, 0] when empty.
fn percentiles(mut v: Vec<f64>) -> [f64; 2] {
    if v.is_empty() {
        return [0.0, 0.0];
    }
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((q * (v.len() - 1) as f64).round() as usize).min(v.len() - 1)];
    [at(0.05), at(0.95)]
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerobench_schema::config::{RunConfig, ZeroStage};
    use zerobench_schema::models::ModelPreset;

    /// Each group counts as right or not by the medians, as shown slower only when the chosen
    /// stage's repeats separate from the fastest's, and adds its cost to the mean and the largest.
    #[test]
    fn a_choice_counts_its_cost_and_whether_the_repeats_show_it_slower() {
        let mut c = ChoiceCount::default();
        let fastest = [10.0, 10.2, 9.9];
        c.add(&fastest, &fastest);
        assert_eq!((c.groups, c.right, c.right_within_tie, c.shown_slower, c.regret_pct_max), (1, 1, 1, 0, 0.0));
        // 1% slower by the medians, runs overlapping the fastest's: a miss within the tie, not shown.
        c.add(&[10.1, 9.8, 10.3], &fastest);
        assert_eq!((c.groups, c.right, c.right_within_tie, c.shown_slower), (2, 1, 2, 0));
        // 10% slower and every run slower: shown.
        c.add(&[11.0, 11.1, 10.9], &fastest);
        assert_eq!((c.groups, c.right, c.right_within_tie, c.shown_slower), (3, 1, 2, 1));
        // Separated, but two runs of the chosen stage cannot show it.
        c.add(&[12.0, 12.0], &fastest);
        assert_eq!((c.groups, c.right, c.shown_slower), (4, 1, 1));
        let want = [0.0, 1.0, 10.0, 20.0];
        let mean = want.iter().sum::<f64>() / 4.0;
        assert!((c.regret_pct_mean - mean).abs() < 1e-9, "{} vs {mean}", c.regret_pct_mean);
        assert!((c.regret_pct_max - 20.0).abs() < 1e-9, "{}", c.regret_pct_max);
    }

    /// A run of gpt2 at `stage` by worker `build`, measured at `step` ms.
    fn run_of(stage: ZeroStage, build: Option<&str>, step: f64) -> Observation {
        let query = crate::work::Query::new(RunConfig::new(ModelPreset::Gpt2, stage), 1, 1);
        let run = Observation::measured(format!("z{}-{build:?}-{step}", stage.index()), query, step);
        Observation { build: build.map(String::from), ..run }
    }

    /// Runs of one configuration by two builds, and by a build the logs do not name, are three
    /// groups: each build's stages are compared among themselves, never with another build's (a
    /// pooled group would measure stage 2, the unknown build's, fastest).
    #[test]
    fn the_stage_choice_compares_the_stages_of_one_build() {
        let runs = [
            run_of(ZeroStage::Z0, Some("a"), 10.0),
            run_of(ZeroStage::Z1, Some("a"), 11.0),
            run_of(ZeroStage::Z0, Some("b"), 12.0),
            run_of(ZeroStage::Z3, Some("b"), 8.0),
            run_of(ZeroStage::Z2, None, 5.0),
        ];
        // Priced as measured: the model chooses each group's fastest.
        let priced: Vec<(&Observation, f64)> = runs.iter().map(|o| (o, o.step_ms)).collect();
        let groups = stage_choices(&priced);
        let seen: Vec<(Vec<u8>, u8, u8)> =
            groups.iter().map(|g| (g.stages.iter().map(|s| s.stage).collect(), g.chosen, g.fastest)).collect();
        assert_eq!(seen, [(vec![0, 1], 0, 0), (vec![0, 3], 3, 3)], "{groups:?}");
        assert!(groups[0].key.ends_with("build a") && groups[1].key.ends_with("build b"), "{groups:?}");
    }

    /// A group is device-bound only where every one of its runs kept the GPU busy: one run below
    /// the bar, or one that does not say, makes it not.
    #[test]
    fn a_group_is_device_bound_only_where_all_its_runs_were() {
        let busy = |stage: ZeroStage, util: Option<f64>| Observation {
            gpu_util_pct: util,
            ..run_of(stage, Some("a"), 10.0 + f64::from(stage.index()))
        };
        let bound = |runs: &[Observation]| {
            let priced: Vec<(&Observation, f64)> = runs.iter().map(|o| (o, o.step_ms)).collect();
            stage_choices(&priced)[0].device_bound
        };
        let high = Some(crate::observation::DEVICE_BOUND_UTIL_PCT);
        assert!(bound(&[busy(ZeroStage::Z0, high), busy(ZeroStage::Z1, high), busy(ZeroStage::Z1, Some(99.0))]));
        let low = Some(crate::observation::DEVICE_BOUND_UTIL_PCT - 1.0);
        assert!(!bound(&[busy(ZeroStage::Z0, high), busy(ZeroStage::Z1, low), busy(ZeroStage::Z1, high)]));
        assert!(!bound(&[busy(ZeroStage::Z0, None), busy(ZeroStage::Z1, high)]), "a run that does not say");
    }

    /// Per configuration, the median of its runs' predictions (each run priced at its own host's
    /// AdamW rate) against the median of their steps; the runs' spread around that median apart.
    #[test]
    fn a_configuration_is_judged_by_its_predictions_median() {
        let runs = [
            run_of(ZeroStage::Z0, None, 100.0),
            run_of(ZeroStage::Z0, None, 110.0),
            run_of(ZeroStage::Z0, None, 120.0),
        ];
        let held: Vec<Held> = runs
            .iter()
            .zip([130.0, 100.0, 115.0])
            .map(|(run, step)| Held { run, step, bound: Bound::Launch, mem: 0.0 })
            .collect();
        let e = by_configuration(&held);
        assert_eq!((e.configurations, e.repeated), (1, 1));
        // Predictions' median 115 against the steps' 110 (the first run's 130 alone: 18.2%).
        assert!((e.step_mape_pct - 500.0 / 110.0).abs() < 1e-9, "{e:?}");
        let floor = (10.0 / 100.0 + 0.0 + 10.0 / 120.0) / 3.0 * 100.0;
        assert!((e.repeat_floor_pct - floor).abs() < 1e-9, "{e:?}");
        // A configuration run once is counted, not as repeated.
        let once = run_of(ZeroStage::Z1, None, 100.0);
        let mut both = held;
        both.push(Held { run: &once, step: 100.0, bound: Bound::Launch, mem: 0.0 });
        let e = by_configuration(&both);
        assert_eq!((e.configurations, e.repeated), (2, 1));
    }

    /// A group is decided when each stage has three runs or more and the fastest stage's runs
    /// are all faster than all of the others'.
    #[test]
    fn repeats_decide_a_group_only_when_they_separate_it() {
        let (a, b, c) = ([1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [3.5, 8.0, 9.0]);
        assert!(decides(&[&a, &b]));
        assert!(decides(&[&b, &a, &c]), "the fastest need not come first");
        assert!(!decides(&[&a, &[2.5, 8.0, 9.0]]), "overlapping repeats");
        assert!(!decides(&[&a[..2], &b[..2]]), "two repeats each");
        assert!(!decides(&[&a, &b[..2]]), "one stage with two repeats");
        assert!(!decides(&[&a]), "one stage");
        assert!(!decides(&[&[1.0, 1.0, 1.0], &[1.0, 1.0, 1.0]]), "equal times");
    }
}
