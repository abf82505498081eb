//! Training data: seeded synthetic samples, or byte-level tokens of a text file.
//!
//! Samples are numbered globally: optimizer step `s` uses samples `s·G .. (s+1)·G` with
//! `G = world · grad_accum · micro_batch`, and rank `r` at micro-step `a` takes the `micro_batch`
//! samples starting at `s·G + (a·world + r)·micro_batch`. A sample depends only on its number and
//! the seed, so any split of the same global batch over ranks and micro-steps sees the same data:
//! one rank with `world × micro_batch` sequences trains on exactly what `world` ranks do.
//!
//! What a sample holds depends on the model's [`Task`]:
//!
//! | task | synthetic | `--data FILE` |
//! |---|---|---|
//! | next token (GPT-2, Llama) | seeded uniform tokens | `seq_len + 1` consecutive bytes |
//! | sequence to sequence (T5) | seeded uniform input tokens; the target copies them (cyclically when longer) | `seq_len` bytes, then the `target_len` bytes that follow as the target |
//! | regression (MLP) | seeded uniform vectors `x` (mean 0, variance 1); the target is `y_k = abs(x_(k+1 mod d))` | refused (the MLP reads no text) |
//!
//! The synthetic targets are learnable functions of the inputs, so the loss can fall: T5 learns to
//! copy; the MLP's blocks can represent a permutation of the features followed by `abs` (GELU units
//! approximate `relu(z) + relu(-z)`).
//!
//! Evaluation (`--eval-every`) reads held-out samples, numbered like the training ones within one
//! global batch that is the same at every evaluation. Synthetic ones are hashed from a stream of
//! their own; a text's are drawn from its end (its last tenth, or one sample's bytes if that is
//! more: [`held_out_bytes`]), which training then never reads.

use std::io::Read as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use tch::{Device, Kind, Tensor};
use zerobench_schema::splitmix::{self, mix};
use zerobench_schema::{ModelSpec, RunConfig};

use crate::model::Batch;

/// What one sample holds, by model family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Task {
    /// Next-token prediction over `seq_len` tokens (GPT-2, Llama).
    NextToken { seq_len: usize },
    /// `seq_len` input tokens and `target_len` target tokens, which the decoder also reads shifted
    /// right behind start token 0 (T5).
    Seq2Seq { seq_len: usize, target_len: usize },
    /// `seq_len` vectors of `width` numbers, each with a target vector (the MLP).
    Regression { seq_len: usize, width: usize },
}

impl Task {
    pub fn of(cfg: &RunConfig) -> Task {
        let seq_len = cfg.seq_len as usize;
        match cfg.model.spec() {
            ModelSpec::Gpt2(_) | ModelSpec::Llama(_) => Task::NextToken { seq_len },
            ModelSpec::T5(_) => Task::Seq2Seq { seq_len, target_len: cfg.target_len_or_default() as usize },
            ModelSpec::Mlp(d) => Task::Regression { seq_len, width: d.d_model as usize },
        }
    }

    /// Bytes of host memory one optimizer step's micro-batches take (inputs and targets: tokens as
    /// `i64`, the MLP's vectors as `f32`).
    pub fn step_bytes(&self, micro_batch: u32, grad_accum: u32) -> u64 {
        let sample = match *self {
            Task::Regression { seq_len, width } => (seq_len as u64).saturating_mul(width as u64).saturating_mul(2 * 4),
            _ => (self.tokens() as u64).saturating_mul(8),
        };
        sample.saturating_mul(u64::from(micro_batch)).saturating_mul(u64::from(grad_accum))
    }

    /// Tokens one sample holds (inputs and targets).
    fn tokens(&self) -> usize {
        match *self {
            Task::NextToken { seq_len } => seq_len + 1,
            Task::Seq2Seq { seq_len, target_len } => seq_len + target_len,
            Task::Regression { .. } => 0,
        }
    }
}

