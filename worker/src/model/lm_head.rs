//! The LM head and its loss, without the full logits: logits of the hidden states against the
//! vocabulary's rows, mean cross-entropy against the targets, and both gradients, computed a
//! chunk of tokens at a time.
//!
//! Composed of libtorch operations, the head of GPT-2 at micro-batch 16 holds its logits in bf16,
//! again in fp32 for the loss, and their fp32 gradient: 16 × 1024 × 50304 × (2 + 4 + 4) bytes,
//! 8.2 GB, for a loss of one number. Here the forward pass computes, for each chunk, the logits
//! (one GEMM), the loss and the gradient of the logits in place (one kernel that reads each logit
//! once and writes its gradient once), and from that gradient the gradients of the hidden states
//! and of the weight (two GEMMs). One chunk's logits are alive at a time. This is the approach of
//! llm.c's fused classifier and Liger's fused linear cross-entropy, written for this engine.
//!
//! The gradients reach autograd through an autograd node of the shim (`shim::given_grads`; tch has
//! no custom autograd functions): the returned loss is that node's output, and its backward gives
//! `h` and `W` the gradients `G_h` and `G_W` times the upstream gradient (the trainer's loss
//! multiplier: the fp16 loss scale over the micro-steps and ranks summed), two element-wise
//! products in fp32; `W`'s goes straight into its place where the engine placed its gradient and
//! nothing is there yet (GPT-2's tied embedding then adds its lookups' rows to it,
//! `shim::embedding`). (A surrogate expression, `L + Σ h·G_h − (Σ h·G_h)₀ + …`,
//! did the same with composed operations, for three more passes over the weight each step and
//! the slice of its padded copy's gradient.)
//!
//! What differs from the composed head, and by how much (tested on CPU in fp32 to 1e-5, and on a
//! GPU by `bench/gpu/run.sh selfcheck`):
//! * The loss and the gradient of the logits are computed in fp32 from the 16-bit logits, as
//!   PyTorch's autocast computes cross-entropy; the gradient is rounded to 16 bits for the GEMMs
//!   that follow, as autograd rounds it.
//! * The weight's gradient is the sum over chunks of 16-bit GEMM results, added in fp32, where
//!   autograd rounds one GEMM over all tokens: a few chunks' extra roundings, well within bf16's
//!   resolution of the sum. A single chunk's product is the gradient as it is: no fp32 sum is
//!   held (gpt2-xl at micro-batch 4: 0.30 GiB less at the peak, measured on one H100,
//!   `bench/results/gpu-2026-11-26-head-single-chunk-h100x1.json`).
//! * The head's three GEMMs run in the forward phase (the logged forward time grows and the
//!   backward time shrinks by the same work).
//! * An evaluation (`--eval-every`, forward only under `no_grad`) gets the same loss and pays for
//!   the two gradient GEMMs too; its time is in no step's.
//!
//! The vocabulary is padded to a multiple of 64 inside the GEMMs (GPT-2's 50257 makes them
//! several times slower unaligned); the padding columns never reach the loss.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use tch::{Kind, TchError, Tensor};

use crate::runtime::shim;

/// Rows of the LM-head product are padded to a multiple of this.
const HEAD_ALIGN: i64 = 64;

/// One chunk's logits take at most this many bytes (GPT-2, bf16: 5336 tokens a chunk).
pub const CHUNK_BYTES: i64 = 512 << 20;

/// The head's rows as its products run them: the vocabulary padded to a multiple of 64.
pub fn padded_vocab(v: i64) -> i64 {
    (v + HEAD_ALIGN - 1) / HEAD_ALIGN * HEAD_ALIGN
}

/// Tokens a chunk of the `n` takes: as many as `chunk_bytes` of `v_pad` logits of `elem` bytes
/// each hold, at least one.
pub fn chunk_rows(n: i64, v_pad: i64, elem: i64, chunk_bytes: i64) -> i64 {
    (chunk_bytes / (v_pad * elem).max(1)).clamp(1, n.max(1))
}

/// Targets equal to this are left out of the loss (PyTorch's `ignore_index`).
pub const IGNORE_INDEX: i64 = -100;

/// The loss of the LM head (mean cross-entropy over the targets that are not [`IGNORE_INDEX`]),
/// with gradients for `h` (`[.., d]`) and `w` (`[vocab, d]`) as composed libtorch operations
/// would give them.
pub fn lm_loss(h: &Tensor, w: &Tensor, target: &Tensor) -> Result<Tensor, TchError> {
    lm_loss_chunked(h, w, target, CHUNK_BYTES)
}

