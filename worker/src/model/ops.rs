//! Pieces the transformer families share: sizes as libtorch wants them, RMS norm and attention
//! heads (the LM head and its loss are in `lm_head`).

use tch::{TchError, Tensor};

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

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Kind;

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
}
