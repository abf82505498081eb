//! What a configuration asks of the machine, in the units the cost model's terms are per: FLOPs,
//! activation elements, kernels (units), parameters updated where, bytes on the wire. Everything
//! here is exact arithmetic on the schema's model shapes and ZeRO formulas; nothing is fitted.

use serde::{Deserialize, Serialize};
use zerobench_schema::config::{Offload, RunConfig, ZeroStage};
use zerobench_schema::memory::{engine_buffer_bytes, host_params, model_state_split, padded_params, ParamPath};
use zerobench_schema::traffic::step_traffic_as;

/// A configuration to price: the run's settings, how many GPUs on how many nodes, and, where
/// known, the host's AdamW rate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Query {
    pub config: RunConfig,
    pub gpus: u32,
    pub nodes: u32,
    /// The host's AdamW rate as `examples/cpu_adamw` measures it (one process on all its cores),
    /// in units of 1e9 parameters per second; `None`: unknown, priced as the fitted hosts'.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_adamw_gparams_per_s: Option<f64>,
    /// Where the query is a run: the engine's persistent device buffers as its log gives them
    /// (`setup`'s `buffers_bytes`). They are exact for the build that ran, which may have placed
    /// its buffers otherwise than this one (earlier builds staged the gradients of stages 2 and 3
    /// on one rank too), so fitting and checking a run take its own; `None`: the buffers this
    /// build's engine allocates (`engine_buffer_bytes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logged_buffer_bytes: Option<u64>,
    /// Where the query is a run: how it kept its parameters, as its log shows (stage 3's gather
    /// slots among its buffers or not). Earlier builds gathered stage 3's parameters on one rank
    /// too, so fitting and checking a run take its own; `None`: as this build's engine keeps them
    /// (`ParamPath::of`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logged_param_path: Option<ParamPath>,
}

impl Query {
    /// A query of unknown host.
    pub fn new(config: RunConfig, gpus: u32, nodes: u32) -> Query {
        Query {
            config,
            gpus,
            nodes,
            host_adamw_gparams_per_s: None,
            logged_buffer_bytes: None,
            logged_param_path: None,
        }
    }

    /// The ranks on each node, which share its host.
    pub fn ranks_per_host(&self) -> u32 {
        (self.gpus.max(1) / self.nodes.max(1)).max(1)
    }

    /// The host's AdamW rate where the model prices by it: known, above 0, and the host has one
    /// rank, as the fitted offloaded runs had ([`host_slowness`] says why).
    pub fn rate_priced(&self) -> Option<f64> {
        self.host_adamw_gparams_per_s.filter(|r| *r > 0.0 && self.ranks_per_host() == 1)
    }
}

/// Bus bandwidths the across-node term is scaled by, GB/s (nccl-tests' busbw): what NVLink on an
/// H200 host reaches for a 1 GiB reduce-scatter (`../shared/reference/gpu-host-measurements.md`:
/// 321 GB/s) against one 400 Gb/s InfiniBand NDR port per GPU at 90% of its line rate. No run
/// across nodes has been fitted; a prediction that uses this ratio says so.
pub const INTRA_NODE_BUS_GBPS: f64 = 321.0;
pub const INTER_NODE_BUS_GBPS: f64 = 45.0;

