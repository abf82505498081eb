//! A fitted cost model: its coefficients per GPU kind and precision, the ranges it was fitted
//! over, and its own validation, as the versioned JSON file `zerobench fit` writes; and
//! prediction from it.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use zerobench_schema::config::{Offload, Precision};
use zerobench_schema::memory::ParamPath;

use crate::price::{peak_allocated, peak_reserved, sharing_factor, step_parts, Bound, DeviceDonor, OFFLOAD_SHARING};
use crate::validate::{BoundIntervals, Validation};
use crate::work::{priced_host_rate, Query, Work};

/// The file's format name and version; readers refuse versions before [`OLDEST_READ`] and after
/// this one.
pub const FORMAT: &str = "zerobench-cost-model";
/// Version 2 prices attention's FLOPs apart from the dense products (`ms_per_gflop_attn`); a
/// version-1 model has no such coefficient and would price attention at nothing, so it is refused.
/// Version 3 names the device donor in its own field ([`Fit::device_donor`]); version 2 kept it
/// as a pseudo-coefficient `device_donor.<family>` among the step's, which this build would not
/// see (and a version-2 reader would not see the field), pricing such families differently.
/// Version 4 chooses the donor by its configurations that kept the GPU busy, not its runs, and
/// names the count `busy_configurations`; a version-3 file (`busy_runs`) prices the same donor it
/// names, so it is read.
pub const VERSION: u32 = 4;
/// The oldest version this build reads.
pub const OLDEST_READ: u32 = 3;

/// How far a preset's layer width ([`crate::work::layer_width`]) may lie outside its family's
/// fitted range, relative, before it is flagged: GPT-2's biases and T5's position buckets move
/// the width of one family's presets by less than 0.2%.
pub(crate) const LAYER_WIDTH_SLACK: f64 = 0.01;

/// The model file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CostModel {
    pub format: String,
    pub version: u32,
    pub fits: Vec<Fit>,
}

/// One GPU kind and precision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fit {
    /// The GPU's name as NVML reports it (`NVIDIA H200`).
    pub gpu: String,
    pub precision: Precision,
    pub device_memory_bytes: Option<u64>,
    /// Dense bf16 peak of the GPU, TFLOP/s, for MFU (from the runs).
    pub peak_tflops: Option<f64>,
    /// Step-time coefficients (ms per unit of their quantity; see [`crate::terms`]).
    pub step: BTreeMap<String, f64>,
    /// The family whose device coefficients a family without its own borrows, when one has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_donor: Option<DeviceDonor>,
    /// Peak-allocated coefficients (GiB).
    pub memory: BTreeMap<String, f64>,
    /// Reserved-beyond-allocated coefficients.
    pub reserved: BTreeMap<String, f64>,
    /// The host AdamW rate, 1e9 parameters/s, offload's terms are priced at: the geometric mean of
    /// the fitted offloaded runs' hosts where any was known (`crate::coefficients::host_reference`).
    /// A query of another host's rate is priced by the ratio ([`crate::work::host_slowness`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_adamw_gparams_per_s: Option<f64>,
    pub range: Range,
    /// Relative errors of held-out predictions (measured / predicted − 1), 5th and 95th
    /// percentiles: the interval a prediction is given with.
    pub step_interval: [f64; 2],
    /// The same over the held-out runs predicted launch-bound and device-bound, where there were
    /// enough of them (files written before it have none: every prediction takes `step_interval`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_interval_by_bound: Option<BoundIntervals>,
    pub memory_interval: [f64; 2],
    pub validation: Validation,
    /// The builds of the engine the fitted runs measured (a commit's first 7 digits), where their
    /// logs name one: what the predictions describe (files written before it: not recorded).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub builds: Vec<String>,
    /// The runs fitted on.
    pub runs: Vec<FittedRun>,
}

