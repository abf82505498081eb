//! Model presets: exact dimensions and closed-form parameter counts.
//!
//! The worker builds its libtorch models from these dimensions and its tests check that the built
//! model has exactly [`ModelSpec::param_count`] parameters, unit by unit. The launcher uses the same
//! numbers to predict model-state memory before anything runs.
//!
//! A *unit* is the group of parameters the ZeRO engine flattens, partitions and (in stage 3)
//! gathers together: one transformer block, or the embeddings. [`ModelSpec::units`] lists them in
//! the order the forward pass uses them.

use std::fmt;
use std::str::FromStr;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::text_enum::text_enum;

/// The target length of an encoder-decoder run that names none: a quarter of the input, at least
/// one token. T5's span-corruption pre-training (15% of tokens masked in spans of mean length 3)
/// turns 512 input tokens into targets of about 114, so inputs about four times their targets are
/// the shape these models train on.
pub fn default_target_len(seq_len: u32) -> u32 {
    (seq_len / 4).max(1)
}

/// The share of a training step's FLOPs ([`ModelSpec::train_flops_per_token`]) that its backward
/// does: twice the forward's (measured: gpt2-xl, micro-batch 4, one H100, backward 64.3 of 94.8 ms).
pub const BACKWARD_SHARE: f64 = 2.0 / 3.0;

/// A named model configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ModelPreset {
    /// A two-block GPT-2 with a byte vocabulary, for tests.
    #[serde(rename = "tiny")]
    Tiny,
    #[serde(rename = "gpt2")]
    Gpt2,
    #[serde(rename = "gpt2-medium")]
    Gpt2Medium,
    #[serde(rename = "gpt2-large")]
    Gpt2Large,
    #[serde(rename = "gpt2-xl")]
    Gpt2Xl,
    /// A two-layer T5 with a byte vocabulary, for tests.
    #[serde(rename = "tiny-t5")]
    TinyT5,
    #[serde(rename = "t5-small")]
    T5Small,
    #[serde(rename = "t5-base")]
    T5Base,
    #[serde(rename = "t5-large")]
    T5Large,
    #[serde(rename = "t5-3b")]
    T5_3b,
    #[serde(rename = "t5-11b")]
    T5_11b,
    /// A two-layer Llama/Mistral-style decoder with a byte vocabulary, for tests.
    #[serde(rename = "tiny-llama")]
    TinyLlama,
    #[serde(rename = "mistral-7b")]
    Mistral7b,
    /// The dummy MLP of the DeepSpeed profiling study (about 8.4M parameters; see [`MlpDims`]).
    #[serde(rename = "mlp")]
    Mlp,
}
text_enum!(ModelPreset, "model", {
    Tiny => "tiny", Gpt2 => "gpt2", Gpt2Medium => "gpt2-medium", Gpt2Large => "gpt2-large", Gpt2Xl => "gpt2-xl",
    TinyT5 => "tiny-t5", T5Small => "t5-small", T5Base => "t5-base", T5Large => "t5-large", T5_3b => "t5-3b",
    T5_11b => "t5-11b", TinyLlama => "tiny-llama", Mistral7b => "mistral-7b", Mlp => "mlp",
});

/// GPT-2 (Radford et al. 2019, Hugging Face `GPT2LMHeadModel`): learned positions, pre-LN blocks
/// with biases, GELU MLP of width 4·d, LM head tied to the token embedding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Gpt2Dims {
    pub vocab: u64,
    pub n_positions: u64,
    pub d_model: u64,
    pub n_layer: u64,
    pub n_head: u64,
}

/// T5 v1 as in the original checkpoints: RMS layer norm (weight only), no biases, ReLU FFN,
/// relative position bias (32 buckets) in the first layer of each stack, LM head tied to the
/// shared embedding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct T5Dims {
    pub vocab: u64,
    pub d_model: u64,
    pub d_kv: u64,
    pub d_ff: u64,
    pub n_head: u64,
    /// Layers in the encoder and, equally, in the decoder.
    pub n_layer: u64,
    pub rel_buckets: u64,
}

/// Llama/Mistral-style decoder: RMSNorm, rotary positions, SwiGLU MLP, grouped-query attention,
/// no biases, untied LM head.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LlamaDims {
    pub vocab: u64,
    pub d_model: u64,
    pub n_layer: u64,
    pub n_head: u64,
    pub n_kv_head: u64,
    pub d_ff: u64,
}