/// [`lm_loss`] with chunks of at most `chunk_bytes` of logits (tests use small chunks).
pub fn lm_loss_chunked(h: &Tensor, w: &Tensor, target: &Tensor, chunk_bytes: i64) -> Result<Tensor, TchError> {
    let v = w.size()[0];
    let d = w.size()[1];
    let v_pad = padded_vocab(v);
    let h2 = h.f_reshape([-1, d])?;
    let t = target.f_reshape([-1])?;
    let n = h2.size()[0];
    let rows = chunk_rows(n, v_pad, h2.kind().elt_size_in_bytes() as i64, chunk_bytes);
    let (loss, g_h, g_w) = {
        let _guard = tch::no_grad_guard();
        let hd = h2.detach();
        let wd = if v_pad > v { padded_rows(w, v_pad)? } else { w.detach() };
        // 1 / the targets counted, on the device: reading it on the host would stall the queue.
        let scale = t.f_ne(IGNORE_INDEX)?.f_sum(Kind::Float)?.f_clamp_min(1.0)?.f_reciprocal()?;
        let g_h = Tensor::f_empty_like(&hd)?;
        // The weight's gradient: a single chunk's 16-bit product as it is (its fp32 sum of one
        // term would round back to the same bits), else the fp32 sum of the chunks' products,
        // started from the first (no zeroed buffer to add it to).
        let single = rows >= n;
        let mut g_w: Option<Tensor> = None;
        let mut loss = Tensor::f_zeros([], (Kind::Float, hd.device()))?;
        let mut start = 0;
        while start < n {
            let len = rows.min(n - start);
            let hc = hd.f_narrow(0, start, len)?;
            let tc = t.f_narrow(0, start, len)?;
            let mut logits = Tensor::f_empty([len, v_pad], (hd.kind(), hd.device()))?;
            mm_into(&hc, &wd.f_tr()?, &logits)?;
            let rows_loss = cross_entropy_grad_in_place(&mut logits, &tc, v, &scale)?;
            loss = loss.f_add(&rows_loss.f_sum(Kind::Float)?)?;
            mm_into(&logits, &wd, &g_h.f_narrow(0, start, len)?)?;
            let part = Tensor::f_empty([v_pad, d], (hd.kind(), hd.device()))?;
            mm_into(&logits.f_tr()?, &hc, &part)?;
            g_w = Some(match g_w.take() {
                None if single => part,
                None => part.f_to_kind(Kind::Float)?,
                // In place, without an fp32 copy of the product: a new sum beside the old one
                // would double the largest thing the head holds.
                Some(mut sum) => {
                    let _ = sum.f_add_(&part)?;
                    sum
                }
            });
            start += len;
        }
        let g_w = match g_w {
            Some(g) => g.f_to_kind(wd.kind())?,
            None => Tensor::f_zeros([v_pad, d], (wd.kind(), hd.device()))?,
        };
        // The padding rows' gradient stays behind: `w` has the vocabulary's rows only.
        (loss.f_mul(&scale)?, g_h.f_view(h.size().as_slice())?, g_w.f_narrow(0, 0, v)?)
    };
    Ok(shim::given_grads(&loss, h, w, &g_h, &g_w)?)
}

/// `w` (`[v, d]`) with zero rows below it up to `v_pad`, contiguous. The rows are copied and only
/// the padding zeroed: libtorch's `constant_pad_nd` fills the whole result before it copies `w` in
/// (on gpt2-xl's 161 MB head a 48 µs fill every step, beside the 79 µs copy).
fn padded_rows(w: &Tensor, v_pad: i64) -> Result<Tensor, TchError> {
    let (v, d) = w.size2()?;
    let out = Tensor::f_empty([v_pad, d], (w.kind(), w.device()))?;
    out.f_narrow(0, 0, v)?.f_copy_(&w.detach())?;
    let _ = out.f_narrow(0, v, v_pad - v)?.f_zero_()?;
    Ok(out)
}

/// `out = a·b`: on a GPU through the worker's cuBLASLt plans, each shape's algorithm timed at its
/// first product (`products_cuda`), where they take the tensors (16-bit); otherwise libtorch's
/// `mm`. `out` is contiguous and apart from `a` and `b`.
fn mm_into(a: &Tensor, b: &Tensor, out: &Tensor) -> Result<(), TchError> {
    if out.device().is_cuda() {
        match crate::model::recompute_cuda::matmul_into(a, b, out) {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => {
                warn_once(&PRODUCT_FAILED, || format!("{e}; the LM head's products fall back to libtorch's"));
            }
        }
    }
    let _ = a.f_mm_out(out, b)?;
    Ok(())
}

