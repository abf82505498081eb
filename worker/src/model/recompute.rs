//! GPT-2's layer norms and MLP as autograd nodes that keep less for the backward pass and
//! recompute the rest from it.
//!
//! Composed of libtorch operations, a GPT-2 block keeps, for its backward pass, both normalised
//! inputs (each saved by the linear layer after it) and the GELU's output (saved by the MLP's
//! second linear layer): `2 + 2 + 8` bytes per token and model dimension in 16-bit precision, on
//! top of the layer norms' inputs, which the residual stream keeps anyway. Here
//! `linear(layer_norm(x))` keeps `x` and recomputes the normalised `x` in its backward pass, and
//! the MLP (`linear(gelu_tanh(linear(layer_norm(x))))`) keeps `x` and the GELU's input and
//! recomputes both the normalised `x` and the GELU's output. For gpt2-xl at micro-batch 4 and
//! sequence 1024 that is `12 · 4096 · 1600 · 48` bytes, 3.8 GB of activations, for two
//! layer-norm and one GELU forward kernel more per block in the backward pass (memory-bound,
//! reading and writing what they did in the forward pass). torch.compile's partitioner makes the
//! same trade for pointwise operations.
//!
//! Measured on one H100, each build in the same call (bf16, sequence 1024; with the LM head's
//! in-place gradient sum of the same change): gpt2-xl at micro-batch 4 peaks at 30.3 GiB
//! instead of 34.5 at stage 0 and its step takes 2.1-3.1% longer; gpt2 at micro-batch 16, 5.6
//! GiB instead of 7.6, 2.8-3.8% longer (`bench/results/gpu-2026-11-26-recompute-h100x1.json`).
//!
//! The recomputation runs the forward pass's kernels on the same inputs, so it gives the same
//! bits; the gradients are the products and reductions autograd computes for the composed
//! operations (tested against them below, values and every gradient). tch has no custom autograd
//! functions: the nodes are C++ (`torch::autograd::Function`) in the shim, whose safe wrappers
//! this module names for the models.

