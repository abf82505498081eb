//! ZeRO model-state memory per rank (Rajbhandari et al., "ZeRO: Memory Optimizations Toward
//! Training Trillion Parameter Models", SC'20, section 5), generalised over precision.
//!
//! With Ψ parameters, N ranks, p bytes per parameter and per gradient element on the device and
//! k bytes of optimizer state per parameter (mixed precision: fp32 master + Adam m + v = 12;
//! fp32: m + v = 8, the parameters being the master weights):
//!
//! | stage | parameters | gradients | optimizer | mixed precision total |
//! |---|---|---|---|---|
//! | 0 | pΨ | pΨ | kΨ | 16Ψ |
//! | 1 | pΨ | pΨ | kΨ/N | 4Ψ + 12Ψ/N |
//! | 2 | pΨ | pΨ/N | kΨ/N | 2Ψ + 14Ψ/N |
//! | 3 | pΨ/N | pΨ/N | kΨ/N | 16Ψ/N |
//!
//! zerobench's engine pads every unit so that it splits into N equal shards of a multiple of
//! [`SHARD_ALIGN_ELEMS`] elements; [`padded_params`] gives the Ψ the formulas hold for exactly.
//!
//! **Offload** ([`model_state_split`]) moves the optimizer (and in stage 3 the parameters) to the
//! host. On the device: stage 1 keeps pΨ parameters and its pΨ gradient buffer, stage 2 pΨ
//! parameters (gradients are reduce-scattered into a bucket and copied out), stage 3 pΨ/N
//! parameters, and with `optimizer+params` nothing but buffers. In pinned host memory, per rank:
//! fp32 master weights, Adam m and v (12Ψ/N), the gradient shard as it arrives (pΨ/N), an fp32
//! accumulator when stages 2-3 accumulate gradients over micro-steps (4Ψ/N), and, in mixed precision,
//! the compute-precision parameter shard the CPU writes and the device copies back (pΨ/N).
//!
//! **Twin-Flow** (`offload_ratio` R < 1, after DeepSpeed ZeRO-Offload++) keeps only part of the
//! partition on the host: whole units, taken from the end of forward order ([`first_host_unit`]),
//! Ψh of the Ψ padded elements. The other units keep the states they have without offload
//! (optimizer kΨd/N, stages 2-3 their pΨd/N gradient shard, stage 3 with `optimizer+params` its
//! pΨd/N parameter shard, Ψd = Ψ − Ψh); the host terms above hold for Ψh.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::config::{EngineConfig, Offload, Precision, ZeroStage};
use crate::models::ModelSpec;

/// Every shard of a unit is a multiple of this many elements, so each shard starts on a 256-byte
/// boundary whatever the element size (NCCL and vectorised kernels want aligned buffers).
pub const SHARD_ALIGN_ELEMS: u64 = 128;

/// Model-state bytes held by one rank, split by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ModelStateBytes {
    pub params_bytes: u64,
    pub grads_bytes: u64,
    pub optimizer_bytes: u64,
}

impl ModelStateBytes {
    /// All three, saturating at `u64::MAX`: the counts may be a log's, and a hostile log's must not
    /// wrap the sum (release builds do not check) into a small one.
    pub fn total(&self) -> u64 {
        self.params_bytes.saturating_add(self.grads_bytes).saturating_add(self.optimizer_bytes)
    }
}

/// Elements of one unit after padding for `world` ranks.
pub fn padded_unit(params: u64, world: u64) -> u64 {
    let chunk = world.max(1) * SHARD_ALIGN_ELEMS;
    params.div_ceil(chunk) * chunk
}

/// Ψ after padding every unit of `spec` for `world` ranks.
pub fn padded_params(spec: &ModelSpec, world: u64) -> u64 {
    spec.units().iter().map(|u| padded_unit(u.params, world)).sum()
}