/// What the fit has seen: a query outside it is flagged.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Range {
    /// Per family: the fewest and most tokens per micro-step, and the smallest and largest model.
    pub families: BTreeMap<String, FamilyRange>,
    /// The most GPUs and nodes of the runs communication was fitted on
    /// (`crate::coefficients::communication_runs`), at least 1.
    pub max_gpus: u32,
    pub max_nodes: u32,
    pub offloads: BTreeSet<Offload>,
    /// Whether a run kept part of an offloaded optimizer on the GPU (`offload_ratio` below 1).
    #[serde(default)]
    pub partial_offload: bool,
    /// Whether an offloaded run used the delayed update.
    #[serde(default)]
    pub delayed_update: bool,
    /// The slowest and fastest host AdamW rate among the offloaded runs of one rank per host that
    /// name one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_adamw_gparams_per_s: Option<[f64; 2]>,
    /// The most ranks an offloaded run had on one host (files written before it: not recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offload_ranks_per_host: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FamilyRange {
    pub min_tokens: f64,
    pub max_tokens: f64,
    pub min_params: f64,
    pub max_params: f64,
    /// The shortest and longest sequence fitted: attention's work per token grows with the
    /// sequence, so tokens per micro-step within range do not make a longer sequence fitted (files
    /// written before it: not recorded, not flagged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq_len: Option<[u32; 2]>,
    /// The narrowest and widest layers fitted (`crate::work::layer_width`): the activation terms
    /// count d_model per layer, so a preset whose layers are wider relative to d_model than any
    /// fitted is priced as if they were not (files written before it: not recorded, not flagged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer_width: Option<[f64; 2]>,
}

/// One run a model was fitted on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FittedRun {
    pub run_id: String,
    pub query: Query,
    pub step_ms: f64,
    pub peak_allocated_bytes: u64,
}

/// What a prediction is: the step time with its interval, throughput, memory and whether it fits,
/// and every way the query lies outside what was fitted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    pub gpu: String,
    pub step_ms: f64,
    pub step_ms_interval: [f64; 2],
    /// Which held-out runs' errors `step_ms_interval` spans.
    pub step_ms_interval_of: IntervalOf,
    pub tokens_per_s_per_gpu: f64,
    pub mfu: Option<f64>,
    pub peak_allocated_bytes: u64,
    pub peak_allocated_interval: [u64; 2],
    /// The engine's persistent buffers within `peak_allocated_bytes` (gradient staging, stage 3's
    /// gather slots, hpZ's secondary partition): exact, from the query's log where it has one,
    /// else what this build's engine allocates.
    #[serde(default)]
    pub engine_buffer_bytes: u64,
    /// How the engine keeps the parameters: `sharded`, each unit gathered before its use (stage 3
    /// on several GPUs, or with them on the host), or `whole`; from the query's log where it has
    /// one, else as this build's engine keeps them.
    pub param_path: ParamPath,
    pub peak_reserved_bytes: u64,
    pub device_memory_bytes: Option<u64>,
    /// Reserved memory within the device's; `None` (JSON `null`) where the device's memory is
    /// unknown (a model fitted on logs that do not record it).
    pub fits: Option<bool>,
    /// The parts of the step: the micro-steps' compute (and which bound sets it), the optimizer on
    /// the GPU, offload's host work, communication.
    pub compute_ms: f64,
    pub bound: Bound,
    pub optimizer_ms: f64,
    pub offload_ms: f64,
    pub comm_ms: f64,
    /// With offload: the host AdamW rate its update was priced at, 1e9 parameters/s (the query's
    /// where it is used, else the fitted hosts'; `None` where neither is known).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_adamw_gparams_per_s: Option<f64>,
    /// Terms extrapolated beyond the fitted runs, each with why.
    pub extrapolated: Vec<String>,
}

/// The held-out runs a prediction's step interval comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IntervalOf {
    /// Those predicted launch-bound, as this one is.
    LaunchBound,
    /// Those predicted device-bound, as this one is.
    DeviceBound,
    /// All of them (too few of this one's bound, or a model file without intervals per bound).
    All,
}

