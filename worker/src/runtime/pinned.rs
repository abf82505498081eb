//! Page-locked host memory of exactly the requested size.
//!
//! libtorch's `pin_memory` allocates through its caching host allocator, which rounds every block
//! up to a power of two (up to twice the bytes asked for) and copies the tensor into it: mistral-7b's
//! 116 GB of offloaded states did not finish setting up in 90 s on a 128 GB host. Here a host tensor
//! is allocated at its exact size by the ordinary CPU allocator and page-locked in place with
//! `cuMemHostRegister`, so the host-memory check before set-up (`host_memory`) is what is used.
//! Locking runs at about 2 GB/s per process on the H200 hosts (t5-11b's 181 GB: 72-86 s of set-up,
//! bench/results/gpu-2026-11-22-x2-offload.json, raw/gpu-2026-11-24-offload-setup.tar.gz), on one
//! thread. `worker/examples/pin_bench.rs` measured the alternatives on a 32-core H200 host (4 GiB,
//! raw/gpu-2026-11-24-rendezvous.tar.gz): faulting the pages in from every core before registering
//! reached 12 GB/s there, but inside the worker (tensor by tensor, after the model is built) it was
//! slower than this (1.6 against 2.3 GB/s for gpt2-xl's 25 GB) and is not used; registering ranges
//! from several threads reached 3.0 GB/s and breaks copies that span two ranges
//! (CUDA_ERROR_INVALID_VALUE); `cuMemHostAlloc` 2.8 GB/s.

use cudarc::driver::{sys, DriverError};
use tch::{Device, Kind, TchError, Tensor};

use super::cuda::Gpu;

/// A host tensor registered with CUDA (copies to and from it are asynchronous DMA). The
/// registration ends when this is dropped; it holds a handle on the storage so the memory cannot
/// be freed while still registered.
pub struct Pinned {
    keep: Tensor,
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: the address was registered by `pin_all` and its storage is still alive (`keep`).
        // An error here (the context already torn down at exit) leaves nothing to clean up.
        let _ = unsafe { sys::cuMemHostUnregister(self.keep.data_ptr()) };
    }
}

/// Why host memory could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum PinError {
    #[error(transparent)]
    Torch(#[from] TchError),
    #[error("CUDA context for page-locking host memory: {0}")]
    Context(DriverError),
    #[error("page-locking {bytes} bytes of host memory: {source}")]
    Register { bytes: usize, source: DriverError },
}

/// An uninitialised host tensor of exactly `n` elements.
pub fn host_empty(n: i64, kind: Kind) -> Result<Tensor, TchError> {
    Tensor::f_empty([n], (kind, Device::Cpu))
}

/// Page-locks every (contiguous, CPU) tensor of `tensors` in place.
pub fn pin_all(gpu: &Gpu, tensors: &[&Tensor]) -> Result<Vec<Pinned>, PinError> {
    gpu.ctx.bind_to_thread().map_err(PinError::Context)?;
    tensors.iter().filter_map(|t| register(t.shallow_clone()).transpose()).collect()
}

fn register(t: Tensor) -> Result<Option<Pinned>, PinError> {
    assert!(t.device() == Device::Cpu && t.is_contiguous(), "only contiguous host tensors are page-locked");
    let bytes = t.numel() * t.kind().elt_size_in_bytes();
    if bytes == 0 {
        return Ok(None); // nothing to lock, and CUDA refuses a zero-length range
    }
    let fail = |source| PinError::Register { bytes, source };
    // SAFETY: a live, contiguous host allocation of `bytes`; `Pinned` keeps it alive until it is
    // unregistered. PORTABLE: locked for every context, as libtorch's pinned memory is.
    unsafe { sys::cuMemHostRegister_v2(t.data_ptr(), bytes, sys::CU_MEMHOSTREGISTER_PORTABLE) }
        .result()
        .map_err(fail)?;
    Ok(Some(Pinned { keep: t }))
}
