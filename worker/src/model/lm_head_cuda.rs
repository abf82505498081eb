//! The cross-entropy of [`super::lm_head`] as one CUDA kernel, compiled at start with NVRTC: per
//! row of logits, one pass for the maximum and the sum of exponentials (online, in fp32), one
//! pass that writes the gradient over the logits in place. Each 16-bit logit is read twice and
//! written once, against about ten bytes per logit each way for the composed fp32 loss. Every
//! thread moves 16 bytes per load and store (8 16-bit logits or 4 fp32 ones): one 16-bit logit per
//! thread left each warp with 64 bytes in flight, and gpt2's loss at micro-batch 16 ran at about a
//! third of the memory's bandwidth. Rows are therefore whole vectors: `v_pad` a multiple of the
//! vector, the logits 16-byte aligned (the head pads to 64 columns; the allocator aligns). It runs
//! on the compute stream, in libtorch's order, where libtorch computes there (`Gpu::computes_here`).
//!
//! The first pass folds a vector in at a time: its own maximum, then its exponentials against the
//! new running maximum (independent of each other), the running sum rescaled once. Folding in a
//! logit at a time chained every exponential on the one before through the running sum and
//! maximum: gpt2-xl's loss (4096 rows of 50304 bf16 logits) took 0.479 ms, and 0.389-0.404 ms
//! since (one H200). Both passes take two vectors a thread per iteration, two loads in flight.
//! 768 threads a row (two blocks a multiprocessor instead of three, fewer rows between a row's
//! two passes) took 0.404 ms against 512's 0.389 in the same call: 512 kept.

use std::sync::Arc;

use cudarc::driver::{CudaModule, LaunchConfig, PushKernelArg};
use tch::{Kind, Tensor};

use crate::runtime::cuda::Gpu;
use crate::runtime::kernels::{self, Instances, Precision};

/// Threads per row.
const THREADS: u32 = 512;

/// The kernels, after [`kernels`]' shared conversions. `scale` points at one fp32 on the device
/// (1 / the targets counted); a target outside `[0, v)` (the ignore index) gives a zero row.
pub(crate) const SOURCE: &str = r#"
#define NEG_INF __int_as_float(0xff800000u)
__device__ __forceinline__ void combine(float& m, float& s, float m2, float s2) {
  float mn = fmaxf(m, m2);
  float a = (m == NEG_INF) ? 0.f : s * expf(m - mn);
  float b = (m2 == NEG_INF) ? 0.f : s2 * expf(m2 - mn);
  m = mn; s = a + b;
}

/* Adds vector `i` of the row (N logits, the columns from v on left out) to the running maximum m
   and sum of exponentials s: the vector's own maximum first, then its N exponentials against the
   new maximum, independent of each other, and s rescaled once (not once per logit). */
#define ABSORB(RAW, I, T, N, LOAD)                                                                    \
  {                                                                                                   \
    const T* e = reinterpret_cast<const T*>(&(RAW));                                                  \
    float xs[N];                                                                                      \
    float mv = NEG_INF;                                                                               \
    _Pragma("unroll")                                                                                 \
    for (int k = 0; k < N; ++k) {                                                                     \
      xs[k] = ((I) * N + k < v) ? LOAD(e[k]) : NEG_INF;                                               \
      mv = fmaxf(mv, xs[k]);                                                                          \
    }                                                                                                 \
    if (mv != NEG_INF) {                                                                              \
      float mn = fmaxf(m, mv), acc = 0.f;                                                             \
      _Pragma("unroll")                                                                               \
      for (int k = 0; k < N; ++k) acc += expf(xs[k] - mn);                                            \
      s = s * expf(m - mn) + acc;                                                                     \
      m = mn;                                                                                         \
    }                                                                                                 \
  }

/* Vector `i`'s gradient, written over it. */
#define GRAD(RAW, I, T, VEC, N, LOAD, STORE)                                                          \
  {                                                                                                   \
    const T* e = reinterpret_cast<const T*>(&(RAW));                                                  \
    VEC out;                                                                                          \
    T* o = reinterpret_cast<T*>(&out);                                                                \
    _Pragma("unroll")                                                                                 \
    for (int k = 0; k < N; ++k) {                                                                     \
      long long j = (I) * N + k;                                                                      \
      float gj = 0.f;                                                                                 \
      if (j < v) gj = (expf(LOAD(e[k]) - lse) - (j == t ? 1.f : 0.f)) * g;                            \
      o[k] = STORE(gj);                                                                               \
    }                                                                                                 \
    xv[I] = out;                                                                                      \
  }

/* APPLY(raw, i, ...) on each of the row's vectors this thread takes (vectors threadIdx.x, + step,
   ...), two per iteration so that two loads are in flight; both passes go through it. */
#define EACH_VECTOR(VEC, APPLY, ...)                                                                  \
  {                                                                                                   \
    long long i = threadIdx.x;                                                                        \
    for (; i + step < nv; i += 2 * step) {                                                            \
      VEC a = xv[i], b = xv[i + step];                                                                \
      APPLY(a, i, __VA_ARGS__)                                                                        \
      APPLY(b, i + step, __VA_ARGS__)                                                                 \
    }                                                                                                 \
    if (i < nv) {                                                                                     \
      VEC a = xv[i];                                                                                  \
      APPLY(a, i, __VA_ARGS__)                                                                        \
    }                                                                                                 \
  }