/// Whether a product of the head, or its loss kernel, has failed and fallen back (logged once: a
/// fallback that fails once may fail for every chunk of every step).
static PRODUCT_FAILED: AtomicBool = AtomicBool::new(false);
static KERNEL_FAILED: AtomicBool = AtomicBool::new(false);

/// Logs the message `flag` has not seen yet; `true` where it did.
fn warn_once(flag: &AtomicBool, message: impl FnOnce() -> String) -> bool {
    let first = !flag.swap(true, Ordering::Relaxed);
    if first {
        tracing::warn!("{}", message());
    }
    first
}

/// Replaces a chunk's logits (`[rows, v_pad]`, of which the first `v` columns are the
/// vocabulary's) by the gradient of `scale` (a one-element fp32 tensor) × the summed
/// cross-entropy of its rows, and returns each row's cross-entropy (fp32; 0 for an ignored
/// target). Columns past `v` get gradient 0.
fn cross_entropy_grad_in_place(
    logits: &mut Tensor,
    target: &Tensor,
    v: i64,
    scale: &Tensor,
) -> Result<Tensor, TchError> {
    if let Some(k) = logits.device().is_cuda().then(|| CUDA.get()).flatten() {
        match k.run(logits, target, v, scale) {
            Ok(Some(rows)) => {
                FUSED_LOSSES.fetch_add(1, Ordering::Relaxed);
                return Ok(rows);
            }
            // libtorch computes on another stream here: its operations below run there.
            Ok(None) => {}
            Err(e) => {
                warn_once(&KERNEL_FAILED, || format!("{e}; the LM head's loss composes libtorch operations"));
            }
        }
    }
    let x = logits.f_narrow(1, 0, v)?.f_to_kind(Kind::Float)?;
    let lse = x.f_logsumexp([1], true)?;
    let valid = target.f_ne(IGNORE_INDEX)?;
    let safe = target.f_where_scalarother(&valid, 0)?.f_unsqueeze(1)?;
    let picked = x.f_gather(1, &safe, false)?;
    let rows = lse.f_sub(&picked)?.f_squeeze_dim(1)?.f_mul(&valid.f_to_kind(Kind::Float)?)?;
    let mut grad = x.f_sub(&lse)?.f_exp()?;
    let _ = grad.f_scatter_add_(1, &safe, &Tensor::f_full([safe.size()[0], 1], -1.0, (Kind::Float, x.device()))?)?;
    let grad = grad.f_mul(&valid.f_to_kind(Kind::Float)?.f_unsqueeze(1)?.f_mul(scale)?)?;
    logits.f_narrow(1, 0, v)?.f_copy_(&grad)?;
    if logits.size()[1] > v {
        let _ = logits.f_narrow(1, v, logits.size()[1] - v)?.f_zero_()?;
    }
    Ok(rows)
}

/// The CUDA kernel of [`cross_entropy_grad_in_place`], when [`install_cuda`] compiled it.
static CUDA: OnceLock<crate::model::lm_head_cuda::FusedCrossEntropy> = OnceLock::new();

/// Chunks whose loss and gradient the CUDA kernel computed, since start.
static FUSED_LOSSES: AtomicU64 = AtomicU64::new(0);

/// How many chunks' losses ran through the CUDA kernel since start (the GPU self-check holds that
/// the head uses it on the compute stream, and declines it on another).
pub fn fused_losses() -> u64 {
    FUSED_LOSSES.load(Ordering::Relaxed)
}

/// Whether the fused kernel is compiled and in use on CUDA tensors.
pub fn cuda_kernel_installed() -> bool {
    CUDA.get().is_some()
}

