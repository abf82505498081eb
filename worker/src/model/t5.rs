//! T5 v1 (Raffel et al. 2020) as Hugging Face's `T5ForConditionalGeneration` builds the original
//! checkpoints (t5-small … t5-11b): an encoder and a decoder of `n_layer` pre-norm layers each; RMS
//! layer norm (weight only, eps 1e-6); no biases; ReLU feed-forward `wo(relu(wi(x)))`; attention
//! without the 1/sqrt(d_kv) scaling (T5 folds it into the initialisation); a relative position
//! bias, learned in the first layer of each stack and added to every layer's self-attention
//! (bidirectional buckets in the encoder, causal ones in the decoder, `max_distance` 128); decoder
//! layers attend causally to themselves, then to the encoder's output; the LM head is the shared
//! embedding, applied to the decoder's output scaled by d_model^-0.5 (HF does this when the
//! embeddings are tied). Dropout is left out, as in the GPT-2 model.
//!
//! Units: `embed` (shared embedding, the encoder's and the decoder's final norms), `encoder.i`,
//! `decoder.i`. Segments, in order:
//!
//! | segment | unit | inputs → outputs |
//! |---|---|---|
//! | `embed.encoder` | `embed` | → `[x]`: the input tokens' embeddings |
//! | `encoder.i` | `encoder.i` | `[x, bias]` → `[x, bias]` (layer 0 makes the bias; the last drops it) |
//! | `embed.decoder` | `embed` | `[x]` → `[y, enc]`: decoder input embeddings; the encoder's final norm |
//! | `decoder.i` | `decoder.i` | `[y, enc, bias]` → `[y, enc, bias]` (layer 0 makes the bias; the last keeps `y` only) |
//! | `head` | `embed` | `[y]` → `[loss]`: final norm, scaled tied LM head, cross-entropy |
//!
//! The position biases travel between layers as float tensors (the decoder's with the causal mask
//! folded in as −inf), so their gradients reach the first layer's table, and the encoder's output
//! passes through every decoder layer unchanged, collecting each layer's cross-attention gradient.
//! Both go to SDPA as its additive float `attn_mask`.

use tch::{Kind, TchError, Tensor};
use zerobench_schema::models::T5Dims;

use super::lm_head::lm_loss;
use super::ops::{dim, merge_heads, rms_norm, split_heads};
use super::{relpos, Batch, Init, Model, ParamDef, Segment, Shape, UnitDef};

/// HF's `layer_norm_epsilon`.
const EPS: f64 = 1e-6;
/// HF's `relative_attention_max_distance`.
const MAX_DISTANCE: i64 = 128;

/// Parameter positions in the `embed` unit.
const SHARED: usize = 0;
const ENCODER_NORM: usize = 1;
const DECODER_NORM: usize = 2;

/// Parameter positions in an `encoder.i` unit: self-attention q, k, v, o from `ENC_ATTN`.
const ENC_ATTN: usize = 0;
const ENC_ATTN_NORM: usize = 4;
const ENC_WI: usize = 5;
const ENC_WO: usize = 6;
const ENC_FF_NORM: usize = 7;
/// The relative position table, in layer 0 only.
const ENC_REL_BIAS: usize = 8;

/// Parameter positions in a `decoder.i` unit: self-attention q, k, v, o from `DEC_SELF`, cross
/// attention from `DEC_CROSS`.
const DEC_SELF: usize = 0;
const DEC_SELF_NORM: usize = 4;
const DEC_CROSS: usize = 5;
const DEC_CROSS_NORM: usize = 9;
const DEC_WI: usize = 10;
const DEC_WO: usize = 11;
const DEC_FF_NORM: usize = 12;
const DEC_REL_BIAS: usize = 13;

/// What a segment computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    EncoderEmbed,
    Encoder(usize),
    DecoderEmbed,
    Decoder(usize),
    Head,
}

pub struct T5 {
    dims: T5Dims,
    units: Vec<UnitDef>,
    segments: Vec<Segment>,
}

