//! Models as the ZeRO engine sees them: parameters grouped in *units* (what is flattened,
//! partitioned and gathered together) and computation split into *segments* that run one after
//! another, each using the parameters of one unit.
//!
//! tch has no gradient hooks, so the trainer runs backward segment by segment: each segment's
//! inputs are fresh leaves, and backward of a segment yields its parameters' gradients and the
//! gradients of its inputs, which become the upstream gradients of the segment before it. A unit's
//! gradients can thus be reduced as soon as the last segment that uses it has run backward.
//!
//! A segment may hand several float tensors to the next (integer data, such as masks, is rebuilt
//! from the batch instead); one handed on unchanged collects the gradients of every segment that
//! reads it. A unit may serve several segments (tied embeddings).
//!
//! * `gpt2`, `t5`, `llama`, `mlp`: the families of `ModelSpec`.
//! * `ops`: RMS norm and attention heads; `lm_head` (and its kernel, `lm_head_cuda`): the LM head
//!   and its loss, a chunk of tokens at a time; `recompute`: GPT-2's layer norms and MLP as nodes
//!   that recompute their normalised inputs and GELU outputs in the backward pass (and
//!   `recompute_cuda`, their gradients' reductions as kernels); `relpos`: T5's
//!   position buckets; `rope`: rotary embeddings.

pub mod gpt2;
pub mod llama;
pub mod lm_head;
pub mod lm_head_cuda;
pub mod mlp;
pub mod ops;
pub mod products_cuda;
pub mod recompute;
pub mod recompute_cuda;
pub mod relpos;
pub mod rope;
pub mod t5;

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
    /// Token ids `[batch, seq]` (int64), or the MLP's input vectors `[batch, seq, width]` (fp32).
    pub input: Tensor,
    /// What the loss compares with: next-token ids `[batch, seq]` (GPT-2, Llama), target ids
    /// `[batch, target_len]` (T5; int64), or the MLP's target vectors `[batch, seq, width]` (fp32).
    pub target: Tensor,
    /// T5: the decoder's input, the targets shifted right behind start token 0 (HF T5's
    /// `decoder_start_token_id`), `[batch, target_len]` (int64).
    pub decoder_input: Option<Tensor>,
}

impl Batch {
    /// The same tensors (the storage shared).
    pub fn shallow_clone(&self) -> Batch {
        Batch {
            input: self.input.shallow_clone(),
            target: self.target.shallow_clone(),
            decoder_input: self.decoder_input.as_ref().map(Tensor::shallow_clone),
        }
    }

    /// Writes `other`'s values into this batch's tensors (of the same shapes), in stream order;
    /// nothing where a tensor is the very same memory.
    pub fn copy_from(&self, other: &Batch) -> Result<(), TchError> {
        let pairs = [
            (Some(&self.input), Some(&other.input)),
            (Some(&self.target), Some(&other.target)),
            (self.decoder_input.as_ref(), other.decoder_input.as_ref()),
        ];
        for pair in pairs {
            match pair {
                (None, None) => {}
                (Some(dst), Some(src)) => {
                    if dst.size() != src.size() || dst.kind() != src.kind() {
                        return Err(TchError::Shape(format!(
                            "a batch of {:?} into one of {:?}",
                            src.size(),
                            dst.size()
                        )));
                    }
                    if dst.data_ptr() != src.data_ptr() {
                        dst.shallow_clone().f_copy_(src)?;
                    }
                }
                _ => return Err(TchError::Shape("a batch with a decoder input and one without".into())),
            }
        }
        Ok(())
    }
}

/// The data a FLOP count is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Sequences (MLP: samples).
    pub sequences: u64,
    /// Tokens per sequence: T5's input tokens; the MLP's vectors per sample.
    pub seq_len: u64,
    /// T5's target tokens per sequence (the other families ignore it).
    pub target_len: u64,
}

