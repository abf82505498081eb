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
//! sequence 1024 that is `12 · 4096 · 1600 · 48` bytes, 3.8 GB of activations. On CUDA the
//! recomputation costs no kernel of its own: the layer norm's backward kernel, which reads `x`
//! anyway, writes the normalised `x` again from the forward pass's mean and reciprocal deviation
//! (kept: 8 bytes a row), and the GELU's gradient kernel, which reads the GELU's input anyway,
//! writes the GELU's output. torch.compile's partitioner makes the same trade for pointwise
//! operations.
//!
//! Measured on one H100, each build in the same call (bf16, sequence 1024; with the LM head's
//! in-place gradient sum of the same change): gpt2-xl at micro-batch 4 peaks at 30.3 GiB
//! instead of 34.5 at stage 0 and its step takes 2.1-3.1% longer; gpt2 at micro-batch 16, 5.6
//! GiB instead of 7.6, 2.8-3.8% longer (`bench/results/gpu-2026-11-26-recompute-h100x1.json`).
//!
//! The recomputation computes each element with the forward kernel's function from the same
//! values, so it gives the same bits (the GPU self-check holds it); the gradients are the
//! products and reductions autograd computes for the composed operations (tested against them
//! below, values and every gradient). tch has no custom autograd
//! functions: the nodes are C++ (`torch::autograd::Function`) in the shim, whose safe wrappers
//! this module names for the models.