/// The work of one configuration, per rank.
#[derive(Debug, Clone, PartialEq)]
pub struct Work {
    pub family: &'static str,
    /// Micro-steps per optimizer step.
    pub micro_steps: f64,
    /// Tokens one rank processes per micro-step (T5: encoder input tokens).
    pub micro_tokens: f64,
    /// Training FLOPs per micro-step, in units of 1e9.
    pub gflop: f64,
    /// Of which attention's scores and weighted sums (`ModelSpec::attention_flops_per_input_token`),
    /// in units of 1e9.
    pub gflop_attn: f64,
    /// Activation elements per micro-step: tokens × layers × d_model (T5: input plus target tokens
    /// over each stack), in units of 1e9: what the bandwidth-bound kernels (norms, activations,
    /// dropout, residual adds) stream.
    pub gact: f64,
    /// The activation elements the memory terms count: `gact`, but for T5 scaled by what its
    /// layers keep for backward against a T5 of the fitted shape ([`t5_width_scale`]).
    pub gact_mem: f64,
    /// Whether `gact_mem` counts the layers' widths (T5) or d_model only.
    pub gact_mem_by_width: bool,
    /// The layers' parameters per layer over d_model² ([`layer_width`]): how much wider than
    /// d_model a layer's products are, which `gact` does not count.
    pub layer_width: f64,
    /// Tokens × vocabulary per micro-step, in units of 1e9: the LM head's logits and loss.
    pub gvocab: f64,
    /// The model's width, in thousands.
    pub kd_model: f64,
    /// The engine's units (blocks and embeddings): each is a fixed set of kernels to launch.
    pub units: f64,
    pub stage: ZeroStage,
    pub offload: Offload,
    /// Offload's delayed update: the host's update of step t runs beside step t + 1's compute.
    pub delayed_update: bool,
    /// Parameters whose optimizer update runs on the GPU, per rank, in units of 1e9.
    pub gparams_device: f64,
    /// Parameters whose optimizer update runs on the host, per rank, in units of 1e9.
    pub gparams_host: f64,
    /// How much longer the host takes to update a parameter than the fitted hosts
    /// ([`host_slowness`]).
    pub host_slowness: f64,
    /// How the parameters are kept: sharded and gathered before each use (stage 3 on several
    /// ranks, or with them on the host), or whole.
    pub params: ParamPath,
    /// Parameters gathered per micro-step where they are sharded (0 where they are kept whole),
    /// in units of 1e9.
    pub ggathered: f64,
    /// What a rank sends over NVLink (or within a node) per step, GB, and across nodes.
    pub wire_gb_intra: f64,
    pub wire_gb_inter: f64,
    /// Model states and the engine's persistent buffers on the device, bytes (exact).
    pub device_state_bytes: u64,
    /// The buffers' part of it ([`Query::logged_buffer_bytes`], else the engine's formula).
    pub buffer_bytes: u64,
    /// The largest unit's padded parameters, in units of 1e9.
    pub glargest_unit: f64,
    pub gpus: u32,
    pub nodes: u32,
    /// Ranks sharing one host ([`Query::ranks_per_host`]): with offload, their host updates
    /// share its memory bandwidth (`crate::price::host_update_ms`).
    pub ranks_per_host: f64,
}

/// Activation elements one T5 layer keeps for its backward pass, per token, as multiples of
/// d_model, of the attention's width (heads × d_kv) and of the feed-forward's: an encoder layer per
/// input token, a decoder layer per target token, and the decoder's cross-attention keys and values
/// per input token. Measured with the CUDA allocator on an H200 by `bench/gpu/t5_kept.py` (the
/// layers' operations as `worker/src/model/t5.rs` runs them, bf16, seven shapes; least squares
/// within 25 bytes a token for the encoder, 1 kB for the decoder:
/// `bench/results/gpu-2026-12-02-t5-kept-h200.json`).
const T5_ENCODER_KEPT: [f64; 3] = [3.0, 4.0, 1.0];
const T5_DECODER_KEPT: [f64; 3] = [5.0, 6.0, 1.0];
const T5_CROSS_KEPT: [f64; 3] = [0.0, 2.0, 0.0];

/// What a T5 of `dims` keeps for backward over a sequence of `t` input and `target` target tokens,
/// against a T5 of the same d_model whose attention is d_model wide and whose feed-forward is
/// 4 × d_model, the shape of every fitted T5 preset (t5-small to t5-large): 1 for those, 3.24 for
/// t5-3b at a quarter as many target tokens. `gact` counts d_model per layer, so the memory term
/// fitted on those presets would price t5-3b's activations a third of what they are (its peak 22%
/// low at micro-batch 16 on an H200); scaled by this, the same coefficient prices it.
pub fn t5_width_scale(dims: &zerobench_schema::models::T5Dims, t: f64, target: f64) -> f64 {
    let kept = |inner: f64, d_ff: f64| {
        let per = |k: [f64; 3]| k[0] * dims.d_model as f64 + k[1] * inner + k[2] * d_ff;
        t * (per(T5_ENCODER_KEPT) + per(T5_CROSS_KEPT)) + target * per(T5_DECODER_KEPT)
    };
    let d = dims.d_model as f64;
    kept((dims.n_head * dims.d_kv) as f64, dims.d_ff as f64) / kept(d, 4.0 * d)
}