/// The dummy MLP: `n_layer` residual blocks of Linear(d, h) → GELU → Linear(h, d) with biases,
/// trained to regress seeded random targets. The DeepSpeed profiling study does not print its size; its
/// DeepSpeed log shows 0.02 GB of bf16 parameters on the GPU, which these dimensions reproduce
/// (8,398,848 parameters = 0.017 GB) while keeping several units for ZeRO-3 to partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MlpDims {
    pub d_model: u64,
    pub d_hidden: u64,
    pub n_layer: u64,
}

/// The architecture and dimensions behind a preset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "family", rename_all = "lowercase")]
pub enum ModelSpec {
    Gpt2(Gpt2Dims),
    T5(T5Dims),
    Llama(LlamaDims),
    Mlp(MlpDims),
}

/// One ZeRO unit: a name, what it holds and its parameter count.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct UnitSpec {
    pub name: String,
    pub kind: UnitKind,
    pub params: u64,
}

/// What a unit holds: what the cost model's per-layer counts and T5's FLOPs tell apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum UnitKind {
    /// The token (and position) embeddings, with the final norms; the LM head where it is tied.
    Embedding,
    /// One layer of a single stack (GPT-2's blocks, Llama's and the MLP's layers).
    Layer,
    /// One layer of T5's encoder.
    EncoderLayer,
    /// One layer of T5's decoder.
    DecoderLayer,
    /// An untied LM head (Llama), with the final norm.
    Head,
}

impl UnitKind {
    /// Whether the unit is one of the model's layers (not its embeddings or head).
    pub fn is_layer(self) -> bool {
        matches!(self, UnitKind::Layer | UnitKind::EncoderLayer | UnitKind::DecoderLayer)
    }
}

const fn gpt2(n_layer: u64, d_model: u64, n_head: u64) -> ModelSpec {
    ModelSpec::Gpt2(Gpt2Dims { vocab: 50257, n_positions: 1024, d_model, n_layer, n_head })
}

const fn t5(d_model: u64, d_kv: u64, d_ff: u64, n_head: u64, n_layer: u64) -> ModelSpec {
    ModelSpec::T5(T5Dims { vocab: 32128, d_model, d_kv, d_ff, n_head, n_layer, rel_buckets: 32 })
}

impl ModelPreset {
    /// The dimensions of this preset (Hugging Face's configurations for the public models).
    pub fn spec(self) -> ModelSpec {
        match self {
            ModelPreset::Tiny => {
                ModelSpec::Gpt2(Gpt2Dims { vocab: 256, n_positions: 256, d_model: 64, n_layer: 2, n_head: 4 })
            }
            ModelPreset::Gpt2 => gpt2(12, 768, 12),
            ModelPreset::Gpt2Medium => gpt2(24, 1024, 16),
            ModelPreset::Gpt2Large => gpt2(36, 1280, 20),
            ModelPreset::Gpt2Xl => gpt2(48, 1600, 25),
            ModelPreset::TinyT5 => ModelSpec::T5(T5Dims {
                vocab: 256,
                d_model: 64,
                d_kv: 16,
                d_ff: 128,
                n_head: 4,
                n_layer: 2,
                rel_buckets: 32,
            }),
            ModelPreset::T5Small => t5(512, 64, 2048, 8, 6),
            ModelPreset::T5Base => t5(768, 64, 3072, 12, 12),
            ModelPreset::T5Large => t5(1024, 64, 4096, 16, 24),
            ModelPreset::T5_3b => t5(1024, 128, 16384, 32, 24),
            ModelPreset::T5_11b => t5(1024, 128, 65536, 128, 24),
            ModelPreset::TinyLlama => {
                ModelSpec::Llama(LlamaDims { vocab: 256, d_model: 64, n_layer: 2, n_head: 4, n_kv_head: 2, d_ff: 176 })
            }
            ModelPreset::Mistral7b => ModelSpec::Llama(LlamaDims {
                vocab: 32000,
                d_model: 4096,
                n_layer: 32,
                n_head: 32,
                n_kv_head: 8,
                d_ff: 14336,
            }),
            ModelPreset::Mlp => ModelSpec::Mlp(MlpDims { d_model: 512, d_hidden: 2048, n_layer: 4 }),
        }
    }
}

