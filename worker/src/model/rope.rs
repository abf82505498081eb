//! Rotary position embeddings (Su et al. 2021) as Hugging Face's Llama and Mistral apply them:
//! the two halves of each head's query and key (not interleaved pairs) are rotated by the angle
//! `position · theta^(-2i/head_dim)`, so the score of a query and a key depends on their offset only.

use tch::{Device, Kind, TchError, Tensor};

/// The cosines and sines for positions `0..seq_len`, `[seq_len, head_dim]` in `kind`: computed in
/// fp32 and cast once, as HF's `LlamaRotaryEmbedding` does.
pub fn tables(
    seq_len: i64,
    head_dim: i64,
    theta: f64,
    kind: Kind,
    device: Device,
) -> Result<(Tensor, Tensor), TchError> {
    let exponents = Tensor::f_arange_start_step(0, head_dim, 2, (Kind::Int64, device))?
        .f_to_kind(Kind::Float)?
        .f_div_scalar(head_dim as f64)?;
    let inv_freq = Tensor::f_pow_scalar(theta, &exponents)?.f_reciprocal()?;
    let positions = Tensor::f_arange(seq_len, (Kind::Float, device))?;
    let freqs = positions.f_outer(&inv_freq)?;
    let angles = Tensor::f_cat(&[&freqs, &freqs], -1)?;
    Ok((angles.f_cos()?.f_to_kind(kind)?, angles.f_sin()?.f_to_kind(kind)?))
}

/// Rotates `x` (`[batch, heads, seq, head_dim]`) by the tables of [`tables`].
pub fn apply(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor, TchError> {
    let half = x.size()[3] / 2;
    let (x1, x2) = (x.f_narrow(-1, 0, half)?, x.f_narrow(-1, half, half)?);
    let rotated = Tensor::f_cat(&[&x2.f_neg()?, &x1], -1)?;
    x.f_mul(cos)?.f_add(&rotated.f_mul(sin)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_pair_rotates_by_position() {
        // head_dim 4: pairs (0, 2) turn by one radian per position, (1, 3) by theta^-0.5.
        let (cos, sin) = tables(3, 4, 10_000.0, Kind::Float, Device::Cpu).unwrap();
        let x = Tensor::from_slice(&[1.0f32, 0.0, 0.0, 0.0]).view([1, 1, 1, 4]).expand([1, 1, 3, 4], false);
        let y = apply(&x, &cos, &sin).unwrap();
        for p in 0..3i64 {
            let (c, s) = ((p as f64).cos(), (p as f64).sin());
            assert!((y.double_value(&[0, 0, p, 0]) - c).abs() < 1e-6);
            assert!((y.double_value(&[0, 0, p, 2]) - s).abs() < 1e-6);
        }
        assert!((sin.double_value(&[2, 1]) - (2.0f64 * 0.01).sin()).abs() < 1e-6);
    }

    /// The score of a rotated query and key depends on their offset, not their positions.
    #[test]
    fn scores_depend_on_the_offset_only() {
        let (cos, sin) = tables(16, 8, 10_000.0, Kind::Double, Device::Cpu).unwrap();
        let q = Tensor::randn([8], (Kind::Double, Device::Cpu)).view([1, 1, 1, 8]).expand([1, 1, 16, 8], false);
        let k = Tensor::randn([8], (Kind::Double, Device::Cpu)).view([1, 1, 1, 8]).expand([1, 1, 16, 8], false);
        let (q, k) = (apply(&q, &cos, &sin).unwrap(), apply(&k, &cos, &sin).unwrap());
        let scores = q.matmul(&k.transpose(-1, -2)).view([16, 16]);
        for (i, j) in [(3, 1), (10, 8), (15, 13)] {
            assert!((scores.double_value(&[i, j]) - scores.double_value(&[2, 0])).abs() < 1e-5, "angles are fp32");
        }
        let norm = |t: &Tensor| t.square().sum(Kind::Double).double_value(&[]);
        assert!((norm(&q.narrow(2, 5, 1)) - norm(&q.narrow(2, 0, 1))).abs() < 1e-5, "rotations keep the norm");
    }
}
