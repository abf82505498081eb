//! Page-locked host memory of exactly the requested size, locked at memory speed.
//!
//! libtorch's `pin_memory` allocates through its caching host allocator, which rounds every block
//! up to a power of two (up to twice the bytes asked for) and copies the tensor into it: mistral-7b's
//! 116 GB of offloaded states did not finish setting up in 90 s on a 128 GB host. Here a host tensor
//! is allocated at its exact size and page-locked in place with `cuMemHostRegister`, so the
//! host-memory check before set-up (`host_memory`) is what is used.
//!
//! Registering fresh memory is the kernel faulting in every 4 KiB page on one thread: about 3 GB/s
//! on the H200 hosts (t5-11b's 181 GB took 72-86 s of set-up). `worker/examples/pin_bench.rs`
//! measured the alternatives on a 16-core H200 host (4 and 16 GiB,
//! bench/results/gpu-2026-11-26-offload-setup.json): registering ranges from several threads, 3.1 GB/s
//! (and a copy spanning two ranges is refused); `cuMemHostAlloc`, 2.8 GB/s; writing every page from
//! all cores first, 8-9 GB/s; memory aligned to 2 MiB and advised into transparent huge pages
//! (which these hosts give only on `madvise`), 5-6 GB/s, and **20 GB/s with every page written from
//! all cores first**, 512 times fewer faults on as many cores. So [`host_empty`] allocates that way
//! (through the shim, which gives the tensor its memory and frees it) and [`pin_all`] faults in
//! every page from the rank's threads before registering: by writing zeros where the tensors are
//! fresh (offload's host state, [`Contents::Zero`]), else by a write that changes nothing
//! ([`Contents::Keep`]). On a 2×H100 host, in one call (docs/results/offload-and-hpz.md), t5-11b's
//! 181 GB locked at 22.5-22.9 GB/s zero-filled against 18.9 GB/s kept (2.8 GB/s before either);
//! the first large allocation on a freshly started host is slower either way (6-7 GB/s; most
//! likely the virtual machine backing its memory on first touch). Copies run at 55 GB/s either way.

use std::sync::atomic::{AtomicU8, Ordering};

use cudarc::driver::{sys, DriverError};
use rayon::prelude::*;
use tch::{Device, Kind, TchError, Tensor};

use super::cuda::Gpu;
use super::shim::{self, ShimError};

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
    #[error("allocating host memory: {0}")]
    Alloc(#[from] ShimError),
    #[error("CUDA context for page-locking host memory: {0}")]
    Context(DriverError),
    #[error("page-locking {bytes} bytes of host memory: {source}")]
    Register { bytes: usize, source: DriverError },
}

/// An uninitialised host tensor of exactly `n` elements, in transparent huge pages from 2 MiB up.
pub fn host_empty(n: i64, kind: Kind) -> Result<Tensor, PinError> {
    Ok(shim::host_empty(n, kind)?)
}

/// The smallest page: touching one byte in each faults them all in.
const PAGE: usize = 4096;

/// Pieces of the prefault, so that every thread gets work however the tensors' sizes are spread.
const PREFAULT_PIECE: usize = 64 << 20;

/// What faulting a tensor's pages in does to what it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Contents {
    /// Kept: one byte of each page gets a write that changes nothing (tensors that hold data).
    Keep,
    /// Zeroed: every byte is written with 0, which faults the pages in as fast as any write and
    /// leaves nothing to clear afterwards (fresh tensors that start at zero or are overwritten).
    Zero,
}

/// Page-locks every (contiguous, CPU) tensor of `tensors` in place, after faulting in every page
/// of them from the rank's threads ([`fault_in`]), keeping or zeroing what they hold.
pub fn pin_all(gpu: &Gpu, tensors: &[&Tensor], contents: Contents) -> Result<Vec<Pinned>, PinError> {
    fault_in(tensors, contents);
    gpu.ctx.bind_to_thread().map_err(PinError::Context)?;
    tensors.iter().filter_map(|t| register(t.shallow_clone()).transpose()).collect()
}

