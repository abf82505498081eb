//! Training data: seeded synthetic tokens, or byte-level tokens of a text file.
//!
//! Samples are numbered globally: optimizer step `s` uses samples `s·G .. (s+1)·G` with
//! `G = world · grad_accum · micro_batch`, and rank `r` at micro-step `a` takes the `micro_batch`
//! samples starting at `s·G + (a·world + r)·micro_batch`. A sample depends only on its number and
//! the seed, so any split of the same global batch over ranks and micro-steps sees the same data:
//! one rank with `world × micro_batch` sequences trains on exactly what `world` ranks do.

use std::path::{Path, PathBuf};

use tch::{Device, Kind, Tensor};

use crate::model::Batch;

pub enum Source {
    Synthetic { vocab: u64 },
    Text { bytes: Vec<u8> },
}

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("cannot read --data {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("--data {path} has {len} bytes; sequences of {need} tokens need more")]
    TooShort { path: PathBuf, len: usize, need: usize },
    #[error("--data needs a vocabulary of at least 256 tokens (model has {0})")]
    SmallVocab(u64),
}

pub struct Data {
    source: Source,
    seed: u64,
    seq_len: usize,
    micro_batch: usize,
    world: usize,
    grad_accum: usize,
    rank: usize,
    device: Device,
}

/// SplitMix64: a fast, well-mixed hash of (seed, index) pairs.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Source {
    pub fn open(data: Option<&Path>, vocab: u64, seq_len: usize) -> Result<Source, DataError> {
        let Some(path) = data else { return Ok(Source::Synthetic { vocab }) };
        if vocab < 256 {
            return Err(DataError::SmallVocab(vocab));
        }
        let bytes = std::fs::read(path).map_err(|source| DataError::Read { path: path.into(), source })?;
        if bytes.len() <= seq_len + 1 {
            return Err(DataError::TooShort { path: path.into(), len: bytes.len(), need: seq_len + 1 });
        }
        Ok(Source::Text { bytes })
    }
}

impl Data {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        source: Source,
        seed: u64,
        seq_len: usize,
        micro_batch: usize,
        world: usize,
        grad_accum: usize,
        rank: usize,
        device: Device,
    ) -> Self {
        Self { source, seed, seq_len, micro_batch, world, grad_accum, rank, device }
    }

    /// Tokens `0..=seq_len` of global sample `index`.
    fn sample(&self, index: u64, out: &mut Vec<i64>) {
        let key = mix(self.seed ^ mix(index));
        match &self.source {
            Source::Synthetic { vocab } => {
                out.extend((0..=self.seq_len as u64).map(|j| (mix(key ^ j) % vocab) as i64));
            }
            Source::Text { bytes, .. } => {
                let span = (bytes.len() - self.seq_len - 1) as u64;
                let start = (key % span) as usize;
                out.extend(bytes[start..=start + self.seq_len].iter().map(|&b| i64::from(b)));
            }
        }
    }

    /// The micro-batch this rank trains on at optimizer step `step`, micro-step `micro`.
    pub fn batch(&self, step: u64, micro: usize) -> Result<Batch, tch::TchError> {
        let global = (self.world * self.grad_accum * self.micro_batch) as u64;
        let first = step * global + ((micro * self.world + self.rank) * self.micro_batch) as u64;
        let mut tokens = Vec::with_capacity(self.micro_batch * (self.seq_len + 1));
        for i in 0..self.micro_batch as u64 {
            self.sample(first + i, &mut tokens);
        }
        let (b, t) = (self.micro_batch as i64, self.seq_len as i64);
        let all = Tensor::from_slice(&tokens).f_view([b, t + 1])?;
        let input = all.f_narrow(1, 0, t)?.f_contiguous()?.f_to_device(self.device)?;
        let target = all.f_narrow(1, 1, t)?.f_contiguous()?.f_to_device(self.device)?;
        Ok(Batch { input: input.f_to_kind(Kind::Int64)?, target: target.f_to_kind(Kind::Int64)? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(world: usize, rank: usize, mb: usize, ga: usize) -> Data {
        Data::new(Source::Synthetic { vocab: 50 }, 3, 8, mb, world, ga, rank, Device::Cpu)
    }

    #[test]
    fn any_split_of_a_global_batch_sees_the_same_samples() {
        // One rank, micro-batch 4 == two ranks, micro-batch 2 == one rank, micro-batch 1, accum 4.
        let whole = data(1, 0, 4, 1).batch(5, 0).unwrap().input;
        let r0 = data(2, 0, 2, 1).batch(5, 0).unwrap().input;
        let r1 = data(2, 1, 2, 1).batch(5, 0).unwrap().input;
        assert!(whole.equal(&Tensor::cat(&[r0, r1], 0)));
        let acc: Vec<Tensor> = (0..4).map(|a| data(1, 0, 1, 4).batch(5, a).unwrap().input).collect();
        assert!(whole.equal(&Tensor::cat(&acc, 0)));
    }

    #[test]
    fn targets_are_inputs_shifted_by_one() {
        let b = data(1, 0, 2, 1).batch(0, 0).unwrap();
        assert!(b.input.narrow(1, 1, 7).equal(&b.target.narrow(1, 0, 7)));
        assert!(!data(1, 0, 2, 1).batch(1, 0).unwrap().input.equal(&b.input));
    }
}
