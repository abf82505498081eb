//! Fitting a cost model: one fit per GPU kind and precision found among the runs, each with its
//! coefficients ([`crate::coefficients`]), the ranges it has seen, and its own k-fold validation
//! ([`crate::validate`]).

use std::collections::BTreeMap;

use zerobench_schema::config::{Offload, Precision};

use crate::coefficients::{communication_runs, fit_coefficients};
use crate::model::{CostModel, Fit, FittedRun, Range, FORMAT, VERSION};
use crate::observation::Observation;
use crate::validate::validate;

/// Fewest distinct configurations a fit accepts: with fewer, every term would be fitted to one
/// point.
pub const MIN_CONFIGURATIONS: usize = 3;

#[derive(Debug, thiserror::Error)]
pub enum FitError {
    #[error("no runs to fit on: none of the folders holds a finished zerobench run with step times and peak memory")]
    NoRuns,
    #[error(
        "{gpu} {precision}: {configurations} distinct configuration(s) ({runs} runs); a fit needs at least \
         {MIN_CONFIGURATIONS} that differ in model, batch, sequence, stage or GPU count"
    )]
    TooFewConfigurations { gpu: String, precision: Precision, configurations: usize, runs: usize },
    #[error(
        "{gpu} {precision}: the runs form {groups} group of configurations that differ only in the stage; \
         the fit is validated by holding whole groups out and needs 2 or more (add runs of another model, \
         batch, sequence or GPU count)"
    )]
    OneGroup { gpu: String, precision: Precision, groups: usize },
    #[error(
        "{gpu} {precision}: no run on one GPU without offload; the compute terms are fitted on those \
         (the others' steps add communication or the host's update to them)"
    )]
    NoComputeRuns { gpu: String, precision: Precision },
}

/// A fit per GPU kind and precision that could be fitted, and why each other kind could not.
#[derive(Debug)]
pub struct Fitted {
    pub model: CostModel,
    /// Kinds left out: too few configurations or groups of them (one stray run of another
    /// precision must not stop the others' fit).
    pub skipped: Vec<FitError>,
}

