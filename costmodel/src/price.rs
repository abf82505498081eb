//! Pricing: the terms of [`crate::terms`] evaluated against a set of coefficients, the one place
//! where the formula's max, shares and sums are computed (the fit, the validation and prediction
//! all price through it).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use zerobench_schema::config::Offload;
use zerobench_schema::models::BACKWARD_SHARE;

use crate::terms::{family_of, memory_terms, reserved_terms, step_terms, Part, Term};
use crate::work::Work;

/// Bytes in a GiB: memory terms are fitted in GiB.
pub(crate) const GIB: f64 = (1u64 << 30) as f64;

/// Which bound sets a micro-step's time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Bound {
    /// The host issuing kernels.
    Launch,
    /// The GPU executing them.
    Device,
}

/// A family none of whose runs kept the GPU busy has no device bound of its own; prediction prices
/// it with this family's device coefficients (flagged): the family with the most configurations
/// that kept the GPU busy among those the micro-step's bounds are fitted on (`crate::coefficients`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceDonor {
    pub family: String,
    /// Its configurations that kept the GPU busy, of those the bounds are fitted on. A version-3
    /// model file counted runs, under the name `busy_runs`; the count only informs, so such a file
    /// prices the same.
    #[serde(alias = "busy_runs")]
    pub busy_configurations: u32,
}

/// Evaluates terms against coefficients. A device coefficient of a family whose device bound was
/// not fitted takes the `donor` family's ([`DeviceDonor`]; without one, the fitted
/// families' mean); any other family coefficient the model lacks takes the mean of the fitted
/// families' (both flagged); any other missing coefficient counts 0 (flagged when its quantity is
/// not 0).
pub(crate) fn eval(
    coef: &BTreeMap<String, f64>,
    donor: Option<&DeviceDonor>,
    terms: &[Term],
    part: Part,
    flags: &mut Vec<String>,
) -> f64 {
    terms
        .iter()
        .filter(|t| t.part == part)
        .map(|t| match coef.get(&t.name) {
            Some(c) => c * t.x,
            None if t.x == 0.0 => 0.0,
            None => match family_of(&t.name) {
                Some(fam) => {
                    let (c, why) = borrowed(coef, donor, fam, &t.name[fam.len()..], t.part);
                    note(flags, why);
                    c * t.x
                }
                None => {
                    note(flags, format!("{}: not fitted (no run needed it); counted as 0", t.name));
                    0.0
                }
            },
        })
        // An empty sum is -0.0; a term that is not there prices 0.
        .sum::<f64>()
        + 0.0
}

/// The coefficient family `fam` borrows for its missing term `fam{suffix}` of `part`, and the flag
/// that says so: the donor's for a device term where the model names one, else the mean of the
/// fitted families' (0 where none has it).
fn borrowed(
    coef: &BTreeMap<String, f64>,
    donor: Option<&DeviceDonor>,
    fam: &str,
    suffix: &str,
    part: Part,
) -> (f64, String) {
    let fitted = coef.keys().any(|k| family_of(k) == Some(fam));
    let donor = donor.and_then(|d| Some((d.family.as_str(), *coef.get(&format!("{}{suffix}", d.family))?)));
    let mean = || {
        let others: Vec<f64> =
            coef.iter().filter(|(k, _)| family_of(k).is_some() && k.ends_with(suffix)).map(|(_, v)| *v).collect();
        if others.is_empty() {
            0.0
        } else {
            others.iter().sum::<f64>() / others.len() as f64
        }
    };
    // A fitted family's device terms are left unfitted when none of its runs kept the GPU busy
    // (crate::coefficients).
    const UNBUSY: &str = "its device bound not fitted (none of its runs kept the GPU busy)";
    match (fitted, part, donor) {
        (false, _, _) => {
            (mean(), format!("{fam}: no run of this family was fitted; its terms are the mean of the others'"))
        }
        (true, Part::Device, Some((d, c))) => {
            (c, format!("{fam}: {UNBUSY}; {d}'s, the family with the most busy configurations"))
        }
        (true, Part::Device, None) => (mean(), format!("{fam}: {UNBUSY}; the other families' mean")),
        (true, _, _) => (mean(), format!("{fam}{suffix}: not fitted for this family; the other families' mean")),
    }
}

