//! The AdamW update of [`super::adamw`] as one CUDA kernel, compiled at start with NVRTC: a
//! single pass over the shard that reads the gradient, master weights and moments and writes them
//! back together with the compute-precision copy of the parameters (28 bytes per parameter in
//! bf16, against about three times that for the same update composed of libtorch operations).
//! It runs on the compute stream, in libtorch's order, or beside a replayed backward on the GPU's
//! update stream ([`Lane`]).
//!
//! The update is bound by the memory's bandwidth, so each thread moves four elements per load:
//! 16 bytes of each fp32 state and 8 (or 16) of the gradient and parameter copy. Shards whose
//! tensors are not aligned for those loads take the kernel of one element per load; both apply
//! the same arithmetic to each element, in the same order, and give the same bits.
use std::sync::Arc;

use cudarc::driver::{CudaModule, LaunchConfig, PushKernelArg};
use tch::Tensor;

use crate::runtime::cuda::Gpu;
use crate::runtime::kernels::{self, Instances, Precision};

/// The kernels, after [`kernels`]' shared conversions.
pub const SOURCE: &str = r#"
/* One element of the update; both kernels apply it, so they give the same bits. */
__device__ __forceinline__ void adamw_one(float& p, float& m, float& v, float g, float decay, float omb1, float b2,
                                          float omb2, float step_size, float inv_bc2_sqrt, float eps) {
  p *= decay;
  m += omb1 * (g - m);
  v = b2 * v + omb2 * g * g;
  p -= step_size * m / (sqrtf(v) * inv_bc2_sqrt + eps);
}

#define ADAMW_ARGS                                                                                  \
    float* __restrict__ p, float* __restrict__ m, float* __restrict__ v, const GT* __restrict__ g,  \
    OT* __restrict__ out, long long n, float decay, float omb1, float b2, float omb2,              \
    float step_size, float inv_bc2_sqrt, float eps, float gscale
#define ADAMW_ELEMENT(i, LOAD, STORE)                                                               \
  {                                                                                                 \
    float pi = p[i], mi = m[i], vi = v[i];                                                          \
    adamw_one(pi, mi, vi, LOAD(g[i]) * gscale, decay, omb1, b2, omb2, step_size, inv_bc2_sqrt, eps);\
    p[i] = pi; m[i] = mi; v[i] = vi;                                                                \
    STORE;                                                                                          \
  }

/* One element per thread and load: for shards not aligned for ADAMW_VEC. */
#define ADAMW(NAME, LOAD, STORE)                                                                    \
extern "C" __global__ void NAME(ADAMW_ARGS) {                                                       \
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;                       \
       i += (long long)gridDim.x * blockDim.x)                                                      \
    ADAMW_ELEMENT(i, LOAD, STORE)                                                                   \
}

/* Four elements per thread and load (16 bytes of each fp32 state): elements 4j..4j+3 by thread j,
   the last n % 4 by the first threads. Every pointer must be aligned for its vector type (the
   launcher checks). */
#define ADAMW_VEC(NAME, GV, LOAD, LOAD4, STORE, STORE4)                                             \
extern "C" __global__ void NAME(ADAMW_ARGS) {                                                       \
  const long long nv = n / 4;                                                                       \
  const long long stride = (long long)gridDim.x * blockDim.x;                                       \
  const long long first = blockIdx.x * (long long)blockDim.x + threadIdx.x;                         \
  for (long long j = first; j < nv; j += stride) {                                                  \
    float4 P = reinterpret_cast<float4*>(p)[j];                                                     \
    float4 M = reinterpret_cast<float4*>(m)[j];                                                     \
    float4 V = reinterpret_cast<float4*>(v)[j];                                                     \
    GV G = reinterpret_cast<const GV*>(g)[j];                                                       \
    float gs[4];                                                                                    \
    LOAD4(G, gs);                                                                                   \
    adamw_one(P.x, M.x, V.x, gs[0] * gscale, decay, omb1, b2, omb2, step_size, inv_bc2_sqrt, eps);  \
    adamw_one(P.y, M.y, V.y, gs[1] * gscale, decay, omb1, b2, omb2, step_size, inv_bc2_sqrt, eps);  \
    adamw_one(P.z, M.z, V.z, gs[2] * gscale, decay, omb1, b2, omb2, step_size, inv_bc2_sqrt, eps);  \
    adamw_one(P.w, M.w, V.w, gs[3] * gscale, decay, omb1, b2, omb2, step_size, inv_bc2_sqrt, eps);  \
    reinterpret_cast<float4*>(p)[j] = P;                                                            \
    reinterpret_cast<float4*>(m)[j] = M;                                                            \
    reinterpret_cast<float4*>(v)[j] = V;                                                            \
    STORE4;                                                                                         \
  }                                                                                                 \
  const long long i = 4 * nv + first;                                                               \
  if (i < n) ADAMW_ELEMENT(i, LOAD, STORE)                                                          \
}