/// The per-rank model-state bytes the ZeRO formulas give for `psi` parameters on `world` ranks.
/// `psi` must be divisible by `world` for the result to be exact (use [`padded_params`]).
pub fn model_state_bytes(stage: ZeroStage, precision: Precision, psi: u64, world: u64) -> ModelStateBytes {
    let n = world.max(1);
    let (p, k) = (precision.param_bytes(), precision.optimizer_bytes());
    let full = |b: u64| b * psi;
    let part = |b: u64| b * psi / n;
    match stage {
        ZeroStage::Z0 => ModelStateBytes { params_bytes: full(p), grads_bytes: full(p), optimizer_bytes: full(k) },
        ZeroStage::Z1 => ModelStateBytes { params_bytes: full(p), grads_bytes: full(p), optimizer_bytes: part(k) },
        ZeroStage::Z2 => ModelStateBytes { params_bytes: full(p), grads_bytes: part(p), optimizer_bytes: part(k) },
        ZeroStage::Z3 => ModelStateBytes { params_bytes: part(p), grads_bytes: part(p), optimizer_bytes: part(k) },
    }
}

/// Twin-Flow: the index of the first unit (in forward order) whose optimizer lives on the host
/// when the host's share is `ratio`; every later unit is on the host too. The host takes the
/// fewest units from the end of forward order that hold at least `ratio` of the padded elements:
/// backward produces their gradients first, so their host updates start earliest, and the next
/// forward starts with the units the device updated. Ratio 1 gives 0 (everything on the host).
pub fn first_host_unit(padded_units: &[u64], ratio: f64) -> usize {
    let total: u64 = padded_units.iter().sum();
    let want = ratio * total as f64;
    let (mut first, mut host) = (padded_units.len(), 0u64);
    while first > 0 && (host as f64) < want {
        first -= 1;
        host += padded_units[first];
    }
    first
}

/// Ψh: the padded elements whose optimizer lives on the host with offload ratio `ratio` (all of
/// [`padded_params`] at 1).
pub fn host_params(spec: &ModelSpec, world: u64, ratio: f64) -> u64 {
    let units: Vec<u64> = spec.units().iter().map(|u| padded_unit(u.params, world)).collect();
    units[first_host_unit(&units, ratio)..].iter().sum()
}

/// Model states of one rank split between the device and the host.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct StateSplit {
    pub device: ModelStateBytes,
    pub host_bytes: u64,
}

/// Where the model states of one rank live for a stage, precision and offload setting (see the
/// module documentation), `host_psi` of the `psi` padded elements having their optimizer on the
/// host ([`host_params`]; `psi` itself without a ratio). Without offload it is
/// [`model_state_bytes`] on the device and nothing on the host.
pub fn model_state_split(
    stage: ZeroStage,
    precision: Precision,
    offload: Offload,
    grad_accum: u32,
    psi: u64,
    host_psi: u64,
    world: u64,
) -> StateSplit {
    if offload == Offload::None {
        return StateSplit { device: model_state_bytes(stage, precision, psi, world), host_bytes: 0 };
    }
    let n = world.max(1);
    let (p, k) = (precision.param_bytes(), precision.optimizer_bytes());
    let host = |b: u64| b * host_psi / n;
    let on_device = psi - host_psi;
    let dev = |b: u64| b * on_device / n;
    // The device keeps what it keeps without offload, less what moved: the optimizer always,
    // stages 2-3 the gradient shard (stage 1 keeps its full buffer), and `optimizer+params` the
    // parameter shard.
    let device = ModelStateBytes {
        params_bytes: match (stage, offload) {
            (ZeroStage::Z3, Offload::OptimizerParams) => dev(p),
            (ZeroStage::Z3, _) => p * psi / n,
            _ => p * psi,
        },
        grads_bytes: match stage {
            ZeroStage::Z0 | ZeroStage::Z1 => p * psi,
            ZeroStage::Z2 | ZeroStage::Z3 => dev(p),
        },
        optimizer_bytes: dev(k),
    };
    // Stage 1 accumulates in its device gradient buffer and copies once per step.
    let accumulator = if grad_accum > 1 && stage != ZeroStage::Z1 { host(4) } else { 0 };
    let param_copy = if precision.has_master_copy() { host(p) } else { 0 };
    StateSplit { device, host_bytes: host(12) + host(p) + accumulator + param_copy }
}