fn note(flags: &mut Vec<String>, s: String) {
    if !flags.contains(&s) {
        flags.push(s);
    }
}

/// Step time, the compute bound that set it, and its parts.
pub(crate) struct StepParts {
    pub step_ms: f64,
    pub compute_ms: f64,
    pub bound: Bound,
    pub optimizer_ms: f64,
    /// What the step waits for of the host's update; the update itself in `host_update_ms`.
    pub offload_ms: f64,
    pub host_update_ms: f64,
    pub comm_ms: f64,
}

/// The coefficient of the shorter bound's share that the longer does not hide (fitted on a grid
/// from 0 to 1; see [`crate::terms`]).
pub const UNHIDDEN: &str = "micro.unhidden_share";

/// One micro-step: the longer of its bounds plus the unhidden share of the shorter, plus what runs
/// on top of both.
pub(crate) fn micro_ms(
    coef: &BTreeMap<String, f64>,
    donor: Option<&DeviceDonor>,
    terms: &[Term],
    flags: &mut Vec<String>,
) -> (f64, Bound) {
    let host = eval(coef, donor, terms, Part::Host, flags);
    let device = eval(coef, donor, terms, Part::Device, flags);
    let on_top = eval(coef, donor, terms, Part::Micro, flags);
    let unhidden = coef.get(UNHIDDEN).copied().unwrap_or(0.0);
    if host > device {
        (host + unhidden * device + on_top, Bound::Launch)
    } else {
        (device + unhidden * host + on_top, Bound::Device)
    }
}

/// The coefficient of the GPU's window (`offload_window_ms`) that the host's share of an
/// offloaded update hides behind (fitted on a grid from 0 to 1).
pub const OFFLOAD_HIDDEN: &str = "offload.hidden_share";

/// The GPU's work an offloaded step's host update can run beside: with the delayed update the
/// whole compute of the next step; in exact steps the backward, from which the host's units
/// (the last ones, whose gradients land first) are updated, [`BACKWARD_SHARE`] of the compute;
/// and in both the GPU's own share of the update and, on several GPUs, what communication adds
/// to the step (the host works on while the GPUs wait for their collectives).
pub(crate) fn offload_window_ms(w: &Work, compute_ms: f64, optimizer_ms: f64, comm_ms: f64) -> f64 {
    let share = if w.delayed_update { 1.0 } else { BACKWARD_SHARE };
    share * compute_ms + optimizer_ms + comm_ms
}

/// The part of the host's update (`host_ms`, offload's terms) the step waits for: what the hidden
/// share of the GPU's window does not cover, never below 0.
pub(crate) fn exposed_offload_ms(coef: &BTreeMap<String, f64>, host_ms: f64, window_ms: f64) -> f64 {
    (host_ms - coef.get(OFFLOAD_HIDDEN).copied().unwrap_or(0.0) * window_ms).max(0.0)
}

/// The exponent e by which the ranks sharing a host slow each other's updates: each of N ranks'
/// host AdamW takes N^e times as long as one rank's alone would, from 0 (ranks that do not slow
/// each other) to 1 (the host's rate split evenly between them). Fitted on a grid over the
/// offloaded runs of several ranks per host; a model fitted without such runs has none, and prices
/// each rank as one rank alone.
pub const OFFLOAD_SHARING: &str = "offload.sharing_exponent";

/// How many times longer each of `ranks` ranks sharing a host takes for its host AdamW than one
/// rank alone, at sharing exponent `e` ([`OFFLOAD_SHARING`]): `ranks^e`.
pub fn sharing_factor(ranks: f64, e: f64) -> f64 {
    ranks.powf(e)
}

/// [`sharing_factor`] of `w`'s ranks per host at the fitted exponent (none: 0, each rank alone).
pub(crate) fn host_sharing(coef: &BTreeMap<String, f64>, w: &Work) -> f64 {
    sharing_factor(w.ranks_per_host, coef.get(OFFLOAD_SHARING).copied().unwrap_or(0.0))
}

/// The host's update of one step (offload's terms): its AdamW, slowed by the ranks sharing the
/// host ([`host_sharing`]), and, with the parameters offloaded, their copies per micro-step.
pub(crate) fn host_update_ms(
    coef: &BTreeMap<String, f64>,
    donor: Option<&DeviceDonor>,
    w: &Work,
    terms: &[Term],
    flags: &mut Vec<String>,
) -> f64 {
    step_part(coef, donor, terms, "offload.", flags) * host_sharing(coef, w)
        + step_part(coef, donor, terms, "offload_params.", flags)
}