pub enum Source {
    Synthetic {
        vocab: u64,
    },
    /// A text; training samples lie in `bytes[..train_end]`, held-out ones after it.
    Text {
        bytes: Vec<u8>,
        train_end: usize,
    },
}

/// With evaluation, the bytes at the end of a `len`-byte text held out of training: its last
/// tenth, or one sample of `need` tokens if that is more (a short text still evaluates).
pub fn held_out_bytes(len: usize, need: usize) -> usize {
    (len / 10).max(need + 1)
}

/// Which samples a micro-batch holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Train,
    HeldOut,
}

/// Salts the hashes of held-out samples, so that they are not the training samples of the same
/// number.
const HELD_OUT_STREAM: u64 = 0x6576_616c_5f73_6574;

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("cannot read --data {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("--data {path} has {len} bytes; samples of {need} tokens need more")]
    TooShort { path: PathBuf, len: usize, need: usize },
    #[error("--data {path} has {len} bytes; with --eval-every its end is held out, and each part needs more than {need} bytes")]
    TooShortToHoldOut { path: PathBuf, len: usize, need: usize },
    #[error("--data needs a vocabulary of at least 256 tokens (model has {0})")]
    SmallVocab(u64),
    #[error("--data {path} is not a regular file (a FIFO, device or folder cannot be read as a text)")]
    NotAFile { path: PathBuf },
    #[error(
        "--data {path} has at least {len} bytes; every rank holds the whole text, so at most {MAX_DATA_BYTES} are read"
    )]
    TooLarge { path: PathBuf, len: u64 },
}

/// Why a micro-batch could not be made.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    #[error(transparent)]
    Torch(#[from] tch::TchError),
    /// Its host buffers do not fit in this process's memory (a micro-batch far too large): an
    /// out-of-memory result, not an abort.
    #[error("cannot allocate {bytes} bytes of host memory for one micro-batch")]
    HostMemory { bytes: u64 },
}

/// An empty vector with room for `count × per` elements, or the error saying how much that is.
fn host_vec<T>(count: usize, per: usize) -> Result<Vec<T>, BatchError> {
    let elems = count.checked_mul(per);
    let bytes = elems.and_then(|n| n.checked_mul(std::mem::size_of::<T>())).map_or(u64::MAX, |b| b as u64);
    let mut v = Vec::new();
    match elems {
        Some(n) if v.try_reserve_exact(n).is_ok() => Ok(v),
        _ => Err(BatchError::HostMemory { bytes }),
    }
}

/// The largest `--data` file: every rank holds the whole text in memory.
pub const MAX_DATA_BYTES: u64 = 1 << 30;

pub struct Data {
    source: Source,
    task: Task,
    seed: u64,
    micro_batch: usize,
    world: usize,
    grad_accum: usize,
    rank: usize,
    device: Device,
}

/// A number uniform in [-sqrt(3), sqrt(3)) (mean 0, variance 1) from a hash.
fn uniform(h: u64) -> f32 {
    ((2.0 * splitmix::unit(h) - 1.0) * 3f64.sqrt()) as f32
}