/// Fits one model per GPU kind and precision found in `obs`; a kind that cannot be fitted is left
/// out with its reason, and is the error when no kind can be.
pub fn fit(obs: &[Observation]) -> Result<Fitted, FitError> {
    if obs.is_empty() {
        return Err(FitError::NoRuns);
    }
    let mut kinds: BTreeMap<(String, Precision), Vec<&Observation>> = BTreeMap::new();
    for o in obs {
        kinds.entry((o.gpu.clone(), o.query.config.precision)).or_default().push(o);
    }
    let (mut fits, mut skipped) = (Vec::new(), Vec::new());
    for ((gpu, precision), runs) in kinds {
        let configurations = runs.iter().map(|o| o.config_key()).collect::<std::collections::BTreeSet<_>>().len();
        if configurations < MIN_CONFIGURATIONS {
            skipped.push(FitError::TooFewConfigurations { gpu, precision, configurations, runs: runs.len() });
            continue;
        }
        let groups = runs.iter().map(|o| o.stage_group_key()).collect::<std::collections::BTreeSet<_>>().len();
        if groups < 2 {
            skipped.push(FitError::OneGroup { gpu, precision, groups });
            continue;
        }
        if !runs.iter().any(|o| o.query.gpus == 1 && o.query.config.offload == Offload::None) {
            skipped.push(FitError::NoComputeRuns { gpu, precision });
            continue;
        }
        let (coef, works) = fit_coefficients(&runs);
        let (validation, intervals) = validate(&runs);
        let mut range = Range::default();
        for (o, w) in runs.iter().zip(&works) {
            range.cover(w, &o.query);
        }
        for i in communication_runs(&works) {
            range.cover_communication(&works[i]);
        }
        fits.push(Fit {
            gpu,
            precision,
            device_memory_bytes: runs.iter().filter_map(|o| o.device_memory_bytes).min(),
            peak_tflops: runs.iter().find_map(|o| o.peak_tflops),
            step: coef.step,
            device_donor: coef.device_donor,
            memory: coef.memory,
            reserved: coef.reserved,
            host_adamw_gparams_per_s: coef.host_reference,
            range,
            step_interval: intervals.step,
            step_interval_by_bound: Some(intervals.step_by_bound),
            memory_interval: intervals.memory,
            validation,
            builds: runs
                .iter()
                .filter_map(|o| o.build.as_deref())
                .map(zerobench_schema::log::short_commit)
                .collect::<std::collections::BTreeSet<String>>()
                .into_iter()
                .collect(),
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
    if fits.is_empty() {
        return Err(skipped.remove(0));
    }
    Ok(Fitted { model: CostModel { format: FORMAT.to_string(), version: VERSION, fits }, skipped })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    use crate::coefficients::only;
    use crate::model::Prediction;
    use crate::price::{eval, peak_allocated, step_parts, OFFLOAD_HIDDEN, OFFLOAD_SHARING, UNHIDDEN};
    use crate::terms::{step_terms, Part};
    use crate::work::{Query, Work};
    use zerobench_schema::config::{Offload, RunConfig, ZeroStage};
    use zerobench_schema::models::ModelPreset;

    /// Coefficients to generate runs from: launch-bound small models, device-bound large ones.
    fn truth() -> BTreeMap<String, f64> {
        [
            ("gpt2.launch_ms", 1.0),
            ("gpt2.launch_ms_per_unit", 0.9),
            ("gpt2.device_ms", 2.0),
            ("gpt2.ms_per_gflop", 0.0019),
            ("gpt2.ms_per_gflop_attn", 0.0014),
            ("gpt2.ms_per_gact", 4.0),
            ("t5.launch_ms", 3.0),
            ("t5.launch_ms_per_unit", 1.5),
            ("t5.device_ms", 4.0),
            ("t5.ms_per_gflop", 0.0025),
            ("t5.ms_per_gflop_attn", 0.004),
            ("t5.ms_per_gact", 2.0),
            ("llama.launch_ms", 2.0),
            ("llama.launch_ms_per_unit", 0.7),
            ("llama.device_ms", 0.5),
            ("llama.ms_per_gflop", 0.0019),
            ("llama.ms_per_gflop_attn", 0.0014),
            ("llama.ms_per_gact", 4.0),
            ("stage3.ms_per_gparam_gathered", 1.5),
            ("optimizer.ms_per_gparam", 8.8),
            ("offload.ms_per_gparam", 150.0),
            (OFFLOAD_HIDDEN, 0.6),
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
            ("llama.mem_gib", 0.1),
            ("llama.mem_gib_per_gact", 20.0),
            ("mem_gib_per_gparam_largest", 0.0),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    fn observe(model: ModelPreset, stage: ZeroStage, mb: u32, seq: u32, gpus: u32, offload: Offload) -> Observation {
        let mut c = RunConfig::new(model, stage);
        (c.micro_batch, c.seq_len, c.offload) = (mb, seq, offload);
        observe_config(c, gpus)
    }

    /// gpt2-xl, stage 2, micro-batch 4, one GPU, with the optimizer's `ratio` on the host, exact or
    /// with the delayed update.
    fn observe_ratio(ratio: f64, delayed: bool) -> Observation {
        let mut c = RunConfig::new(ModelPreset::Gpt2Xl, ZeroStage::Z2);
        (c.micro_batch, c.offload, c.offload_ratio) = (4, Offload::Optimizer, Some(ratio));
        c.delayed_update_after = delayed.then_some(3);
        let mut o = observe_config(c, 1);
        o.run_id = format!("{}-r{ratio}-{}", o.run_id, if delayed { "delayed" } else { "exact" });
        o
    }

    fn observe_config(c: RunConfig, gpus: u32) -> Observation {
        observe_query(Query::new(c, gpus, 1))
    }

    /// A run of `query` as the truth prices it.
    fn observe_query(query: Query) -> Observation {
        let c = &query.config;
        let (model, stage, mb, seq, offload, gpus) =
            (c.model, c.stage, c.micro_batch, c.seq_len, c.offload, query.gpus);
        let w = Work::of(&query, None);
        let mut flags = Vec::new();
        let step = step_parts(&truth(), None, &w, &mut flags).step_ms;
        let peak = peak_allocated(&memory_truth(), &w, &mut flags);
        assert!(flags.is_empty(), "{flags:?}");
        let mut f = Vec::new();
        let optimizer = eval(&truth(), None, &step_terms(&w), Part::Step, &mut f)
            - eval(&truth(), None, &only(step_terms(&w), "comm."), Part::Step, &mut f)
            - eval(&truth(), None, &only(step_terms(&w), "offload"), Part::Step, &mut f);
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
            build: None,
        }
    }

    /// A one-GPU stage-3 run as the builds the shipped models were fitted on ran it, gathering
    /// its parameters into slots (its log lists them), which isolates stage 3's gather terms
    /// from the 2-GPU runs' communication.
    fn gathered_on_one_rank(model: ModelPreset, mb: u32, seq: u32) -> Observation {
        let mut c = RunConfig::new(model, ZeroStage::Z3);
        (c.micro_batch, c.seq_len) = (mb, seq);
        let logged_param_path = Some(zerobench_schema::memory::ParamPath::Sharded);
        observe_query(Query { logged_param_path, ..Query::new(c, 1, 1) })
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
                    v.push(observe(m, ZeroStage::Z0, mb, seq, 1, Offload::None));
                    v.push(gathered_on_one_rank(m, mb, seq));
                }
            }
            for stage in ZeroStage::ALL {
                v.push(observe(m, stage, 4, long, 2, Offload::None));
            }
            v.push(observe(m, ZeroStage::Z2, 4, long, 1, Offload::Optimizer));
        }
        // Part of the optimizer on the host: the host's share hidden in part (0.5) and whole (0.1:
        // the step waits for none of it), exact and delayed.
        for ratio in [0.1, 0.5] {
            for delayed in [false, true] {
                v.push(observe_ratio(ratio, delayed));
            }
        }
        v
    }

    /// The AdamW rate of the hosts the truth's offload terms price ([`on_host`]).
    const REFERENCE_RATE: f64 = 5.0;

    /// `o`'s configuration run on a host whose AdamW runs at `rate` (1e9 parameters/s), its step as
    /// the truth prices it against hosts of [`REFERENCE_RATE`].
    fn on_host(o: &Observation, rate: f64) -> Observation {
        let mut r = o.clone();
        r.query.host_adamw_gparams_per_s = Some(rate);
        r.run_id = format!("{}-host{rate}", o.run_id);
        let w = Work::of(&r.query, Some(REFERENCE_RATE));
        r.step_ms = step_parts(&truth(), None, &w, &mut Vec::new()).step_ms;
        r
    }

    /// Every offloaded run of the sweep on three hosts whose rates' geometric mean is
    /// [`REFERENCE_RATE`]: the fit takes that mean as its reference, recovers the truth's offload
    /// terms, prices each host's runs by its rate and a host it never saw in proportion (flagged),
    /// and two ranks on one host each as a fitted host's one (flagged). Without the rates the
    /// hosts' runs differ by what no configuration explains.
    #[test]
    fn hosts_of_other_adamw_rates_are_priced_by_their_rate() {
        let rates = [4.0, 5.0, 6.25];
        let mut runs = Vec::new();
        for o in sweep() {
            if o.query.config.offload == Offload::None {
                runs.push(o);
            } else {
                runs.extend(rates.iter().map(|&r| on_host(&o, r)));
            }
        }
        let f = &fit(&runs).unwrap().model.fits[0];
        let reference = f.host_adamw_gparams_per_s.unwrap();
        assert!((reference - REFERENCE_RATE).abs() < 1e-9, "{reference}");
        for name in ["offload.ms_per_gparam", OFFLOAD_HIDDEN] {
            let (got, want) = (f.step[name], truth()[name]);
            assert!((got - want).abs() <= 1e-6 * want, "{name}: {got} vs {want}");
        }
        assert_eq!(f.range.host_adamw_gparams_per_s, Some([4.0, 6.25]));
        let off = |p: &Prediction, o: &Observation| (p.step_ms / o.step_ms - 1.0).abs();
        for o in &runs {
            let p = f.predict(&o.query);
            assert!(off(&p, o) < 0.01, "{}: {} vs {}", o.run_id, p.step_ms, o.step_ms);
            assert!(p.extrapolated.is_empty(), "{}: {:?}", o.run_id, p.extrapolated);
        }
        // The hosts' steps differ: the slowest host waits longer for the same update.
        let xl =
            |rate: f64| runs.iter().find(|o| o.run_id.ends_with(&format!("r0.5-exact-host{rate}"))).unwrap().step_ms;
        assert!(xl(4.0) > xl(6.25) * 1.05, "{} vs {}", xl(4.0), xl(6.25));
        // A slower host than any fitted, and two ranks on one host: in proportion, and flagged.
        let large = observe(ModelPreset::Gpt2Large, ZeroStage::Z2, 4, 1024, 1, Offload::Optimizer);
        let slow = on_host(&large, 3.0);
        let p = f.predict(&slow.query);
        assert!(off(&p, &slow) < 0.01 && p.host_adamw_gparams_per_s == Some(3.0), "{p:?}");
        assert!(p.extrapolated.iter().any(|e| e.contains("host AdamW at 3.00G")), "{:?}", p.extrapolated);
        // The fitted rates widened by 0.1% are inside, their edges included; a hair beyond is not.
        let flagged = |rate: f64| {
            let p = f.predict(&on_host(&large, rate).query);
            p.extrapolated.iter().any(|e| e.contains("host AdamW at"))
        };
        for edge in [4.0 * 0.999, 6.25 * 1.001] {
            assert!(!flagged(edge), "{edge}");
        }
        for beyond in [(4.0 * 0.999_f64).next_down(), (6.25 * 1.001_f64).next_up()] {
            assert!(flagged(beyond), "{beyond}");
        }
        // Two ranks on one host: each priced as a fitted host's rank, the host's rate not used.
        let two = on_host(&observe(ModelPreset::Gpt2Large, ZeroStage::Z2, 4, 1024, 2, Offload::Optimizer), 3.0);
        assert_eq!(Work::of(&two.query, Some(REFERENCE_RATE)).host_slowness, 1.0);
        let p = f.predict(&two.query);
        assert!(off(&p, &two) < 0.01, "{} vs {}", p.step_ms, two.step_ms);
        assert_eq!(p.host_adamw_gparams_per_s, Some(reference));
        for says in ["2 ranks share a host", "rate is not used with several ranks"] {
            assert!(p.extrapolated.iter().any(|e| e.contains(says)), "{says}: {:?}", p.extrapolated);
        }
        // Unknown host: priced at the fitted hosts' rate, which the prediction names.
        let mut unknown = slow.query.clone();
        unknown.host_adamw_gparams_per_s = None;
        assert_eq!(f.predict(&unknown).host_adamw_gparams_per_s, Some(reference));
        // The same runs with their hosts unknown: one price for each configuration's three steps.
        let blind: Vec<Observation> = runs
            .iter()
            .cloned()
            .map(|mut o| {
                o.query.host_adamw_gparams_per_s = None;
                o
            })
            .collect();
        let g = &fit(&blind).unwrap().model.fits[0];
        assert_eq!(g.host_adamw_gparams_per_s, None);
        // Such a model prices every host alike: a rate given to it is not used, and said so.
        let p = g.predict(&slow.query);
        assert_eq!((p.step_ms, p.host_adamw_gparams_per_s), (g.predict(&unknown).step_ms, None));
        assert!(p.extrapolated.iter().any(|e| e.contains("the given rate is not used")), "{:?}", p.extrapolated);
        let worst = blind.iter().map(|o| off(&g.predict(&o.query), o)).fold(0.0, f64::max);
        assert!(worst > 0.05, "{worst}");
    }

    /// Offloaded runs of two ranks per host whose updates slow each other by 2^0.5: the fit
    /// recovers the exponent on its grid, prices them and their configurations never run as the
    /// truth does, and a host of more ranks than fitted by the exponent, flagged. The one-rank
    /// runs, and the terms fitted on them, are the same as without.
    #[test]
    fn ranks_sharing_a_host_slow_each_other_by_the_fitted_exponent() {
        let mut shared_truth = truth();
        shared_truth.insert(OFFLOAD_SHARING.to_string(), 0.5);
        let on_shared_host = |model: ModelPreset, ratio: f64, delayed: bool, gpus: u32| {
            let mut c = RunConfig::new(model, ZeroStage::Z2);
            (c.micro_batch, c.offload, c.offload_ratio) = (4, Offload::Optimizer, Some(ratio));
            c.delayed_update_after = delayed.then_some(3);
            let mut o = observe_config(c, gpus);
            o.run_id = format!("{}-r{ratio}-{delayed}", o.run_id);
            o.step_ms = step_parts(&shared_truth, None, &Work::of(&o.query, None), &mut Vec::new()).step_ms;
            o
        };
        let mut runs = sweep();
        for ratio in [0.3, 0.5, 1.0] {
            for delayed in [false, true] {
                runs.push(on_shared_host(ModelPreset::Gpt2Xl, ratio, delayed, 2));
            }
        }
        // Sharing shows: all on the host, two ranks wait longer than one rank's half would.
        let one_rank = step_parts(&truth(), None, &Work::of(&runs.last().unwrap().query, None), &mut Vec::new());
        assert!(runs.last().unwrap().step_ms > one_rank.step_ms * 1.1);
        let f = &fit(&runs).unwrap().model.fits[0];
        assert_eq!(f.step.get(OFFLOAD_SHARING), Some(&0.5));
        for name in ["offload.ms_per_gparam", OFFLOAD_HIDDEN] {
            let (got, want) = (f.step[name], truth()[name]);
            assert!((got - want).abs() <= 1e-6 * want, "{name}: {got} vs {want}");
        }
        let unseen =
            [on_shared_host(ModelPreset::Gpt2Large, 0.7, false, 2), on_shared_host(ModelPreset::Gpt2Xl, 0.8, true, 2)];
        for o in runs.iter().chain(&unseen) {
            let p = f.predict(&o.query);
            assert!((p.step_ms / o.step_ms - 1.0).abs() < 0.01, "{}: {} vs {}", o.run_id, p.step_ms, o.step_ms);
            assert!(p.extrapolated.is_empty(), "{}: {:?}", o.run_id, p.extrapolated);
        }
        // Four ranks on one host: each rank's update 4^0.5 = 2 times one rank's, flagged.
        let four = on_shared_host(ModelPreset::Gpt2Xl, 1.0, false, 4);
        let p = f.predict(&four.query);
        assert!((p.step_ms / four.step_ms - 1.0).abs() < 0.01, "{} vs {}", p.step_ms, four.step_ms);
        let says = "4 ranks share a host, fitted with up to 2: each rank's host update is priced 2.00 times";
        assert!(p.extrapolated.iter().any(|e| e.contains(says)), "{:?}", p.extrapolated);
    }

    /// Offload's terms from runs whose host update the GPU's window hides in part or whole, none
    /// of them waiting for more than its window: the fit takes the runs whose update outlasts the
    /// hidden share of their window, not the whole of it.
    #[test]
    fn offload_is_fitted_on_runs_that_wait_for_part_of_their_window() {
        let mut runs: Vec<Observation> =
            sweep().into_iter().filter(|o| o.query.config.offload == Offload::None).collect();
        let (mut partly, mut hidden) = (0, 0);
        for r in 1..=20 {
            for delayed in [false, true] {
                let o = observe_ratio(f64::from(r) / 20.0, delayed);
                let p = step_parts(&truth(), None, &Work::of(&o.query, None), &mut Vec::new());
                // Waiting for e = h - 0.6 w > 0, and h < w: 0 < e < 0.4 h.
                if p.offload_ms > 0.0 && p.offload_ms < 0.4 * p.host_update_ms {
                    partly += 1;
                    runs.push(o);
                } else if p.offload_ms == 0.0 && hidden < 2 {
                    hidden += 1;
                    runs.push(o);
                }
            }
        }
        assert!(partly >= 2 && hidden == 2, "{partly} partly hidden, {hidden} hidden");
        let f = &fit(&runs).unwrap().model.fits[0];
        for name in ["offload.ms_per_gparam", OFFLOAD_HIDDEN] {
            let (got, want) = (f.step[name], truth()[name]);
            assert!((got - want).abs() <= 1e-6 * want, "{name}: {got} vs {want}");
        }
    }

    /// The sharing exponent is the grid's value whose prices lie closest to the steps, relative to
    /// each step: on a small model too, whose steps move by about a millisecond from one grid
    /// value to the next. Without such runs the fit has none.
    #[test]
    fn a_small_models_runs_on_a_shared_host_give_its_exponent() {
        let mut shared_truth = truth();
        shared_truth.insert(OFFLOAD_SHARING.to_string(), 0.35);
        let mut runs = sweep();
        for ratio in [0.5, 1.0] {
            let mut c = RunConfig::new(ModelPreset::Gpt2, ZeroStage::Z2);
            (c.micro_batch, c.offload, c.offload_ratio) = (4, Offload::Optimizer, Some(ratio));
            let mut o = observe_config(c, 2);
            o.run_id = format!("{}-r{ratio}", o.run_id);
            o.step_ms = step_parts(&shared_truth, None, &Work::of(&o.query, None), &mut Vec::new()).step_ms;
            runs.push(o);
        }
        let f = &fit(&runs).unwrap().model.fits[0];
        assert_eq!(f.step.get(OFFLOAD_SHARING), Some(&0.35));
        // Without offloaded runs of several ranks per host there is no exponent to fit: the
        // sweep's offloaded runs have a GPU each, and its runs of two GPUs offload nothing.
        assert_eq!(fit(&sweep()).unwrap().model.fits[0].step.get(OFFLOAD_SHARING), None);
    }

    /// Offloaded runs of 4 GPUs widen what offload has seen (ranks per host), not what
    /// communication has: its terms are fitted on the runs without offload, so a 4-GPU query
    /// without offload, and one with, is still flagged past the 2 GPUs they had.
    #[test]
    fn offloaded_runs_of_more_gpus_do_not_widen_communication() {
        let mut c = RunConfig::new(ModelPreset::Gpt2Xl, ZeroStage::Z2);
        (c.micro_batch, c.offload, c.offload_ratio) = (4, Offload::Optimizer, Some(0.5));
        let mut runs = sweep();
        runs.push(observe_config(c.clone(), 4));
        let f = &fit(&runs).unwrap().model.fits[0];
        assert_eq!((f.range.max_gpus, f.range.offload_ranks_per_host), (2, Some(4)));
        let plain = observe(ModelPreset::Gpt2Xl, ZeroStage::Z2, 4, 1024, 4, Offload::None);
        for q in [&plain.query, &Query::new(c, 4, 1)] {
            let p = f.predict(q);
            assert!(
                p.extrapolated.iter().any(|e| e == "communication: 4 GPUs, fitted up to 2"),
                "{:?}",
                p.extrapolated
            );
            assert!(!p.extrapolated.iter().any(|e| e.contains("share a host")), "{:?}", p.extrapolated);
        }
        // A fit on one GPU only has seen one GPU, and flags two.
        let single: Vec<Observation> = sweep().into_iter().filter(|o| o.query.gpus == 1).collect();
        let g = &fit(&single).unwrap().model.fits[0];
        assert_eq!((g.range.max_gpus, g.range.max_nodes), (1, 1));
        assert!(g
            .predict(&observe(ModelPreset::Gpt2, ZeroStage::Z0, 4, 1024, 1, Offload::None).query)
            .extrapolated
            .is_empty());
    }

    #[test]
    fn the_fit_recovers_what_generated_the_runs() {
        let runs = sweep();
        // The sweep's partial offload has runs that wait for part of the host's update and runs
        // that wait for none of it.
        let exposed =
            |o: &Observation| step_parts(&truth(), None, &Work::of(&o.query, None), &mut Vec::new()).offload_ms;
        assert!(exposed(&observe_ratio(0.1, true)) == 0.0 && exposed(&observe_ratio(0.5, false)) > 5.0);
        let model = fit(&runs).unwrap().model;
        let f = &model.fits[0];
        // The terms each stage of the fit isolates come back exactly.
        for name in ["optimizer.ms_per_gparam", "offload.ms_per_gparam", OFFLOAD_HIDDEN, UNHIDDEN] {
            let (got, want) = (f.step[name], truth()[name]);
            assert!((got - want).abs() <= 1e-6 * want.max(1.0), "{name}: {got} vs {want}");
        }
        // Every run, and configurations never generated, are predicted as the truth prices them.
        let unseen = [
            observe(ModelPreset::Gpt2Large, ZeroStage::Z1, 8, 512, 1, Offload::None),
            observe(ModelPreset::T5Base, ZeroStage::Z3, 2, 384, 2, Offload::None),
            observe(ModelPreset::Gpt2Large, ZeroStage::Z2, 4, 1024, 1, Offload::Optimizer),
            observe_ratio(0.3, false),
            observe_ratio(0.3, true),
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
        assert_eq!((c.right_within_tie, c.shown_slower, c.groups > 10), (c.groups, 0, true), "{c:?}");
    }

    /// The fit records the builds its runs' logs name, by a commit's first 7 digits and each
    /// once (runs naming none add nothing); runs naming none at all leave the list empty.
    #[test]
    fn the_fit_records_the_builds_its_runs_name() {
        let unnamed = sweep();
        assert!(fit(&unnamed).unwrap().model.fits[0].builds.is_empty());
        let named: Vec<Observation> = unnamed
            .into_iter()
            .enumerate()
            .map(|(i, o)| {
                let build = ["41cf013aaaa", "41cf013bbbb", "0e1fab4cccc"].get(i % 4).map(|b| b.to_string());
                Observation { build, ..o }
            })
            .collect();
        assert_eq!(fit(&named).unwrap().model.fits[0].builds, ["0e1fab4", "41cf013"]);
    }

    /// A 2-GPU run measured just under what its compute and optimizer are priced at (a remainder
    /// of -0.3 ms for communication to explain, as a run the compute terms price long leaves)
    /// does not hold its stage's communication at zero: the remainders are fitted relative to
    /// each run's step, not to themselves, where such a run would outweigh all the others.
    #[test]
    fn a_run_priced_long_does_not_zero_its_stages_communication() {
        let mut runs = sweep();
        let mut under = observe(ModelPreset::Gpt2Large, ZeroStage::Z3, 8, 512, 2, Offload::None);
        let w = Work::of(&under.query, None);
        let comm = eval(&truth(), None, &only(step_terms(&w), "comm."), Part::Step, &mut Vec::new());
        under.step_ms -= comm + 0.3;
        runs.push(under);
        let f = &fit(&runs).unwrap().model.fits[0];
        let (got, want) = (f.step["comm.stage3.ms_per_gb"], truth()["comm.stage3.ms_per_gb"]);
        assert!((got / want - 1.0).abs() < 0.25, "comm.stage3.ms_per_gb: {got} vs {want}");
        let xl = observe(ModelPreset::Gpt2Xl, ZeroStage::Z3, 4, 1024, 2, Offload::None);
        let p = f.predict(&xl.query);
        assert!((p.step_ms / xl.step_ms - 1.0).abs() < 0.02, "{} vs {}", p.step_ms, xl.step_ms);
    }

    /// Runs whose T5 products compute faster than the GPU's peak (generated so): the fitted FLOP
    /// rates are held at the peak's time per GFLOP, T5's dense one there; runs that give no peak are
    /// fitted without the floor, and T5's dense rate comes out under it.
    #[test]
    fn no_flop_rate_is_fitted_faster_than_the_peak() {
        let mut fast = truth();
        fast.insert("t5.ms_per_gflop".into(), 0.0002);
        let regenerate = |o: &Observation| {
            let mut r = o.clone();
            r.step_ms = step_parts(&fast, None, &Work::of(&r.query, None), &mut Vec::new()).step_ms;
            r
        };
        let runs: Vec<Observation> = sweep().iter().map(regenerate).collect();
        let floor = 1.0 / 989.0;
        let f = &fit(&runs).unwrap().model.fits[0];
        for (name, c) in f.step.iter().filter(|(n, _)| n.contains(".ms_per_gflop")) {
            assert!(*c >= floor * (1.0 - 1e-9), "{name}: {c} under {floor}");
        }
        assert!((f.step["t5.ms_per_gflop"] / floor - 1.0).abs() < 1e-6, "{}", f.step["t5.ms_per_gflop"]);
        let unknown: Vec<Observation> = runs.iter().map(|o| Observation { peak_tflops: None, ..o.clone() }).collect();
        let g = &fit(&unknown).unwrap().model.fits[0];
        assert!(g.step["t5.ms_per_gflop"] < floor / 2.0, "{}", g.step["t5.ms_per_gflop"]);
    }

    /// Repeats 10% either side of each configuration: the error per configuration (against its
    /// median, which is the truth) stays well below the repeats' own spread, which is exactly
    /// theirs whatever the fit.
    #[test]
    fn the_error_per_configuration_sets_the_repeats_spread_apart() {
        let mut runs = Vec::new();
        for o in sweep() {
            for (i, f) in [0.9, 1.0, 1.1].into_iter().enumerate() {
                let mut r = o.clone();
                r.run_id = format!("{}-{i}", o.run_id);
                r.step_ms *= f;
                runs.push(r);
            }
        }
        let v = &fit(&runs).unwrap().model.fits[0].validation;
        let c = &v.by_configuration;
        assert_eq!((c.configurations as usize, c.repeated), (runs.len() / 3, c.configurations));
        assert!(c.step_mape_pct < c.repeat_floor_pct / 2.0, "{c:?}");
        let floor = (0.1 / 0.9 + 0.1 / 1.1) / 3.0 * 100.0;
        assert!((c.repeat_floor_pct - floor).abs() < 1e-9, "{} vs {floor}", c.repeat_floor_pct);
        assert!(v.step_mape_pct >= c.repeat_floor_pct - 1.0, "per run {} below the floor", v.step_mape_pct);
    }

    /// gpt2 fitted at sequences 256 and 1024: a longer sequence is flagged even where its tokens
    /// per micro-step (and model) lie within the fitted range, one within it is not, and a model
    /// file that recorded no sequences (written before them) flags none.
    #[test]
    fn a_sequence_longer_than_fitted_is_flagged_though_its_tokens_are_not() {
        let model = fit(&sweep()).unwrap().model;
        let f = &model.fits[0];
        assert_eq!(f.range.families["gpt2"].seq_len, Some([256, 1024]));
        // gpt2 at micro-batch 1: its tokens per micro-step are its sequence.
        let flags = |f: &Fit, seq: u32| {
            f.predict(&observe(ModelPreset::Gpt2, ZeroStage::Z0, 1, seq, 1, Offload::None).query).extrapolated
        };
        let sequence_flags = |f: &Fit, seq: u32| flags(f, seq).into_iter().filter(|e| e.contains("sequence")).count();
        // 2048 tokens lie within the fitted 256-16384: the sequence alone is flagged.
        assert_eq!(
            flags(f, 2048),
            ["compute: sequence 2048, fitted 256-1024 for gpt2 (attention's work per token grows with it)"]
        );
        assert_eq!(sequence_flags(f, 512), 0);
        assert_eq!(sequence_flags(f, 128), 1);
        // A file without the field reads, and flags no sequence.
        let mut json = serde_json::to_value(&model).unwrap();
        for family in json["fits"][0]["range"]["families"].as_object_mut().unwrap().values_mut() {
            assert!(family.as_object_mut().unwrap().remove("seq_len").is_some());
        }
        let old: CostModel = serde_json::from_value(json).unwrap();
        assert_eq!(old.fits[0].range.families["gpt2"].seq_len, None);
        assert_eq!(sequence_flags(&old.fits[0], 2048), 0);
    }

    /// t5-small and t5-large fitted (layers of 14 d_model²): t5-3b, whose layers are four times
    /// as wide relative to d_model, is flagged for its activations, t5-base (14, unfitted) is
    /// not, and a model file that recorded no widths (written before them) flags none.
    #[test]
    fn a_preset_with_wider_layers_than_fitted_is_flagged() {
        let model = fit(&sweep()).unwrap().model;
        let f = &model.fits[0];
        let [lo, hi] = f.range.families["t5"].layer_width.unwrap();
        assert!((14.0..14.01).contains(&lo) && (14.0..14.01).contains(&hi), "{lo}-{hi}");
        let width_flags = |f: &Fit, m: ModelPreset| {
            let q = observe(m, ZeroStage::Z0, 4, 512, 1, Offload::None).query;
            f.predict(&q).extrapolated.into_iter().filter(|e| e.starts_with("activations:")).collect::<Vec<_>>()
        };
        assert_eq!(
            width_flags(f, ModelPreset::T5_3b),
            [format!(
                "activations: layers of 56.0 d_model² parameters, fitted {lo:.1}-{hi:.1} for t5 (their elementwise \
                 work is priced per d_model, their memory by their widths)"
            )]
        );
        assert!(width_flags(f, ModelPreset::T5Base).is_empty());
        assert!(width_flags(f, ModelPreset::Gpt2Large).is_empty());
        let mut json = serde_json::to_value(&model).unwrap();
        for family in json["fits"][0]["range"]["families"].as_object_mut().unwrap().values_mut() {
            assert!(family.as_object_mut().unwrap().remove("layer_width").is_some());
        }
        let old: CostModel = serde_json::from_value(json).unwrap();
        assert!(width_flags(&old.fits[0], ModelPreset::T5_3b).is_empty());
    }

    #[test]
    fn a_family_that_never_kept_the_gpu_busy_has_no_device_terms_of_its_own() {
        let device_terms = ["t5.device_ms", "t5.ms_per_gflop", "t5.ms_per_gact"];
        let t5 = |o: &Observation| o.query.config.model.spec().family() == "t5";
        // Every T5 run below 90% utilisation: its device bound was never what set a step.
        let mut runs = sweep();
        runs.iter_mut().filter(|o| t5(o)).for_each(|o| o.gpu_util_pct = Some(60.0));
        let f = &fit(&runs).unwrap().model.fits[0];
        for name in device_terms {
            assert!(!f.step.contains_key(name), "{name} fitted: {:?}", f.step);
        }
        assert!(f.step.contains_key("t5.launch_ms") && f.step.contains_key("gpt2.ms_per_gflop"), "{:?}", f.step);
        // A T5 prediction prices them as the other families' and says so.
        let q = &runs.iter().find(|o| t5(o)).unwrap().query.clone();
        let p = f.predict(q);
        assert!(p.extrapolated.iter().any(|e| e.contains("t5: its device bound not fitted")), "{:?}", p.extrapolated);
        // Runs that do not say (no utilisation logged) keep the family's terms, as do busy ones.
        runs.iter_mut().filter(|o| t5(o)).for_each(|o| o.gpu_util_pct = None);
        let f = &fit(&runs).unwrap().model.fits[0];
        assert!(device_terms.iter().any(|n| f.step.contains_key(*n)), "{:?}", f.step);
        assert!(f.predict(q).extrapolated.is_empty());
        // Every family has its own device terms: none is borrowed, so no donor is named.
        assert_eq!(f.device_donor, None);
    }

    /// Validation over the runs of one stage group holds nothing out: its one fold would leave no
    /// run to fit on.
    #[test]
    fn one_stage_group_is_validated_over_no_runs() {
        let runs: Vec<Observation> =
            ZeroStage::ALL.into_iter().map(|z| observe(ModelPreset::Gpt2, z, 4, 1024, 1, Offload::None)).collect();
        let refs: Vec<&Observation> = runs.iter().collect();
        assert_eq!(refs.iter().map(|o| o.stage_group_key()).collect::<BTreeSet<_>>().len(), 1);
        let (v, _) = crate::validate::validate(&refs);
        assert_eq!((v.folds, v.held_out.len()), (1, 0), "{v:?}");
    }

    /// Runs of several micro-steps are fitted per micro-step: half of the one-GPU runs accumulate
    /// over 2 or 4, and every run of the sweep is priced as the truth prices it, the truth's device
    /// rates recovered, its throughput counting every micro-step's tokens.
    #[test]
    fn accumulated_runs_are_fitted_per_micro_step() {
        let runs: Vec<Observation> = sweep()
            .into_iter()
            .enumerate()
            .map(|(i, o)| {
                if o.query.gpus != 1 || o.query.config.offload != Offload::None || i % 2 == 0 {
                    return o;
                }
                let mut q = o.query.clone();
                q.config.grad_accum = if i % 4 == 1 { 2 } else { 4 };
                let mut a = observe_query(q);
                a.run_id = format!("{}-x{}", o.run_id, a.query.config.grad_accum);
                a
            })
            .collect();
        assert!(runs.iter().filter(|o| o.query.config.grad_accum > 1).count() >= 20);
        let f = &fit(&runs).unwrap().model.fits[0];
        for o in &runs {
            let p = f.predict(&o.query);
            assert!((p.step_ms / o.step_ms - 1.0).abs() < 0.01, "{}: {} vs {}", o.run_id, p.step_ms, o.step_ms);
            // A step's tokens are every micro-step's.
            let c = &o.query.config;
            let per_gpu = f64::from(c.micro_batch * c.seq_len * c.grad_accum) / (p.step_ms / 1e3);
            let got = p.tokens_per_s_per_gpu;
            assert!((got / per_gpu - 1.0).abs() < 1e-9, "{}: {got} vs {per_gpu}", o.run_id);
        }
        for name in ["gpt2.ms_per_gflop", "t5.ms_per_gflop"] {
            let (got, want) = (f.step[name], truth()[name]);
            assert!((got / want - 1.0).abs() < 0.01, "{name}: {got} vs {want}");
        }
    }

    /// A family without device terms of its own borrows those of the family with the most busy
    /// configurations, not a mean that a slow family (here T5, made 4 times slower per FLOP) drags.
    #[test]
    fn a_family_without_device_terms_borrows_the_best_measured_familys() {
        let mut runs = sweep();
        let mut slow_t5 = truth();
        *slow_t5.get_mut("t5.ms_per_gflop").unwrap() *= 4.0;
        *slow_t5.get_mut("t5.device_ms").unwrap() *= 4.0;
        for o in runs.iter_mut().filter(|o| o.query.config.model.spec().family() == "t5") {
            o.step_ms = step_parts(&slow_t5, None, &Work::of(&o.query, None), &mut Vec::new()).step_ms;
        }
        let llama: Vec<Observation> = [(1, 256), (4, 256), (4, 1024), (16, 512)]
            .into_iter()
            .flat_map(|(mb, seq)| [ZeroStage::Z0, ZeroStage::Z3].map(|z| (mb, seq, z)))
            .map(|(mb, seq, z)| {
                let mut o = observe(ModelPreset::TinyLlama, z, mb, seq, 1, Offload::None);
                o.gpu_util_pct = Some(10.0);
                o
            })
            .collect();
        runs.extend(llama.iter().cloned());
        let f = &fit(&runs).unwrap().model.fits[0];
        // Counted over the configurations the bounds are fitted on: one GPU, no offload.
        let gpt2_busy = runs
            .iter()
            .filter(|o| o.query.config.model.spec().family() == "gpt2")
            .filter(|o| o.query.gpus == 1 && o.query.config.offload == Offload::None)
            .map(Observation::config_key)
            .collect::<BTreeSet<_>>()
            .len();
        let donor = crate::DeviceDonor { family: "gpt2".into(), busy_configurations: gpt2_busy as u32 };
        assert_eq!(f.device_donor, Some(donor));
        assert!(!f.step.contains_key("llama.ms_per_gflop"), "{:?}", f.step);
        // The llama prediction prices its device bound with gpt2's coefficients, and says so.
        let q = &llama[5].query;
        let p = f.predict(q);
        assert!(
            p.extrapolated.iter().any(|e| e.contains("llama: its device bound not fitted") && e.contains("gpt2's")),
            "{:?}",
            p.extrapolated
        );
        let mut as_gpt2 = f.step.clone();
        for suffix in [".device_ms", ".ms_per_gflop", ".ms_per_gflop_attn", ".ms_per_gact"] {
            as_gpt2.insert(format!("llama{suffix}"), f.step[&format!("gpt2{suffix}")]);
        }
        let want = step_parts(&as_gpt2, None, &Work::of(q, None), &mut Vec::new()).step_ms;
        assert!((p.step_ms - want).abs() < 1e-9, "{} vs {want}", p.step_ms);
        // A fit without a donor prices it as the fitted families' mean.
        let mut old = f.clone();
        old.device_donor = None;
        let p_old = old.predict(q);
        assert!(p_old.extrapolated.iter().any(|e| e.contains("the other families' mean")), "{:?}", p_old.extrapolated);
        assert!(p_old.step_ms > p.step_ms, "the slow T5 should pull the mean up: {} vs {}", p_old.step_ms, p.step_ms);
    }

    /// Repeats do not make a donor: T5 measured three times over has more busy runs than gpt2 but
    /// fewer busy configurations, and gpt2, whose configurations measure more of the device's
    /// rates, stays the donor.
    #[test]
    fn the_donor_is_counted_in_configurations_not_repeats() {
        let one_gpu = |o: &&Observation| o.query.gpus == 1 && o.query.config.offload == Offload::None;
        let family = |o: &Observation| o.query.config.model.spec().family();
        let mut runs = sweep();
        let t5: Vec<Observation> = runs.iter().filter(one_gpu).filter(|o| family(o) == "t5").cloned().collect();
        for repeat in 1..=2 {
            runs.extend(t5.iter().map(|o| Observation { run_id: format!("{}@{repeat}", o.run_id), ..o.clone() }));
        }
        let mut llama = observe(ModelPreset::TinyLlama, ZeroStage::Z0, 4, 512, 1, Offload::None);
        llama.gpu_util_pct = Some(10.0);
        runs.push(llama);
        let busy = |fam: &str| -> (usize, usize) {
            let rs: Vec<&Observation> = runs.iter().filter(one_gpu).filter(|o| family(o) == fam).collect();
            (rs.len(), rs.iter().map(|o| o.config_key()).collect::<BTreeSet<_>>().len())
        };
        let ((t5_runs, t5_configs), (gpt2_runs, gpt2_configs)) = (busy("t5"), busy("gpt2"));
        assert!(t5_runs > gpt2_runs && t5_configs < gpt2_configs, "{t5_runs} {gpt2_runs} {t5_configs} {gpt2_configs}");
        let f = &fit(&runs).unwrap().model.fits[0];
        let donor = crate::DeviceDonor { family: "gpt2".into(), busy_configurations: gpt2_configs as u32 };
        assert_eq!(f.device_donor, Some(donor));
    }

    #[test]
    fn predictions_take_the_interval_of_their_bound() {
        // Launch-bound runs up to 15% off either way (a host's noise, by a hash of the run);
        // device-bound ones exact.
        let mut runs = sweep();
        for o in &mut runs {
            let u = (zerobench_schema::fnv::fnv1a(o.run_id.as_bytes()) % 1001) as f64 / 1000.0;
            if step_parts(&truth(), None, &Work::of(&o.query, None), &mut Vec::new()).bound == crate::Bound::Launch {
                o.step_ms *= 0.85 + 0.3 * u;
            }
            // Memory 4% off either way, so that its interval is not [0, 0].
            o.peak_allocated_bytes = (o.peak_allocated_bytes as f64 * (0.96 + 0.08 * u)) as u64;
        }
        let f = &fit(&runs).unwrap().model.fits[0];
        let by = f.step_interval_by_bound.as_ref().unwrap();
        let (l, d) = (by.launch.unwrap(), by.device.unwrap());
        assert!(l[1] - l[0] > 0.1, "launch-bound {l:?}");
        assert!(d[1] - d[0] < 0.5 * (l[1] - l[0]), "device-bound {d:?} against launch-bound {l:?}");
        let predict = |o: &Observation| f.predict(&o.query);
        let p = runs.iter().map(predict).find(|p| p.bound == crate::Bound::Launch).unwrap();
        assert_eq!(p.step_ms_interval_of, crate::IntervalOf::LaunchBound);
        assert!((p.step_ms_interval[1] / p.step_ms - 1.0 - l[1]).abs() < 1e-9, "{p:?}");
        let p = runs.iter().map(predict).find(|p| p.bound == crate::Bound::Device).unwrap();
        assert_eq!(p.step_ms_interval_of, crate::IntervalOf::DeviceBound);
        // A model file from before the intervals per bound gives every prediction the overall one.
        let mut json: serde_json::Value = serde_json::to_value(f).unwrap();
        json.as_object_mut().unwrap().remove("step_interval_by_bound");
        let old: crate::Fit = serde_json::from_value(json).unwrap();
        let p = old.predict(&runs[0].query);
        assert_eq!(p.step_ms_interval_of, crate::IntervalOf::All);
        assert!((p.step_ms_interval[0] / p.step_ms - 1.0 - f.step_interval[0]).abs() < 1e-9, "{p:?}");
        // Every prediction's throughput is its tokens over its step, its MFU their FLOPs over the
        // step and the peak rate, and its memory interval the memory's relative errors around its
        // peak.
        let [mlo, mhi] = f.memory_interval;
        assert!(mlo < -0.01 && mhi > 0.01, "{:?}", f.memory_interval);
        for o in runs.iter().filter(|o| o.query.config.model.spec().family() == "gpt2") {
            let (p, c) = (f.predict(&o.query), &o.query.config);
            let tokens = f64::from(c.micro_batch * c.seq_len * c.grad_accum);
            assert!((p.tokens_per_s_per_gpu * p.step_ms / 1e3 / tokens - 1.0).abs() < 1e-9, "{}: {p:?}", o.run_id);
            let flop_rate = c.train_flops_per_token() * tokens / (p.step_ms / 1e3);
            let mfu = p.mfu.expect("the sweep records the peak rate");
            assert!((mfu * 989.0e12 / flop_rate - 1.0).abs() < 1e-9, "{}: {p:?}", o.run_id);
            let alloc = p.peak_allocated_bytes as f64;
            for (bound, e) in p.peak_allocated_interval.iter().zip([mlo, mhi]) {
                assert!((*bound as f64 / alloc - 1.0 - e).abs() < 1e-6, "{}: {p:?}", o.run_id);
            }
        }
    }

    /// A byte across nodes is priced at the buses' ratio (within a node over across) times a byte
    /// within one: no fit has seen a second node.
    #[test]
    fn bytes_across_nodes_are_priced_at_the_buses_ratio() {
        let f = &fit(&sweep()).unwrap().model.fits[0];
        let within = observe(ModelPreset::Gpt2Xl, ZeroStage::Z3, 4, 1024, 2, Offload::None).query;
        let across = Query { nodes: 2, ..within.clone() };
        let fixed = f.step["comm.ms"];
        let (a, b) = (f.predict(&within).comm_ms - fixed, f.predict(&across).comm_ms - fixed);
        assert!(a > 1.0, "{a}");
        let ratio = crate::work::INTRA_NODE_BUS_GBPS / crate::work::INTER_NODE_BUS_GBPS;
        assert!((b / a / ratio - 1.0).abs() < 1e-9, "{b} / {a}");
        // Fitted on one node, a second is flagged, and one is not.
        let says = "communication: 2 nodes, fitted up to 1";
        assert!(f.predict(&across).extrapolated.iter().any(|e| e.starts_with(says)), "{:?}", f.predict(&across));
        assert!(!f.predict(&within).extrapolated.iter().any(|e| e.contains("nodes")));
    }

    /// More tokens per micro-step than any fitted run of the family held is flagged; a model
    /// fitted on no offload ratio below 1 flags one, and not a whole host's.
    #[test]
    fn tokens_past_the_fitted_and_an_unfitted_ratio_are_flagged() {
        let f = &fit(&sweep()).unwrap().model.fits[0];
        let tokens_flags = |mb: u32| {
            let q = observe(ModelPreset::Gpt2, ZeroStage::Z0, mb, 1024, 1, Offload::None).query;
            f.predict(&q).extrapolated.into_iter().filter(|e| e.contains("tokens per micro-step")).count()
        };
        // Fitted at 256-16384 tokens (micro-batches 1-16, sequences 256 and 1024).
        assert_eq!((tokens_flags(4), tokens_flags(64)), (0, 1));
        let whole: Vec<Observation> = sweep().into_iter().filter(|o| o.query.config.offload_ratio.is_none()).collect();
        let f = &fit(&whole).unwrap().model.fits[0];
        let ratio_flags = |ratio: f64| {
            let flags = f.predict(&observe_ratio(ratio, false).query).extrapolated;
            flags.into_iter().filter(|e| e.starts_with("offload: a ratio below 1 not fitted")).count()
        };
        assert_eq!((ratio_flags(0.5), ratio_flags(1.0)), (1, 0));
    }

    /// A preset of more (or fewer) parameters than its family's fitted presets is flagged; one
    /// between them is not.
    #[test]
    fn a_preset_outside_its_familys_fitted_sizes_is_flagged() {
        let f = &fit(&sweep()).unwrap().model.fits[0];
        let compute_flags = |m: ModelPreset| {
            let q = observe(m, ZeroStage::Z0, 4, 512, 1, Offload::None).query;
            let flags = f.predict(&q).extrapolated;
            flags.into_iter().filter(|e| e.starts_with("compute: ") && e.contains("B parameters, fitted")).count()
        };
        // t5-small and t5-large were fitted: t5-base lies between them, t5-3b above, tiny-t5 below.
        assert_eq!(compute_flags(ModelPreset::T5Base), 0);
        assert_eq!(compute_flags(ModelPreset::T5_3b), 1);
        assert_eq!(compute_flags(ModelPreset::TinyT5), 1);
    }

    /// A family's fitted sizes widened by 0.1% are inside, their edges included: a preset whose
    /// size is exactly the widened least or largest is not flagged, one a hair beyond is. The
    /// same for its layers' width, widened by 1%.
    #[test]
    fn a_preset_at_the_edge_of_its_familys_widened_sizes_is_inside() {
        let f = fit(&sweep()).unwrap().model.fits[0].clone();
        let q = observe(ModelPreset::T5Base, ZeroStage::Z0, 4, 512, 1, Offload::None).query;
        let params = q.config.model.spec().param_count() as f64;
        let work = Work::of(&q, None);
        let (family, width) = (work.family, work.layer_width);
        // The bound whose product with `scale` is exactly `value`.
        let edge_of = |value: f64, scale: f64| {
            let mut m = value / scale;
            while m * scale > value {
                m = m.next_down();
            }
            while m * scale < value {
                m = m.next_up();
            }
            assert_eq!(m * scale, value, "no bound gives the edge exactly");
            m
        };
        let flagged = |min: f64, max: f64| {
            let mut g = f.clone();
            let r = g.range.families.get_mut(family).unwrap();
            (r.min_params, r.max_params) = (min, max);
            g.predict(&q).extrapolated.iter().any(|e| e.contains("B parameters, fitted"))
        };
        let (low, high) = (edge_of(params, 0.999), edge_of(params, 1.001));
        assert!(!flagged(low, 2.0 * params), "at the lower edge");
        assert!(!flagged(0.5 * params, high), "at the upper edge");
        assert!(flagged(low.next_up().next_up(), 2.0 * params), "just above the lower edge");
        assert!(flagged(0.5 * params, high.next_down().next_down()), "just below the upper edge");
        let width_flagged = |lo: f64, hi: f64| {
            let mut g = f.clone();
            g.range.families.get_mut(family).unwrap().layer_width = Some([lo, hi]);
            g.predict(&q).extrapolated.iter().any(|e| e.starts_with("activations: layers of"))
        };
        let slack = crate::model::LAYER_WIDTH_SLACK;
        let (low, high) = (edge_of(width, 1.0 - slack), edge_of(width, 1.0 + slack));
        assert!(!width_flagged(low, 2.0 * width), "at the lower edge of the widths");
        assert!(!width_flagged(0.5 * width, high), "at the upper edge of the widths");
        assert!(width_flagged(low.next_up().next_up(), 2.0 * width), "just above the lower edge of the widths");
        assert!(width_flagged(0.5 * width, high.next_down().next_down()), "just below the upper edge of the widths");
    }

    /// k-fold validation holds each run out exactly once: the held-out list is the runs fitted,
    /// each predicted by the fold that left its group out.
    #[test]
    fn each_run_is_held_out_once() {
        let runs = sweep();
        let fitted = fit(&runs).unwrap();
        let v = &fitted.model.fits[0].validation;
        let mut held: Vec<&str> = v.held_out.iter().map(|h| h.run_id.as_str()).collect();
        let mut want: Vec<&str> = runs.iter().map(|o| o.run_id.as_str()).collect();
        held.sort_unstable();
        want.sort_unstable();
        assert_eq!(held, want);
        assert_eq!(v.runs as usize, runs.len());
    }

    #[test]
    fn too_few_configurations_and_no_runs_are_errors() {
        assert!(matches!(fit(&[]), Err(FitError::NoRuns)));
        let one = observe(ModelPreset::Gpt2, ZeroStage::Z0, 4, 1024, 1, Offload::None);
        let repeats = vec![one.clone(), one.clone(), one];
        let err = fit(&repeats).unwrap_err();
        assert!(matches!(err, FitError::TooFewConfigurations { configurations: 1, runs: 3, .. }), "{err}");
        assert!(err.to_string().contains("1 distinct configuration"), "{err}");
        // Three configurations, all of one group (one model, batch and sequence; only the stage
        // differs): no group could be held out, and it validated nothing while claiming 0% error.
        let stages: Vec<Observation> = [ZeroStage::Z0, ZeroStage::Z1, ZeroStage::Z3]
            .into_iter()
            .map(|s| observe(ModelPreset::Gpt2, s, 4, 1024, 1, Offload::None))
            .collect();
        let err = fit(&stages).unwrap_err();
        assert!(matches!(err, FitError::OneGroup { groups: 1, .. }), "{err}");
        // A second group (another micro-batch) is enough: one is held out while the other fits
        // (these two groups' hashes agree modulo 2, so folds by the hash alone held out neither).
        let mut two_groups = stages.clone();
        two_groups.push(observe(ModelPreset::Gpt2, ZeroStage::Z0, 8, 1024, 1, Offload::None));
        let fitted = fit(&two_groups).unwrap();
        assert_eq!((fitted.model.fits.len(), fitted.skipped.len()), (1, 0));
        assert_eq!(fitted.model.fits[0].validation.runs, 4, "every run held out once");
        // A stray run of another precision beside a sweep is left out with its reason.
        let mut runs = sweep();
        let mut stray = runs[0].clone();
        stray.query.config.precision = Precision::Fp32;
        runs.push(stray);
        let fitted = fit(&runs).unwrap();
        assert_eq!(fitted.model.fits.len(), 1);
        assert!(matches!(fitted.skipped[..], [FitError::TooFewConfigurations { configurations: 1, .. }]));
        // Runs on two GPUs only price no compute (it printed 0 ms and an MFU above 100%).
        let two: Vec<Observation> = sweep()
            .into_iter()
            .map(|mut o| {
                o.query.gpus = 2;
                o
            })
            .collect();
        assert!(matches!(fit(&two).unwrap_err(), FitError::NoComputeRuns { .. }));
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
        let model = fit(&runs).unwrap().model;
        assert_eq!(model.fits.len(), 2);
        let q = &runs[5].query;
        let a = model.fit_for("GPU", q.config.precision).unwrap().predict(q).step_ms;
        let b = model.fit_for("other", q.config.precision).unwrap().predict(q).step_ms;
        assert!((b / a - 2.0).abs() < 0.02, "{a} {b}");
    }
}