/// The attention's output projection goes through a node of the shim too (`linear`): it
/// recomputes nothing, but its bias gradient is the same column-sum kernel as the nodes' on CUDA
/// (`super::recompute_cuda`).
pub use crate::runtime::shim::{linear, ln_gelu_mlp, ln_linear, LnMlpParams};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::shim;
    use tch::{Device, Kind, Tensor};

    const EPS: f64 = 1e-5;

    /// Leaves of `shape` drawn from a fixed seed, in fp64 (the comparisons are then exact up to
    /// the order of the sums).
    fn leaves(shapes: &[&[i64]], seed: i64) -> Vec<Tensor> {
        tch::manual_seed(seed);
        shapes.iter().map(|s| Tensor::randn(*s, (Kind::Double, Device::Cpu)).set_requires_grad(true)).collect()
    }

    fn assert_close(what: &str, got: &Tensor, want: &Tensor) {
        assert_eq!(got.size(), want.size(), "{what}: shape");
        let err = (got - want).abs().max().double_value(&[]);
        let scale = want.abs().max().double_value(&[]).max(1.0);
        assert!(err <= 1e-12 * scale, "{what}: off by {err} (largest value {scale})");
    }

    /// The node against the composed operations on leaves of `shapes` (x first, then the inputs
    /// `names` name): the output, then, after backward from `upstream` (the output's shape
    /// and a fixed seed when `None`), every input's gradient.
    fn matches_composed(
        shapes: &[&[i64]],
        names: &[&str],
        upstream: Option<Tensor>,
        node: impl Fn(&[Tensor]) -> Tensor,
        composed: impl Fn(&[Tensor]) -> Tensor,
    ) {
        let ours = leaves(shapes, 1);
        // Fresh leaves of the same values, so each side collects its own gradients.
        let theirs: Vec<Tensor> = ours.iter().map(|t| t.detach().copy().set_requires_grad(true)).collect();
        let (y, want) = (node(&ours), composed(&theirs));
        assert_close("value", &y, &want);
        let g = upstream.unwrap_or_else(|| {
            tch::manual_seed(99);
            Tensor::randn(y.size(), (Kind::Double, Device::Cpu))
        });
        shim::backward(&[&y], &[&g]).unwrap();
        shim::backward(&[&want], &[&g]).unwrap();
        for (name, (a, b)) in names.iter().zip(ours.iter().zip(&theirs)) {
            assert_close(name, &a.grad(), &b.grad());
        }
    }

    fn composed_ln_linear(t: &[Tensor]) -> Tensor {
        t[0].layer_norm([8], Some(&t[1]), Some(&t[2]), EPS, false).linear(&t[3], Some(&t[4]))
    }

    #[test]
    fn ln_linear_matches_the_composed_operations_and_their_gradients() {
        // x: [batch 2, seq 3, d 8]; w: [5, 8].
        matches_composed(
            &[&[2, 3, 8], &[8], &[8], &[5, 8], &[5]],
            &["x", "gamma", "beta", "w", "b"],
            None,
            |t| ln_linear(&t[0], &t[1], &t[2], &t[3], &t[4], EPS).unwrap(),
            composed_ln_linear,
        );
    }

    #[test]
    fn ln_gelu_mlp_matches_the_composed_operations_and_their_gradients() {
        // x: [2, 3, 8]; the MLP widens to 16 and returns to 8.
        matches_composed(
            &[&[2, 3, 8], &[8], &[8], &[16, 8], &[16], &[8, 16], &[8]],
            &["x", "gamma", "beta", "w1", "b1", "w2", "b2"],
            None,
            |t| ln_gelu_mlp(&t[0], [&t[1], &t[2], &t[3], &t[4], &t[5], &t[6]], EPS).unwrap(),
            |t| {
                t[0].layer_norm([8], Some(&t[1]), Some(&t[2]), EPS, false)
                    .linear(&t[3], Some(&t[4]))
                    .gelu("tanh")
                    .linear(&t[5], Some(&t[6]))
            },
        );
    }

    #[test]
    fn linear_matches_the_composed_operation_and_its_gradients() {
        matches_composed(
            &[&[2, 3, 8], &[5, 8], &[5]],
            &["x", "w", "b"],
            None,
            |t| linear(&t[0], &t[1], &t[2]).unwrap(),
            |t| t[0].linear(&t[1], Some(&t[2])),
        );
    }

    #[test]
    fn the_nodes_take_an_upstream_gradient_that_is_not_contiguous() {
        // The engine hands each segment its upstream gradient as the next segment produced it.
        tch::manual_seed(5);
        let g = Tensor::randn([2, 3, 5], (Kind::Double, Device::Cpu)).transpose(0, 1);
        assert!(!g.is_contiguous());
        matches_composed(
            &[&[3, 2, 8], &[8], &[8], &[5, 8], &[5]],
            &["x", "gamma", "beta", "w", "b"],
            Some(g),
            |t| ln_linear(&t[0], &t[1], &t[2], &t[3], &t[4], EPS).unwrap(),
            composed_ln_linear,
        );
    }

    /// A flat buffer of `n` elements, each `fill`, in fp64 on the CPU.
    fn flat(n: i64, fill: f64) -> Tensor {
        Tensor::full([n], fill, (Kind::Double, Device::Cpu))
    }

    #[test]
    fn placed_weight_gradients_land_in_the_buffer_and_not_in_grad() {
        // The MLP's two weights placed at offsets 3 and 3 + 128 of one buffer; the rest of the
        // inputs' gradients reach .grad as before.
        let shapes: [&[i64]; 7] = [&[2, 3, 8], &[8], &[8], &[16, 8], &[16], &[8, 16], &[8]];
        let mlp = |t: &[Tensor]| ln_gelu_mlp(&t[0], [&t[1], &t[2], &t[3], &t[4], &t[5], &t[6]], EPS).unwrap();
        let (ours, theirs) = (leaves(&shapes, 1), leaves(&shapes, 1));
        let g = Tensor::randn([2, 3, 8], (Kind::Double, Device::Cpu));
        for accumulate in [false, true] {
            let buf = flat(3 + 128 + 128 + 2, 0.5);
            shim::grad_into(&ours[3], &buf, 3, accumulate).unwrap();
            shim::grad_into(&ours[5], &buf, 3 + 128, accumulate).unwrap();
            shim::backward(&[&mlp(&ours)], &[&g]).unwrap();
            shim::backward(&[&mlp(&theirs)], &[&g]).unwrap();
            assert!(shim::grad_taken(&ours[3]).unwrap() && shim::grad_taken(&ours[5]).unwrap());
            // Taking ends the placement: a second call finds none.
            assert!(!shim::grad_taken(&ours[3]).unwrap());
            let base = if accumulate { 0.5 } else { 0.0 };
            for (i, off, n) in [(3, 3, 128), (5, 3 + 128, 128)] {
                assert!(!ours[i].grad().defined(), "input {i}: a placed gradient also reached .grad");
                let want = theirs[i].grad().reshape([-1]) + base;
                assert_close(&format!("input {i} in place"), &buf.narrow(0, off, n), &want);
                let _ = theirs[i].grad().zero_();
            }
            // Around the places the buffer is as it was.
            assert_close("before", &buf.narrow(0, 0, 3), &flat(3, 0.5));
            assert_close("after", &buf.narrow(0, 3 + 256, 2), &flat(2, 0.5));
            for i in [0, 1, 2, 4, 6] {
                assert_close(&format!("input {i}"), &ours[i].grad(), &theirs[i].grad());
                let _ = ours[i].grad().zero_();
                let _ = theirs[i].grad().zero_();
            }
        }
    }

    #[test]
    fn a_weight_used_twice_sums_both_uses_in_its_place() {
        // y = linear(ln_linear(x, w), w): the first node to write replaces what the buffer held,
        // the second adds to it.
        let shapes: [&[i64]; 5] = [&[2, 3, 8], &[8], &[8], &[8, 8], &[8]];
        let twice = |t: &[Tensor]| {
            let h = ln_linear(&t[0], &t[1], &t[2], &t[3], &t[4], EPS).unwrap();
            linear(&h, &t[3], &t[4]).unwrap()
        };
        let (ours, theirs) = (leaves(&shapes, 2), leaves(&shapes, 2));
        let buf = flat(64, 7.0);
        shim::grad_into(&ours[3], &buf, 0, false).unwrap();
        let g = Tensor::ones([2, 3, 8], (Kind::Double, Device::Cpu));
        shim::backward(&[&twice(&ours)], &[&g]).unwrap();
        shim::backward(&[&twice(&theirs)], &[&g]).unwrap();
        assert!(shim::grad_taken(&ours[3]).unwrap());
        assert!(!ours[3].grad().defined());
        assert_close("w in place", &buf, &theirs[3].grad().reshape([-1]));
    }

    #[test]
    fn a_place_that_does_not_suit_the_parameter_is_refused() {
        let w = leaves(&[&[4, 8]], 3).remove(0);
        let short = shim::grad_into(&w, &flat(40, 0.0), 10, false).unwrap_err();
        assert!(short.to_string().contains("lie past the buffer"), "{short}");
        let float = Tensor::zeros([32], (Kind::Float, Device::Cpu));
        let kind = shim::grad_into(&w, &float, 0, false).unwrap_err();
        assert!(kind.to_string().contains("kind or device"), "{kind}");
        let matrix = Tensor::zeros([4, 8], (Kind::Double, Device::Cpu));
        let flatness = shim::grad_into(&w, &matrix, 0, false).unwrap_err();
        assert!(flatness.to_string().contains("not flat"), "{flatness}");
        // Nothing was placed.
        assert!(!shim::grad_taken(&w).unwrap());
    }

    #[test]
    fn a_shape_mismatch_is_an_error_not_a_crash() {
        let t = leaves(&[&[2, 3, 8], &[8], &[8], &[5, 7], &[5]], 4);
        let err = ln_linear(&t[0], &t[1], &t[2], &t[3], &t[4], EPS).unwrap_err();
        assert!(err.to_string().contains("mat"), "{err}");
    }
}