/* Four 16-bit values in one 8-byte word, the first in the low half. */
#define LO(w) ((unsigned short)((w) & 0xffffu))
#define HI(w) ((unsigned short)((w) >> 16))
#define PACK(a, b) ((unsigned int)(a) | ((unsigned int)(b) << 16))
#define LOAD4_16(CVT, G, gs) { gs[0] = CVT(LO(G.x)); gs[1] = CVT(HI(G.x)); gs[2] = CVT(LO(G.y)); gs[3] = CVT(HI(G.y)); }
#define BF_LOAD4(G, gs) LOAD4_16(bf2f, G, gs)
#define H_LOAD4(G, gs) LOAD4_16(h2f, G, gs)
#define F_LOAD4(G, gs) { gs[0] = G.x; gs[1] = G.y; gs[2] = G.z; gs[3] = G.w; }
#define STORE4_16(CVT) reinterpret_cast<uint2*>(out)[j] = make_uint2(PACK(CVT(P.x), CVT(P.y)), PACK(CVT(P.z), CVT(P.w)))

#define GT unsigned short
#define OT unsigned short
ADAMW(adamw_bf16, bf2f, out[i] = f2bf(pi))
ADAMW(adamw_f16, h2f, out[i] = f2h(pi))
ADAMW_VEC(adamw_vec_bf16, uint2, bf2f, BF_LOAD4, out[i] = f2bf(pi), STORE4_16(f2bf))
ADAMW_VEC(adamw_vec_f16, uint2, h2f, H_LOAD4, out[i] = f2h(pi), STORE4_16(f2h))
#undef GT
#undef OT
#define GT float
#define OT float
ADAMW(adamw_f32, f2f, (void)out)
ADAMW_VEC(adamw_vec_f32, float4, f2f, F_LOAD4, (void)out, (void)out)
"#;

/// The per-step scalars of the update, as the kernel takes them (the CPU loop of `adamw` takes
/// the same).
#[derive(Debug, Clone, Copy)]
pub struct Coeffs {
    pub decay: f32,
    pub one_minus_b1: f32,
    pub b2: f32,
    pub one_minus_b2: f32,
    pub step_size: f32,
    pub inv_bc2_sqrt: f32,
    pub eps: f32,
    pub grad_scale: f32,
}

/// Where and how an update's kernel is launched. Both give the same bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// On the compute stream after the backward: at most 16 blocks a multiprocessor, each looping
    /// over the shard (as fast as any form measured alone, `examples/adamw_bw`).
    InOrder,
    /// On the update stream while a backward replays at a higher priority: a block per 256
    /// vectors (256 elements where the shard is not aligned for vectors; the engine's are), each
    /// short-lived, so that a product waiting for multiprocessors gets one as soon as a block ends
    /// instead of after the whole update.
    Beside,
}

pub struct FusedAdamW {
    gpu: Arc<Gpu>,
    _module: Arc<CudaModule>,
    /// One element per load, and four ([`VECTOR`]).
    adamw: Instances,
    adamw_vec: Instances,
    max_blocks: u32,
}

/// Elements per thread and load of `adamw_vec`.
const VECTOR: usize = 4;

/// Threads per block of the update's kernels.
pub const THREADS: u32 = 256;