/// Faults in every page of the (contiguous, CPU) `tensors` from the rayon pool's threads.
///
/// [`Contents::Keep`]: one byte of each page gets an atomic compare-and-swap of 0 for 0, which
/// changes no byte but is a write access (x86-64's `lock cmpxchg` writes even when the comparison
/// fails). It must be a write and nothing else: a first read maps the shared (huge) zero page, and
/// the write after it splits that into 4 KiB pages (tried on 2×H200: 6.7 GB/s for t5-11b's
/// states); an atomic `fetch_or(0)` is compiled to a load (tried: 2.6 GB/s, as with no faulting
/// in). [`Contents::Zero`]: every byte is written with 0.
pub(crate) fn fault_in(tensors: &[&Tensor], contents: Contents) {
    let pieces: Vec<(usize, usize)> = tensors
        .iter()
        .flat_map(|t| {
            let (addr, bytes) = (t.data_ptr() as usize, t.numel() * t.kind().elt_size_in_bytes());
            (0..bytes).step_by(PREFAULT_PIECE).map(move |off| (addr + off, PREFAULT_PIECE.min(bytes - off)))
        })
        .collect();
    pieces.par_iter().for_each(|&(addr, len)| {
        if contents == Contents::Zero {
            // SAFETY: `len` bytes inside a live tensor of `tensors`, which nothing else accesses
            // during this call; the pieces are disjoint.
            unsafe { std::ptr::write_bytes(addr as *mut u8, 0, len) };
            return;
        }
        // One byte per page from the piece's first, and its last byte (the piece need not start
        // on a page boundary).
        for page in (addr..addr + len).step_by(PAGE).chain(std::iter::once(addr + len - 1)) {
            // SAFETY: a byte inside a live tensor of `tensors`, which nothing else accesses
            // during this call; each byte is touched by one thread.
            let byte = unsafe { AtomicU8::from_ptr(page as *mut u8) };
            let _ = byte.compare_exchange(0, 0, Ordering::Relaxed, Ordering::Relaxed);
        }
    });
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failure::Failure;

    const HUGE: usize = 2 << 20;

    #[test]
    fn host_tensors_from_2_mib_up_start_on_a_huge_page_and_hold_what_is_written() {
        for (n, kind) in [(3_000_017i64, Kind::Float), (1_048_577, Kind::BFloat16), (1_048_576, Kind::Half)] {
            let t = host_empty(n, kind).unwrap();
            assert_eq!((t.size(), t.kind(), t.device()), (vec![n], kind, Device::Cpu));
            assert_eq!(t.data_ptr() as usize % HUGE, 0, "{n} {kind:?} is not on a 2 MiB boundary");
            let _ = t.shallow_clone().fill_(1.5);
            assert_eq!(t.sum(Kind::Double).double_value(&[]), 1.5 * n as f64);
        }
        // Below a huge page: an ordinary tensor, still exactly `n` elements.
        let small = host_empty(1000, Kind::Float).unwrap();
        assert_eq!(small.size(), vec![1000]);
    }

    #[test]
    fn faulting_in_fresh_tensors_zeroes_every_byte() {
        let tensors: Vec<Tensor> = [(40_000_003i64, Kind::Float), (5_000, Kind::BFloat16)]
            .into_iter()
            .map(|(n, kind)| {
                let t = host_empty(n, kind).unwrap();
                let _ = t.shallow_clone().fill_(1.5);
                t
            })
            .collect();
        fault_in(&tensors.iter().collect::<Vec<_>>(), Contents::Zero);
        for t in &tensors {
            assert_eq!(t.count_nonzero(0).int64_value(&[]), 0, "zeroing left bytes of {:?}", t.size());
        }
    }

    #[test]
    fn faulting_in_keeps_every_byte() {
        // Sizes across the piece length and page boundaries; the small one does not start on one.
        let tensors: Vec<Tensor> = [(40_000_003i64, Kind::BFloat16), (5_000, Kind::Float), (1, Kind::Half)]
            .into_iter()
            .map(|(n, kind)| {
                let t = host_empty(n, kind).unwrap();
                t.shallow_clone().copy_(&Tensor::randn([n], (Kind::Float, Device::Cpu)).to_kind(kind));
                t
            })
            .collect();
        let before: Vec<Tensor> = tensors.iter().map(Tensor::copy).collect();
        fault_in(&tensors.iter().collect::<Vec<_>>(), Contents::Keep);
        for (t, b) in tensors.iter().zip(&before) {
            assert!(t.equal(b), "faulting in changed a tensor of {:?}", t.size());
        }
    }

    #[test]
    fn a_host_tensor_too_large_for_memory_is_an_out_of_memory_result() {
        let e = host_empty(1 << 60, Kind::Float).unwrap_err();
        match Failure::from(crate::zero::engine::EngineError::Pin(e)) {
            Failure::Oom { requested_bytes, .. } => assert_eq!(requested_bytes, Some(4 << 60)),
            f => panic!("not an out-of-memory result: {f:?}"),
        }
        assert!(host_empty(10, Kind::Int64).is_err(), "only offload's element types");
    }
}