impl Shape {
    /// Input tokens, as a factor of FLOP counts.
    pub fn tokens(&self) -> f64 {
        (self.sequences * self.seq_len) as f64
    }
}

/// Where a model's layers leave their weights' gradients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightGrads {
    /// In autograd's `.grad`, from where the engine moves them into its buffers.
    Returned,
    /// Where the engine places them before the unit's last backward segment (`shim::grad_into`),
    /// for the matrices the shim's nodes multiply (GPT-2's blocks); the rest as `Returned`.
    InPlace,
}

/// A model the ZeRO engine can train.
pub trait Model {
    fn units(&self) -> &[UnitDef];
    fn segments(&self) -> &[Segment];
    /// Runs segment `s`. `params` are the parameters of its unit in declaration order, `inputs` the
    /// outputs of segment `s - 1` (none for the first), as fresh leaves in the same order. The last
    /// segment returns the mean loss.
    fn forward(&self, s: usize, params: &[Tensor], inputs: &[Tensor], batch: &Batch) -> Result<Vec<Tensor>, TchError>;
    /// Forward FLOPs of segment `s` for a batch of `shape` (matrix products counted as 2·m·n·k,
    /// attention in full as PaLM counts it; backward is about twice this). Three times their sum
    /// over the segments is `ModelSpec::train_flops_per_input_token` per token, less the small
    /// terms that count parameters outside matrix products (biases, norms).
    fn forward_flops(&self, s: usize, shape: &Shape) -> f64;
    /// Where its layers leave the weights' gradients: the engine places them only for models whose
    /// layers take a place.
    fn weight_grads(&self) -> WeightGrads {
        WeightGrads::Returned
    }
}

/// Builds the model of a preset. Building declares shapes only: nothing is allocated. Fails for
/// dimensions no model can have (none of the presets).
pub fn build(spec: &ModelSpec) -> Result<Box<dyn Model>, String> {
    Ok(match spec {
        ModelSpec::Gpt2(d) => Box::new(gpt2::Gpt2::new(*d)),
        ModelSpec::T5(d) => Box::new(t5::T5::new(*d)),
        ModelSpec::Llama(d) => Box::new(llama::Llama::new(*d)?),
        ModelSpec::Mlp(d) => Box::new(mlp::Mlp::new(*d)),
    })
}

/// Fills a unit's parameters with their initial values (fp32, flat, on `device`), deterministically
/// from `seed` and the unit's index, whatever the number of ranks: every rank computes the same
/// values, and a run on one rank starts from the same model as a run on many. (The CPU and CUDA
/// generators differ, so the values depend on the device type.)
pub fn init_unit(unit: &UnitDef, index: usize, seed: u64, device: tch::Device) -> Result<Tensor, TchError> {
    let _guard = tch::no_grad_guard();
    let unit_seed = seed.wrapping_mul(1_000_003).wrapping_add(index as u64);
    with_seed(unit_seed, || init_params(unit, device))
}

/// libtorch's generators are global: seeding and drawing happen under one lock, so threads (tests)
/// that draw random numbers cannot interleave with each other.
pub fn with_seed<T>(seed: u64, f: impl FnOnce() -> T) -> T {
    static RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _lock = RNG.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    tch::manual_seed(i64::from_ne_bytes(seed.to_ne_bytes()) & i64::MAX);
    f()
}

