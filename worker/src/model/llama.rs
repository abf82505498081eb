//! A Llama/Mistral-style decoder as in Hugging Face's `LlamaForCausalLM` / `MistralForCausalLM`:
//! pre-norm blocks with RMSNorm (eps 1e-5, Mistral's and Llama 2's `rms_norm_eps`), rotary
//! positions (theta 10000: `rope_theta` of Mistral-7B-v0.1 and of Llama 2), grouped-query
//! attention, a SwiGLU MLP `down(silu(gate(x)) · up(x))`, no biases, an LM head of its own.
//!
//! Attention is causal over the whole sequence. Mistral-7B-v0.1 also has a 4096-token sliding
//! window, which changes nothing up to 4096 tokens and is not modelled beyond.
//!
//! Grouped-query attention goes through SDPA's `enable_gqa`: the kernels that support it (flash
//! attention in bf16/fp16 on CUDA) read each key/value head for its group of query heads without
//! copies; the others fall back to libtorch's math kernel, which repeats them.
//!
//! Units: `embed` (token embedding), `layer.i`, `head` (final norm, LM head). Segments: `embed`,
//! `layer.i`, `head`, each on its own unit.

use std::sync::Mutex;

use tch::{Device, Kind, TchError, Tensor};
use zerobench_schema::models::LlamaDims;

use super::lm_head::lm_loss;
use super::ops::{dim, merge_heads, rms_norm, split_heads};
use super::{rope, Batch, Init, Model, ParamDef, Segment, Shape, UnitDef};

/// Hugging Face's `initializer_range` (every linear layer and the embedding).
const STD: f64 = 0.02;
const EPS: f64 = 1e-5;
const ROPE_THETA: f64 = 10_000.0;

/// Parameter positions within a `layer.i` unit.
const IN_NORM: usize = 0;
const Q: usize = 1;
const K: usize = 2;
const V: usize = 3;
const O: usize = 4;
const POST_NORM: usize = 5;
const GATE: usize = 6;
const UP: usize = 7;
const DOWN: usize = 8;

pub struct Llama {
    dims: LlamaDims,
    head_dim: i64,
    units: Vec<UnitDef>,
    segments: Vec<Segment>,
    /// The rotary tables of the last (sequence length, dtype, device) seen: the same for every
    /// layer and step, so built once rather than in each layer's forward.
    rope: Mutex<Option<RopeTables>>,
}

struct RopeTables {
    key: (i64, Kind, Device),
    cos: Tensor,
    sin: Tensor,
}

impl Llama {
    /// Fails unless the heads divide the model width and the key/value heads divide the heads.
    pub fn new(dims: LlamaDims) -> Result<Self, String> {
        if dims.n_head == 0
            || dims.d_model % dims.n_head != 0
            || dims.n_kv_head == 0
            || dims.n_head % dims.n_kv_head != 0
        {
            return Err(format!(
                "{} heads and {} key/value heads cannot split a width of {}",
                dims.n_head, dims.n_kv_head, dims.d_model
            ));
        }
        let (c, v, ff) = (dim(dims.d_model), dim(dims.vocab), dim(dims.d_ff));
        let head_dim = c / dim(dims.n_head);
        let kv = dim(dims.n_kv_head) * head_dim;
        let mut units = vec![UnitDef {
            name: "embed".into(),
            params: vec![ParamDef::new("embed_tokens", &[v, c], Init::Normal(STD))],
        }];
        for i in 0..dims.n_layer {
            // In the order of the positions above.
            let params = vec![
                ParamDef::new("input_layernorm", &[c], Init::Ones),
                ParamDef::new("self_attn.q_proj", &[c, c], Init::Normal(STD)),
                ParamDef::new("self_attn.k_proj", &[kv, c], Init::Normal(STD)),
                ParamDef::new("self_attn.v_proj", &[kv, c], Init::Normal(STD)),
                ParamDef::new("self_attn.o_proj", &[c, c], Init::Normal(STD)),
                ParamDef::new("post_attention_layernorm", &[c], Init::Ones),
                ParamDef::new("mlp.gate_proj", &[ff, c], Init::Normal(STD)),
                ParamDef::new("mlp.up_proj", &[ff, c], Init::Normal(STD)),
                ParamDef::new("mlp.down_proj", &[c, ff], Init::Normal(STD)),
            ];
            units.push(UnitDef { name: format!("layer.{i}"), params });
        }
        units.push(UnitDef {
            name: "head".into(),
            params: vec![ParamDef::new("norm", &[c], Init::Ones), ParamDef::new("lm_head", &[v, c], Init::Normal(STD))],
        });
        let segments = units.iter().enumerate().map(|(i, u)| Segment { name: u.name.clone(), unit: i }).collect();
        Ok(Self { dims, head_dim, units, segments, rope: Mutex::new(None) })
    }