/// A model's layers' parameters per layer over d_model² (embeddings and head left out): 12 for
/// GPT-2 (attention 4, MLP 8), 14 for T5 up to t5-large (encoder 12, decoder 16) but 56 for
/// t5-3b, whose feed-forward is 16 × d_model and attention 4 × d_model, 11.3-13 for the Llama
/// presets. The activation terms count d_model per layer (`gact`); a family fitted at one width
/// prices a wider one's activations as if they were its own (`Range` flags it).
pub fn layer_width(spec: &zerobench_schema::models::ModelSpec) -> f64 {
    let layer_params: u64 = spec.units().iter().filter(|u| u.kind.is_layer()).map(|u| u.params).sum();
    let d = spec.d_model() as f64;
    layer_params as f64 / spec.layers().max(1) as f64 / (d * d)
}

/// How much longer a host updates a parameter than the hosts a model was fitted on: their AdamW
/// rate (`reference`) over this host's where both are known and the host has one rank, as the
/// fitted offloaded runs had ([`Query::rate_priced`]); else 1. `examples/cpu_adamw` measures one
/// process over all the host's cores, not what each of several ranks gets, so a host of several
/// ranks is priced at the fitted hosts' rate (flagged where a rate was given), and how its ranks
/// slow each other by the fitted exponent (`crate::price::host_sharing`).
pub fn host_slowness(q: &Query, reference: Option<f64>) -> f64 {
    match (reference, priced_host_rate(q, reference)) {
        (Some(fitted), Some(priced)) => fitted / priced,
        _ => 1.0,
    }
}

/// The host AdamW rate a query's host update is priced at ([`host_slowness`]): its own where that
/// is used, else the fitted hosts' (`None` where that is unknown).
pub fn priced_host_rate(q: &Query, reference: Option<f64>) -> Option<f64> {
    let fitted = reference.filter(|r| *r > 0.0)?;
    Some(q.rate_priced().unwrap_or(fitted))
}