impl From<Bound> for IntervalOf {
    fn from(b: Bound) -> Self {
        match b {
            Bound::Launch => Self::LaunchBound,
            Bound::Device => Self::DeviceBound,
        }
    }
}

/// Errors of model files and queries.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(
        "{0}: not a zerobench cost model (format {1:?}, version {2}; this build reads {FORMAT:?} versions {OLDEST_READ}-{VERSION})"
    )]
    Format(String, String, u32),
    #[error("{0}: {1}")]
    Json(String, serde_json::Error),
    #[error("no fit for GPU {gpu:?} in {precision}: the model has {have}")]
    NoGpu { gpu: String, precision: Precision, have: String },
    #[error("GPU {gpu:?} matches several fits ({have}): name it more exactly")]
    Ambiguous { gpu: String, have: String },
    #[error("{origin}: {field} is {value}; {rule}")]
    Value { origin: String, field: String, value: f64, rule: &'static str },
}

impl CostModel {
    /// Reads a model file's text; `origin` names it in errors.
    pub fn from_json(origin: &str, text: &str) -> Result<CostModel, ModelError> {
        #[derive(Deserialize)]
        struct Head {
            format: String,
            version: u32,
        }
        let head: Head = serde_json::from_str(text).map_err(|e| ModelError::Json(origin.to_string(), e))?;
        if head.format != FORMAT || !(OLDEST_READ..=VERSION).contains(&head.version) {
            return Err(ModelError::Format(origin.to_string(), head.format, head.version));
        }
        let model: CostModel = serde_json::from_str(text).map_err(|e| ModelError::Json(origin.to_string(), e))?;
        model.check(origin)?;
        Ok(model)
    }

    /// Every value a prediction is made of is one a fit can give: a file edited by hand (or
    /// written by a broken fit) would otherwise price negative or infinite steps, or "fit" any
    /// configuration. The fit's coefficients are non-negative (`crate::nnls`), its shares
    /// fractions, its intervals ordered relative errors above −1.
    fn check(&self, origin: &str) -> Result<(), ModelError> {
        let bad = |field: String, value: f64, rule: &'static str| ModelError::Value {
            origin: origin.to_string(),
            field,
            value,
            rule,
        };
        for (i, f) in self.fits.iter().enumerate() {
            for (table, values) in [("step", &f.step), ("memory", &f.memory), ("reserved", &f.reserved)] {
                for (key, &v) in values {
                    let field = format!("fits[{i}].{table}.{key}");
                    if !(v.is_finite() && v >= 0.0) {
                        return Err(bad(field, v, "a coefficient is a finite number, 0 or more"));
                    }
                    if key.ends_with("_share") && v > 1.0 {
                        return Err(bad(field, v, "a share is at most 1"));
                    }
                }
            }
            for (name, v) in [("peak_tflops", f.peak_tflops), ("host_adamw_gparams_per_s", f.host_adamw_gparams_per_s)]
            {
                if let Some(v) = v.filter(|v| !(v.is_finite() && *v > 0.0)) {
                    return Err(bad(format!("fits[{i}].{name}"), v, "a rate is a finite number above 0"));
                }
            }
            let by_bound = f.step_interval_by_bound.as_ref();
            let intervals = [
                ("step_interval", Some(f.step_interval)),
                ("memory_interval", Some(f.memory_interval)),
                ("step_interval_by_bound.launch", by_bound.and_then(|b| b.launch)),
                ("step_interval_by_bound.device", by_bound.and_then(|b| b.device)),
            ];
            for (name, interval) in intervals {
                let Some([lo, hi]) = interval else { continue };
                if !(lo.is_finite() && hi.is_finite() && -1.0 < lo && lo <= hi) {
                    return Err(bad(
                        format!("fits[{i}].{name}[0]"),
                        lo,
                        "an interval is two finite relative errors, the first above -1 and not above the second",
                    ));
                }
            }
        }
        Ok(())
    }

    /// The fit for a GPU named in full or in part, case-insensitively (`h200`, `H100 80GB`).
    pub fn fit_for(&self, gpu: &str, precision: Precision) -> Result<&Fit, ModelError> {
        let want = gpu.to_lowercase();
        let have = || match self.fits.as_slice() {
            [] => "no fits".to_string(),
            fits => fits.iter().map(|f| format!("{} {}", f.gpu, f.precision)).collect::<Vec<_>>().join(", "),
        };
        let hits: Vec<&Fit> =
            self.fits.iter().filter(|f| f.precision == precision && f.gpu.to_lowercase().contains(&want)).collect();
        if let Some(exact) = hits.iter().find(|f| f.gpu.eq_ignore_ascii_case(gpu)) {
            return Ok(exact);
        }
        match hits.as_slice() {
            [one] => Ok(one),
            [] => Err(ModelError::NoGpu { gpu: gpu.to_string(), precision, have: have() }),
            _ => Err(ModelError::Ambiguous {
                gpu: gpu.to_string(),
                have: hits.iter().map(|f| f.gpu.as_str()).collect::<Vec<_>>().join(", "),
            }),
        }
    }
}

