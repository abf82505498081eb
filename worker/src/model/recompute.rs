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
//! functions: the nodes are C++ (`torch::autograd::Function`) in the shim.

use tch::{TchError, Tensor};

use crate::runtime::shim;

/// `linear(layer_norm(x, gamma, beta, eps), w, b)` over the last dimension.
pub fn ln_linear(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    w: &Tensor,
    b: &Tensor,
    eps: f64,
) -> Result<Tensor, TchError> {
    shim::ln_linear(x, gamma, beta, w, b, eps).map_err(|e| TchError::Torch(e.0))
}

/// `linear(gelu_tanh(linear(layer_norm(x, gamma, beta, eps), w1, b1)), w2, b2)` over the last
/// dimension; `params` is `[gamma, beta, w1, b1, w2, b2]`.
pub fn ln_gelu_mlp(x: &Tensor, params: shim::LnMlpParams<'_>, eps: f64) -> Result<Tensor, TchError> {
    shim::ln_gelu_mlp(x, params, eps).map_err(|e| TchError::Torch(e.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    const EPS: f64 = 1e-5;

    /// Leaves of `shape` drawn from a fixed seed, in fp64 (the comparisons are then exact up to
    /// the order of the sums).
    fn leaves(shapes: &[&[i64]], seed: i64) -> Vec<Tensor> {
        tch::manual_seed(seed);
        shapes.iter().map(|s| Tensor::randn(*s, (Kind::Double, Device::Cpu)).set_requires_grad(true)).collect()
    }

    /// Copies of `ts` that are fresh leaves, so each side collects its own gradients.
    fn twins(ts: &[Tensor]) -> Vec<Tensor> {
        ts.iter().map(|t| t.detach().copy().set_requires_grad(true)).collect()
    }

    /// Backward from `y` with a fixed, non-uniform upstream gradient; the gradients of `ts`.
    fn grads(y: &Tensor, ts: &[Tensor]) -> Vec<Tensor> {
        tch::manual_seed(99);
        let g = Tensor::randn(y.size(), (Kind::Double, Device::Cpu));
        shim::backward(&[y], &[&g]).unwrap();
        ts.iter().map(|t| t.grad()).collect()
    }

    fn assert_close(what: &str, got: &Tensor, want: &Tensor) {
        assert_eq!(got.size(), want.size(), "{what}: shape");
        let err = (got - want).abs().max().double_value(&[]);
        let scale = want.abs().max().double_value(&[]).max(1.0);
        assert!(err <= 1e-12 * scale, "{what}: off by {err} (largest value {scale})");
    }

    #[test]
    fn ln_linear_matches_the_composed_operations_and_their_gradients() {
        // x: [batch 2, seq 3, d 8]; w: [5, 8].
        let ours = leaves(&[&[2, 3, 8], &[8], &[8], &[5, 8], &[5]], 1);
        let theirs = twins(&ours);
        let y = ln_linear(&ours[0], &ours[1], &ours[2], &ours[3], &ours[4], EPS).unwrap();
        let t = &theirs;
        let want = t[0].layer_norm([8], Some(&t[1]), Some(&t[2]), EPS, false).linear(&t[3], Some(&t[4]));
        assert_close("value", &y, &want);
        let (g, gw) = (grads(&y, &ours), grads(&want, theirs.as_slice()));
        for (name, (a, b)) in ["x", "gamma", "beta", "w", "b"].iter().zip(g.iter().zip(&gw)) {
            assert_close(name, a, b);
        }
    }

    #[test]
    fn ln_gelu_mlp_matches_the_composed_operations_and_their_gradients() {
        // x: [2, 3, 8]; the MLP widens to 16 and returns to 8.
        let ours = leaves(&[&[2, 3, 8], &[8], &[8], &[16, 8], &[16], &[8, 16], &[8]], 2);
        let theirs = twins(&ours);
        let o = &ours;
        let y = ln_gelu_mlp(&o[0], [&o[1], &o[2], &o[3], &o[4], &o[5], &o[6]], EPS).unwrap();
        let t = &theirs;
        let want = t[0]
            .layer_norm([8], Some(&t[1]), Some(&t[2]), EPS, false)
            .linear(&t[3], Some(&t[4]))
            .gelu("tanh")
            .linear(&t[5], Some(&t[6]));
        assert_close("value", &y, &want);
        let (g, gw) = (grads(&y, &ours), grads(&want, theirs.as_slice()));
        for (name, (a, b)) in ["x", "gamma", "beta", "w1", "b1", "w2", "b2"].iter().zip(g.iter().zip(&gw)) {
            assert_close(name, a, b);
        }
    }

    #[test]
    fn the_nodes_take_an_upstream_gradient_that_is_not_contiguous() {
        // The engine hands each segment its upstream gradient as the next segment produced it.
        let ours = leaves(&[&[3, 2, 8], &[8], &[8], &[5, 8], &[5]], 3);
        let theirs = twins(&ours);
        let y = ln_linear(&ours[0], &ours[1], &ours[2], &ours[3], &ours[4], EPS).unwrap();
        let t = &theirs;
        let want = t[0].layer_norm([8], Some(&t[1]), Some(&t[2]), EPS, false).linear(&t[3], Some(&t[4]));
        tch::manual_seed(5);
        let g = Tensor::randn([2, 3, 5], (Kind::Double, Device::Cpu)).transpose(0, 1);
        assert!(!g.is_contiguous());
        shim::backward(&[&y], &[&g]).unwrap();
        shim::backward(&[&want], &[&g]).unwrap();
        for (name, (a, b)) in ["x", "gamma", "beta", "w", "b"].iter().zip(ours.iter().zip(&theirs)) {
            assert_close(name, &a.grad(), &b.grad());
        }
    }

    #[test]
    fn a_shape_mismatch_is_an_error_not_a_crash() {
        let t = leaves(&[&[2, 3, 8], &[8], &[8], &[5, 7], &[5]], 4);
        let err = ln_linear(&t[0], &t[1], &t[2], &t[3], &t[4], EPS).unwrap_err();
        assert!(err.to_string().contains("mat"), "{err}");
    }
}
