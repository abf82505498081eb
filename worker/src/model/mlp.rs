//! The dummy MLP of the DeepSpeed profiling study: `n_layer` residual blocks `x + Linear(h, d)(GELU(Linear(d, h)(x)))`
//! with biases, regressing target vectors with the mean squared error. It reads `[batch, seq,
//! d_model]` vectors (a "token" is one vector), so tokens per step and FLOPs per token mean what
//! they mean for the transformers.
//!
//! Units and segments: `layer.i`, one per block; the first reads the batch, the last also computes
//! the loss (in fp32).

use tch::{Kind, Reduction, TchError, Tensor};
use zerobench_schema::models::MlpDims;

use super::ops::dim;
use super::{Batch, Init, Model, ParamDef, Segment, Shape, UnitDef};

pub struct Mlp {
    dims: MlpDims,
    units: Vec<UnitDef>,
    segments: Vec<Segment>,
}

impl Mlp {
    pub fn new(dims: MlpDims) -> Self {
        let (d, h) = (dim(dims.d_model), dim(dims.d_hidden));
        // PyTorch's `nn.Linear` draws weights with variance 1/(3·fan_in); a normal of that variance
        // keeps its scale. Biases start at zero.
        let std = |fan_in: i64| (3.0 * fan_in as f64).powf(-0.5);
        let units: Vec<UnitDef> = (0..dims.n_layer)
            .map(|i| UnitDef {
                name: format!("layer.{i}"),
                params: vec![
                    ParamDef::new("fc_in.weight", &[h, d], Init::Normal(std(d))),
                    ParamDef::new("fc_in.bias", &[h], Init::Zeros),
                    ParamDef::new("fc_out.weight", &[d, h], Init::Normal(std(h))),
                    ParamDef::new("fc_out.bias", &[d], Init::Zeros),
                ],
            })
            .collect();
        let segments = units.iter().enumerate().map(|(i, u)| Segment { name: u.name.clone(), unit: i }).collect();
        Self { dims, units, segments }
    }
}

impl Model for Mlp {
    fn units(&self) -> &[UnitDef] {
        &self.units
    }

    fn segments(&self) -> &[Segment] {
        &self.segments
    }

    fn forward(&self, s: usize, p: &[Tensor], inputs: &[Tensor], batch: &Batch) -> Result<Vec<Tensor>, TchError> {
        // The batch is fp32; the first block computes in the parameters' dtype.
        let x = match inputs.first() {
            Some(x) => x.shallow_clone(),
            None => batch.input.f_to_kind(p[0].kind())?,
        };
        let h = x.f_linear(&p[0], Some(&p[1]))?.f_gelu("none")?.f_linear(&p[2], Some(&p[3]))?;
        let y = x.f_add(&h)?;
        if s + 1 < self.segments.len() {
            return Ok(vec![y]);
        }
        Ok(vec![y.f_to_kind(Kind::Float)?.f_mse_loss(&batch.target, Reduction::Mean)?])
    }

    fn forward_flops(&self, _s: usize, shape: &Shape) -> f64 {
        shape.tokens() * 2.0 * 2.0 * (self.dims.d_model * self.dims.d_hidden) as f64
    }
}