impl ModelSpec {
    /// The family name used in logs and tables.
    pub fn family(&self) -> &'static str {
        match self {
            ModelSpec::Gpt2(_) => "gpt2",
            ModelSpec::T5(_) => "t5",
            ModelSpec::Llama(_) => "llama",
            ModelSpec::Mlp(_) => "mlp",
        }
    }

    /// The ZeRO units in forward order. Their parameter counts add up to [`Self::param_count`].
    pub fn units(&self) -> Vec<UnitSpec> {
        let unit = |name: String, kind: UnitKind, params: u64| UnitSpec { name, kind, params };
        match *self {
            ModelSpec::Gpt2(d) => {
                let c = d.d_model;
                // Token and position embeddings plus the final layer norm; the LM head is tied.
                let mut u = vec![unit("embed".into(), UnitKind::Embedding, d.vocab * c + d.n_positions * c + 2 * c)];
                let block = 12 * c * c + 13 * c;
                u.extend((0..d.n_layer).map(|i| unit(format!("block.{i}"), UnitKind::Layer, block)));
                u
            }
            ModelSpec::T5(d) => {
                let (c, inner) = (d.d_model, d.n_head * d.d_kv);
                let rel = d.rel_buckets * d.n_head;
                // Shared (tied) embedding plus the two final RMS norms.
                let mut u = vec![unit("embed".into(), UnitKind::Embedding, d.vocab * c + 2 * c)];
                let enc = 4 * c * inner + 2 * c * d.d_ff + 2 * c;
                let dec = 8 * c * inner + 2 * c * d.d_ff + 3 * c;
                let first = |i: u64| if i == 0 { rel } else { 0 };
                u.extend((0..d.n_layer).map(|i| unit(format!("encoder.{i}"), UnitKind::EncoderLayer, enc + first(i))));
                u.extend((0..d.n_layer).map(|i| unit(format!("decoder.{i}"), UnitKind::DecoderLayer, dec + first(i))));
                u
            }
            ModelSpec::Llama(d) => {
                let c = d.d_model;
                let head_dim = c / d.n_head;
                let kv = d.n_kv_head * head_dim;
                let layer = 2 * c * c + 2 * c * kv + 3 * c * d.d_ff + 2 * c;
                let mut u = vec![unit("embed".into(), UnitKind::Embedding, d.vocab * c)];
                u.extend((0..d.n_layer).map(|i| unit(format!("layer.{i}"), UnitKind::Layer, layer)));
                u.push(unit("head".into(), UnitKind::Head, d.vocab * c + c));
                u
            }
            ModelSpec::Mlp(d) => {
                let layer = 2 * d.d_model * d.d_hidden + d.d_hidden + d.d_model;
                (0..d.n_layer).map(|i| unit(format!("layer.{i}"), UnitKind::Layer, layer)).collect()
            }
        }
    }

    /// The unit each segment of the forward pass uses, in forward order (backward runs them in
    /// reverse). A tied embedding is used again by the head (and by T5's decoder), so it appears
    /// more than once; ZeRO-3 gathers by this order.
    pub fn segment_units(&self) -> Vec<usize> {
        let n = self.units().len();
        match *self {
            // embed, block.0 … block.{L-1}, head (the embedding's matrix).
            ModelSpec::Gpt2(_) => (0..n).chain([0]).collect(),
            // embed (encoder), encoder.0 …, embed (decoder), decoder.0 …, head (tied).
            ModelSpec::T5(d) => {
                let layers = d.n_layer as usize;
                (0..=layers).chain([0]).chain(layers + 1..n).chain([0]).collect()
            }
            ModelSpec::Llama(_) | ModelSpec::Mlp(_) => (0..n).collect(),
        }
    }

    /// Total trainable parameters (tied weights counted once), equal to Hugging Face's count.
    pub fn param_count(&self) -> u64 {
        self.units().iter().map(|u| u.params).sum()
    }

    /// The largest unit: what ZeRO-3 must hold gathered at once.
    pub fn largest_unit_params(&self) -> u64 {
        self.units().iter().map(|u| u.params).max().unwrap_or(0)
    }

    /// Number of transformer layers (T5: encoder plus decoder layers).
    pub fn layers(&self) -> u64 {
        match *self {
            ModelSpec::Gpt2(d) => d.n_layer,
            ModelSpec::T5(d) => 2 * d.n_layer,
            ModelSpec::Llama(d) => d.n_layer,
            ModelSpec::Mlp(d) => d.n_layer,
        }
    }

    /// Hidden size.
    pub fn d_model(&self) -> u64 {
        match *self {
            ModelSpec::Gpt2(d) => d.d_model,
            ModelSpec::T5(d) => d.d_model,
            ModelSpec::Llama(d) => d.d_model,
            ModelSpec::Mlp(d) => d.d_model,
        }
    }

    /// Vocabulary size (0 for the MLP, which takes no tokens).
    pub fn vocab(&self) -> u64 {
        match *self {
            ModelSpec::Gpt2(d) => d.vocab,
            ModelSpec::T5(d) => d.vocab,
            ModelSpec::Llama(d) => d.vocab,
            ModelSpec::Mlp(_) => 0,
        }
    }

    /// Whether the model reads an input sequence and writes a target sequence of its own length (T5).
    pub fn is_encoder_decoder(&self) -> bool {
        matches!(self, ModelSpec::T5(_))
    }

    /// The longest sequence the model can take, where positions are learned.
    pub fn max_seq_len(&self) -> Option<u32> {
        match *self {
            ModelSpec::Gpt2(d) => u32::try_from(d.n_positions).ok(),
            _ => None,
        }
    }

    /// The sequence length a preset trains with unless told otherwise.
    pub fn default_seq_len(&self) -> u32 {
        match *self {
            ModelSpec::Gpt2(d) => u32::try_from(d.n_positions.min(1024)).unwrap_or(1024),
            ModelSpec::T5(_) => 512,
            ModelSpec::Llama(_) => 1024,
            ModelSpec::Mlp(_) => 1,
        }
    }

    /// Training FLOPs per token (forward + backward), the convention of PaLM (Chowdhery et al.
    /// 2022, appendix B) and nanoGPT's `estimate_mfu`: `6·N + 12·L·d·T`, where N counts the
    /// parameters that take part in matrix products (all parameters but learned position
    /// embeddings and, where the LM head is untied, the input embedding lookup) and the second
    /// term is attention's score and value products at sequence length T. For T5, T is the input
    /// length and the count is per input token of an encoder-decoder pass whose target has
    /// `target_len` tokens, [`default_target_len`] of T when not given, as the worker trains (see
    /// [`Self::train_flops_per_input_token`]); the other families have no target and ignore it. For
    /// the MLP, a "token" is one input vector and there is no attention term.
    pub fn train_flops_per_token(&self, seq_len: u32, target_len: Option<u32>) -> f64 {
        self.train_flops_per_input_token(seq_len, target_len.unwrap_or_else(|| default_target_len(seq_len)))
    }

    /// [`Self::train_flops_per_token`] where T5's decoder reads `target_len` tokens for the
    /// `seq_len` input tokens of its encoder, per input token: the encoder's parameters act on
    /// every input token, the decoder's on every target token (but its cross-attention keys and
    /// values, which project the encoder's output, on every input token), the tied LM head on every
    /// target token; plus [`Self::attention_flops_per_input_token`]. The other families have no
    /// target length and ignore it.
    pub fn train_flops_per_input_token(&self, seq_len: u32, target_len: u32) -> f64 {
        let t = f64::from(seq_len);
        let n = self.param_count() as f64;
        let attention = self.attention_flops_per_input_token(seq_len, target_len);
        match *self {
            ModelSpec::Gpt2(d) => 6.0 * (n - (d.n_positions * d.d_model) as f64) + attention,
            ModelSpec::T5(d) => {
                let (c, inner, l) = ((d.d_model) as f64, (d.n_head * d.d_kv) as f64, d.n_layer as f64);
                let units = self.units();
                let sum =
                    |kind: UnitKind| -> f64 { units.iter().filter(|u| u.kind == kind).map(|u| u.params as f64).sum() };
                // Per input token: r target tokens.
                let r = f64::from(target_len) / t;
                let cross_kv = 2.0 * l * c * inner;
                let encoder = sum(UnitKind::EncoderLayer) + c;
                let decoder = sum(UnitKind::DecoderLayer) - cross_kv + c + (d.vocab * d.d_model) as f64;
                6.0 * (encoder + cross_kv + decoder * r) + attention
            }
            ModelSpec::Llama(d) => 6.0 * (n - (d.vocab * d.d_model) as f64) + attention,
            ModelSpec::Mlp(_) => 6.0 * n,
        }
    }

    /// The part of [`Self::train_flops_per_input_token`] that attention's scores and weighted sums
    /// take (forward and backward: 12 FLOPs per layer, per attended pair, per unit of the
    /// attention's width): quadratic in the sequence, and run by attention kernels rather than the
    /// dense matrix products. GPT-2 and Llama: 12·L·d·T per token; T5: the encoder's over T·T, the
    /// decoder's over T'·T' and T'·T (cross), per input token; the MLP has none.
    pub fn attention_flops_per_input_token(&self, seq_len: u32, target_len: u32) -> f64 {
        let t = f64::from(seq_len);
        match *self {
            ModelSpec::Gpt2(d) => 12.0 * (d.n_layer * d.d_model) as f64 * t,
            ModelSpec::T5(d) => {
                let (inner, l) = ((d.n_head * d.d_kv) as f64, d.n_layer as f64);
                let (t2, r) = (f64::from(target_len), f64::from(target_len) / t);
                12.0 * l * inner * (t + t2 * r + t2)
            }
            ModelSpec::Llama(d) => 12.0 * (d.n_layer * d.d_model) as f64 * t,
            ModelSpec::Mlp(_) => 0.0,
        }
    }
}