impl Work {
    /// The work of `q`, its host's update priced against hosts of AdamW rate `host_reference`
    /// (the fitted hosts': [`host_slowness`]).
    pub fn of(q: &Query, host_reference: Option<f64>) -> Work {
        let c = &q.config;
        let spec = c.model.spec();
        let world = q.gpus.max(1);
        let (b, t) = (f64::from(c.micro_batch), f64::from(c.seq_len));
        let target = f64::from(c.target_len_or_default());
        let tokens = b * t;
        let gflop = spec.train_flops_per_input_token(c.seq_len, c.target_len_or_default()) * tokens / 1e9;
        let gflop_attn = spec.attention_flops_per_input_token(c.seq_len, c.target_len_or_default()) * tokens / 1e9;
        let d = spec.d_model() as f64;
        let (gact, gvocab) = if spec.is_encoder_decoder() {
            let per_stack = spec.layers() as f64 / 2.0;
            (b * (t + target) * per_stack * d / 1e9, b * target * spec.vocab() as f64 / 1e9)
        } else {
            (tokens * spec.layers() as f64 * d / 1e9, tokens * spec.vocab() as f64 / 1e9)
        };
        let (gact_mem, gact_mem_by_width) = match spec {
            zerobench_schema::models::ModelSpec::T5(dims) => (gact * t5_width_scale(&dims, t, target), true),
            _ => (gact, false),
        };
        let psi = padded_params(&spec, u64::from(world));
        let host_psi =
            if c.offload == Offload::None { 0 } else { host_params(&spec, u64::from(world), c.host_share()) };
        let per_rank = |elems: u64| elems as f64 / f64::from(world) / 1e9;
        let split = model_state_split(c.stage, c.precision, c.offload, c.grad_accum, psi, host_psi, u64::from(world));
        let buffers = q.logged_buffer_bytes.unwrap_or_else(|| {
            engine_buffer_bytes(&spec, c.stage, c.precision, c.offload, &c.engine, u64::from(world))
        });
        let params = q.logged_param_path.unwrap_or_else(|| ParamPath::of(c.stage, u64::from(world), c.offload));
        let traffic = step_traffic_as(c, world, params);
        let p = c.precision.param_bytes() as f64;
        let ggathered = if params == ParamPath::Sharded {
            // The all-gathers of a micro-step, in parameters, as the slots gather them on any
            // number of ranks (on one rank they are local copies).
            let m = f64::from(c.grad_accum.max(1));
            step_traffic_as(c, 2, ParamPath::Sharded)
                .bytes
                .iter()
                .filter(|(k, _)| k.kind == zerobench_schema::collective::CollectiveKind::AllGather)
                .map(|(_, v)| *v as f64)
                .sum::<f64>()
                / p
                / m
                / 1e9
        } else {
            0.0
        };
        let (mut intra, mut inter) = (0.0, 0.0);
        for (key, bytes) in traffic.wire(world, c.engine.hpz) {
            if q.nodes > 1 && !key.group {
                inter += bytes / 1e9;
            } else {
                intra += bytes / 1e9;
            }
        }
        let largest = spec.units().iter().map(|u| u.params).max().unwrap_or(0) as f64 / 1e9;
        Work {
            family: spec.family(),
            micro_steps: f64::from(c.grad_accum.max(1)),
            micro_tokens: tokens,
            gflop,
            gflop_attn,
            gact,
            gact_mem,
            gact_mem_by_width,
            layer_width: layer_width(&spec),
            gvocab,
            kd_model: d / 1000.0,
            units: spec.units().len() as f64,
            stage: c.stage,
            offload: c.offload,
            delayed_update: c.delayed_update_after.is_some(),
            gparams_device: per_rank(psi - host_psi),
            gparams_host: per_rank(host_psi),
            host_slowness: host_slowness(q, host_reference),
            params,
            ggathered,
            wire_gb_intra: intra,
            wire_gb_inter: inter,
            device_state_bytes: split.device.total() + buffers,
            buffer_bytes: buffers,
            glargest_unit: largest,
            gpus: world,
            nodes: q.nodes.max(1),
            ranks_per_host: f64::from(q.ranks_per_host()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerobench_schema::models::ModelPreset;

    fn q(stage: ZeroStage, gpus: u32) -> Query {
        let mut c = RunConfig::new(ModelPreset::Gpt2Xl, stage);
        c.micro_batch = 4;
        c.seq_len = 1024;
        Query::new(c, gpus, 1)
    }

    /// A micro-step's activations, FLOPs and vocabulary work grow in proportion to its samples,
    /// for a decoder and an encoder-decoder alike.
    #[test]
    fn a_micro_steps_work_grows_with_its_samples() {
        for model in [ModelPreset::Gpt2, ModelPreset::T5Small] {
            let of = |mb: u32| {
                let mut c = RunConfig::new(model, ZeroStage::Z0);
                (c.micro_batch, c.seq_len) = (mb, 512);
                Work::of(&Query::new(c, 1, 1), None)
            };
            let (one, four) = (of(1), of(4));
            for (what, a, b) in [
                ("gact", one.gact, four.gact),
                ("gact_mem", one.gact_mem, four.gact_mem),
                ("gflop", one.gflop, four.gflop),
                ("gvocab", one.gvocab, four.gvocab),
            ] {
                assert!(a > 0.0 && (b / a - 4.0).abs() < 1e-9, "{model}: {what} {a} -> {b}");
            }
        }
    }

    /// The activation elements and the logits, as their fields define them: tokens × layers ×
    /// d_model and tokens × vocabulary; T5's activations the input and target tokens over each
    /// stack's layers, its logits the target tokens'.
    #[test]
    fn activations_and_logits_count_as_documented() {
        let of = |model: ModelPreset| {
            let mut c = RunConfig::new(model, ZeroStage::Z0);
            (c.micro_batch, c.seq_len) = (4, 512);
            let target = f64::from(c.target_len_or_default());
            (Work::of(&Query::new(c, 1, 1), None), model.spec(), target)
        };
        let close = |a: f64, b: f64| (a / b - 1.0).abs() < 1e-12;
        let (w, spec, _) = of(ModelPreset::Gpt2);
        let (tokens, layers, d, vocab) = (2048.0, spec.layers() as f64, spec.d_model() as f64, spec.vocab() as f64);
        assert!(close(w.gact, tokens * layers * d / 1e9) && close(w.gvocab, tokens * vocab / 1e9), "{w:?}");
        let (w, spec, target) = of(ModelPreset::T5Small);
        let (layers, d, vocab) = (spec.layers() as f64, spec.d_model() as f64, spec.vocab() as f64);
        assert!(close(w.gact, 4.0 * (512.0 + target) * layers / 2.0 * d / 1e9), "{w:?}");
        assert!(close(w.gvocab, 4.0 * target * vocab / 1e9), "{w:?}");
    }

    #[test]
    fn flops_and_states_follow_the_schema() {
        let w = Work::of(&q(ZeroStage::Z0, 1), None);
        let c = &q(ZeroStage::Z0, 1).config;
        assert!((w.gflop * 1e9 - c.train_flops_per_token() * 4096.0).abs() / w.gflop < 1e-3);
        // Mixed precision stage 0 on one rank: 16 bytes per padded parameter, no buffers.
        let psi = padded_params(&c.model.spec(), 1);
        assert_eq!(w.device_state_bytes, 16 * psi);
        assert_eq!((w.wire_gb_intra, w.wire_gb_inter, w.ggathered), (0.0, 0.0, 0.0));
    }

    /// The layers' width in d_model² from each family's shapes, checked against closed forms:
    /// GPT-2's blocks 12 d² plus 13 d of biases and norms, T5's encoder and decoder layers
    /// (4 and 8 attention matrices of d × n_head·d_kv, 2 feed-forward matrices of d × d_ff),
    /// Llama's (grouped key and value heads, 3 feed-forward matrices).
    #[test]
    fn layer_width_counts_each_layers_matrices() {
        let width = |m: ModelPreset| layer_width(&m.spec());
        for (m, d) in [(ModelPreset::Gpt2, 768.0), (ModelPreset::Gpt2Xl, 1600.0)] {
            assert!((width(m) - (12.0 + 13.0 / d)).abs() < 1e-12, "{m:?}");
        }
        // t5-large: inner = d, d_ff = 4d: (12 + 16) / 2 = 14, plus norms and 32 position buckets
        // per head in each stack's first layer.
        let d = 1024.0;
        let norms = (2.0 * d + 3.0 * d + 2.0 * 32.0 * 16.0 / 24.0) / 2.0;
        assert!((width(ModelPreset::T5Large) - (14.0 + norms / (d * d))).abs() < 1e-12);
        // t5-3b: inner = 4d, d_ff = 16d: (48 + 64) / 2 = 56.
        assert!((width(ModelPreset::T5_3b) - 56.0).abs() < 0.01);
        // mistral-7b: 2 d² (query, output) + 2 d·kv (kv = d/4) + 3 d·d_ff (d_ff = 3.5 d) = 13 d².
        assert!((width(ModelPreset::Mistral7b) - 13.0).abs() < 0.001);
    }

    /// The fitted T5 presets keep what `gact` counts (scale 1); t5-3b, whose attention is 4 and
    /// feed-forward 16 × d_model, keeps (35 + 8) d per input token and 45 d per target token
    /// against (11 + 2) d and 15 d; GPT-2's count is left as it is.
    #[test]
    fn t5_activation_memory_scales_with_its_layers_widths() {
        let work = |m: ModelPreset| {
            let mut c = RunConfig::new(m, ZeroStage::Z0);
            c.micro_batch = 4;
            c.seq_len = 512;
            Work::of(&Query::new(c, 1, 1), None)
        };
        for m in [ModelPreset::T5Small, ModelPreset::T5Base, ModelPreset::T5Large, ModelPreset::Gpt2Xl] {
            let w = work(m);
            assert_eq!(w.gact_mem, w.gact, "{m:?}");
        }
        let w = work(ModelPreset::T5_3b);
        let want = (512.0 * 43.0 + 128.0 * 45.0) / (512.0 * 13.0 + 128.0 * 15.0);
        assert!((w.gact_mem / w.gact - want).abs() < 1e-12, "{} vs {want}", w.gact_mem / w.gact);
        assert!((want - 3.24).abs() < 0.01);
    }

    /// A run's logged buffers stand in for the formula's, which price this build's engine: on
    /// one rank stage 2 now stages nothing, where an earlier build's log says it did.
    #[test]
    fn a_runs_logged_buffers_replace_the_formulas() {
        let now = Work::of(&q(ZeroStage::Z2, 1), None);
        assert_eq!(now.device_state_bytes, Work::of(&q(ZeroStage::Z1, 1), None).device_state_bytes);
        let staged = 384 << 20;
        let logged = Work::of(&Query { logged_buffer_bytes: Some(staged), ..q(ZeroStage::Z2, 1) }, None);
        assert_eq!(logged.device_state_bytes, now.device_state_bytes + staged);
        assert_eq!((now.buffer_bytes, logged.buffer_bytes), (0, staged));
    }

    /// On one rank stage 3 gathers nothing unless a run's log says it did (earlier builds
    /// gathered there) or its parameters live on the host.
    #[test]
    fn one_rank_stage_3_gathers_only_as_logged_or_offloaded() {
        let now = Work::of(&q(ZeroStage::Z3, 1), None);
        assert_eq!((now.params, now.ggathered), (ParamPath::Whole, 0.0));
        let logged = Work::of(&Query { logged_param_path: Some(ParamPath::Sharded), ..q(ZeroStage::Z3, 1) }, None);
        let two = Work::of(&q(ZeroStage::Z3, 2), None);
        assert_eq!(logged.params, ParamPath::Sharded);
        // The slots gather as many parameters on one rank as on two (up to the padding).
        assert!((logged.ggathered / two.ggathered - 1.0).abs() < 1e-3, "{} vs {}", logged.ggathered, two.ggathered);
        let mut offloaded = q(ZeroStage::Z3, 1);
        offloaded.config.offload = Offload::OptimizerParams;
        assert_eq!(Work::of(&offloaded, None).params, ParamPath::Sharded);
    }

    /// A host's rate counts against the fitted hosts' where both are known and it has one rank.
    #[test]
    fn a_host_is_slower_by_its_rate() {
        let mut one = q(ZeroStage::Z2, 1);
        assert_eq!(host_slowness(&one, Some(5.0)), 1.0);
        one.host_adamw_gparams_per_s = Some(4.0);
        assert_eq!(host_slowness(&one, Some(5.0)), 1.25);
        assert_eq!(host_slowness(&one, None), 1.0);
        // A fitted rate of 0 is no rate to price by.
        assert_eq!((priced_host_rate(&one, Some(0.0)), host_slowness(&one, Some(0.0))), (None, 1.0));
        assert_eq!(priced_host_rate(&one, Some(5.0)), Some(4.0), "its own rate");
        let mut eight = q(ZeroStage::Z2, 8);
        eight.host_adamw_gparams_per_s = Some(4.0);
        assert_eq!((eight.ranks_per_host(), host_slowness(&eight, Some(5.0))), (8, 1.0));
        assert_eq!((one.rate_priced(), eight.rate_priced()), (Some(4.0), None));
        eight.nodes = 8;
        assert_eq!((eight.ranks_per_host(), host_slowness(&eight, Some(5.0))), (1, 1.25));
    }

    #[test]
    fn stage3_gathers_and_two_ranks_send() {
        let w = Work::of(&q(ZeroStage::Z3, 2), None);
        // G ≥ 2Ψ per micro-step (forward and backward gathers), Ψ = 1.56e9.
        assert!(w.ggathered > 3.0 && w.ggathered < 3.6, "{}", w.ggathered);
        assert!(w.wire_gb_intra > 0.0 && w.wire_gb_inter == 0.0);
        let mut over_nodes = q(ZeroStage::Z3, 2);
        over_nodes.nodes = 2;
        let w2 = Work::of(&over_nodes, None);
        assert_eq!(w2.wire_gb_intra, 0.0);
        assert!((w2.wire_gb_inter - w.wire_gb_intra).abs() < 1e-9);
    }
}