    /// The rotary tables for `x`'s sequence length, dtype and device (cached).
    fn rope_tables(&self, x: &Tensor) -> Result<(Tensor, Tensor), TchError> {
        let key = (x.size()[1], x.kind(), x.device());
        let mut cache = self.rope.lock().expect("rope cache");
        if cache.as_ref().is_none_or(|c| c.key != key) {
            let (cos, sin) = rope::tables(key.0, self.head_dim, ROPE_THETA, key.1, key.2)?;
            *cache = Some(RopeTables { key, cos, sin });
        }
        let c = cache.as_ref().expect("just filled");
        Ok((c.cos.shallow_clone(), c.sin.shallow_clone()))
    }

    fn layer(&self, p: &[Tensor], x: &Tensor) -> Result<Vec<Tensor>, TchError> {
        let (n_head, n_kv) = (dim(self.dims.n_head), dim(self.dims.n_kv_head));
        let h = rms_norm(x, &p[IN_NORM], EPS)?;
        let (cos, sin) = self.rope_tables(x)?;
        let q = rope::apply(&split_heads(&h.f_linear::<Tensor>(&p[Q], None)?, n_head)?, &cos, &sin)?;
        let k = rope::apply(&split_heads(&h.f_linear::<Tensor>(&p[K], None)?, n_kv)?, &cos, &sin)?;
        let v = split_heads(&h.f_linear::<Tensor>(&p[V], None)?, n_kv)?;
        let y = Tensor::f_scaled_dot_product_attention(&q, &k, &v, None::<Tensor>, 0.0, true, None, n_kv != n_head)?;
        let x = x.f_add(&merge_heads(&y)?.f_linear::<Tensor>(&p[O], None)?)?;
        let h = rms_norm(&x, &p[POST_NORM], EPS)?;
        let gated = h.f_linear::<Tensor>(&p[GATE], None)?.f_silu()?.f_mul(&h.f_linear::<Tensor>(&p[UP], None)?)?;
        Ok(vec![x.f_add(&gated.f_linear::<Tensor>(&p[DOWN], None)?)?])
    }
}

impl Model for Llama {
    fn units(&self) -> &[UnitDef] {
        &self.units
    }

    fn segments(&self) -> &[Segment] {
        &self.segments
    }

    fn forward(&self, s: usize, params: &[Tensor], inputs: &[Tensor], batch: &Batch) -> Result<Vec<Tensor>, TchError> {
        if s == 0 {
            Ok(vec![Tensor::f_embedding(&params[0], &batch.input, -1, false, false)?])
        } else if s == self.segments.len() - 1 {
            let h = rms_norm(&inputs[0], &params[0], EPS)?;
            Ok(vec![lm_loss(&h, &params[1], &batch.target)?])
        } else {
            self.layer(params, &inputs[0])
        }
    }

    fn forward_flops(&self, s: usize, shape: &Shape) -> f64 {
        let d = self.dims;
        let (c, kv) = (d.d_model as f64, (d.n_kv_head as f64) * self.head_dim as f64);
        let per_token = if s == 0 {
            0.0 // lookups
        } else if s == self.segments.len() - 1 {
            2.0 * (d.vocab as f64) * c
        } else {
            // q and o (c·c each), k and v (c·kv each), gate, up and down (c·d_ff each); scores and
            // weighted values over the sequence, 4·T·c.
            2.0 * (2.0 * c * c + 2.0 * c * kv + 3.0 * c * d.d_ff as f64) + 4.0 * shape.seq_len as f64 * c
        };
        per_token * shape.tokens()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SDPA's grouped-query path equals attention with each key/value head repeated for its group.
    #[test]
    fn grouped_query_attention_equals_repeated_heads() {
        let opts = (Kind::Double, Device::Cpu);
        let q = Tensor::randn([2, 4, 5, 8], opts);
        let k = Tensor::randn([2, 2, 5, 8], opts);
        let v = Tensor::randn([2, 2, 5, 8], opts);
        let gqa = Tensor::scaled_dot_product_attention(&q, &k, &v, None::<Tensor>, 0.0, true, None, true);
        let (k2, v2) = (k.repeat_interleave_self_int(2, 1, None), v.repeat_interleave_self_int(2, 1, None));
        let full = Tensor::scaled_dot_product_attention(&q, &k2, &v2, None::<Tensor>, 0.0, true, None, false);
        assert!(gqa.allclose(&full, 1e-12, 1e-12, false));
    }
}