#[derive(Debug, thiserror::Error)]
pub enum FusedError {
    #[error("the AdamW kernel: {0}")]
    Kernel(#[from] kernels::KernelError),
    #[error("CUDA: {0}")]
    Cuda(#[from] cudarc::driver::DriverError),
}

impl FusedAdamW {
    /// Compiles the kernels for this GPU's architecture.
    pub fn new(gpu: Arc<Gpu>) -> Result<Self, FusedError> {
        let module = kernels::load(&gpu, SOURCE)?;
        Ok(Self {
            adamw: Instances::load(&module, "adamw")?,
            adamw_vec: Instances::load(&module, "adamw_vec")?,
            _module: module,
            max_blocks: kernels::multiprocessors(&gpu)? * 16,
            gpu,
        })
    }

    /// One update of a shard (see `adamw::Shard` for the roles of the tensors).
    #[allow(clippy::too_many_arguments)]
    pub fn step(
        &self,
        k: &Coeffs,
        master: &Tensor,
        m: &Tensor,
        v: &Tensor,
        grad: &Tensor,
        out: Option<&Tensor>,
        lane: Lane,
    ) -> Result<(), FusedError> {
        let n = master.numel();
        if n == 0 {
            return Ok(());
        }
        // The gradient's precision picks the instance; fp32 for anything else, as before.
        let precision = Precision::of(grad.kind()).unwrap_or(Precision::F32);
        let ptr = |t: &Tensor| t.data_ptr() as u64;
        let (p, mp, vp, gp) = (ptr(master), ptr(m), ptr(v), ptr(grad));
        let op = out.map_or(0, ptr);
        // Four elements per load where every tensor starts on a boundary of its vector type.
        let gbytes = (VECTOR * grad.kind().elt_size_in_bytes()) as u64;
        let obytes = out.map_or(1, |o| (VECTOR * o.kind().elt_size_in_bytes()) as u64);
        let vector = [p, mp, vp].iter().all(|a| a % 16 == 0) && gp % gbytes == 0 && op % obytes == 0;
        let (func, threads_needed) = if vector {
            (self.adamw_vec.get(precision), (n / VECTOR).max(n % VECTOR))
        } else {
            (self.adamw.get(precision), n)
        };
        let blocks = u32::try_from(threads_needed.div_ceil(THREADS as usize)).unwrap_or(u32::MAX);
        let (blocks, stream) = match lane {
            Lane::InOrder => (blocks.min(self.max_blocks), &self.gpu.compute),
            Lane::Beside => (blocks, &self.gpu.update),
        };
        // SAFETY: the engine's contiguous shards of `n` elements of the kernel's types, alive until
        // the kernel has run (they are persistent), each aligned for the kernel's loads (above).
        unsafe { self.launch_on(stream, func, blocks, k, [p, mp, vp, gp, op], n as i64) }?;
        Ok(())
    }

    /// Launches `func`, a kernel of [`SOURCE`]'s argument list (`examples/adamw_bw` times other
    /// forms of the update with it), on the compute stream: `blocks` blocks of [`THREADS`] over
    /// `n` elements at the device addresses `[master, m, v, grad, out]` (`out` 0 for none).
    ///
    /// # Safety
    /// The addresses hold `n` elements of the kernel's types, aligned for its loads, alive until
    /// it has run on the compute stream.
    pub unsafe fn launch(
        &self,
        func: &cudarc::driver::CudaFunction,
        blocks: u32,
        k: &Coeffs,
        addresses: [u64; 5],
        n: i64,
    ) -> Result<(), FusedError> {
        // SAFETY: as the caller promises.
        unsafe { self.launch_on(&self.gpu.compute, func, blocks, k, addresses, n) }
    }

    /// [`Self::launch`] on `stream`.
    ///
    /// # Safety
    /// As [`Self::launch`], alive until the kernel has run on `stream`.
    unsafe fn launch_on(
        &self,
        stream: &Arc<cudarc::driver::CudaStream>,
        func: &cudarc::driver::CudaFunction,
        blocks: u32,
        k: &Coeffs,
        [p, mp, vp, gp, op]: [u64; 5],
        n: i64,
    ) -> Result<(), FusedError> {
        let cfg = LaunchConfig { grid_dim: (blocks.max(1), 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        let mut launch = stream.launch_builder(func);
        launch
            .arg(&p)
            .arg(&mp)
            .arg(&vp)
            .arg(&gp)
            .arg(&op)
            .arg(&n)
            .arg(&k.decay)
            .arg(&k.one_minus_b1)
            .arg(&k.b2)
            .arg(&k.one_minus_b2)
            .arg(&k.step_size)
            .arg(&k.inv_bc2_sqrt)
            .arg(&k.eps)
            .arg(&k.grad_scale);
        // SAFETY: as the caller promises; the argument list is the kernels'.
        unsafe { launch.launch(cfg) }?;
        Ok(())
    }
}