/// What a step waits for of its host's update ([`host_update_ms`]) less what the GPU's window of
/// `compute_ms`, `optimizer_ms` and `comm_ms` hides ([`exposed_offload_ms`]), and the host's
/// update itself; both 0 without offload.
pub(crate) fn offload_step_ms(
    coef: &BTreeMap<String, f64>,
    donor: Option<&DeviceDonor>,
    w: &Work,
    terms: &[Term],
    (compute_ms, optimizer_ms, comm_ms): (f64, f64, f64),
    flags: &mut Vec<String>,
) -> (f64, f64) {
    match w.offload {
        Offload::None => (0.0, 0.0),
        _ => {
            let host = host_update_ms(coef, donor, w, terms, flags);
            (exposed_offload_ms(coef, host, offload_window_ms(w, compute_ms, optimizer_ms, comm_ms)), host)
        }
    }
}

/// The share of an offloaded configuration's parameters on the host at which its host's update
/// takes as long as the hidden share of the GPU's window beside it (`w`: the configuration with
/// all of them on the host). Below it the step waits for none of the host's update; above it, for
/// the difference. Both sides are linear in the share s: the host's update is s times all of it,
/// and the window loses the GPU's update of the s that moved to the host:
/// `s · host(1) = hidden · (window(1) + (1 − s) · optimizer(all on the GPU))`. 1 where even all of
/// it hides; `None` without offload.
pub(crate) fn offload_balance(coef: &BTreeMap<String, f64>, donor: Option<&DeviceDonor>, w: &Work) -> Option<f64> {
    if w.offload == Offload::None {
        return None;
    }
    let parts = step_parts(coef, donor, w, &mut Vec::new());
    let host = parts.host_update_ms;
    let window = offload_window_ms(w, parts.compute_ms, parts.optimizer_ms, parts.comm_ms);
    // The GPU's update of every parameter the host holds here.
    let gpu_update = coef.get("optimizer.ms_per_gparam").copied().unwrap_or(0.0) * w.gparams_host;
    let hidden = coef.get(OFFLOAD_HIDDEN).copied().unwrap_or(0.0);
    let balance = hidden * (window + gpu_update) / (host + hidden * gpu_update);
    Some(if balance.is_finite() { balance.clamp(0.0, 1.0) } else { 1.0 })
}

/// The sum of the per-step terms whose names start with `prefix`.
pub(crate) fn step_part(
    coef: &BTreeMap<String, f64>,
    donor: Option<&DeviceDonor>,
    terms: &[Term],
    prefix: &str,
    flags: &mut Vec<String>,
) -> f64 {
    let sel: Vec<Term> = terms.iter().filter(|t| t.part == Part::Step && t.name.starts_with(prefix)).cloned().collect();
    eval(coef, donor, &sel, Part::Step, flags)
}

pub(crate) fn step_parts(
    coef: &BTreeMap<String, f64>,
    donor: Option<&DeviceDonor>,
    w: &Work,
    flags: &mut Vec<String>,
) -> StepParts {
    let terms = step_terms(w);
    let (micro, bound) = micro_ms(coef, donor, &terms, flags);
    let optimizer_ms = step_part(coef, donor, &terms, "optimizer.", flags);
    let comm_ms = step_part(coef, donor, &terms, "comm.", flags);
    let compute_ms = w.micro_steps * micro;
    let (offload_ms, host_update_ms) =
        offload_step_ms(coef, donor, w, &terms, (compute_ms, optimizer_ms, comm_ms), flags);
    StepParts {
        step_ms: compute_ms + optimizer_ms + offload_ms + comm_ms,
        compute_ms,
        bound,
        optimizer_ms,
        offload_ms,
        host_update_ms,
        comm_ms,
    }
}

/// Peak allocated bytes (exact states and buffers plus the fitted rest).
pub(crate) fn peak_allocated(coef: &BTreeMap<String, f64>, w: &Work, flags: &mut Vec<String>) -> f64 {
    w.device_state_bytes as f64 + eval(coef, None, &memory_terms(w), Part::Step, flags) * GIB
}