impl fmt::Display for ModelSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({} parameters)", self.family(), self.param_count())
    }
}

impl ModelPreset {
    /// Parses a preset name, for callers that prefer `Option`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::from_str(name).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Published parameter counts (Hugging Face `num_parameters()`, tied weights once).
    #[test]
    fn parameter_counts_equal_the_published_ones() {
        let cases = [
            (ModelPreset::Gpt2, 124_439_808u64),
            (ModelPreset::Gpt2Medium, 354_823_168),
            (ModelPreset::Gpt2Large, 774_030_080),
            (ModelPreset::Gpt2Xl, 1_557_611_200),
            (ModelPreset::T5Small, 60_506_624),
            (ModelPreset::T5Base, 222_903_552),
            (ModelPreset::T5Large, 737_668_096),
            (ModelPreset::T5_3b, 2_851_598_336),
            (ModelPreset::T5_11b, 11_307_321_344),
            (ModelPreset::Mistral7b, 7_241_732_096),
            (ModelPreset::Mlp, 8_398_848),
        ];
        for (p, n) in cases {
            assert_eq!(p.spec().param_count(), n, "{p}");
        }
    }

    #[test]
    fn names_round_trip() {
        for p in ModelPreset::ALL {
            assert_eq!(p.as_str().parse::<ModelPreset>().unwrap(), *p);
            assert_eq!(serde_json::to_value(p).unwrap(), serde_json::Value::String(p.as_str().into()));
        }
        assert!("gpt3".parse::<ModelPreset>().unwrap_err().contains("gpt2-xl"));
    }