impl Source {
    /// The samples of a run: seeded, or read from the text `data` (with its end held out of
    /// training when `hold_out`: [`held_out_bytes`]).
    pub fn open(data: Option<&Path>, vocab: u64, task: &Task, hold_out: bool) -> Result<Source, DataError> {
        let Some(path) = data else { return Ok(Source::Synthetic { vocab }) };
        if vocab < 256 {
            return Err(DataError::SmallVocab(vocab));
        }
        // Checked before opening: opening a FIFO blocks until a writer comes, and a device such as
        // /dev/zero never ends.
        let meta = std::fs::metadata(path).map_err(|source| DataError::Read { path: path.into(), source })?;
        if !meta.is_file() {
            return Err(DataError::NotAFile { path: path.into() });
        }
        if meta.len() > MAX_DATA_BYTES {
            return Err(DataError::TooLarge { path: path.into(), len: meta.len() });
        }
        // Read through the file opened, never past the limit: a file whose size says 0 and reads
        // on (`/proc/self/pagemap`), or one swapped for another after the check, stops there.
        // O_NONBLOCK: a FIFO put in its place does not block the open.
        let read = |source| DataError::Read { path: path.into(), source };
        let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path).map_err(read)?;
        if !file.metadata().map_err(read)?.is_file() {
            return Err(DataError::NotAFile { path: path.into() });
        }
        let mut bytes = Vec::new();
        file.take(MAX_DATA_BYTES + 1).read_to_end(&mut bytes).map_err(read)?;
        if bytes.len() as u64 > MAX_DATA_BYTES {
            return Err(DataError::TooLarge { path: path.into(), len: bytes.len() as u64 });
        }
        let need = task.tokens();
        let len = bytes.len();
        if len <= need {
            return Err(DataError::TooShort { path: path.into(), len, need });
        }
        let train_end = if hold_out { len.saturating_sub(held_out_bytes(len, need)) } else { len };
        if train_end <= need {
            return Err(DataError::TooShortToHoldOut { path: path.into(), len, need });
        }
        Ok(Source::Text { bytes, train_end })
    }
}