impl T5 {
    pub fn new(dims: T5Dims) -> Self {
        let (c, v, ff) = (dim(dims.d_model), dim(dims.vocab), dim(dims.d_ff));
        let inner = dim(dims.n_head * dims.d_kv);
        let n = dims.n_layer as usize;
        // HF's `T5PreTrainedModel._init_weights` with `initializer_factor` 1.
        let (cf, kvf, ffv, innerf) = (c as f64, dims.d_kv as f64, ff as f64, inner as f64);
        let attention = |prefix: &str| {
            vec![
                ParamDef::new(format!("{prefix}.q"), &[inner, c], Init::Normal((cf * kvf).powf(-0.5))),
                ParamDef::new(format!("{prefix}.k"), &[inner, c], Init::Normal(cf.powf(-0.5))),
                ParamDef::new(format!("{prefix}.v"), &[inner, c], Init::Normal(cf.powf(-0.5))),
                ParamDef::new(format!("{prefix}.o"), &[c, inner], Init::Normal(innerf.powf(-0.5))),
            ]
        };
        let feed_forward = || {
            vec![
                ParamDef::new("DenseReluDense.wi", &[ff, c], Init::Normal(cf.powf(-0.5))),
                ParamDef::new("DenseReluDense.wo", &[c, ff], Init::Normal(ffv.powf(-0.5))),
            ]
        };
        let table = || {
            ParamDef::new(
                "relative_attention_bias",
                &[dim(dims.rel_buckets), dim(dims.n_head)],
                Init::Normal(cf.powf(-0.5)),
            )
        };
        let norm = |name: &str| ParamDef::new(name, &[c], Init::Ones);

        // In the order of the positions above.
        let mut units = vec![UnitDef {
            name: "embed".into(),
            params: vec![
                ParamDef::new("shared", &[v, c], Init::Normal(1.0)),
                norm("encoder.final_layer_norm"),
                norm("decoder.final_layer_norm"),
            ],
        }];
        for i in 0..n {
            let mut params = attention("SelfAttention");
            params.push(norm("SelfAttention.layer_norm"));
            params.extend(feed_forward());
            params.push(norm("DenseReluDense.layer_norm"));
            if i == 0 {
                params.push(table());
            }
            units.push(UnitDef { name: format!("encoder.{i}"), params });
        }
        for i in 0..n {
            let mut params = attention("SelfAttention");
            params.push(norm("SelfAttention.layer_norm"));
            params.extend(attention("EncDecAttention"));
            params.push(norm("EncDecAttention.layer_norm"));
            params.extend(feed_forward());
            params.push(norm("DenseReluDense.layer_norm"));
            if i == 0 {
                params.push(table());
            }
            units.push(UnitDef { name: format!("decoder.{i}"), params });
        }

        let mut segments = vec![Segment { name: "embed.encoder".into(), unit: 0 }];
        segments.extend((0..n).map(|i| Segment { name: format!("encoder.{i}"), unit: 1 + i }));
        segments.push(Segment { name: "embed.decoder".into(), unit: 0 });
        segments.extend((0..n).map(|i| Segment { name: format!("decoder.{i}"), unit: 1 + n + i }));
        segments.push(Segment { name: "head".into(), unit: 0 });
        Self { dims, units, segments }
    }

    fn part(&self, s: usize) -> Part {
        let n = self.dims.n_layer as usize;
        match s {
            0 => Part::EncoderEmbed,
            s if s <= n => Part::Encoder(s - 1),
            s if s == n + 1 => Part::DecoderEmbed,
            s if s <= 2 * n + 1 => Part::Decoder(s - n - 2),
            _ => Part::Head,
        }
    }

    fn is_last_layer(&self, i: usize) -> bool {
        i + 1 == self.dims.n_layer as usize
    }

    /// T5 attention of `x` over `kv` with weights q, k, v, o, unscaled, plus the additive `bias`.
    fn attention(&self, x: &Tensor, kv: &Tensor, w: &[Tensor], bias: Option<&Tensor>) -> Result<Tensor, TchError> {
        let heads = dim(self.dims.n_head);
        let q = split_heads(&x.f_linear::<Tensor>(&w[0], None)?, heads)?;
        let k = split_heads(&kv.f_linear::<Tensor>(&w[1], None)?, heads)?;
        let v = split_heads(&kv.f_linear::<Tensor>(&w[2], None)?, heads)?;
        let y = Tensor::f_scaled_dot_product_attention(&q, &k, &v, bias, 0.0, false, 1.0, false)?;
        merge_heads(&y)?.f_linear::<Tensor>(&w[3], None)
    }

    fn feed_forward(&self, x: &Tensor, wi: &Tensor, wo: &Tensor) -> Result<Tensor, TchError> {
        x.f_linear::<Tensor>(wi, None)?.f_relu()?.f_linear::<Tensor>(wo, None)
    }

    fn encoder_layer(&self, i: usize, p: &[Tensor], inputs: &[Tensor]) -> Result<Vec<Tensor>, TchError> {
        let x = &inputs[0];
        let bias = match i {
            0 => {
                let t = x.size()[1];
                relpos::bias(&p[ENC_REL_BIAS], t, t, true, MAX_DISTANCE)?
            }
            _ => inputs[1].shallow_clone(),
        };
        let h = rms_norm(x, &p[ENC_ATTN_NORM], EPS)?;
        let x = x.f_add(&self.attention(&h, &h, &p[ENC_ATTN..ENC_ATTN + 4], Some(&bias))?)?;
        let h = rms_norm(&x, &p[ENC_FF_NORM], EPS)?;
        let x = x.f_add(&self.feed_forward(&h, &p[ENC_WI], &p[ENC_WO])?)?;
        Ok(if self.is_last_layer(i) { vec![x] } else { vec![x, bias] })
    }