    #[test]
    fn gpt2_units_are_embeddings_then_blocks() {
        let u = ModelPreset::Gpt2.spec().units();
        assert_eq!(u.len(), 13);
        assert_eq!(u[0].name, "embed");
        assert_eq!(u[1].params, 7_087_872);
        assert_eq!(ModelPreset::Gpt2.spec().largest_unit_params(), u[0].params);
    }

    /// Each family's units by kind, in forward order: the embeddings first, then the layers (T5's
    /// encoder's, then its decoder's), then Llama's untied head; the layers are the model's
    /// `layers()` (T5: both stacks).
    #[test]
    fn units_are_kinded_in_forward_order() {
        use UnitKind::{DecoderLayer, Embedding, EncoderLayer, Head, Layer};
        let kinds = |p: ModelPreset| p.spec().units().iter().map(|u| u.kind).collect::<Vec<_>>();
        let seq = |k: UnitKind, n: usize| std::iter::repeat_n(k, n);
        let want = |parts: &[(UnitKind, usize)]| parts.iter().flat_map(|&(k, n)| seq(k, n)).collect::<Vec<_>>();
        assert_eq!(kinds(ModelPreset::Gpt2), want(&[(Embedding, 1), (Layer, 12)]));
        assert_eq!(kinds(ModelPreset::T5Small), want(&[(Embedding, 1), (EncoderLayer, 6), (DecoderLayer, 6)]));
        assert_eq!(kinds(ModelPreset::Mistral7b), want(&[(Embedding, 1), (Layer, 32), (Head, 1)]));
        let mlp = ModelPreset::Mlp.spec().layers() as usize;
        assert_eq!(kinds(ModelPreset::Mlp), want(&[(Layer, mlp)]));
        for p in ModelPreset::ALL {
            let layers = p.spec().units().iter().filter(|u| u.kind.is_layer()).count() as u64;
            assert_eq!(layers, p.spec().layers(), "{p}");
        }
    }