impl Fit {
    /// The share of an offloaded query's parameters the host can update before the step waits for
    /// it (`crate::price::offload_balance`), at the query's host rate and ranks per host; `None`
    /// without offload. `zerobench plan --gpu` proposes offload ratios from it.
    pub fn offload_balance(&self, q: &Query) -> Option<f64> {
        let mut all = q.clone();
        all.config.offload_ratio = Some(1.0);
        crate::price::offload_balance(
            &self.step,
            self.device_donor.as_ref(),
            &Work::of(&all, self.host_adamw_gparams_per_s),
        )
    }

    /// Predicts one configuration.
    pub fn predict(&self, q: &Query) -> Prediction {
        let w = Work::of(q, self.host_adamw_gparams_per_s);
        let mut flags = Vec::new();
        self.range.flag(&w, q, self.step.get(OFFLOAD_SHARING).copied(), &mut flags);
        let s = step_parts(&self.step, self.device_donor.as_ref(), &w, &mut flags);
        let alloc = peak_allocated(&self.memory, &w, &mut flags);
        let reserved = peak_reserved(&self.reserved, alloc, &mut flags);
        let tokens = w.micro_tokens * w.micro_steps;
        let flops = q.config.train_flops_per_token() * tokens;
        let tokens_per_s = tokens / (s.step_ms / 1e3);
        let mfu = self.peak_tflops.map(|p| flops / (s.step_ms / 1e3) / (p * 1e12));
        let (of, [lo, hi]) = match self.step_interval_by_bound.as_ref().and_then(|b| b.of(s.bound)) {
            Some(i) => (IntervalOf::from(s.bound), i),
            None => (IntervalOf::All, self.step_interval),
        };
        let [mlo, mhi] = self.memory_interval;
        Prediction {
            gpu: self.gpu.clone(),
            step_ms: s.step_ms,
            step_ms_interval: [s.step_ms * (1.0 + lo), s.step_ms * (1.0 + hi)],
            step_ms_interval_of: of,
            tokens_per_s_per_gpu: tokens_per_s,
            mfu,
            peak_allocated_bytes: alloc.round() as u64,
            peak_allocated_interval: [(alloc * (1.0 + mlo)).round() as u64, (alloc * (1.0 + mhi)).round() as u64],
            engine_buffer_bytes: w.buffer_bytes,
            param_path: w.params,
            peak_reserved_bytes: reserved.round() as u64,
            device_memory_bytes: self.device_memory_bytes,
            fits: self.device_memory_bytes.map(|m| reserved <= m as f64),
            compute_ms: s.compute_ms,
            bound: s.bound,
            optimizer_ms: s.optimizer_ms,
            offload_ms: s.offload_ms,
            comm_ms: s.comm_ms,
            host_adamw_gparams_per_s: (w.offload != Offload::None)
                .then(|| priced_host_rate(q, self.host_adamw_gparams_per_s))
                .flatten(),
            extrapolated: flags,
        }
    }
}