    fn decoder_layer(&self, i: usize, p: &[Tensor], inputs: &[Tensor]) -> Result<Vec<Tensor>, TchError> {
        let (y, enc) = (&inputs[0], &inputs[1]);
        let bias = match i {
            0 => {
                let t = y.size()[1];
                let future = Tensor::f_ones([t, t], (Kind::Bool, y.device()))?.f_triu(1)?;
                relpos::bias(&p[DEC_REL_BIAS], t, t, false, MAX_DISTANCE)?.f_masked_fill(&future, f64::NEG_INFINITY)?
            }
            _ => inputs[2].shallow_clone(),
        };
        let h = rms_norm(y, &p[DEC_SELF_NORM], EPS)?;
        let y = y.f_add(&self.attention(&h, &h, &p[DEC_SELF..DEC_SELF + 4], Some(&bias))?)?;
        let h = rms_norm(&y, &p[DEC_CROSS_NORM], EPS)?;
        let y = y.f_add(&self.attention(&h, enc, &p[DEC_CROSS..DEC_CROSS + 4], None)?)?;
        let h = rms_norm(&y, &p[DEC_FF_NORM], EPS)?;
        let y = y.f_add(&self.feed_forward(&h, &p[DEC_WI], &p[DEC_WO])?)?;
        Ok(if self.is_last_layer(i) { vec![y] } else { vec![y, enc.shallow_clone(), bias] })
    }

    fn decoder_embed(&self, p: &[Tensor], x: &Tensor, batch: &Batch) -> Result<Vec<Tensor>, TchError> {
        let ids =
            batch.decoder_input.as_ref().ok_or_else(|| TchError::Shape("a T5 batch needs a decoder input".into()))?;
        let y = Tensor::f_embedding(&p[SHARED], ids, -1, false, false)?;
        Ok(vec![y, rms_norm(x, &p[ENCODER_NORM], EPS)?])
    }

    fn head(&self, p: &[Tensor], y: &Tensor, batch: &Batch) -> Result<Vec<Tensor>, TchError> {
        let h = rms_norm(y, &p[DECODER_NORM], EPS)?.f_mul_scalar((self.dims.d_model as f64).powf(-0.5))?;
        Ok(vec![lm_loss(&h, &p[SHARED], &batch.target)?])
    }
}

impl Model for T5 {
    fn units(&self) -> &[UnitDef] {
        &self.units
    }

    fn segments(&self) -> &[Segment] {
        &self.segments
    }

    fn forward(&self, s: usize, params: &[Tensor], inputs: &[Tensor], batch: &Batch) -> Result<Vec<Tensor>, TchError> {
        match self.part(s) {
            Part::EncoderEmbed => Ok(vec![Tensor::f_embedding(&params[SHARED], &batch.input, -1, false, false)?]),
            Part::Encoder(i) => self.encoder_layer(i, params, inputs),
            Part::DecoderEmbed => self.decoder_embed(params, &inputs[0], batch),
            Part::Decoder(i) => self.decoder_layer(i, params, inputs),
            Part::Head => self.head(params, &inputs[0], batch),
        }
    }