    /// With the target as long as the input, T5's count is `6·N` plus three attentions (encoder
    /// self, decoder self, cross) per layer pair; a shorter target shrinks the decoder's share.
    #[test]
    fn t5_flops_per_input_token() {
        let spec = ModelPreset::T5Small.spec();
        let equal = spec.train_flops_per_input_token(512, 512);
        assert_eq!(equal, spec.train_flops_per_token(512, Some(512)));
        let want = 6.0 * 60_506_624.0 + 12.0 * 6.0 * 512.0 * 512.0 * 3.0;
        assert!((equal - want).abs() / want < 1e-12, "{equal} vs {want}");
        let short = spec.train_flops_per_input_token(512, 128);
        assert!(short < equal && short > 0.4 * equal, "{short} vs {equal}");
        // No target length: the worker's default, a quarter of the input.
        assert_eq!(spec.train_flops_per_token(512, None), short);
    }

    #[test]
    fn gpt2_flops_per_token_match_nanogpt() {
        // nanoGPT's estimate_mfu for GPT-2 124M at T=1024 (6N + 12·L·H·Q·T, N without wpe).
        let f = ModelPreset::Gpt2.spec().train_flops_per_token(1024, None);
        let n = 124_439_808.0 - 1024.0 * 768.0;
        assert_eq!(f, 6.0 * n + 12.0 * 12.0 * 768.0 * 1024.0);
    }

    /// The family a spec reports is the `family` tag it is serialized with.
    #[test]
    fn family_names_are_the_serialized_tags() {
        let cases = [
            (ModelPreset::Gpt2, "gpt2"),
            (ModelPreset::Tiny, "gpt2"),
            (ModelPreset::T5Small, "t5"),
            (ModelPreset::Mistral7b, "llama"),
            (ModelPreset::Mlp, "mlp"),
        ];
        for (p, family) in cases {
            assert_eq!(p.spec().family(), family, "{p}");
        }
        for p in ModelPreset::ALL {
            assert_eq!(serde_json::to_value(p.spec()).unwrap()["family"], p.spec().family(), "{p}");
        }
    }

    /// T5-small's 6 + 6 layers: embed, encoder.0-5 (units 1-6), embed again for the decoder,
    /// decoder.0-5 (units 7-12), then the tied head.
    #[test]
    fn t5_segments_use_the_shared_embedding_three_times() {
        let want = [0, 1, 2, 3, 4, 5, 6, 0, 7, 8, 9, 10, 11, 12, 0];
        assert_eq!(ModelPreset::T5Small.spec().segment_units(), want);
        assert_eq!(ModelPreset::Gpt2.spec().segment_units(), [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0]);
    }

    /// Layers (T5: encoder plus decoder), hidden size and vocabulary of the published presets.
    #[test]
    fn layers_width_and_vocab_of_the_presets() {
        let cases = [
            (ModelPreset::Gpt2, 12, 768, 50257),
            (ModelPreset::Gpt2Xl, 48, 1600, 50257),
            (ModelPreset::T5Small, 12, 512, 32128),
            (ModelPreset::T5Base, 24, 768, 32128),
            (ModelPreset::Mistral7b, 32, 4096, 32000),
            (ModelPreset::Mlp, 4, 512, 0),
        ];
        for (p, layers, d_model, vocab) in cases {
            let s = p.spec();
            assert_eq!((s.layers(), s.d_model(), s.vocab()), (layers, d_model, vocab), "{p}");
        }
    }