#define CE(NAME, T, VEC, N, LOAD, STORE)                                                              \
extern "C" __global__ void NAME(T* __restrict__ logits, const long long* __restrict__ target,        \
    float* __restrict__ loss, long long v_pad, long long v, const float* __restrict__ scale) {        \
  __shared__ float red_m[32];                                                                         \
  __shared__ float red_s[32];                                                                         \
  __shared__ float picked;                                                                            \
  T* x = logits + blockIdx.x * v_pad;                                                                 \
  VEC* xv = reinterpret_cast<VEC*>(x);                                                                \
  const long long nv = v_pad / N, step = blockDim.x;                                                  \
  long long t = target[blockIdx.x];                                                                   \
  bool valid = t >= 0 && t < v;                                                                       \
  float m = NEG_INF, s = 0.f;                                                                       \
  EACH_VECTOR(VEC, ABSORB, T, N, LOAD)                                                                \
  for (int off = 16; off > 0; off >>= 1)                                                              \
    combine(m, s, __shfl_xor_sync(0xffffffffu, m, off), __shfl_xor_sync(0xffffffffu, s, off));      \
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;                      \
  if (lane == 0) { red_m[warp] = m; red_s[warp] = s; }                                                \
  if (threadIdx.x == 0) picked = valid ? LOAD(x[t]) : 0.f;                                            \
  __syncthreads();                                                                                    \
  m = lane < warps ? red_m[lane] : NEG_INF;                                                         \
  s = lane < warps ? red_s[lane] : 0.f;                                                               \
  for (int off = 16; off > 0; off >>= 1)                                                              \
    combine(m, s, __shfl_xor_sync(0xffffffffu, m, off), __shfl_xor_sync(0xffffffffu, s, off));      \
  float lse = m + logf(s);                                                                            \
  float g = valid ? *scale : 0.f;                                                                     \
  if (threadIdx.x == 0) loss[blockIdx.x] = valid ? lse - picked : 0.f;                                \
  EACH_VECTOR(VEC, GRAD, T, VEC, N, LOAD, STORE)                                                      \
}

CE(cross_entropy_bf16, unsigned short, uint4, 8, bf2f, f2bf)
CE(cross_entropy_f16, unsigned short, uint4, 8, h2f, f2h)
CE(cross_entropy_f32, float, float4, 4, f2f, f2f)
"#;

pub struct FusedCrossEntropy {
    gpu: Arc<Gpu>,
    _module: Arc<CudaModule>,
    cross_entropy: Instances,
}

#[derive(Debug, thiserror::Error)]
pub enum CrossEntropyError {
    #[error("the cross-entropy kernel: {0}")]
    Kernel(#[from] kernels::KernelError),
    #[error("CUDA: {0}")]
    Cuda(#[from] cudarc::driver::DriverError),
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
    #[error(
        "the cross-entropy kernel takes contiguous, 16-byte aligned rows of logits whose length is a multiple of 16 \
         bytes, and int64 targets"
    )]
    Layout,
    #[error("libtorch's current stream: {0}")]
    Stream(#[from] crate::runtime::shim::ShimError),
}

impl FusedCrossEntropy {
    /// Compiles the kernels for this GPU's architecture.
    pub fn new(gpu: Arc<Gpu>) -> Result<Self, CrossEntropyError> {
        let module = kernels::load(&gpu, SOURCE)?;
        Ok(Self { cross_entropy: Instances::load(&module, "cross_entropy")?, _module: module, gpu })
    }

    /// Each row's cross-entropy (fp32), the logits replaced by their gradient; `None` (nothing
    /// written) where libtorch computes on another stream than the compute stream on this thread:
    /// the caller's libtorch operations then run there instead, as the products decline
    /// (`recompute_cuda::matmul_into`).
    pub fn run(
        &self,
        logits: &Tensor,
        target: &Tensor,
        v: i64,
        scale: &Tensor,
    ) -> Result<Option<Tensor>, CrossEntropyError> {
        let (rows, v_pad) = logits.size2()?;
        let p = Precision::of(logits.kind()).ok_or(CrossEntropyError::Layout)?;
        let (func, vector) = (self.cross_entropy.get(p), p.vector());
        if !logits.is_contiguous()
            || v_pad % vector != 0
            || logits.data_ptr() as usize % 16 != 0
            || target.kind() != Kind::Int64
            || !target.is_contiguous()
            || target.numel() != rows as usize
            || scale.kind() != Kind::Float
            || v > v_pad
        {
            return Err(CrossEntropyError::Layout);
        }
        if !self.gpu.computes_here()? {
            return Ok(None);
        }
        let loss = Tensor::f_empty([rows], (Kind::Float, logits.device()))?;
        if rows == 0 {
            return Ok(Some(loss));
        }
        let grid = u32::try_from(rows).map_err(|_| CrossEntropyError::Layout)?;
        let cfg = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        let ptr = |t: &Tensor| t.data_ptr() as u64;
        let (lp, tp, op, sp) = (ptr(logits), ptr(target), ptr(&loss), ptr(scale));
        let mut launch = self.gpu.compute.launch_builder(func);
        launch.arg(&lp).arg(&tp).arg(&op).arg(&v_pad).arg(&v).arg(&sp);
        // SAFETY: contiguous device tensors of the kernel's types and shapes (checked above),
        // alive until the kernel has run: libtorch frees them in stream order, on this stream.
        unsafe { launch.launch(cfg) }?;
        Ok(Some(loss))
    }
}