impl Data {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        source: Source,
        task: Task,
        seed: u64,
        micro_batch: usize,
        world: usize,
        grad_accum: usize,
        rank: usize,
        device: Device,
    ) -> Self {
        Self { source, task, seed, micro_batch, world, grad_accum, rank, device }
    }

    /// The tokens of the sample with hash `key` ([`Task::tokens`] of them) of `part`: inputs, then
    /// targets.
    fn tokens(&self, key: u64, part: Part, out: &mut Vec<i64>) {
        let n = self.task.tokens();
        match &self.source {
            Source::Synthetic { vocab } => {
                let inputs = match self.task {
                    Task::Seq2Seq { seq_len, .. } => seq_len,
                    _ => n,
                };
                let start = out.len();
                out.extend((0..inputs as u64).map(|j| (mix(key ^ j) % vocab) as i64));
                // T5's synthetic targets copy the input.
                for j in 0..n - inputs {
                    out.push(out[start + j % inputs]);
                }
            }
            Source::Text { bytes, train_end } => {
                // A sample starts where all of its bytes lie inside its part.
                let (from, to) = match part {
                    Part::Train => (0, *train_end),
                    Part::HeldOut => (*train_end, bytes.len()),
                };
                let start = from + (key % (to - from - n) as u64) as usize;
                out.extend(bytes[start..start + n].iter().map(|&b| i64::from(b)));
            }
        }
    }

    /// The input and target vectors of the sample with hash `key`, for the MLP.
    fn vectors(&self, key: u64, seq_len: usize, width: usize, input: &mut Vec<f32>, target: &mut Vec<f32>) {
        for t in 0..seq_len {
            let row: Vec<f32> = (0..width).map(|k| uniform(mix(key ^ mix((t * width + k) as u64)))).collect();
            target.extend((0..width).map(|k| row[(k + 1) % width].abs()));
            input.extend(row);
        }
    }

    /// The micro-batch this rank trains on at optimizer step `step`, micro-step `micro`. Its host
    /// buffers are reserved before anything is computed, so a micro-batch too large for host
    /// memory is an error, not an abort.
    pub fn batch(&self, step: u64, micro: usize) -> Result<Batch, BatchError> {
        let global = (self.world * self.grad_accum * self.micro_batch) as u64;
        self.samples(step * global + self.offset(micro), Part::Train)
    }

    /// Micro-batch `micro` of this rank's share of the held-out global batch: the same samples at
    /// every evaluation.
    pub fn held_out_batch(&self, micro: usize) -> Result<Batch, BatchError> {
        self.samples(self.offset(micro), Part::HeldOut)
    }

    /// Where this rank's micro-batch `micro` starts within a global batch.
    fn offset(&self, micro: usize) -> u64 {
        ((micro * self.world + self.rank) * self.micro_batch) as u64
    }

    /// The micro-batch of the `micro_batch` samples of `part` numbered from `first`.
    fn samples(&self, first: u64, part: Part) -> Result<Batch, BatchError> {
        let b = self.micro_batch as i64;
        let on_device = |t: Tensor| t.f_contiguous()?.f_to_device(self.device);
        // The sample hashes, made after the sample buffers so that a micro-batch too large fails
        // on those before anything is computed.
        let keys = || -> Result<Vec<u64>, BatchError> {
            let mut keys = host_vec::<u64>(self.micro_batch, 1)?;
            let seed = match part {
                Part::Train => self.seed,
                Part::HeldOut => mix(self.seed ^ HELD_OUT_STREAM),
            };
            keys.extend((0..self.micro_batch as u64).map(|i| mix(seed ^ mix(first + i))));
            Ok(keys)
        };
        match self.task {
            Task::NextToken { seq_len } => {
                let tokens = host_vec::<i64>(self.micro_batch, self.task.tokens())?;
                let (all, t) = (self.token_matrix(&keys()?, part, tokens)?, seq_len as i64);
                Ok(Batch {
                    input: on_device(all.f_narrow(1, 0, t)?)?,
                    target: on_device(all.f_narrow(1, 1, t)?)?,
                    decoder_input: None,
                })
            }
            Task::Seq2Seq { seq_len, target_len } => {
                let tokens = host_vec::<i64>(self.micro_batch, self.task.tokens())?;
                let (all, t, t2) = (self.token_matrix(&keys()?, part, tokens)?, seq_len as i64, target_len as i64);
                let target = all.f_narrow(1, t, t2)?;
                let start = Tensor::f_zeros([b, 1], (Kind::Int64, Device::Cpu))?;
                let decoder_input = Tensor::f_cat(&[&start, &target.f_narrow(1, 0, t2 - 1)?], 1)?;
                Ok(Batch {
                    input: on_device(all.f_narrow(1, 0, t)?)?,
                    target: on_device(target)?,
                    decoder_input: Some(on_device(decoder_input)?),
                })
            }
            Task::Regression { seq_len, width } => {
                let per = seq_len.saturating_mul(width);
                let mut input = host_vec::<f32>(self.micro_batch, per)?;
                let mut target = host_vec::<f32>(self.micro_batch, per)?;
                for key in keys()? {
                    self.vectors(key, seq_len, width, &mut input, &mut target);
                }
                let shape = [b, seq_len as i64, width as i64];
                let input = on_device(Tensor::from_slice(&input).f_view(shape)?)?;
                let target = on_device(Tensor::from_slice(&target).f_view(shape)?)?;
                Ok(Batch { input, target, decoder_input: None })
            }
        }
    }

    /// The tokens of the samples with hash `keys`, `[keys, Task::tokens]` (int64, on the host),
    /// written into `tokens` (reserved by the caller).
    fn token_matrix(&self, keys: &[u64], part: Part, mut tokens: Vec<i64>) -> Result<Tensor, tch::TchError> {
        for &key in keys {
            self.tokens(key, part, &mut tokens);
        }
        Tensor::from_slice(&tokens).f_view([keys.len() as i64, self.task.tokens() as i64])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A FIFO (whose open would wait for a writer) and /dev/zero (which never ends) are refused
    /// before they are opened.
    #[test]
    fn special_files_are_refused_before_reading() {
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("text.fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo(3) with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let task = Task::NextToken { seq_len: 8 };
        for p in [fifo.as_path(), Path::new("/dev/zero"), d.path()] {
            match Source::open(Some(p), 50257, &task, false) {
                Err(DataError::NotAFile { .. }) => {}
                Err(e) => panic!("{}: {e}", p.display()),
                Ok(_) => panic!("{}: read", p.display()),
            }
        }
    }

    fn data(world: usize, rank: usize, mb: usize, ga: usize) -> Data {
        Data::new(Source::Synthetic { vocab: 50 }, Task::NextToken { seq_len: 8 }, 3, mb, world, ga, rank, Device::Cpu)
    }

    /// A micro-batch whose host buffers cannot be allocated is an error naming the bytes, for
    /// every task, not an abort of the process.
    #[test]
    fn a_micro_batch_too_large_for_host_memory_is_an_error() {
        let tasks = [
            Task::NextToken { seq_len: 1024 },
            Task::Seq2Seq { seq_len: 512, target_len: 128 },
            Task::Regression { seq_len: 512, width: 1024 },
        ];
        for task in tasks {
            let d = Data::new(Source::Synthetic { vocab: 50 }, task, 3, 1 << 40, 1, 1, 0, Device::Cpu);
            match d.batch(0, 0) {
                Err(BatchError::HostMemory { bytes }) => assert!(bytes > 1 << 50, "{task:?}: {bytes}"),
                Err(e) => panic!("{task:?}: {e}"),
                Ok(_) => panic!("{task:?}: a batch of 2^40 samples"),
            }
        }
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

    #[test]
    fn t5_targets_copy_the_input_and_the_decoder_reads_them_shifted() {
        let task = Task::Seq2Seq { seq_len: 5, target_len: 7 };
        let b = Data::new(Source::Synthetic { vocab: 50 }, task, 3, 2, 1, 1, 0, Device::Cpu).batch(0, 0).unwrap();
        assert_eq!(b.input.size(), [2, 5]);
        assert_eq!(b.target.size(), [2, 7]);
        assert!(b.target.narrow(1, 0, 5).equal(&b.input));
        assert!(b.target.narrow(1, 5, 2).equal(&b.input.narrow(1, 0, 2)));
        let dec = b.decoder_input.unwrap();
        assert!(dec.narrow(1, 0, 1).equal(&Tensor::zeros([2, 1], (Kind::Int64, Device::Cpu))));
        assert!(dec.narrow(1, 1, 6).equal(&b.target.narrow(1, 0, 6)));
    }

    #[test]
    fn t5_text_targets_are_the_following_bytes() {
        let bytes: Vec<u8> = (0..=255).collect();
        let task = Task::Seq2Seq { seq_len: 4, target_len: 3 };
        let b = Data::new(Source::Text { train_end: bytes.len(), bytes }, task, 1, 3, 1, 1, 0, Device::Cpu)
            .batch(2, 0)
            .unwrap();
        let (input, target) =
            (Vec::<i64>::try_from(b.input.view([-1])).unwrap(), Vec::<i64>::try_from(b.target.view([-1])).unwrap());
        for s in 0..3 {
            let first = input[s * 4];
            assert_eq!(&input[s * 4..s * 4 + 4], &[first, first + 1, first + 2, first + 3]);
            assert_eq!(&target[s * 3..s * 3 + 3], &[first + 4, first + 5, first + 6]);
        }
    }

    #[test]
    fn mlp_vectors_have_unit_variance_and_a_learnable_target() {
        let task = Task::Regression { seq_len: 3, width: 64 };
        let split =
            |world, rank, mb| Data::new(Source::Synthetic { vocab: 0 }, task, 9, mb, world, 1, rank, Device::Cpu);
        let b = split(1, 0, 4).batch(1, 0).unwrap();
        assert_eq!(b.input.size(), [4, 3, 64]);
        assert_eq!(b.input.kind(), Kind::Float);
        let var = b.input.square().mean(Kind::Double).double_value(&[]);
        assert!((var - 1.0).abs() < 0.15, "variance {var}");
        assert!(b.target.equal(&b.input.roll([-1], [2]).abs()));
        // Any split of the global batch sees the same vectors.
        let halves = [split(2, 0, 2).batch(1, 0).unwrap().input, split(2, 1, 2).batch(1, 0).unwrap().input];
        assert!(b.input.equal(&Tensor::cat(&halves, 0)));
    }

    /// With evaluation a text's last tenth is held out: training reads only the part before it
    /// and evaluation only that part, whatever the step, micro-step or rank.
    #[test]
    fn held_out_text_is_never_trained_on() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("text.txt");
        // 900 bytes of 'a', then 100 of 'z': the held-out tenth is exactly the 'z's.
        let mut text = vec![b'a'; 900];
        text.extend([b'z'; 100]);
        std::fs::write(&path, &text).unwrap();
        let task = Task::NextToken { seq_len: 16 };
        let open = |hold_out| Source::open(Some(&path), 50257, &task, hold_out).unwrap();
        let text_data = |source, world, rank| Data::new(source, task, 5, 4, world, 2, rank, Device::Cpu);
        let all =
            |t: Tensor, byte: u8| Vec::<i64>::try_from(t.view([-1])).unwrap().iter().all(|&x| x == i64::from(byte));
        for (world, rank) in [(1, 0), (2, 1)] {
            for step in 0..20 {
                for micro in 0..2 {
                    assert!(all(text_data(open(true), world, rank).batch(step, micro).unwrap().input, b'a'));
                }
            }
            for micro in 0..2 {
                let b = text_data(open(true), world, rank).held_out_batch(micro).unwrap();
                assert!(all(b.input, b'z') && all(b.target, b'z'), "micro {micro}");
            }
        }
        // Without evaluation the whole text is read, as before: some sample reaches the 'z's.
        let reaches = (0..50).any(|step| !all(text_data(open(false), 1, 0).batch(step, 0).unwrap().target, b'a'));
        assert!(reaches, "training without evaluation reads the whole text");
    }

    /// The held-out batch is one global batch, the same at every evaluation, split over ranks and
    /// micro-steps like a training batch, and none of its synthetic samples is a training sample.
    #[test]
    fn the_held_out_batch_is_fixed_and_not_trained_on() {
        let held = data(1, 0, 4, 1).held_out_batch(0).unwrap().input;
        assert!(held.equal(&data(1, 0, 4, 1).held_out_batch(0).unwrap().input));
        let halves =
            [data(2, 0, 2, 1).held_out_batch(0).unwrap().input, data(2, 1, 2, 1).held_out_batch(0).unwrap().input];
        assert!(held.equal(&Tensor::cat(&halves, 0)));
        for step in 0..8 {
            let train = data(1, 0, 4, 1).batch(step, 0).unwrap().input;
            for i in 0..4 {
                assert!(!held.get(i).equal(&train.get(i)), "held-out sample {i} is step {step}'s");
            }
        }
    }

    /// A short text holds out one sample's bytes (more than its tenth), and evaluation reads only
    /// those; one that cannot hold a sample on both sides of the cut is refused with evaluation,
    /// and read without it.
    #[test]
    fn a_short_text_holds_out_one_sample_or_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let task = Task::NextToken { seq_len: 16 };
        // 100 bytes: a tenth is 10, a sample 17, so the last 18 bytes are held out.
        let path = d.path().join("short.txt");
        let mut text = vec![b'a'; 82];
        text.extend([b'z'; 18]);
        std::fs::write(&path, &text).unwrap();
        let data = Data::new(Source::open(Some(&path), 50257, &task, true).unwrap(), task, 1, 3, 1, 1, 0, Device::Cpu);
        let held = Vec::<i64>::try_from(data.held_out_batch(0).unwrap().input.view([-1])).unwrap();
        assert!(held.iter().all(|&t| t == i64::from(b'z')), "{held:?}");
        let train = Vec::<i64>::try_from(data.batch(3, 0).unwrap().target.view([-1])).unwrap();
        assert!(train.iter().all(|&t| t == i64::from(b'a')), "{train:?}");

        let path = d.path().join("shorter.txt");
        std::fs::write(&path, vec![b'x'; 30]).unwrap();
        match Source::open(Some(&path), 50257, &task, true) {
            Err(e @ DataError::TooShortToHoldOut { .. }) => {
                assert!(e.to_string().contains("--eval-every"), "{e}");
                assert!(e.to_string().contains("30 bytes"), "{e}");
            }
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("12 training bytes for 17-byte samples"),
        }
        Source::open(Some(&path), 50257, &task, false).unwrap();
    }
}