    /// T5-small at 512 input tokens and 128 target tokens (r = 1/4 target token per input token),
    /// by hand. Encoder layers: 4·512·512 + 2·512·2048 + 2·512 = 3,146,752 each, plus 256 relative
    /// buckets: 18,880,768; with the final norm 18,881,280. Decoder layers: 8·512·512 +
    /// 2·512·2048 + 3·512 = 4,195,840 each, plus 256: 25,175,296; its cross-attention keys and
    /// values (2·6·512·512 = 3,145,728) act on every input token, the rest with the final norm and
    /// the tied head (32128·512) on every target token: 38,479,616. So 6·(18,881,280 + 3,145,728 +
    /// 38,479,616 / 4) = 189,881,472, plus attention 12·6·512·(512 + 128 / 4 + 128) = 24,772,608.
    #[test]
    fn t5_flops_with_a_shorter_target_count_the_decoder_per_target_token() {
        let got = ModelPreset::T5Small.spec().train_flops_per_input_token(512, 128);
        let want = 189_881_472.0 + 24_772_608.0;
        assert!((got - want).abs() <= 1e-12 * want, "{got} vs {want}");
    }

    /// Mistral 7B's LM head is untied, so its input embedding (32000 × 4096) is a lookup and out of
    /// N: 6·(7,241,732,096 − 131,072,000) + 12·32·4096·1024 at 1024 tokens.
    #[test]
    fn llama_flops_leave_out_the_untied_input_embedding() {
        let n = 7_241_732_096.0 - 32_000.0 * 4096.0;
        let want = 6.0 * n + 12.0 * 32.0 * 4096.0 * 1024.0;
        assert_eq!(want, 44_274_573_312.0);
        assert_eq!(ModelPreset::Mistral7b.spec().train_flops_per_token(1024, None), want);
    }

    /// Attention's share is the quadratic term of each family's count, by hand: GPT-2's
    /// 12·L·d·T, T5-small's 12·6·512·(512 + 128/4 + 128) at a 128-token target, Mistral's
    /// 12·32·4096·T; the MLP has none.
    #[test]
    fn attention_flops_are_the_quadratic_terms() {
        let gpt2 = ModelPreset::Gpt2.spec();
        assert_eq!(gpt2.attention_flops_per_input_token(1024, 256), 12.0 * 12.0 * 768.0 * 1024.0);
        assert_eq!(ModelPreset::T5Small.spec().attention_flops_per_input_token(512, 128), 24_772_608.0);
        assert_eq!(
            ModelPreset::Mistral7b.spec().attention_flops_per_input_token(1024, 256),
            12.0 * 32.0 * 4096.0 * 1024.0
        );
        assert_eq!(ModelPreset::Mlp.spec().attention_flops_per_input_token(64, 16), 0.0);
        // What is left is linear in the sequence: twice as long, the same per token.
        let dense =
            |t: u32| gpt2.train_flops_per_input_token(t, t / 4) - gpt2.attention_flops_per_input_token(t, t / 4);
        assert_eq!(dense(512), dense(1024));
    }

    /// The MLP has no attention: 6 FLOPs per parameter per input vector, whatever the "length".
    #[test]
    fn mlp_flops_are_six_per_parameter() {
        for len in [1, 64] {
            assert_eq!(ModelPreset::Mlp.spec().train_flops_per_token(len, None), 6.0 * 8_398_848.0);
        }
    }

    #[test]
    fn a_spec_displays_its_family_and_parameter_count() {
        assert_eq!(ModelPreset::Gpt2.spec().to_string(), "gpt2 (124439808 parameters)");
        assert_eq!(ModelPreset::T5Small.spec().to_string(), "t5 (60506624 parameters)");
    }

    #[test]
    fn preset_names_parse_to_presets_and_others_to_none() {
        assert_eq!(ModelPreset::from_name("gpt2-xl"), Some(ModelPreset::Gpt2Xl));
        assert_eq!(ModelPreset::from_name("t5-11b"), Some(ModelPreset::T5_11b));
        assert_eq!(ModelPreset::from_name("mlp"), Some(ModelPreset::Mlp));
        assert_eq!(ModelPreset::from_name("gpt3"), None);
        assert_eq!(ModelPreset::from_name(""), None);
    }
}