fn init_params(unit: &UnitDef, device: tch::Device) -> Result<Tensor, TchError> {
    let parts = unit
        .params
        .iter()
        .map(|p| {
            let n = i64::try_from(p.numel()).expect("small");
            let opts = (Kind::Float, device);
            match p.init {
                Init::Normal(std) => Tensor::f_randn([n], opts)?.f_mul_scalar(std),
                Init::Zeros => Tensor::f_zeros([n], opts),
                Init::Ones => Tensor::f_ones([n], opts),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    Tensor::f_cat(&parts, 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerobench_schema::ModelPreset;

    /// A replayed step's batch lands in the captured one's tensors: values copied, the same
    /// memory left alone, another shape or a missing decoder input refused.
    #[test]
    fn a_batch_copies_into_another() {
        let ids = |v: &[i64]| Tensor::from_slice(v).view([1, -1]);
        let fixed = Batch { input: ids(&[0, 0, 0]), target: ids(&[0, 0]), decoder_input: Some(ids(&[0, 0])) };
        let fresh = Batch { input: ids(&[1, 2, 3]), target: ids(&[4, 5]), decoder_input: Some(ids(&[6, 7])) };
        fixed.copy_from(&fresh).unwrap();
        assert!(fixed.input.equal(&fresh.input) && fixed.target.equal(&fresh.target));
        assert!(fixed.decoder_input.as_ref().unwrap().equal(fresh.decoder_input.as_ref().unwrap()));
        let same = fixed.shallow_clone();
        fixed.copy_from(&same).unwrap();
        assert_eq!(same.input.data_ptr(), fixed.input.data_ptr());
        let longer = Batch { input: ids(&[1, 2, 3, 4]), ..fresh.shallow_clone() };
        assert!(fixed.copy_from(&longer).is_err());
        let without = Batch { decoder_input: None, ..fresh.shallow_clone() };
        assert!(fixed.copy_from(&without).is_err());
    }

    /// The worker's models have exactly the parameters the schema's closed forms give, unit by
    /// unit, so memory predictions and logs agree with what trains; every unit is used by a
    /// segment, the segments use the units in the schema's order, and the first segment reads the
    /// batch.
    #[test]
    fn units_match_the_schema() {
        for &preset in ModelPreset::ALL {
            let spec = preset.spec();
            let model = build(&spec).unwrap();
            let want = spec.units();
            assert_eq!(model.units().len(), want.len(), "{preset}");
            for (u, w) in model.units().iter().zip(&want) {
                assert_eq!(u.name, w.name, "{preset}");
                assert_eq!(u.numel() as u64, w.params, "{preset} {}", u.name);
            }
            for (i, _) in model.units().iter().enumerate() {
                assert!(model.segments().iter().any(|s| s.unit == i), "{preset}: unit {i} is used");
            }
            // The planner's stage-3 gathers follow the schema's segment order.
            let segments: Vec<usize> = model.segments().iter().map(|s| s.unit).collect();
            assert_eq!(segments, spec.segment_units(), "{preset}");
        }
    }

    /// The per-segment counts behind `--profile-step` add up to the schema's count per token
    /// (which also counts the parameters outside matrix products: biases, norms, T5's
    /// position-bias tables).
    #[test]
    fn segment_flops_add_up_to_the_schema() {
        for &preset in ModelPreset::ALL {
            let spec = preset.spec();
            let model = build(&spec).unwrap();
            let seq_len = spec.default_seq_len();
            for target_len in [seq_len, zerobench_schema::config::default_target_len(seq_len)] {
                let shape = Shape { sequences: 3, seq_len: u64::from(seq_len), target_len: u64::from(target_len) };
                let forward: f64 = (0..model.segments().len()).map(|s| model.forward_flops(s, &shape)).sum();
                let per_token = 3.0 * forward / shape.tokens();
                let want = spec.train_flops_per_input_token(seq_len, target_len);
                let rel = (per_token - want).abs() / want;
                assert!(rel < 0.01, "{preset} at {seq_len}/{target_len}: {per_token} vs {want}");
            }
        }
    }

    /// Every unit's parameters as fp64 leaves, initialised as the engine does.
    fn leaves(model: &dyn Model) -> Vec<Vec<Tensor>> {
        model
            .units()
            .iter()
            .enumerate()
            .map(|(i, u)| {
                let flat = init_unit(u, i, 5, tch::Device::Cpu).unwrap().to_kind(Kind::Double);
                let mut offset = 0;
                u.params
                    .iter()
                    .map(|p| {
                        let n = p.numel() as i64;
                        let t = flat.narrow(0, offset, n).view(p.shape.as_slice()).detach().set_requires_grad(true);
                        offset += n;
                        t
                    })
                    .collect()
            })
            .collect()
    }

    fn take_grads(params: &[Vec<Tensor>]) -> Vec<Tensor> {
        params
            .iter()
            .flatten()
            .map(|p| {
                let g = p.grad().copy();
                crate::runtime::shim::clear_grad(p).unwrap();
                g
            })
            .collect()
    }

    /// The trainer's protocol (each segment from fresh leaves, backward segment by segment from
    /// the next one's input gradients) gives every parameter the gradient of one autograd pass over
    /// the whole model: nothing a segment hands on (T5's pass-through encoder output and position
    /// biases included) loses its gradient.
    #[test]
    fn segmented_backward_equals_whole_backward() {
        let batches = |preset: ModelPreset| -> crate::model::Batch {
            let cfg = zerobench_schema::RunConfig {
                seq_len: 12,
                target_len: None,
                ..zerobench_schema::RunConfig::new(preset, zerobench_schema::ZeroStage::Z0)
            };
            let task = crate::data::Task::of(&cfg);
            let source = crate::data::Source::open(None, preset.spec().vocab(), &task, false).unwrap();
            crate::data::Data::new(source, task, 1, 2, 1, 1, 0, tch::Device::Cpu).batch(0, 0).unwrap()
        };
        for preset in [ModelPreset::Tiny, ModelPreset::TinyT5, ModelPreset::TinyLlama, ModelPreset::Mlp] {
            let model = build(&preset.spec()).unwrap();
            let params = leaves(model.as_ref());
            let batch = batches(preset);
            let n = model.segments().len();
            let unit = |s: usize| &params[model.segments()[s].unit];

            let mut state: Vec<Tensor> = Vec::new();
            for s in 0..n {
                state = model.forward(s, unit(s), &state, &batch).unwrap();
            }
            state[0].backward();
            let whole = take_grads(&params);

            let (mut inputs, mut outputs): (Vec<Vec<Tensor>>, Vec<Vec<Tensor>>) = (Vec::new(), Vec::new());
            for s in 0..n {
                let leaves: Vec<Tensor> = outputs.last().map_or(Vec::new(), |o: &Vec<Tensor>| {
                    o.iter().map(|t| t.detach().set_requires_grad(true)).collect()
                });
                outputs.push(model.forward(s, unit(s), &leaves, &batch).unwrap());
                inputs.push(leaves);
            }
            outputs[n - 1][0].backward();
            for s in (0..n - 1).rev() {
                let grads: Vec<Tensor> = inputs[s + 1].iter().map(Tensor::grad).collect();
                let outs: Vec<&Tensor> = outputs[s].iter().collect();
                crate::runtime::shim::backward(&outs, &grads.iter().collect::<Vec<_>>()).unwrap();
            }
            let segmented = take_grads(&params);

            for (i, (a, b)) in whole.iter().zip(&segmented).enumerate() {
                assert!(a.abs().max().double_value(&[]) > 0.0, "{preset}: parameter {i} gets a gradient");
                assert!(a.allclose(b, 1e-9, 1e-12, false), "{preset}: parameter {i}");
            }
        }
    }

    #[test]
    fn init_is_deterministic_per_unit() {
        let model = build(&ModelPreset::Tiny.spec()).unwrap();
        let a = init_unit(&model.units()[1], 1, 7, tch::Device::Cpu).unwrap();
        let b = init_unit(&model.units()[1], 1, 7, tch::Device::Cpu).unwrap();
        let c = init_unit(&model.units()[1], 1, 8, tch::Device::Cpu).unwrap();
        assert!(a.equal(&b));
        assert!(!a.equal(&c));
    }
}