/// Compiles the fused cross-entropy kernel for this rank's GPU; without it (or if NVRTC fails)
/// the head composes libtorch operations per chunk, with the same results.
pub fn install_cuda(gpu: &Arc<crate::runtime::cuda::Gpu>) {
    if CUDA.get().is_some() {
        return;
    }
    match crate::model::lm_head_cuda::FusedCrossEntropy::new(Arc::clone(gpu)) {
        Ok(k) => {
            let _ = CUDA.set(k);
        }
        Err(e) => tracing::warn!("{e}; the LM head's loss falls back to libtorch operations"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    /// The composed head: logits, fp32 cross-entropy, autograd.
    fn plain(h: &Tensor, w: &Tensor, target: &Tensor) -> Tensor {
        let v = w.size()[0];
        h.linear::<Tensor>(w, None).to_kind(Kind::Float).reshape([-1, v]).cross_entropy_loss::<Tensor>(
            &target.reshape([-1]),
            None,
            tch::Reduction::Mean,
            IGNORE_INDEX,
            0.0,
        )
    }

    fn grads(loss: Tensor, h: &Tensor, w: &Tensor) -> (f64, Tensor, Tensor) {
        let value = loss.double_value(&[]);
        loss.backward();
        (value, h.grad().copy(), w.grad().copy())
    }

    fn leaves(kind: Kind) -> (Tensor, Tensor, Tensor) {
        tch::manual_seed(7);
        let h = Tensor::randn([3, 7, 16], (Kind::Float, Device::Cpu)).to_kind(kind).set_requires_grad(true);
        let w = (Tensor::randn([70, 16], (Kind::Float, Device::Cpu)) * 0.3).to_kind(kind).set_requires_grad(true);
        let t = Tensor::randint(70, [3, 7], (Kind::Int64, Device::Cpu));
        // Two ignored targets, and the last token of the vocabulary.
        let _ = t.get(0).get(2).fill_(IGNORE_INDEX);
        let _ = t.get(2).get(6).fill_(IGNORE_INDEX);
        let _ = t.get(1).get(0).fill_(69);
        (h, w, t)
    }

    /// GPT-2's tied weight as the engine places its gradient. Placed from the head's segment on
    /// (a unit's own buffer), the head's product and the lookup's rows (repeated tokens among them)
    /// both land in the place, `.grad` untouched, within rounding of autograd's sum of the two; at
    /// a later micro-step (earlier ones' sum in the place) the head's share goes through `.grad`
    /// and the rows are added to it there. Placed only at the lookup's segment (a staging buffer,
    /// whose place holds anything before the engine's move), the rows are added to the head's
    /// share in `.grad` and the place is left to the move. Placed or not (an offloaded unit's
    /// weight is not), the gradient has the same bits. Without a place the lookup's value is
    /// libtorch's embedding's.
    #[test]
    fn a_tied_weight_sums_the_heads_and_the_lookups_gradients_in_its_place() {
        let (_, w, t) = leaves(Kind::Float);
        let tokens = t.clamp(0, 69);
        let _ = tokens.get(2).get(3).fill_(5);
        let _ = tokens.get(2).get(4).fill_(5);
        // Backward as the engine runs it, a segment at a time: the head's (its gradient for w to
        // `.grad` or the place), then the lookup's; `between` runs between the two.
        let model = |w: &Tensor, lookup: &dyn Fn(&Tensor) -> Tensor, between: &dyn Fn()| {
            let h = (lookup(w) * 1.5).tanh();
            let leaf = h.detach().set_requires_grad(true);
            lm_loss(&leaf, w, &t).unwrap().backward();
            between();
            shim::backward(&[&h], &[&leaf.grad()]).unwrap();
        };
        let theirs = w.detach().copy().set_requires_grad(true);
        let libtorch = |w: &Tensor| Tensor::embedding(w, &tokens, -1, false, false);
        model(&theirs, &libtorch, &|| ());
        let want = theirs.grad().reshape([-1]);
        let close = |what: &str, got: &Tensor| {
            let err = (got - &want).abs().max().double_value(&[]);
            assert!(err <= 1e-6 * want.abs().max().double_value(&[]), "{what}: off by {err}");
        };

        let ours = |w: &Tensor| shim::embedding(w, &tokens).unwrap();
        let unplaced = w.detach().copy().set_requires_grad(true);
        assert!(ours(&unplaced).equal(&libtorch(&unplaced)), "the lookup's value");
        model(&unplaced, &ours, &|| ());
        let unplaced = unplaced.grad().reshape([-1]);
        close("without a place", &unplaced);

        let n = w.numel() as i64;
        // (placed before the head, adds to the place, what the place holds before, nodes' writes)
        for (early, add, before, written) in [(true, false, 0.0, 1), (true, true, 0.5, 0), (false, false, 7.0, 0)] {
            let what = format!("placed {}, add {add}", if early { "from the head on" } else { "at the lookup" });
            let buf = Tensor::full([n + 5], before, (Kind::Float, Device::Cpu));
            let place = || shim::grad_into(&w, &buf, 3, add).unwrap();
            if early {
                place();
                model(&w, &ours, &|| ());
            } else {
                model(&w, &ours, &place);
            }
            assert_eq!(w.grad().defined(), add || !early, "{what}: the head's share in .grad");
            assert_eq!(shim::take_grads(std::slice::from_ref(&w), &[3], &buf, add).unwrap(), written, "{what}");
            let got = buf.narrow(0, 3, n);
            let base = if add { before } else { 0.0 };
            close(&what, &(&got - base));
            assert!(got.equal(&(&unplaced + base)), "{what}: not the bits of the gradient without a place");
            let around = Tensor::cat(&[buf.narrow(0, 0, 3), buf.narrow(0, n + 3, 2)], 0);
            assert!(around.eq(before).all().int64_value(&[]) == 1, "{what}: written outside the place");
        }
    }

    /// Values and both gradients equal the composed head's, with chunks of one token up to all
    /// of them, ignored targets and a vocabulary that is not a multiple of 64.
    #[test]
    fn chunked_head_equals_the_composed_head() {
        let (h, w, t) = leaves(Kind::Float);
        let (want, want_h, want_w) = grads(plain(&h, &w, &t), &h, &w);
        for chunk_bytes in [1, 128 * 4 * 5, i64::MAX] {
            let (h2, w2) = (h.detach().set_requires_grad(true), w.detach().set_requires_grad(true));
            let (got, got_h, got_w) = grads(lm_loss_chunked(&h2, &w2, &t, chunk_bytes).unwrap(), &h2, &w2);
            assert!((got - want).abs() < 1e-5 * want.abs(), "{chunk_bytes}: loss {got} vs {want}");
            assert!(got_h.allclose(&want_h, 1e-5, 1e-6, false), "{chunk_bytes}: dL/dh");
            assert!(got_w.allclose(&want_w, 1e-5, 1e-6, false), "{chunk_bytes}: dL/dw");
        }
    }

    /// In bf16, within the rounding of 16-bit gradients.
    #[test]
    fn chunked_head_in_bf16_is_within_its_rounding() {
        let (h, w, t) = leaves(Kind::BFloat16);
        let (want, want_h, want_w) = grads(plain(&h, &w, &t), &h, &w);
        let rel = |a: &Tensor, b: &Tensor| {
            let a = a.to_kind(Kind::Float);
            let b = b.to_kind(Kind::Float);
            (&a - &b).norm().double_value(&[]) / b.norm().double_value(&[])
        };
        // Chunks of two tokens (the weight's gradient summed in fp32), and one chunk (the 16-bit
        // product as it is).
        for chunk_bytes in [64 * 2 * 4, i64::MAX] {
            let (h2, w2) = (h.detach().set_requires_grad(true), w.detach().set_requires_grad(true));
            let (got, got_h, got_w) = grads(lm_loss_chunked(&h2, &w2, &t, chunk_bytes).unwrap(), &h2, &w2);
            assert!((got - want).abs() < 1e-3 * want.abs(), "{chunk_bytes}: loss {got} vs {want}");
            assert!(rel(&got_h, &want_h) < 1e-2, "{chunk_bytes}: dL/dh off by {}", rel(&got_h, &want_h));
            assert!(rel(&got_w, &want_w) < 1e-2, "{chunk_bytes}: dL/dw off by {}", rel(&got_w, &want_w));
            assert_eq!(got_w.kind(), Kind::BFloat16);
        }
    }

    /// A fallback is logged the first time only, whatever the message.
    #[test]
    fn a_fallback_warns_once() {
        let flag = AtomicBool::new(false);
        assert!(warn_once(&flag, || "first".into()));
        assert!(!warn_once(&flag, || unreachable!("not built again")));
    }

    /// A micro-batch without tokens: loss 0, and zero gradients of the weight's shape and kind.
    #[test]
    fn no_tokens_give_zero_loss_and_gradients() {
        let (_, w, _) = leaves(Kind::BFloat16);
        let h = Tensor::zeros([0, 16], (Kind::BFloat16, Device::Cpu)).set_requires_grad(true);
        let t = Tensor::zeros([0], (Kind::Int64, Device::Cpu));
        let (loss, g_h, g_w) = grads(lm_loss(&h, &w, &t).unwrap(), &h, &w);
        assert_eq!(loss, 0.0);
        assert_eq!(g_h.size(), [0, 16]);
        assert_eq!(g_w.size(), [70, 16]);
        assert_eq!(g_w.kind(), Kind::BFloat16);
        assert_eq!(g_w.abs().sum(Kind::Float).double_value(&[]), 0.0);
    }

    /// Under a loss scale the gradients scale with it, as autograd's would.
    #[test]
    fn gradients_follow_the_upstream_gradient() {
        let (h, w, t) = leaves(Kind::Float);
        let (_, one_h, one_w) = grads(lm_loss_chunked(&h, &w, &t, 1 << 10).unwrap(), &h, &w);
        let (h2, w2) = (h.detach().set_requires_grad(true), w.detach().set_requires_grad(true));
        (lm_loss_chunked(&h2, &w2, &t, 1 << 10).unwrap() * 1024.0).backward();
        assert!(h2.grad().allclose(&(one_h * 1024.0), 1e-5, 1e-6, false));
        assert!(w2.grad().allclose(&(one_w * 1024.0), 1e-5, 1e-6, false));
    }

    /// The node multiplies 16-bit gradients by the upstream gradient in fp32, rounding once: a
    /// factor of 1/3 is not first rounded to bf16, and an fp16 loss scale of 2^16 (fp16's
    /// infinity, rounded) stays finite.
    #[test]
    fn the_upstream_factor_multiplies_in_fp32() {
        for (kind, factor) in [(Kind::BFloat16, 1.0f32 / 3.0), (Kind::Half, 65536.0)] {
            let (h, w, _) = leaves(kind);
            let g = |t: &Tensor| (Tensor::randn(t.size(), (Kind::Float, Device::Cpu)) * 1e-3).to_kind(kind);
            let (gh, gw) = (g(&h), g(&w));
            let loss = Tensor::zeros([], (Kind::Float, Device::Cpu));
            let out = shim::given_grads(&loss, &h, &w, &gh, &gw).unwrap();
            let u = Tensor::from(factor);
            shim::backward(&[&out], &[&u]).unwrap();
            let fp32 = (gw.to_kind(Kind::Float) * f64::from(factor)).to_kind(kind);
            assert!(w.grad().equal(&fp32), "{kind:?}: not the fp32 product rounded once");
            assert_eq!(w.grad().isfinite().all().int64_value(&[]), 1, "{kind:?}");
            // What the factor rounded to 16 bits first gives (libtorch's mul on CUDA) is told apart.
            let rounded_first = (gw.to_kind(Kind::Float) * u.to_kind(kind).to_kind(Kind::Float)).to_kind(kind);
            assert!(!w.grad().equal(&rounded_first), "{kind:?}: the factor rounded to 16 bits gives the same");
        }
    }

    /// The padded weight is the weight's rows, then zero rows up to the padded size, whatever the
    /// memory it was allocated from held.
    #[test]
    fn padded_rows_are_the_rows_then_zeros() {
        let w = Tensor::randn([70, 16], (Kind::Float, Device::Cpu)).to_kind(Kind::BFloat16);
        // Leave non-zero values where the padding will be allocated next, as a reused block would.
        drop(Tensor::full([padded_vocab(70), 16], 7.0, (Kind::BFloat16, Device::Cpu)));
        let p = padded_rows(&w, padded_vocab(70)).unwrap();
        assert_eq!(p.size(), [padded_vocab(70), 16]);
        assert!(p.narrow(0, 0, 70).equal(&w));
        assert_eq!(p.narrow(0, 70, padded_vocab(70) - 70).abs().sum(Kind::Float).double_value(&[]), 0.0);
    }

    /// The node that hands the head's gradients to autograd refuses gradients whose shapes are not
    /// its inputs' (a padded weight's, say), rather than giving autograd a wrong-sized gradient.
    #[test]
    fn given_gradients_of_another_shape_are_refused() {
        let (h, w, _) = leaves(Kind::Float);
        let loss = Tensor::zeros([], (Kind::Float, Device::Cpu));
        let padded = Tensor::zeros([padded_vocab(70), 16], (Kind::Float, Device::Cpu));
        let err = shim::given_grads(&loss, &h, &w, &h.zeros_like(), &padded).unwrap_err();
        assert!(err.0.contains("shapes are not those of the inputs"), "{err}");
        assert!(shim::given_grads(&loss, &h, &w, &h.zeros_like(), &w.zeros_like()).is_ok());
    }
}