impl Range {
    pub(crate) fn cover(&mut self, w: &Work, q: &Query) {
        let params = q.config.model.spec().param_count() as f64;
        let r = self.families.entry(w.family.to_string()).or_insert(FamilyRange {
            min_tokens: f64::INFINITY,
            max_tokens: 0.0,
            min_params: f64::INFINITY,
            max_params: 0.0,
            seq_len: None,
            layer_width: None,
        });
        let t = q.config.seq_len;
        r.seq_len = Some(r.seq_len.map_or([t, t], |[lo, hi]| [lo.min(t), hi.max(t)]));
        let lw = w.layer_width;
        r.layer_width = Some(r.layer_width.map_or([lw, lw], |[lo, hi]| [lo.min(lw), hi.max(lw)]));
        r.min_tokens = r.min_tokens.min(w.micro_tokens);
        r.max_tokens = r.max_tokens.max(w.micro_tokens);
        r.min_params = r.min_params.min(params);
        r.max_params = r.max_params.max(params);
        // One GPU on one node needs no communication; more are covered by the runs communication
        // was fitted on (`cover_communication`), which offloaded runs of more GPUs need not be.
        self.max_gpus = self.max_gpus.max(1);
        self.max_nodes = self.max_nodes.max(1);
        self.offloads.insert(w.offload);
        self.partial_offload |= w.offload != Offload::None && w.gparams_device > 0.0;
        self.delayed_update |= w.delayed_update;
        if w.offload != Offload::None {
            let ranks = q.ranks_per_host();
            self.offload_ranks_per_host = Some(self.offload_ranks_per_host.map_or(ranks, |r| r.max(ranks)));
            if let Some(rate) = q.rate_priced() {
                self.host_adamw_gparams_per_s =
                    Some(self.host_adamw_gparams_per_s.map_or([rate, rate], |[lo, hi]| [lo.min(rate), hi.max(rate)]));
            }
        }
    }

    /// A run communication was fitted on: its GPUs and nodes are within the fitted range.
    pub(crate) fn cover_communication(&mut self, w: &Work) {
        self.max_gpus = self.max_gpus.max(w.gpus);
        self.max_nodes = self.max_nodes.max(w.nodes);
    }