/// How the engine carries a rank's gradients from backward into the shards its optimizer reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GradientPath {
    /// Each unit's full gradient buffer, where backward writes and micro-steps accumulate, reduced
    /// in buckets of units at the last micro-step: all-reduced at stage 0, reduce-scattered into
    /// the rank's slice of it at the others.
    Buckets,
    /// Two staging buffers that backward fills in turn, each reduce-scattered into the units'
    /// gradient shards (or sent on to the host's optimizer) every micro-step, while the other
    /// fills.
    Staged,
}

impl GradientPath {
    /// Stages 0 and 1 keep full buffers; stages 2 and 3 stage their gradients, but on one rank
    /// with the optimizer on the device. There a unit's shard is the whole unit and its
    /// reduce-scatter a copy of it, so its gradients are written to it in place, as stage 1 does
    /// (pΨ either way, as the formulas say), without the staging buffers or the copy. With
    /// offload the staging buffers stay: they hold a bucket on the device where the full buffers
    /// would hold every offloaded gradient.
    pub fn of(stage: ZeroStage, world: u64, offload: Offload) -> GradientPath {
        match stage {
            ZeroStage::Z2 | ZeroStage::Z3 if world > 1 || offload != Offload::None => GradientPath::Staged,
            _ => GradientPath::Buckets,
        }
    }
}

/// How the engine keeps a rank's parameters between their uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ParamPath {
    /// Each unit whole, where forward and backward read it (stages 0-2).
    Whole,
    /// This rank's shard of each unit; the unit is all-gathered into one of `prefetch + 1` gather
    /// slots before each use and released after it (stage 3).
    Sharded,
}

impl ParamPath {
    /// Stage 3 shards its parameters, but on one rank with them on the device. There a unit's
    /// shard is the whole unit and its all-gather a copy of it into a slot, so the unit is kept
    /// whole, as stages 0-2 keep it (pΨ/N = pΨ either way, as the formulas say), without the
    /// slots or the copies. With `optimizer+params` offload the parameters live on the host, and
    /// each use copies the unit in: the slots stay.
    pub fn of(stage: ZeroStage, world: u64, offload: Offload) -> ParamPath {
        match stage {
            ZeroStage::Z3 if world > 1 || offload == Offload::OptimizerParams => ParamPath::Sharded,
            _ => ParamPath::Whole,
        }
    }
}

/// The name a run's log gives stage 3's gather slots among its buffers (`setup`'s
/// `buffers_bytes`): present exactly when the run kept its parameters [`ParamPath::Sharded`].
pub const GATHER_SLOTS_BUFFER: &str = "gather_slots";

impl ParamPath {
    /// How a run kept its parameters, from its buffers as its log names them.
    pub fn logged(buffers_bytes: &std::collections::BTreeMap<String, u64>) -> ParamPath {
        if buffers_bytes.contains_key(GATHER_SLOTS_BUFFER) {
            ParamPath::Sharded
        } else {
            ParamPath::Whole
        }
    }
}

/// The engine's persistent device buffers beyond model states, per rank: where gradients are
/// staged ([`GradientPath::Staged`]), two staging buckets, each of `min(bucket, Ψ) + the largest
/// unit` elements (a bucket closes once it holds at least `bucket_mb`); where parameters are
/// sharded ([`ParamPath::Sharded`]), `prefetch + 1` gather slots of the largest unit. Elements
/// are in the compute precision; all sizes are padded as in [`padded_unit`]; with hpZ, sharded
/// parameters also keep the secondary partition, pΨ/group. (Activations come on top and depend
/// on batch and sequence.)
pub fn engine_buffer_bytes(
    spec: &ModelSpec,
    stage: ZeroStage,
    precision: Precision,
    offload: Offload,
    engine: &EngineConfig,
    world: u64,
) -> u64 {
    let p = precision.param_bytes();
    let bucket = ((engine.bucket_mb * 1024.0 * 1024.0) as u64 / p).max(1);
    let staging = match GradientPath::of(stage, world, offload) {
        GradientPath::Staged => 2 * (bucket.min(padded_params(spec, world)) + largest_padded_unit(spec, world)) * p,
        GradientPath::Buckets => 0,
    };
    let gathering = match ParamPath::of(stage, world, offload) {
        ParamPath::Sharded => {
            let secondary = engine.hpz.map_or(0, |g| padded_params(spec, world) / u64::from(g.max(1)) * p);
            gather_slot_bytes(spec, precision, engine, world) + secondary
        }
        ParamPath::Whole => 0,
    };
    staging + gathering
}

