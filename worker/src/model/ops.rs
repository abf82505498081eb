//! Pieces the transformer families share: sizes as libtorch wants them, RMS norm, attention heads,
//! and the LM head with its loss.

use tch::{Kind, Reduction, TchError, Tensor};

/// Rows of the LM-head product are padded to a multiple of this (see [`lm_loss`]).
const HEAD_ALIGN: i64 = 64;

/// A model dimension as a libtorch size. The presets' dimensions are far below `i64::MAX`.
pub fn dim(n: u64) -> i64 {
    i64::try_from(n).expect("model dimensions fit in i64")
}

/// RMS norm over the last dimension with a weight and no bias (T5's `T5LayerNorm`, Llama's
/// `LlamaRMSNorm`). libtorch normalises in fp32 and scales in the input's dtype, as those do.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor, TchError> {
    x.f_rms_norm(weight.size().as_slice(), Some(weight), eps)
}

/// `[batch, seq, heads·head_dim]` → `[batch, heads, seq, head_dim]`, the layout attention takes.
pub fn split_heads(x: &Tensor, heads: i64) -> Result<Tensor, TchError> {
    let (b, t, width) = x.size3()?;
    x.f_view([b, t, heads, width / heads])?.f_transpose(1, 2)
}

/// The inverse of [`split_heads`].
pub fn merge_heads(y: &Tensor) -> Result<Tensor, TchError> {
    let (b, heads, t, head_dim) = y.size4()?;
    y.f_transpose(1, 2)?.f_contiguous()?.f_view([b, t, heads * head_dim])
}

/// The LM head and its loss: logits of the hidden states `h` against the vocabulary's rows `w`
/// (`[vocab, d]`), mean cross-entropy against the token ids `target`.
///
/// A vocabulary that is not a multiple of 64 (GPT-2's 50257) makes the three LM-head matrix
/// products several times slower than aligned ones. The weight is padded with zero rows inside the
/// product and the extra logits are sliced off before the loss: the same parameters and the same
/// arithmetic, on aligned shapes.
///
/// The loss is computed in fp32, as PyTorch's autocast computes cross-entropy: bf16 or fp16 logits
/// are upcast first, so the loss and its gradient keep their precision.
pub fn lm_loss(h: &Tensor, w: &Tensor, target: &Tensor) -> Result<Tensor, TchError> {
    let v = w.size()[0];
    let v_aligned = (v + HEAD_ALIGN - 1) / HEAD_ALIGN * HEAD_ALIGN;
    let w = if v_aligned > v { w.f_constant_pad_nd([0, 0, 0, v_aligned - v])? } else { w.shallow_clone() };
    let logits = h.f_linear::<Tensor>(&w, None)?.f_narrow(-1, 0, v)?.f_to_kind(Kind::Float)?;
    logits.f_reshape([-1, v])?.f_cross_entropy_loss::<Tensor>(
        &target.f_reshape([-1])?,
        None,
        Reduction::Mean,
        -100,
        0.0,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_scales_to_unit_root_mean_square() {
        let x = Tensor::from_slice(&[3.0f32, -4.0, 0.0, 0.0]).view([1, 4]);
        let w = Tensor::from_slice(&[1.0f32, 2.0, 1.0, 1.0]);
        let y = rms_norm(&x, &w, 0.0).unwrap();
        // rms = sqrt(25 / 4) = 2.5
        let want = Tensor::from_slice(&[1.2f32, -3.2, 0.0, 0.0]).view([1, 4]);
        assert!(y.allclose(&want, 1e-6, 1e-6, false), "{y}");
    }

    #[test]
    fn heads_round_trip() {
        let x = Tensor::arange(2 * 3 * 8, (Kind::Float, tch::Device::Cpu)).view([2, 3, 8]);
        let h = split_heads(&x, 4).unwrap();
        assert_eq!(h.size(), [2, 4, 3, 2]);
        assert!(merge_heads(&h).unwrap().equal(&x));
    }

    /// Padding the vocabulary changes nothing but the shapes.
    #[test]
    fn aligned_lm_loss_equals_plain_cross_entropy() {
        let h = Tensor::randn([2, 5, 8], (Kind::Float, tch::Device::Cpu));
        let w = Tensor::randn([70, 8], (Kind::Float, tch::Device::Cpu));
        let target = Tensor::from_slice(&[0i64, 69, 3, 4, 5, 6, 7, 8, 9, 10]).view([2, 5]);
        let plain = h.linear::<Tensor>(&w, None).view([-1, 70]).cross_entropy_for_logits(&target.view([-1]));
        let aligned = lm_loss(&h, &w, &target).unwrap();
        assert!(aligned.allclose(&plain, 1e-6, 1e-6, false), "{aligned} vs {plain}");
    }
}
