//! The cost model's terms: each a coefficient (fitted) times a quantity of [`Work`] (exact).
//!
//! **Step time** (ms), per optimizer step of G micro-steps:
//!
//! ```text
//! step = G · (max(host, device) + u · min(host, device) + gathers) + optimizer + offload + comm
//! host   = launch_ms[f] + launch_ms_per_unit[f] · units + launch_ms_per_unit_kd · units · d/1000
//!          + stage3.launch_ms_per_unit · units·[parameters sharded]
//! device = device_ms[f] + ms_per_gflop[f] · GFLOP_dense + ms_per_gflop_attn[f] · GFLOP_attn
//!          + ms_per_gact[f] · Gact + head.ms_per_gvocab · Gvocab
//! gathers = stage3.ms_per_gparam_gathered · Ggathered
//!          ([parameters sharded]: stage 3 on several ranks, or with them on the host; on one
//!          rank stage 3 keeps them whole, `ParamPath`, and both stage-3 terms are 0)
//! optimizer = optimizer.ms_per_gparam · Gparams on the device
//! offload   = max(0, host update − offload.hidden_share · window)   (crate::price)
//! host update = offload.ms_per_gparam · Gparams on the host · slowness · ranks^e
//!           + offload_params.ms_per_gparam_micro · G · Gparams on the host·[optimizer+params]
//! slowness  = fitted hosts' AdamW rate / this host's, one rank per host; else 1   (crate::work::host_slowness)
//! ranks^e   = ranks per host ^ offload.sharing_exponent, fitted; 0 without   (crate::price::host_sharing)
//! window    = (BACKWARD_SHARE · compute, or all of it with the delayed update) + optimizer + comm
//! comm      = comm.ms·[gpus > 1] + comm.stage{s}.ms_per_gb · (GB within a node + GB across nodes · r)
//! ```
//!
//! f is the model family. A micro-step has two bounds: the host issuing its kernels (a fixed set
//! per unit, more and larger small ones as the width d grows, so small models at small batches run
//! at the launch rate whatever their size) and the GPU executing them (matrix FLOPs at an achieved
//! rate, `ms_per_gflop` being its inverse, and attention's quadratic FLOPs at a rate of their own,
//! since attention kernels (flash attention for GPT-2, T5's with its position bias) run at another
//! speed than the dense products; bandwidth-bound elementwise work over the activations;
//! the head's logits). It takes the longer plus the share u (`micro.unhidden_share`, fitted on a
//! grid from 0 to 1) of the shorter that the longer does not hide, plus stage 3's gathers.
//! Communication is what the second GPU costs beyond the halved
//! optimizer: the exposed collectives and the slowdown of the computation they overlap, per byte
//! each rank sends (nccl-tests' bus bytes), per stage because each stage overlaps differently.
//! r = [`INTRA_NODE_BUS_GBPS`] / [`INTER_NODE_BUS_GBPS`] prices bytes across nodes, which no fit has
//! seen.
//!
//! **Peak allocated memory** (GiB): the exact model states and engine buffers, plus
//! `mem_gib[f] + mem_gib_per_gact[f] · Gact' + mem_gib_per_gparam_largest · Glargest` (activations
//! kept for backward, and the temporaries of the largest unit); Gact' is Gact, scaled for T5 by
//! what its layers keep against the fitted presets' shape (`crate::work::t5_width_scale`).
//! **Reserved** adds the caching allocator's `reserved.gib + reserved.per_allocated · allocated`.

use crate::work::{Work, INTER_NODE_BUS_GBPS, INTRA_NODE_BUS_GBPS};
use zerobench_schema::config::Offload;
use zerobench_schema::memory::ParamPath;

/// Which bound a term belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// Per micro-step, host-bound.
    Host,
    /// Per micro-step, device-bound.
    Device,
    /// Per micro-step, on top of the larger bound (stage 3's gathers, on a stream of their own).
    Micro,
    /// Per optimizer step.
    Step,
}

/// One term: the coefficient's name and the quantity it multiplies.
#[derive(Debug, Clone, PartialEq)]
pub struct Term {
    pub name: String,
    pub part: Part,
    pub x: f64,
}

/// Whether a coefficient belongs to one model family (named `family.…`).
pub fn family_of(name: &str) -> Option<&str> {
    let head = name.split('.').next()?;
    ["gpt2", "t5", "llama", "mlp"].contains(&head).then_some(head)
}

/// The step-time terms of a configuration.
pub fn step_terms(w: &Work) -> Vec<Term> {
    let f = w.family;
    // Stage 3's per-unit cost is its gathers' and releases' bookkeeping: none where it keeps
    // its parameters whole (one rank).
    let s3 = if w.params == ParamPath::Sharded { 1.0 } else { 0.0 };
    let t = |name: String, part, x: f64| Term { name, part, x };
    let mut v = vec![
        t(format!("{f}.launch_ms"), Part::Host, 1.0),
        t(format!("{f}.launch_ms_per_unit"), Part::Host, w.units),
        t("stage3.launch_ms_per_unit".into(), Part::Host, s3 * w.units),
        t("launch_ms_per_unit_kd".into(), Part::Host, w.units * w.kd_model),
        t(format!("{f}.device_ms"), Part::Device, 1.0),
        t(format!("{f}.ms_per_gflop"), Part::Device, w.gflop - w.gflop_attn),
        t(format!("{f}.ms_per_gflop_attn"), Part::Device, w.gflop_attn),
        t(format!("{f}.ms_per_gact"), Part::Device, w.gact),
        t("head.ms_per_gvocab".into(), Part::Device, w.gvocab),
        t("stage3.ms_per_gparam_gathered".into(), Part::Micro, w.ggathered),
        t("optimizer.ms_per_gparam".into(), Part::Step, w.gparams_device),
    ];
    if w.offload != Offload::None {
        v.push(t("offload.ms_per_gparam".into(), Part::Step, w.gparams_host * w.host_slowness));
    }
    if w.offload == Offload::OptimizerParams {
        v.push(t("offload_params.ms_per_gparam_micro".into(), Part::Step, w.micro_steps * w.gparams_host));
    }
    if w.gpus > 1 {
        let gb = w.wire_gb_intra + w.wire_gb_inter * INTRA_NODE_BUS_GBPS / INTER_NODE_BUS_GBPS;
        v.push(t("comm.ms".into(), Part::Step, 1.0));
        v.push(t(format!("comm.stage{}.ms_per_gb", w.stage.index()), Part::Step, gb));
    }
    v
}

/// The peak-allocated terms (GiB beyond the exact states and buffers).
pub fn memory_terms(w: &Work) -> Vec<Term> {
    let f = w.family;
    let t = |name: String, x: f64| Term { name, part: Part::Step, x };
    vec![
        t(format!("{f}.mem_gib"), 1.0),
        t(format!("{f}.mem_gib_per_gact"), w.gact_mem),
        t("mem_gib_per_gparam_largest".into(), w.glargest_unit),
    ]
}

/// The reserved-beyond-allocated terms, given the allocated GiB.
pub fn reserved_terms(allocated_gib: f64) -> Vec<Term> {
    vec![
        Term { name: "reserved.gib".into(), part: Part::Step, x: 1.0 },
        Term { name: "reserved.per_allocated".into(), part: Part::Step, x: allocated_gib },
    ]
}
