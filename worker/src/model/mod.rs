//! Models as the ZeRO engine sees them: parameters grouped in *units* (what is flattened,
//! partitioned and gathered together) and computation split into *segments* that run one after
//! another, each using the parameters of one unit.
//!
//! tch has no gradient hooks, so the trainer runs backward segment by segment: each segment's
//! inputs are fresh leaves, and backward of a segment yields its parameters' gradients and the
//! gradients of its inputs, which become the upstream gradients of the segment before it. A unit's
//! gradients can thus be reduced as soon as the last segment that uses it has run backward.

pub mod gpt2;

use tch::{Kind, TchError, Tensor};
use zerobench_schema::models::ModelSpec;

/// How a parameter starts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    Normal(f64),
    Zeros,
    Ones,
}

#[derive(Debug, Clone)]
pub struct ParamDef {
    pub name: String,
    pub shape: Vec<i64>,
    pub init: Init,
}

impl ParamDef {
    pub fn new(name: impl Into<String>, shape: &[i64], init: Init) -> Self {
        Self { name: name.into(), shape: shape.to_vec(), init }
    }
    pub fn numel(&self) -> usize {
        self.shape.iter().map(|&d| usize::try_from(d).expect("non-negative dim")).product()
    }
}

/// A group of parameters flattened into one buffer.
#[derive(Debug, Clone)]
pub struct UnitDef {
    pub name: String,
    pub params: Vec<ParamDef>,
}

impl UnitDef {
    pub fn numel(&self) -> usize {
        self.params.iter().map(ParamDef::numel).sum()
    }
}

/// One step of the forward pass, using the parameters of one unit.
#[derive(Debug, Clone)]
pub struct Segment {
    pub name: String,
    pub unit: usize,
}

/// The data of one micro-batch, on the compute device.
pub struct Batch {
    /// Token ids, `[batch, seq]` (int64).
    pub input: Tensor,
    /// Next-token targets, `[batch, seq]` (int64).
    pub target: Tensor,
}

/// A model the ZeRO engine can train.
pub trait Model {
    fn units(&self) -> &[UnitDef];
    fn segments(&self) -> &[Segment];
    /// Runs segment `s`. `params` are the parameters of its unit in declaration order, `inputs` the
    /// outputs of segment `s - 1` (none for the first). The last segment returns the mean loss.
    fn forward(&self, s: usize, params: &[Tensor], inputs: &[Tensor], batch: &Batch) -> Result<Vec<Tensor>, TchError>;
}

/// Builds the model of a preset. `kind` is the compute precision.
pub fn build(spec: &ModelSpec, kind: Kind) -> Result<Box<dyn Model>, String> {
    match spec {
        ModelSpec::Gpt2(d) => Ok(Box::new(gpt2::Gpt2::new(*d, kind))),
        other => Err(format!("the {} family is not implemented in the worker yet", other.family())),
    }
}

/// Fills a unit's parameters with their initial values, deterministically from `seed` and the
/// unit's index, whatever the number of ranks: every rank computes the same values, and a run on
/// one rank starts from the same model as a run on many.
pub fn init_unit(unit: &UnitDef, index: usize, seed: u64) -> Tensor {
    let _guard = tch::no_grad_guard();
    let unit_seed = seed.wrapping_mul(1_000_003).wrapping_add(index as u64);
    tch::manual_seed(i64::from_ne_bytes(unit_seed.to_ne_bytes()) & i64::MAX);
    let parts: Vec<Tensor> = unit
        .params
        .iter()
        .map(|p| {
            let n = i64::try_from(p.numel()).expect("small");
            let opts = (Kind::Float, tch::Device::Cpu);
            match p.init {
                Init::Normal(std) => Tensor::randn([n], opts) * std,
                Init::Zeros => Tensor::zeros([n], opts),
                Init::Ones => Tensor::ones([n], opts),
            }
        })
        .collect();
    Tensor::cat(&parts, 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerobench_schema::ModelPreset;

    /// The worker's models have exactly the parameters the schema's closed forms give, unit by
    /// unit, so memory predictions and logs agree with what trains.
    #[test]
    fn units_match_the_schema() {
        for preset in [ModelPreset::Tiny, ModelPreset::Gpt2, ModelPreset::Gpt2Medium, ModelPreset::Gpt2Large, ModelPreset::Gpt2Xl] {
            let spec = preset.spec();
            let model = build(&spec, Kind::Float).unwrap();
            let want = spec.units();
            assert_eq!(model.units().len(), want.len(), "{preset}");
            for (u, w) in model.units().iter().zip(&want) {
                assert_eq!(u.name, w.name, "{preset}");
                assert_eq!(u.numel() as u64, w.params, "{preset} {}", u.name);
            }
        }
    }

    #[test]
    fn init_is_deterministic_per_unit() {
        let model = build(&ModelPreset::Tiny.spec(), Kind::Float).unwrap();
        let a = init_unit(&model.units()[1], 1, 7);
        let b = init_unit(&model.units()[1], 1, 7);
        let c = init_unit(&model.units()[1], 1, 8);
        assert!(a.equal(&b));
        assert!(!a.equal(&c));
    }
}
