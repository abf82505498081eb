//! GPT-2 (Radford et al. 2019) as in Hugging Face's `GPT2LMHeadModel`: learned positions, pre-LN
//! blocks, causal scaled-dot-product attention, tanh-approximated GELU, LM head tied to the token
//! embedding. The layer norms and the MLP recompute what their backward pass needs
//! (`super::recompute`). Linear weights are stored `[out, in]` (HF's Conv1D stores the transpose;
//! the parameter count is the same).
//!
//! Units: `embed` (token and position embeddings, final layer norm) and one per block.
//! Segments: `embed` (unit 0), `block.i` (unit i + 1), `head` (unit 0 again: final layer norm,
//! tied LM head, cross-entropy).

use tch::{Kind, TchError, Tensor};
use zerobench_schema::models::Gpt2Dims;

use super::lm_head::lm_loss;
use super::ops::{dim, merge_heads, split_heads};
use super::recompute::{ln_linear, residual_linear, residual_ln_gelu_mlp, LnLinear};
use super::{Batch, Init, Model, ParamDef, Segment, Shape, UnitDef, WeightGrads};
use crate::runtime::shim;

pub struct Gpt2 {
    dims: Gpt2Dims,
    units: Vec<UnitDef>,
    segments: Vec<Segment>,
}

/// Hugging Face's `initializer_range`.
const STD: f64 = 0.02;
const LN_EPS: f64 = 1e-5;

impl Gpt2 {
    pub fn new(dims: Gpt2Dims) -> Self {
        let (c, v, p) = (dim(dims.d_model), dim(dims.vocab), dim(dims.n_positions));
        // GPT-2 scales the residual projections by 1/sqrt(2·layers) at init.
        let proj_std = STD / (2.0 * dims.n_layer as f64).sqrt();
        let mut units = vec![UnitDef {
            name: "embed".into(),
            params: vec![
                ParamDef::new("wte", &[v, c], Init::Normal(STD)),
                ParamDef::new("wpe", &[p, c], Init::Normal(0.01)),
                ParamDef::new("ln_f.weight", &[c], Init::Ones),
                ParamDef::new("ln_f.bias", &[c], Init::Zeros),
            ],
        }];
        for i in 0..dims.n_layer {
            units.push(UnitDef {
                name: format!("block.{i}"),
                params: vec![
                    ParamDef::new("ln_1.weight", &[c], Init::Ones),
                    ParamDef::new("ln_1.bias", &[c], Init::Zeros),
                    ParamDef::new("attn.c_attn.weight", &[3 * c, c], Init::Normal(STD)),
                    ParamDef::new("attn.c_attn.bias", &[3 * c], Init::Zeros),
                    ParamDef::new("attn.c_proj.weight", &[c, c], Init::Normal(proj_std)),
                    ParamDef::new("attn.c_proj.bias", &[c], Init::Zeros),
                    ParamDef::new("ln_2.weight", &[c], Init::Ones),
                    ParamDef::new("ln_2.bias", &[c], Init::Zeros),
                    ParamDef::new("mlp.c_fc.weight", &[4 * c, c], Init::Normal(STD)),
                    ParamDef::new("mlp.c_fc.bias", &[4 * c], Init::Zeros),
                    ParamDef::new("mlp.c_proj.weight", &[c, 4 * c], Init::Normal(proj_std)),
                    ParamDef::new("mlp.c_proj.bias", &[c], Init::Zeros),
                ],
            });
        }
        let mut segments = vec![Segment { name: "embed".into(), unit: 0 }];
        segments.extend((0..dims.n_layer).map(|i| Segment { name: format!("block.{i}"), unit: 1 + i as usize }));
        segments.push(Segment { name: "head".into(), unit: 0 });
        Self { dims, units, segments }
    }

    fn embed(&self, p: &[Tensor], batch: &Batch) -> Result<Vec<Tensor>, TchError> {
        let (wte, wpe) = (&p[0], &p[1]);
        let t = batch.input.size()[1];
        let pos = Tensor::f_arange(t, (Kind::Int64, batch.input.device()))?;
        // The shim's lookups add their gradients into the places the engine gives the weights, the
        // tied wte's beside the head's.
        let tok = shim::embedding(wte, &batch.input)?;
        let pos = shim::embedding(wpe, &pos)?;
        Ok(vec![tok.f_add(&pos)?])
    }

    fn block(&self, p: &[Tensor], x: &Tensor) -> Result<Vec<Tensor>, TchError> {
        let nh = dim(self.dims.n_head);
        // q, k and v come out of the node apart, so that their gradients are joined there (with
        // the bias gradient's sums); the residual too, so that its gradient joins x's there.
        let LnLinear { y: qkv, residual } = ln_linear(x, &p[0], &p[1], &p[2], &p[3], LN_EPS, 3)?;
        let (q, k, v) = (split_heads(&qkv[0], nh)?, split_heads(&qkv[1], nh)?, split_heads(&qkv[2], nh)?);
        let y = Tensor::f_scaled_dot_product_attention(&q, &k, &v, None::<Tensor>, 0.0, true, None, false)?;
        let x = residual_linear(&residual, &merge_heads(&y)?, &p[4], &p[5])?;
        Ok(vec![residual_ln_gelu_mlp(&x, [&p[6], &p[7], &p[8], &p[9], &p[10], &p[11]], LN_EPS)?])
    }

    fn head(&self, p: &[Tensor], x: &Tensor, batch: &Batch) -> Result<Vec<Tensor>, TchError> {
        let h = x.f_layer_norm([dim(self.dims.d_model)], Some(&p[2]), Some(&p[3]), LN_EPS, true)?;
        Ok(vec![lm_loss(&h, &p[0], &batch.target)?])
    }
}

impl Model for Gpt2 {
    fn units(&self) -> &[UnitDef] {
        &self.units
    }

    /// The blocks' nodes write their matrices' gradients where the engine places them.
    fn weight_grads(&self) -> WeightGrads {
        WeightGrads::InPlace
    }

    fn segments(&self) -> &[Segment] {
        &self.segments
    }

    fn forward_flops(&self, s: usize, shape: &Shape) -> f64 {
        let (c, v) = (self.dims.d_model as f64, self.dims.vocab as f64);
        let per_token = if s == 0 {
            0.0 // lookups
        } else if s == self.segments.len() - 1 {
            2.0 * v * c // tied LM head
        } else {
            // qkv, attention output, MLP in and out: 12·d² weights; scores and weighted values: 4·T·d.
            2.0 * 12.0 * c * c + 4.0 * shape.seq_len as f64 * c
        };
        per_token * shape.tokens()
    }

    fn forward(&self, s: usize, params: &[Tensor], inputs: &[Tensor], batch: &Batch) -> Result<Vec<Tensor>, TchError> {
        if s == 0 {
            self.embed(params, batch)
        } else if s == self.segments.len() - 1 {
            self.head(params, &inputs[0], batch)
        } else {
            self.block(params, &inputs[0])
        }
    }
}