pub(crate) fn peak_reserved(coef: &BTreeMap<String, f64>, allocated: f64, flags: &mut Vec<String>) -> f64 {
    allocated + eval(coef, None, &reserved_terms(allocated / GIB), Part::Step, flags) * GIB
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::work::Query;
    use zerobench_schema::config::{RunConfig, ZeroStage};
    use zerobench_schema::models::ModelPreset;

    /// With the delayed update the host's update hides behind the whole compute, in exact steps
    /// behind the backward; both add the GPU's own update; what is left never goes below zero; and
    /// a model without the hidden share waits for all of it.
    #[test]
    fn the_host_update_hides_behind_its_window_and_never_below_zero() {
        let work = |delayed: bool| {
            let mut c = RunConfig::new(ModelPreset::Gpt2Xl, ZeroStage::Z2);
            (c.offload, c.offload_ratio, c.delayed_update_after) =
                (Offload::Optimizer, Some(0.5), delayed.then_some(2));
            Work::of(&Query::new(c, 1, 1), None)
        };
        assert_eq!(offload_window_ms(&work(true), 90.0, 6.0, 0.0), 96.0);
        assert_eq!(offload_window_ms(&work(false), 90.0, 6.0, 0.0), 66.0);
        assert_eq!(offload_window_ms(&work(false), 90.0, 6.0, 10.0), 76.0);
        let coef: BTreeMap<String, f64> = [(OFFLOAD_HIDDEN.to_string(), 0.5)].into();
        assert_eq!(exposed_offload_ms(&coef, 100.0, 66.0), 67.0);
        assert_eq!(exposed_offload_ms(&coef, 20.0, 66.0), 0.0);
        assert_eq!(exposed_offload_ms(&BTreeMap::new(), 100.0, 66.0), 100.0);
    }

    /// The balance is the share at which the host's update equals the hidden window: the exposed
    /// host update, priced at shares on either side of it, is 0 below and above 0 above; all of it
    /// hiding gives 1, no offload none.
    #[test]
    fn the_offload_balance_is_where_the_host_stops_hiding() {
        let all = |offload: Offload| {
            let mut c = RunConfig::new(ModelPreset::Gpt2Xl, ZeroStage::Z2);
            (c.offload, c.offload_ratio) = (offload, Some(1.0));
            Work::of(&Query::new(c, 1, 1), None)
        };
        let coef: BTreeMap<String, f64> = [
            ("gpt2.device_ms".to_string(), 100.0),
            ("optimizer.ms_per_gparam".to_string(), 10.0),
            ("offload.ms_per_gparam".to_string(), 200.0),
            (OFFLOAD_HIDDEN.to_string(), 0.8),
        ]
        .into();
        assert_eq!(offload_balance(&coef, None, &all(Offload::None)), None);
        let b = offload_balance(&coef, None, &all(Offload::Optimizer)).unwrap();
        assert!(b > 0.05 && b < 0.95, "{b}");
        // The step at share s: s of the parameters on the host, 1 - s updated on the GPU.
        let w = all(Offload::Optimizer);
        let exposed = |s: f64| {
            let host = 200.0 * w.gparams_host * s;
            let window = BACKWARD_SHARE * 100.0 + 10.0 * w.gparams_host * (1.0 - s);
            exposed_offload_ms(&coef, host, window)
        };
        assert!(exposed(b * 0.99) == 0.0 && exposed(b * 1.01) > 0.0, "{b}");
        let mut cheap = coef.clone();
        cheap.insert("offload.ms_per_gparam".to_string(), 1.0);
        assert_eq!(offload_balance(&cheap, None, &all(Offload::Optimizer)), Some(1.0));
    }

    /// A part with no terms of its own (none, or only another part's), or only terms of 0 (here
    /// -0.0), prices +0.0: an empty float sum is -0.0, which a prediction would print as "-0".
    #[test]
    fn nothing_prices_positive_zero() {
        let coef: BTreeMap<String, f64> = [("gpt2.device_ms".to_string(), 2.0)].into_iter().collect();
        // None; one of another part; one whose count is -0.0.
        let term = |part, x| Term { name: "gpt2.device_ms".into(), part, x };
        for terms in [vec![], vec![term(Part::Device, 1.0)], vec![term(Part::Step, -0.0)]] {
            let v = eval(&coef, None, &terms, Part::Step, &mut Vec::new());
            assert!(v == 0.0 && v.is_sign_positive(), "{v:?} for {terms:?}");
        }
    }

    /// Reserved memory is the allocated peak plus the fitted rest: a constant and a share of it.
    #[test]
    fn reserved_is_allocated_plus_the_rest() {
        let coef: BTreeMap<String, f64> =
            [("reserved.gib".to_string(), 0.25), ("reserved.per_allocated".to_string(), 0.1)].into_iter().collect();
        let got = peak_reserved(&coef, 8.0 * GIB, &mut Vec::new());
        assert!((got / GIB - (8.0 + 0.25 + 0.8)).abs() < 1e-9, "{}", got / GIB);
    }

    /// A term a family lacks is borrowed, with the flag that says from where: a family no run
    /// fitted takes the fitted families' mean; a fitted family's device term the donor's (the
    /// others' mean without one), and its other terms the others' mean.
    #[test]
    fn a_missing_term_is_borrowed_and_said_where_from() {
        let coef: BTreeMap<String, f64> = [
            ("gpt2.device_ms", 10.0),
            ("gpt2.host_ms", 1.0),
            ("t5.device_ms", 30.0),
            ("t5.host_ms", 3.0),
            // llama fitted without a device bound (none of its runs kept the GPU busy).
            ("llama.host_ms", 5.0),
            // No family's: never in a mean, and no sign that mlp was fitted.
            ("optimizer.ms_per_gparam", 7.0),
        ]
        .map(|(k, v)| (k.to_string(), v))
        .into();
        let donor = DeviceDonor { family: "t5".into(), busy_configurations: 4 };
        assert_eq!(
            borrowed(&coef, Some(&donor), "mlp", ".device_ms", Part::Device),
            (20.0, "mlp: no run of this family was fitted; its terms are the mean of the others'".to_string())
        );
        assert_eq!(borrowed(&coef, Some(&donor), "mlp", ".host_ms", Part::Host).0, 3.0);
        let (c, why) = borrowed(&coef, Some(&donor), "llama", ".device_ms", Part::Device);
        assert_eq!((c, why.ends_with("t5's, the family with the most busy configurations")), (30.0, true), "{why}");
        let (c, why) = borrowed(&coef, None, "llama", ".device_ms", Part::Device);
        assert_eq!((c, why.ends_with("the other families' mean")), (20.0, true), "{why}");
        let (c, why) = borrowed(&coef, Some(&donor), "llama", ".ms_per_gflop", Part::Step);
        assert_eq!(
            (c, why.as_str()),
            (0.0, "llama.ms_per_gflop: not fitted for this family; the other families' mean")
        );
    }

    /// Ranks sharing a host slow its AdamW by ranks^e, not the parameters' copies; a model without
    /// the exponent prices each rank as one alone.
    #[test]
    fn ranks_sharing_a_host_slow_its_adamw_only() {
        let work = |gpus: u32| {
            let mut c = RunConfig::new(ModelPreset::Gpt2Xl, ZeroStage::Z3);
            c.offload = Offload::OptimizerParams;
            Work::of(&Query::new(c, gpus, 1), None)
        };
        let (one, four) = (work(1), work(4));
        let coef: BTreeMap<String, f64> = [
            ("offload.ms_per_gparam".to_string(), 100.0),
            ("offload_params.ms_per_gparam_micro".to_string(), 10.0),
            (OFFLOAD_SHARING.to_string(), 0.5),
        ]
        .into();
        let host =
            |coef: &BTreeMap<String, f64>, w: &Work| host_update_ms(coef, None, w, &step_terms(w), &mut Vec::new());
        let (adamw, copies) = (100.0 * four.gparams_host, 10.0 * four.gparams_host);
        assert!((host(&coef, &four) - (2.0 * adamw + copies)).abs() < 1e-9);
        assert!((host(&coef, &one) - 110.0 * one.gparams_host).abs() < 1e-9);
        let mut alone = coef.clone();
        alone.remove(OFFLOAD_SHARING);
        assert!((host(&alone, &four) - (adamw + copies)).abs() < 1e-9);
    }
}
