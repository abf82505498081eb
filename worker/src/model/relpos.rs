//! T5's relative position bias: every (query, key) pair falls in a bucket by the key's offset from
//! the query, and a learned table gives each bucket one additive attention bias per head.
//!
//! The buckets are Hugging Face's `T5Attention._relative_position_bucket`, op for op (the
//! logarithmic part in fp32, truncated towards zero), so a position lands in the bucket it lands in
//! there: half the buckets are exact offsets, the other half grow logarithmically up to
//! `max_distance`, beyond which offsets share the last bucket. The encoder's buckets are
//! bidirectional (half of them for keys after the query); the decoder's are causal (offsets into
//! the future all fall in bucket 0, and the causal mask hides them anyway).

use tch::{Device, Kind, TchError, Tensor};

/// The bucket of each (query, key) pair, `[q_len, k_len]` (int64).
pub fn buckets(
    q_len: i64,
    k_len: i64,
    bidirectional: bool,
    num_buckets: i64,
    max_distance: i64,
    device: Device,
) -> Result<Tensor, TchError> {
    let context = Tensor::f_arange(q_len, (Kind::Int64, device))?.f_view([q_len, 1])?;
    let memory = Tensor::f_arange(k_len, (Kind::Int64, device))?.f_view([1, k_len])?;
    let relative = memory.f_sub(&context)?;
    let (num_buckets, offset, distance) = if bidirectional {
        let half = num_buckets / 2;
        // Keys after the query use the upper half of the buckets.
        (half, relative.f_gt(0)?.f_to_kind(Kind::Int64)?.f_mul_scalar(half)?, relative.f_abs()?)
    } else {
        (num_buckets, Tensor::f_zeros_like(&relative)?, relative.f_clamp_max(0)?.f_neg()?)
    };
    let max_exact = num_buckets / 2;
    let is_small = distance.f_lt(max_exact)?;
    // The logarithm is only kept where the distance is at least `max_exact`; clamping first keeps
    // log(0) out of the discarded lanes.
    let large = distance
        .f_clamp_min(max_exact)?
        .f_to_kind(Kind::Float)?
        .f_div_scalar(max_exact as f64)?
        .f_log()?
        .f_div_scalar((max_distance as f64 / max_exact as f64).ln())?
        .f_mul_scalar((num_buckets - max_exact) as f64)?
        .f_to_kind(Kind::Int64)?
        .f_add_scalar(max_exact)?
        .f_clamp_max(num_buckets - 1)?;
    offset.f_add(&distance.f_where_self(&is_small, &large)?)
}

/// The additive attention bias `[1, heads, q_len, k_len]` from the learned `table`
/// (`[num_buckets, heads]`), in the table's dtype, contiguous: SDPA's fused kernels take a mask
/// only with its last dimension at stride 1, and the table's lookup leaves the heads last (with a
/// strided mask, SDPA falls back to its composed fp32 path, about twenty kernels per call).
pub fn bias(
    table: &Tensor,
    q_len: i64,
    k_len: i64,
    bidirectional: bool,
    max_distance: i64,
) -> Result<Tensor, TchError> {
    let num_buckets = table.size()[0];
    let b = buckets(q_len, k_len, bidirectional, num_buckets, max_distance, table.device())?;
    Tensor::f_embedding(table, &b, -1, false, false)?.f_permute([2, 0, 1])?.f_contiguous()?.f_unsqueeze(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// HF's `_relative_position_bucket` for one offset, written out in scalar arithmetic (f32 for
    /// the logarithmic part, as there).
    fn reference(relative: i64, bidirectional: bool, mut num_buckets: i64, max_distance: i64) -> i64 {
        let mut bucket = 0;
        let distance = if bidirectional {
            num_buckets /= 2;
            if relative > 0 {
                bucket += num_buckets;
            }
            relative.abs()
        } else {
            -relative.min(0)
        };
        let max_exact = num_buckets / 2;
        if distance < max_exact {
            return bucket + distance;
        }
        let scaled = (distance as f32 / max_exact as f32).ln() / (max_distance as f64 / max_exact as f64).ln() as f32
            * (num_buckets - max_exact) as f32;
        bucket + (max_exact + scaled as i64).min(num_buckets - 1)
    }

    fn bucket_of(q: i64, k: i64, bidirectional: bool) -> i64 {
        let b = buckets(q + 1, k + 1, bidirectional, 32, 128, Device::Cpu).unwrap();
        b.int64_value(&[q, k])
    }

    #[test]
    fn known_buckets() {
        // Bidirectional (encoder): 16 buckets per direction, 8 exact.
        assert_eq!(bucket_of(0, 0, true), 0);
        assert_eq!(bucket_of(5, 6, true), 17);
        assert_eq!(bucket_of(6, 5, true), 1);
        assert_eq!(bucket_of(28, 8, true), 10);
        assert_eq!(bucket_of(0, 200, true), 31);
        assert_eq!(bucket_of(200, 0, true), 15);
        // Causal (decoder): 32 buckets backwards, 16 exact; the future is bucket 0.
        assert_eq!(bucket_of(20, 0, false), 17);
        assert_eq!(bucket_of(15, 0, false), 15);
        assert_eq!(bucket_of(16, 0, false), 16);
        assert_eq!(bucket_of(0, 5, false), 0);
        assert_eq!(bucket_of(1000, 0, false), 31);
    }

    #[test]
    fn every_offset_matches_the_reference() {
        for bidirectional in [true, false] {
            let (q, k) = (300, 260);
            let b = buckets(q, k, bidirectional, 32, 128, Device::Cpu).unwrap();
            let got = Vec::<i64>::try_from(b.view([-1])).unwrap();
            for i in 0..q {
                for j in 0..k {
                    let want = reference(j - i, bidirectional, 32, 128);
                    assert_eq!(got[(i * k + j) as usize], want, "query {i} key {j} bidirectional {bidirectional}");
                }
            }
        }
    }

    #[test]
    fn bias_looks_up_the_table_per_head() {
        let table = Tensor::arange(32 * 3, (Kind::Float, Device::Cpu)).view([32, 3]);
        let b = bias(&table, 4, 6, true, 128).unwrap();
        assert_eq!(b.size(), [1, 3, 4, 6]);
        // The layout SDPA's fused kernels need of a mask.
        assert_eq!(b.stride()[3], 1, "{:?}", b.stride());
        // Query 1, key 3: offset +2, bucket 18; head 2 reads table[18][2].
        assert_eq!(b.double_value(&[0, 2, 1, 3]), (18 * 3 + 2) as f64);
    }
}
