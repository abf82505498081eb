//! Page-locked host memory of exactly the requested size.
//!
//! libtorch's `pin_memory` allocates through its caching host allocator, which rounds every block
//! up to a power of two (up to twice the bytes asked for) and copies the tensor into it: mistral-7b's
//! 116 GB of offloaded states did not finish setting up in 90 s on a 128 GB host. Here a host tensor
//! is allocated at its exact size by the ordinary CPU allocator and page-locked in place with
//! `cuMemHostRegister`, so the host-memory check before set-up (`host_memory`) is what is used.
//!
//! Registering a fresh allocation is slow because the kernel faults in every page on the one
//! registering thread: 2.7 GB/s for 4 GiB on a 32-core H200 host. Each tensor's pages are therefore
//! faulted in first from every core (a read and a write of one byte per page, so any data already
//! there stays), and the registration then only pins them: 12 GB/s on the same host, in the same
//! call (`worker/examples/pin_bench.rs`, bench/results/raw/gpu-2026-11-24-rendezvous.tar.gz).
//! Registering ranges from several threads instead is no faster (3.0 GB/s) and breaks copies that
//! span two ranges (CUDA_ERROR_INVALID_VALUE); `cuMemHostAlloc` is as slow as registering.

use cudarc::driver::{sys, DriverError};
use rayon::prelude::*;
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
    prefault(t.data_ptr().cast(), bytes);
    let fail = |source| PinError::Register { bytes, source };
    // SAFETY: a live, contiguous host allocation of `bytes`; `Pinned` keeps it alive until it is
    // unregistered. PORTABLE: locked for every context, as libtorch's pinned memory is.
    unsafe { sys::cuMemHostRegister_v2(t.data_ptr(), bytes, sys::CU_MEMHOSTREGISTER_PORTABLE) }
        .result()
        .map_err(fail)?;
    Ok(Some(Pinned { keep: t }))
}

/// Bytes of one page: the unit the kernel faults in (huge pages only make it coarser).
const PAGE: usize = 4096;

/// Faults in every page of `len` bytes at `ptr` from every core of the pool: one byte of each page
/// is read and written back, so the contents stay as they were.
fn prefault(ptr: *mut u8, len: usize) {
    let base = ptr as usize;
    (0..len.div_ceil(PAGE)).into_par_iter().with_min_len(256).for_each(|page| {
        // SAFETY: `page * PAGE < len`, inside the live allocation of `len` bytes at `ptr` that the
        // caller owns; nothing else touches it during set-up, and the byte is written back as read.
        unsafe {
            let p = (base + page * PAGE) as *mut u8;
            p.write_volatile(p.read_volatile());
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefaulting_keeps_the_contents() {
        let t = Tensor::arange(3 * 4096 + 17, (Kind::Float, Device::Cpu));
        let before = t.copy();
        let bytes = t.numel() * t.kind().elt_size_in_bytes();
        prefault(t.data_ptr().cast(), bytes);
        assert!(t.equal(&before));
    }
}
