//! The AdamW update of [`super::adamw`] as one CUDA kernel, compiled at start with NVRTC: a
//! single pass over the shard that reads the gradient, master weights and moments and writes them
//! back together with the compute-precision copy of the parameters (28 bytes per parameter in
//! bf16, against about three times that for the same update composed of libtorch operations).
//! It runs on the compute stream, in libtorch's order.

use std::sync::Arc;

use cudarc::driver::{CudaModule, LaunchConfig, PushKernelArg};
use tch::Tensor;

use crate::runtime::cuda::Gpu;
use crate::runtime::kernels::{self, Instances, Precision};

/// The kernels, after [`kernels`]' shared conversions.
pub(crate) const SOURCE: &str = r#"
#define ADAMW(NAME, GT, LOAD, OT, STORE)                                                              \
extern "C" __global__ void NAME(float* __restrict__ p, float* __restrict__ m, float* __restrict__ v, \
    const GT* __restrict__ g, OT* __restrict__ out, long long n, float decay, float omb1, float b2,  \
    float omb2, float step_size, float inv_bc2_sqrt, float eps, float gscale) {                      \
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;                        \
       i += (long long)gridDim.x * blockDim.x) {                                                      \
    float gi = LOAD(g[i]) * gscale;                                                                   \
    float pi = p[i] * decay;                                                                          \
    float mi = m[i];                                                                                  \
    mi += omb1 * (gi - mi);                                                                           \
    float vi = b2 * v[i] + omb2 * gi * gi;                                                            \
    pi -= step_size * mi / (sqrtf(vi) * inv_bc2_sqrt + eps);                                          \
    p[i] = pi; m[i] = mi; v[i] = vi;                                                                  \
    STORE;                                                                                            \
  }                                                                                                   \
}

ADAMW(adamw_bf16, unsigned short, bf2f, unsigned short, out[i] = f2bf(pi))
ADAMW(adamw_f16, unsigned short, h2f, unsigned short, out[i] = f2h(pi))
ADAMW(adamw_f32, float, f2f, float, (void)out)
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

pub struct FusedAdamW {
    gpu: Arc<Gpu>,
    _module: Arc<CudaModule>,
    adamw: Instances,
    max_blocks: u32,
}

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
            _module: module,
            max_blocks: kernels::multiprocessors(&gpu)? * 16,
            gpu,
        })
    }

    /// One update of a shard (see `adamw::Shard` for the roles of the tensors).
    pub fn step(
        &self,
        k: &Coeffs,
        master: &Tensor,
        m: &Tensor,
        v: &Tensor,
        grad: &Tensor,
        out: Option<&Tensor>,
    ) -> Result<(), FusedError> {
        let n = master.numel();
        if n == 0 {
            return Ok(());
        }
        // The gradient's precision picks the instance; fp32 for anything else, as before.
        let func = self.adamw.get(Precision::of(grad.kind()).unwrap_or(Precision::F32));
        let ptr = |t: &Tensor| t.data_ptr() as u64;
        let (p, mp, vp, gp) = (ptr(master), ptr(m), ptr(v), ptr(grad));
        let op = out.map_or(0, ptr);
        let n64 = n as i64;
        let threads = 256u32;
        let blocks = u32::try_from(n.div_ceil(threads as usize)).unwrap_or(u32::MAX).min(self.max_blocks);
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 };
        let stream = &self.gpu.compute;
        let mut launch = stream.launch_builder(func);
        launch
            .arg(&p)
            .arg(&mp)
            .arg(&vp)
            .arg(&gp)
            .arg(&op)
            .arg(&n64)
            .arg(&k.decay)
            .arg(&k.one_minus_b1)
            .arg(&k.b2)
            .arg(&k.one_minus_b2)
            .arg(&k.step_size)
            .arg(&k.inv_bc2_sqrt)
            .arg(&k.eps)
            .arg(&k.grad_scale);
        // SAFETY: the engine's contiguous shards of `n` elements of the kernel's types, alive until
        // the kernel has run (they are persistent); the argument list matches the kernel's.
        unsafe { launch.launch(cfg) }?;
        Ok(())
    }
}