/// The [`GATHER_SLOTS_BUFFER`] of sharded parameters: [`gather_slots`] slots of the largest
/// padded unit, in the compute precision.
pub fn gather_slot_bytes(spec: &ModelSpec, precision: Precision, engine: &EngineConfig, world: u64) -> u64 {
    gather_slots(spec.units().len(), engine.prefetch) as u64
        * largest_padded_unit(spec, world)
        * precision.param_bytes()
}

/// The gather slots of sharded parameters: the unit computed and the `prefetch` after it, of
/// which a model of `units` has at most `units - 1` (a `--prefetch` past them, 4294967295 say,
/// would otherwise allocate a slot for each).
pub fn gather_slots(units: usize, prefetch: u32) -> usize {
    (prefetch as usize).min(units.saturating_sub(1)) + 1
}

fn largest_padded_unit(spec: &ModelSpec, world: u64) -> u64 {
    spec.units().iter().map(|u| padded_unit(u.params, world)).max().unwrap_or(0)
}

/// Model-state bytes per rank for a model, with zerobench's padding.
pub fn model_state_for(spec: &ModelSpec, stage: ZeroStage, precision: Precision, world: u64) -> ModelStateBytes {
    model_state_bytes(stage, precision, padded_params(spec, world), world)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::ModelPreset;
    use proptest::prelude::*;

    /// A prefetch past the model's units gathers into one slot a unit, not one per prefetch step.
    #[test]
    fn gather_slots_are_bounded_by_the_units() {
        assert_eq!(gather_slots(12, 2), 3);
        assert_eq!(gather_slots(12, u32::MAX), 12);
        assert_eq!(gather_slots(1, 5), 1);
        let spec = ModelPreset::Tiny.spec();
        let one_slot =
            gather_slot_bytes(&spec, Precision::Bf16, &EngineConfig { prefetch: 0, ..EngineConfig::default() }, 2);
        let most = gather_slot_bytes(
            &spec,
            Precision::Bf16,
            &EngineConfig { prefetch: u32::MAX, ..EngineConfig::default() },
            2,
        );
        assert_eq!(most, one_slot * spec.units().len() as u64);
    }

    #[test]
    fn paper_example_7_5b_on_64_ranks() {
        // ZeRO paper figure 1: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB.
        let psi = 7_500_000_000u64;
        let gb = |s| model_state_bytes(s, Precision::Bf16, psi, 64).total() as f64 / 1e9;
        assert!((gb(ZeroStage::Z0) - 120.0).abs() < 0.05);
        assert!((gb(ZeroStage::Z1) - 31.4).abs() < 0.05);
        assert!((gb(ZeroStage::Z2) - 16.6).abs() < 0.05);
        assert!((gb(ZeroStage::Z3) - 1.9).abs() < 0.05);
    }

    /// A model's states per rank are the ZeRO formulas of its padded Ψ.
    #[test]
    fn model_states_of_a_preset() {
        let spec = ModelPreset::Gpt2.spec();
        let psi = padded_params(&spec, 2);
        assert_eq!(model_state_for(&spec, ZeroStage::Z0, Precision::Bf16, 2).total(), 16 * psi);
        assert_eq!(model_state_for(&spec, ZeroStage::Z3, Precision::Bf16, 2).total(), 8 * psi);
    }

    /// The total of counts a hostile log makes as large as they go stops at `u64::MAX`, not
    /// wrapped round to a small number (release builds do not check).
    #[test]
    fn total_saturates() {
        let b =
            |params_bytes, grads_bytes, optimizer_bytes| ModelStateBytes { params_bytes, grads_bytes, optimizer_bytes };
        assert_eq!(b(1, 2, 4).total(), 7);
        assert_eq!(b(u64::MAX, 2, 2).total(), u64::MAX);
        assert_eq!(b(2, u64::MAX, 2).total(), u64::MAX);
        assert_eq!(b(2, 2, u64::MAX).total(), u64::MAX);
        assert_eq!(b(u64::MAX, u64::MAX, u64::MAX).total(), u64::MAX);
        assert_eq!(b(u64::MAX - 7, 3, 3).total(), u64::MAX - 1);
    }

    /// Padding rounds a unit up to a multiple of world size × 128 elements, never down.
    #[test]
    fn padded_units_by_hand() {
        assert_eq!(padded_unit(0, 4), 0);
        assert_eq!(padded_unit(1, 1), 128);
        assert_eq!(padded_unit(128, 1), 128);
        assert_eq!(padded_unit(129, 2), 256);
        assert_eq!(padded_unit(1000, 3), 1152);
    }

    /// The engine's buffers by their parts, each computed here from the padded sizes: two
    /// staging buckets at stages 2-3, `prefetch + 1` gather slots at stage 3, and hpZ's secondary
    /// partition; nothing at stages 0-1.
    #[test]
    fn engine_buffers_by_their_parts() {
        let spec = ModelPreset::Gpt2.spec();
        let world = 4;
        let largest = spec.units().iter().map(|u| padded_unit(u.params, world)).max().unwrap();
        let psi = padded_params(&spec, world);
        let mut engine = EngineConfig { bucket_mb: 4.0, prefetch: 2, ..EngineConfig::default() };
        let bytes = |stage, precision, engine: &EngineConfig| {
            engine_buffer_bytes(&spec, stage, precision, Offload::None, engine, world)
        };
        let bucket = 4 * 1024 * 1024 / 2;
        assert!(bucket < psi);
        let staging = 2 * (bucket + largest) * 2;
        assert_eq!(bytes(ZeroStage::Z0, Precision::Bf16, &engine), 0);
        assert_eq!(bytes(ZeroStage::Z1, Precision::Bf16, &engine), 0);
        assert_eq!(bytes(ZeroStage::Z2, Precision::Bf16, &engine), staging);
        assert_eq!(bytes(ZeroStage::Z3, Precision::Bf16, &engine), staging + 3 * largest * 2);
        // fp32: every element 4 bytes, the bucket half as many elements.
        let staging32 = 2 * (bucket / 2 + largest) * 4;
        assert_eq!(bytes(ZeroStage::Z3, Precision::Fp32, &engine), staging32 + 3 * largest * 4);
        engine.hpz = Some(2);
        assert_eq!(bytes(ZeroStage::Z3, Precision::Bf16, &engine), staging + 3 * largest * 2 + psi / 2 * 2);
        // A bucket larger than the model stages the model.
        engine.bucket_mb = 1e6;
        engine.hpz = None;
        assert_eq!(bytes(ZeroStage::Z2, Precision::Bf16, &engine), 2 * (psi + largest) * 2);
    }

    /// On one rank, stages 2 and 3 write gradients to their shards in place and stage nothing,
    /// and stage 3 keeps its parameters whole; with offload, or on several ranks, they stage (and
    /// stage 3 gathers into slots only with the parameters offloaded, or on several ranks).
    #[test]
    fn one_rank_stages_gradients_only_with_offload() {
        use GradientPath::{Buckets, Staged};
        for stage in ZeroStage::ALL {
            let many = if stage >= ZeroStage::Z2 { Staged } else { Buckets };
            assert_eq!(GradientPath::of(stage, 1, Offload::None), Buckets, "stage {stage}");
            assert_eq!(GradientPath::of(stage, 2, Offload::None), many, "stage {stage}");
            assert_eq!(GradientPath::of(stage, 1, Offload::Optimizer), many, "stage {stage}");
            let sharded = if stage == ZeroStage::Z3 { ParamPath::Sharded } else { ParamPath::Whole };
            assert_eq!(ParamPath::of(stage, 1, Offload::None), ParamPath::Whole, "stage {stage}");
            assert_eq!(ParamPath::of(stage, 1, Offload::Optimizer), ParamPath::Whole, "stage {stage}");
            assert_eq!(ParamPath::of(stage, 2, Offload::None), sharded, "stage {stage}");
            assert_eq!(ParamPath::of(stage, 1, Offload::OptimizerParams), sharded, "stage {stage}");
        }
        let spec = ModelPreset::Gpt2.spec();
        let engine = EngineConfig { bucket_mb: 4.0, prefetch: 2, ..EngineConfig::default() };
        let largest = spec.units().iter().map(|u| padded_unit(u.params, 1)).max().unwrap();
        let staging = 2 * (4 * 1024 * 1024 / 2 + largest) * 2;
        let bytes = |stage, offload| engine_buffer_bytes(&spec, stage, Precision::Bf16, offload, &engine, 1);
        assert_eq!(bytes(ZeroStage::Z2, Offload::None), 0);
        assert_eq!(bytes(ZeroStage::Z3, Offload::None), 0);
        assert_eq!(bytes(ZeroStage::Z2, Offload::Optimizer), staging);
        assert_eq!(bytes(ZeroStage::Z3, Offload::Optimizer), staging);
        assert_eq!(bytes(ZeroStage::Z3, Offload::OptimizerParams), staging + 3 * largest * 2);
    }

    #[test]
    fn padding_is_bounded() {
        let spec = ModelPreset::Gpt2Xl.spec();
        for n in [1u64, 2, 3, 4, 8, 64] {
            let padded = padded_params(&spec, n);
            let units = spec.units().len() as u64;
            assert!(padded >= spec.param_count());
            assert!(padded - spec.param_count() < units * n * SHARD_ALIGN_ELEMS);
            assert_eq!(padded % n, 0);
        }
    }

    /// Stage 1 keeps full gradients on the device with optimizer offload (it accumulates there
    /// and copies its shard once per step): pΨ, not pΨ/N. One rank cannot tell the two apart.
    #[test]
    fn stage_1_offload_keeps_full_device_gradients_not_a_shard() {
        let (psi, n) = (1_000_000u64 * 8, 8u64);
        let s = model_state_split(ZeroStage::Z1, Precision::Bf16, Offload::Optimizer, 1, psi, psi, n);
        assert_eq!(s.device, ModelStateBytes { params_bytes: 2 * psi, grads_bytes: 2 * psi, optimizer_bytes: 0 });
        // No fp32 accumulator on the host for stage 1, even when accumulating.
        let ga = model_state_split(ZeroStage::Z1, Precision::Bf16, Offload::Optimizer, 4, psi, psi, n);
        assert_eq!(ga.host_bytes, s.host_bytes);
        assert_eq!(s.host_bytes, 16 * psi / n);
    }

    #[test]
    fn offload_moves_the_optimizer_to_the_host() {
        let (psi, n) = (1_000_000u64 * 8, 8u64);
        let split = |s, o, ga| model_state_split(s, Precision::Bf16, o, ga, psi, psi, n);
        // Stage 2 with optimizer offload: bf16 parameters on the GPU (DeepSpeed's estimate: 2Ψ).
        assert_eq!(split(ZeroStage::Z2, Offload::Optimizer, 1).device.total(), 2 * psi);
        // Stage 3: the parameter shard on the GPU; with parameter offload, nothing.
        assert_eq!(split(ZeroStage::Z3, Offload::Optimizer, 1).device.total(), 2 * psi / n);
        assert_eq!(split(ZeroStage::Z3, Offload::OptimizerParams, 1).device.total(), 0);
        // Host: 12 (master, m, v) + 2 (gradient shard) + 2 (bf16 parameter copy), +4 accumulating.
        assert_eq!(split(ZeroStage::Z2, Offload::Optimizer, 1).host_bytes, 16 * psi / n);
        assert_eq!(split(ZeroStage::Z2, Offload::Optimizer, 4).host_bytes, 20 * psi / n);
        assert_eq!(
            split(ZeroStage::Z1, Offload::None, 1),
            StateSplit { device: model_state_bytes(ZeroStage::Z1, Precision::Bf16, psi, n), host_bytes: 0 }
        );
    }

    /// The host takes whole units from the end of forward order until it holds the ratio.
    #[test]
    fn the_host_takes_the_last_units_up_to_the_ratio() {
        let units = [400, 200, 200, 200];
        assert_eq!(first_host_unit(&units, 1.0), 0);
        assert_eq!(first_host_unit(&units, 0.2), 3);
        assert_eq!(first_host_unit(&units, 0.2001), 2);
        assert_eq!(first_host_unit(&units, 0.6), 1);
        assert_eq!(first_host_unit(&units, 1e-9), 3);
        // Past the whole model (validation refuses it; a caller may not): everything on the host,
        // never a unit before the first.
        assert_eq!(first_host_unit(&units, 1.5), 0);
        assert_eq!(first_host_unit(&[], 1.0), 0);
        let spec = ModelPreset::Gpt2Xl.spec();
        assert_eq!(host_params(&spec, 4, 1.0), padded_params(&spec, 4));
        let half = host_params(&spec, 4, 0.5) as f64 / padded_params(&spec, 4) as f64;
        assert!((0.5..0.53).contains(&half), "{half}");
    }

    /// With a ratio the device keeps the no-offload states of its units, the host the offload
    /// states of its own: bytes by hand for bf16 (k = 12, p = 2).
    #[test]
    fn a_ratio_splits_the_states_by_units() {
        let (psi, host, n) = (8_000u64, 2_000u64, 4u64);
        let dev = psi - host;
        let split = |s, o| model_state_split(s, Precision::Bf16, o, 1, psi, host, n);
        let z1 = split(ZeroStage::Z1, Offload::Optimizer);
        assert_eq!(
            z1.device,
            ModelStateBytes { params_bytes: 2 * psi, grads_bytes: 2 * psi, optimizer_bytes: 12 * dev / n }
        );
        assert_eq!(z1.host_bytes, 16 * host / n);
        let z2 = split(ZeroStage::Z2, Offload::Optimizer);
        assert_eq!(
            z2.device,
            ModelStateBytes { params_bytes: 2 * psi, grads_bytes: 2 * dev / n, optimizer_bytes: 12 * dev / n }
        );
        let z3 = split(ZeroStage::Z3, Offload::OptimizerParams);
        assert_eq!(
            z3.device,
            ModelStateBytes { params_bytes: 2 * dev / n, grads_bytes: 2 * dev / n, optimizer_bytes: 12 * dev / n }
        );
        // Device and host together hold what the device alone holds without offload (the host's
        // gradient replaces the device shard), plus the host's bf16 parameter copy, which with
        // `optimizer+params` replaces the device's parameter shard.
        for (s, o, copy) in
            [(ZeroStage::Z2, Offload::Optimizer, 2 * host / n), (ZeroStage::Z3, Offload::OptimizerParams, 0)]
        {
            let t = split(s, o);
            let none = model_state_bytes(s, Precision::Bf16, psi, n).total();
            assert_eq!(t.device.total() + t.host_bytes, none + copy, "{s:?}");
        }
    }

    proptest! {
        #[test]
        fn mixed_precision_totals_match_the_paper(psi in 1u64..1_000_000_000, n in 1u64..512) {
            let psi = psi * n; // divisible, as after padding
            let t = |s| model_state_bytes(s, Precision::Bf16, psi, n).total();
            prop_assert_eq!(t(ZeroStage::Z0), 16 * psi);
            prop_assert_eq!(t(ZeroStage::Z1), 4 * psi + 12 * psi / n);
            prop_assert_eq!(t(ZeroStage::Z2), 2 * psi + 14 * psi / n);
            prop_assert_eq!(t(ZeroStage::Z3), 16 * psi / n);
            // Every stage needs no more than the one before it.
            prop_assert!(t(ZeroStage::Z1) <= t(ZeroStage::Z0));
            prop_assert!(t(ZeroStage::Z2) <= t(ZeroStage::Z1));
            prop_assert!(t(ZeroStage::Z3) <= t(ZeroStage::Z2));
        }
    }
}