    /// `sharing`: the fit's sharing exponent ([`OFFLOAD_SHARING`]), where it has one.
    fn flag(&self, w: &Work, q: &Query, sharing: Option<f64>, flags: &mut Vec<String>) {
        let params = q.config.model.spec().param_count() as f64;
        if let Some(r) = self.families.get(w.family) {
            if w.micro_tokens < r.min_tokens || w.micro_tokens > r.max_tokens {
                flags.push(format!(
                    "compute: {} tokens per micro-step, fitted {}-{} for {}",
                    w.micro_tokens, r.min_tokens, r.max_tokens, w.family
                ));
            }
            if let Some([lo, hi]) = r.seq_len.filter(|&[lo, hi]| !(lo..=hi).contains(&q.config.seq_len)) {
                flags.push(format!(
                    "compute: sequence {}, fitted {lo}-{hi} for {} (attention's work per token grows with it)",
                    q.config.seq_len, w.family
                ));
            }
            let lw = w.layer_width;
            let outside =
                |&[lo, hi]: &[f64; 2]| lw < lo * (1.0 - LAYER_WIDTH_SLACK) || lw > hi * (1.0 + LAYER_WIDTH_SLACK);
            if let Some([lo, hi]) = r.layer_width.filter(outside) {
                // The elementwise work's time counts d_model; the memory too, but where it counts
                // what the layers keep (T5: `crate::work::t5_width_scale`).
                let priced = if w.gact_mem_by_width {
                    "their elementwise work is priced per d_model, their memory by their widths"
                } else {
                    "activations are priced per d_model, not per the layers' width"
                };
                flags.push(format!(
                    "activations: layers of {lw:.1} d_model² parameters, fitted {lo:.1}-{hi:.1} for {} ({priced})",
                    w.family
                ));
            }
            if params < r.min_params * 0.999 || params > r.max_params * 1.001 {
                flags.push(format!(
                    "compute: {:.3}B parameters, fitted {:.3}B-{:.3}B for {}",
                    params / 1e9,
                    r.min_params / 1e9,
                    r.max_params / 1e9,
                    w.family
                ));
            }
        }
        if w.gpus > self.max_gpus {
            flags.push(format!("communication: {} GPUs, fitted up to {}", w.gpus, self.max_gpus));
        }
        if w.nodes > self.max_nodes {
            flags.push(format!(
                "communication: {} nodes, fitted up to {} (bytes across nodes priced at {:.1}x those within)",
                w.nodes,
                self.max_nodes,
                crate::work::INTRA_NODE_BUS_GBPS / crate::work::INTER_NODE_BUS_GBPS
            ));
        }
        if w.offload != Offload::None && w.gparams_device > 0.0 && !self.partial_offload {
            flags.push(
                "offload: a ratio below 1 not fitted; the host's share is priced beside the GPU's work as \
                 whole-host runs hide it"
                    .to_string(),
            );
        }
        if w.delayed_update && !self.delayed_update {
            flags.push(
                "offload: the delayed update not fitted; the host's update is priced beside the next step's \
                 compute as exact runs hide it beside the backward"
                    .to_string(),
            );
        }
        if !self.offloads.contains(&w.offload) {
            flags.push(format!("offload: {} not fitted", w.offload));
        }
        if w.offload != Offload::None {
            self.flag_host(q, sharing, flags);
        }
    }

    /// An offloaded query's host beyond the fitted hosts: more ranks sharing it, or an AdamW rate
    /// outside theirs, or one that is not used.
    fn flag_host(&self, q: &Query, sharing: Option<f64>, flags: &mut Vec<String>) {
        let ranks = q.ranks_per_host();
        if let Some(fitted) = self.offload_ranks_per_host.filter(|&r| ranks > r) {
            flags.push(match sharing {
                Some(e) => format!(
                    "offload: {ranks} ranks share a host, fitted with up to {fitted}: each rank's host update is \
                     priced {:.2} times one rank's alone ({ranks}^{e:.2}, the fitted sharing exponent)",
                    sharing_factor(f64::from(ranks), e)
                ),
                None => format!(
                    "offload: {ranks} ranks share a host, fitted with {fitted}: each rank's host update is priced as \
                     one rank's alone, short where the host's update sets the step (two ranks of a 2xH100 host took \
                     as long as one rank with all the parameters)"
                ),
            });
        }
        match (q.host_adamw_gparams_per_s, self.host_adamw_gparams_per_s) {
            (Some(_), _) if ranks > 1 => flags.push(
                "offload: the host's AdamW rate is not used with several ranks per host (one process over all \
                 its cores does not say what each rank gets)"
                    .to_string(),
            ),
            (Some(r), Some([lo, hi])) if r < lo * 0.999 || r > hi * 1.001 => flags.push(format!(
                "offload: host AdamW at {r:.2}G parameters/s, fitted hosts {lo:.2}-{hi:.2}G (priced in proportion)"
            )),
            (Some(_), None) => {
                flags.push("offload: no fitted run's host AdamW rate was known; the given rate is not used".to_string())
            }
            _ => {}
        }
    }
}