    fn forward_flops(&self, s: usize, shape: &Shape) -> f64 {
        let d = self.dims;
        let (c, inner, ff) = (d.d_model as f64, (d.n_head * d.d_kv) as f64, d.d_ff as f64);
        let (t, t2, seqs) = (shape.seq_len as f64, shape.target_len as f64, shape.sequences as f64);
        let (input_tokens, target_tokens) = (seqs * t, seqs * t2);
        match self.part(s) {
            Part::EncoderEmbed | Part::DecoderEmbed => 0.0, // lookups and a norm
            // q, k, v, o and the feed-forward per token; scores and weighted values over T·T.
            Part::Encoder(_) => input_tokens * 2.0 * (4.0 * c * inner + 2.0 * c * ff) + seqs * 4.0 * t * t * inner,
            Part::Decoder(_) => {
                // Self-attention q, k, v, o, cross-attention q and o, feed-forward per target
                // token; cross-attention k and v per input token; self-attention over T'·T',
                // cross-attention over T'·T.
                target_tokens * 2.0 * (6.0 * c * inner + 2.0 * c * ff)
                    + input_tokens * 2.0 * 2.0 * c * inner
                    + seqs * 4.0 * (t2 * t2 + t2 * t) * inner
            }
            Part::Head => target_tokens * 2.0 * d.vocab as f64 * c,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;
    use zerobench_schema::ModelPreset;

    fn tiny() -> T5 {
        match ModelPreset::TinyT5.spec() {
            zerobench_schema::ModelSpec::T5(d) => T5::new(d),
            other => panic!("{other}"),
        }
    }

    /// SDPA with scale 1 and a float mask is T5's `softmax(q·kᵀ + bias)·v`, gradient of the bias
    /// included (it trains the position table).
    #[test]
    fn attention_is_unscaled_with_additive_bias() {
        let opts = (Kind::Double, Device::Cpu);
        let q = Tensor::randn([2, 3, 5, 4], opts);
        let k = Tensor::randn([2, 3, 6, 4], opts);
        let v = Tensor::randn([2, 3, 6, 4], opts);
        let bias = Tensor::randn([1, 3, 5, 6], opts).set_requires_grad(true);
        let sdpa = Tensor::scaled_dot_product_attention(&q, &k, &v, Some(&bias), 0.0, false, 1.0, false);
        let g_sdpa = Tensor::run_backward(&[sdpa.square().sum(Kind::Double)], &[&bias], false, false);
        let manual = (q.matmul(&k.transpose(-1, -2)) + &bias).softmax(-1, Kind::Double).matmul(&v);
        let g_manual = Tensor::run_backward(&[manual.square().sum(Kind::Double)], &[&bias], false, false);
        assert!(sdpa.allclose(&manual, 1e-10, 1e-10, false));
        assert!(g_sdpa[0].allclose(&g_manual[0], 1e-10, 1e-10, false));
    }

    #[test]
    fn segments_follow_the_table() {
        let m = tiny();
        let names: Vec<&str> = m.segments().iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            ["embed.encoder", "encoder.0", "encoder.1", "embed.decoder", "decoder.0", "decoder.1", "head"]
        );
        let units: Vec<usize> = m.segments().iter().map(|s| s.unit).collect();
        assert_eq!(units, [0, 1, 2, 0, 3, 4, 0]);
        assert_eq!(m.units()[1].params[ENC_REL_BIAS].name, "relative_attention_bias");
        assert_eq!(m.units()[3].params[DEC_REL_BIAS].name, "relative_attention_bias");
        assert_eq!(m.units()[3].params[DEC_CROSS].name, "EncDecAttention.q");
        assert_eq!(m.units()[4].params.len(), DEC_REL_BIAS);
    }

    /// The decoder is causal: a change in the last target token changes no earlier position's
    /// output, while any change in the input reaches every position.
    #[test]
    fn decoder_is_causal_and_sees_the_whole_input() {
        let m = tiny();
        let params: Vec<Vec<Tensor>> = m
            .units()
            .iter()
            .enumerate()
            .map(|(i, u)| {
                let flat = super::super::init_unit(u, i, 1, Device::Cpu).unwrap();
                let mut off = 0;
                u.params
                    .iter()
                    .map(|p| {
                        let n = p.numel() as i64;
                        let t = flat.narrow(0, off, n).view(p.shape.as_slice());
                        off += n;
                        t
                    })
                    .collect()
            })
            .collect();
        // Runs every segment but the head and returns the decoder's output.
        let decode = |input: &[i64], dec: &[i64]| -> Tensor {
            let batch = Batch {
                input: Tensor::from_slice(input).view([1, -1]),
                target: Tensor::from_slice(dec).view([1, -1]),
                decoder_input: Some(Tensor::from_slice(dec).view([1, -1])),
            };
            let mut state: Vec<Tensor> = Vec::new();
            for s in 0..m.segments().len() - 1 {
                state = m.forward(s, &params[m.segments()[s].unit], &state, &batch).unwrap();
            }
            state.remove(0)
        };
        let base = decode(&[5, 6, 7, 8, 9], &[0, 1, 2, 3]);
        let changed_last = decode(&[5, 6, 7, 8, 9], &[0, 1, 2, 4]);
        assert!(base.narrow(1, 0, 3).allclose(&changed_last.narrow(1, 0, 3), 1e-6, 1e-6, false));
        assert!(!base.narrow(1, 3, 1).allclose(&changed_last.narrow(1, 3, 1), 1e-6, 1e-6, false));
        let changed_input = decode(&[5, 6, 7, 8, 10], &[0, 1, 2, 3]);
        assert!(!base.narrow(1, 0, 1).allclose(&changed_input.narrow(1, 0, 1), 1e-6, 1e-6, false));
    }
}