/// The attention's output projection with its residual addition goes through a node of the shim
/// too (`residual_linear`): it recomputes nothing, but its bias gradient is the same column-sum
/// kernel as the nodes' on CUDA (`super::recompute_cuda`), and on 16-bit CUDA tensors the residual
/// is added in the product's epilogue (`super::products_cuda`), as in the MLP's node. Its residual
/// is `ln_linear`'s last output (x passed on), so the residual's gradient joins x's in the layer
/// norm's backward kernel, as the MLP node's own residual's does.
pub use crate::runtime::shim::{ln_linear, residual_linear, residual_ln_gelu_mlp, LnLinear, LnMlpParams};

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

    /// Two sets of leaves of the same values, each collecting its own gradients: copies, since the
    /// generator `leaves` seeds is the process's, which tests on other threads draw from too.
    fn twin_leaves(shapes: &[&[i64]], seed: i64) -> (Vec<Tensor>, Vec<Tensor>) {
        let ours = leaves(shapes, seed);
        let theirs = ours.iter().map(|t| t.detach().copy().set_requires_grad(true)).collect();
        (ours, theirs)
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
        let (ours, theirs) = twin_leaves(shapes, 1);
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
            |t| ln_linear(&t[0], &t[1], &t[2], &t[3], &t[4], EPS, 1).unwrap().y.remove(0),
            composed_ln_linear,
        );
    }

    #[test]
    fn residual_ln_gelu_mlp_matches_the_composed_operations_and_their_gradients() {
        // x: [2, 3, 8]; the MLP widens to 16 and returns to 8, and x is added to its output (x's
        // gradient is then the layer norm's plus the residual's).
        matches_composed(
            &[&[2, 3, 8], &[8], &[8], &[16, 8], &[16], &[8, 16], &[8]],
            &["x", "gamma", "beta", "w1", "b1", "w2", "b2"],
            None,
            |t| residual_ln_gelu_mlp(&t[0], [&t[1], &t[2], &t[3], &t[4], &t[5], &t[6]], EPS).unwrap(),
            |t| {
                &t[0]
                    + t[0]
                        .layer_norm([8], Some(&t[1]), Some(&t[2]), EPS, false)
                        .linear(&t[3], Some(&t[4]))
                        .gelu("tanh")
                        .linear(&t[5], Some(&t[6]))
            },
        );
    }

    #[test]
    fn residual_linear_matches_the_composed_operation_and_its_gradients() {
        // res: [2, 3, 5]; x: [2, 3, 8]; w: [5, 8].
        matches_composed(
            &[&[2, 3, 5], &[2, 3, 8], &[5, 8], &[5]],
            &["res", "x", "w", "b"],
            None,
            |t| residual_linear(&t[0], &t[1], &t[2], &t[3]).unwrap(),
            |t| &t[0] + t[1].linear(&t[2], Some(&t[3])),
        );
    }

    #[test]
    fn ln_linear_passes_x_on_and_sums_its_gradient_with_the_layer_norms() {
        // The attention sub-block as GPT-2 joins it: the residual taken from ln_linear's second
        // output, added after a product of the first. x's gradient is the layer norm's plus the
        // residual's; the node's backward must add the second (dropping it fails the x check).
        // x: [2, 3, 8]; w: [5, 8]; w2: [8, 5].
        matches_composed(
            &[&[2, 3, 8], &[8], &[8], &[5, 8], &[5], &[8, 5], &[8]],
            &["x", "gamma", "beta", "w", "b", "w2", "b2"],
            None,
            |t| {
                let o = ln_linear(&t[0], &t[1], &t[2], &t[3], &t[4], EPS, 1).unwrap();
                assert_eq!(o.residual.data_ptr(), t[0].data_ptr(), "x is passed on, not copied");
                residual_linear(&o.residual, &o.y[0], &t[5], &t[6]).unwrap()
            },
            |t| &t[0] + composed_ln_linear(t).linear(&t[5], Some(&t[6])),
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
            |t| ln_linear(&t[0], &t[1], &t[2], &t[3], &t[4], EPS, 1).unwrap().y.remove(0),
            composed_ln_linear,
        );
    }

    /// A flat buffer of `n` elements, each `fill`, in fp64 on the CPU.
    fn flat(n: i64, fill: f64) -> Tensor {
        Tensor::full([n], fill, (Kind::Double, Device::Cpu))
    }

    #[test]
    fn placed_weight_gradients_land_in_the_buffer_and_not_in_grad() {
        // The MLP's seven inputs as one unit's parameters, back to back in a flat buffer from
        // element 3 on; its two weights (inputs 3 and 5) placed. Moving the gradients in leaves the
        // placed ones as the nodes wrote them and copies the others, in two runs around them.
        let shapes: [&[i64]; 7] = [&[2, 3, 8], &[8], &[8], &[16, 8], &[16], &[8, 16], &[8]];
        let numels: Vec<usize> = shapes.iter().map(|s| s.iter().product::<i64>() as usize).collect();
        let offsets: Vec<usize> = numels.iter().scan(3, |o, n| Some(std::mem::replace(o, *o + n))).collect();
        let end = offsets[6] + numels[6];
        let mlp = |t: &[Tensor]| residual_ln_gelu_mlp(&t[0], [&t[1], &t[2], &t[3], &t[4], &t[5], &t[6]], EPS).unwrap();
        let (ours, theirs) = twin_leaves(&shapes, 1);
        let g = Tensor::randn([2, 3, 8], (Kind::Double, Device::Cpu));
        shim::backward(&[&mlp(&theirs)], &[&g]).unwrap();
        let want = Tensor::cat(&theirs.iter().map(|t| t.grad().reshape([-1])).collect::<Vec<_>>(), 0);
        for add in [false, true] {
            let buf = flat(end as i64 + 2, 0.5);
            for i in [3, 5] {
                shim::grad_into(&ours[i], &buf, offsets[i], add).unwrap();
            }
            shim::backward(&[&mlp(&ours)], &[&g]).unwrap();
            for (i, p) in ours.iter().enumerate() {
                assert_eq!(p.grad().defined(), i != 3 && i != 5, "input {i}: .grad after a placed backward");
            }
            assert_eq!(shim::take_grads(&ours, &offsets, &buf, add).unwrap(), 2);
            assert!(ours.iter().all(|p| !p.grad().defined()), "every .grad is dropped");
            let base = if add { 0.5 } else { 0.0 };
            assert_close("the unit's gradients", &buf.narrow(0, 3, end as i64 - 3), &(&want + base));
            // Around the unit the buffer is as it was.
            assert_close("before", &buf.narrow(0, 0, 3), &flat(3, 0.5));
            assert_close("after", &buf.narrow(0, end as i64, 2), &flat(2, 0.5));
            // Taking ends the places: another backward returns every gradient to .grad.
            shim::backward(&[&mlp(&ours)], &[&g]).unwrap();
            assert!(ours.iter().all(|p| p.grad().defined()));
            assert_eq!(shim::take_grads(&ours, &offsets, &buf, false).unwrap(), 0);
            assert_close("nothing placed", &buf.narrow(0, 3, end as i64 - 3), &want);
        }
    }

    #[test]
    fn a_weight_used_twice_sums_both_uses_in_its_place() {
        // y = residual_linear(x, ln_linear(x, w), w) + x·w: the first node to write replaces what
        // the buffer held, the second adds to it, and the plain product's share reaches .grad and
        // is added when the gradients are moved in.
        let shapes: [&[i64]; 5] = [&[2, 3, 8], &[8], &[8], &[8, 8], &[8]];
        let twice = |t: &[Tensor]| {
            let h = ln_linear(&t[0], &t[1], &t[2], &t[3], &t[4], EPS, 1).unwrap().y.remove(0);
            residual_linear(&t[0], &h, &t[3], &t[4]).unwrap() + t[0].matmul(&t[3])
        };
        let (ours, theirs) = twin_leaves(&shapes, 2);
        let buf = flat(64, 7.0);
        shim::grad_into(&ours[3], &buf, 0, false).unwrap();
        let g = Tensor::ones([2, 3, 8], (Kind::Double, Device::Cpu));
        shim::backward(&[&twice(&ours)], &[&g]).unwrap();
        shim::backward(&[&twice(&theirs)], &[&g]).unwrap();
        assert!(ours[3].grad().defined(), "the plain product's share");
        assert_eq!(shim::take_grads(&ours[3..4], &[0], &buf, false).unwrap(), 1);
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
        // Nothing was placed: the gradient (none) is moved in as zeros.
        let buf = flat(32, 1.0);
        assert_eq!(shim::take_grads(std::slice::from_ref(&w), &[0], &buf, false).unwrap(), 0);
        assert_close("zeros", &buf, &flat(32, 0.0));
    }

    /// q, k and v as GPT-2 takes them: the three blocks of one product's columns, combined so
    /// that each block's gradient differs (a node that joined them in another order, or dropped
    /// one, fails the w and b checks). `unused`: k goes unused, so its gradient is autograd's zeros.
    fn three_parts(t: &[Tensor], parts: &[Tensor], unused: bool) -> Tensor {
        let (q, k, v) = (&parts[0], &parts[1], &parts[2]);
        let mixed = if unused { q * 2.0 } else { q * k };
        mixed + v.tanh() + t[0].narrow(2, 0, 2)
    }

    #[test]
    fn ln_linear_in_three_parts_joins_their_gradients_and_sums_the_bias_gradient() {
        // x: [2, 3, 8]; w: [6, 8], three blocks of two columns.
        for unused in [false, true] {
            matches_composed(
                &[&[2, 3, 8], &[8], &[8], &[6, 8], &[6]],
                &["x", "gamma", "beta", "w", "b"],
                None,
                |t| {
                    let o = ln_linear(&t[0], &t[1], &t[2], &t[3], &t[4], EPS, 3).unwrap();
                    assert_eq!(o.y.len(), 3);
                    three_parts(t, &o.y, unused)
                },
                |t| three_parts(t, &composed_ln_linear(t).split(2, 2), unused),
            );
        }
    }

    #[test]
    fn a_joined_bias_gradient_lands_in_its_place() {
        // The bias placed in a buffer (as the engine places a unit's): the joined gradient's column
        // sums are written there, and .grad stays empty.
        let shapes: [&[i64]; 5] = [&[2, 3, 8], &[8], &[8], &[6, 8], &[6]];
        let (ours, theirs) = twin_leaves(&shapes, 6);
        let run = |t: &[Tensor]| {
            let o = ln_linear(&t[0], &t[1], &t[2], &t[3], &t[4], EPS, 3).unwrap();
            three_parts(t, &o.y, false)
        };
        let buf = flat(10, 3.0);
        shim::grad_into(&ours[4], &buf, 2, false).unwrap();
        let g = Tensor::randn([2, 3, 2], (Kind::Double, Device::Cpu));
        shim::backward(&[&run(&ours)], &[&g]).unwrap();
        shim::backward(&[&run(&theirs)], &[&g]).unwrap();
        assert!(!ours[4].grad().defined(), "a placed bias gets no .grad");
        assert_eq!(shim::take_grads(&ours[4..5], &[2], &buf, false).unwrap(), 1);
        assert_close("b in place", &buf.narrow(0, 2, 6), &theirs[4].grad());
        assert_close("around it", &buf.narrow(0, 0, 2), &flat(2, 3.0));
    }

    #[test]
    fn a_shape_mismatch_is_an_error_not_a_crash() {
        let t = leaves(&[&[2, 3, 8], &[8], &[8], &[5, 7], &[5]], 4);
        let err = ln_linear(&t[0], &t[1], &t[2], &t[3], &t[4], EPS, 1).unwrap_err();
        assert!(err.to_string().contains("mat"), "{err}");
        // Parts that do not divide the outputs, or none.
        let t = leaves(&[&[2, 3, 8], &[8], &[8], &[5, 8], &[5]], 4);
        for parts in [0, 3] {
            let err = ln_linear(&t[0], &t[1], &t[2], &t[3], &t[4], EPS, parts).unwrap_err();
            assert!(err.to_string().contains(&format!("5 outputs in {parts} parts")), "{err}");
        }
    }
}
