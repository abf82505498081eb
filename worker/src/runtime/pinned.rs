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
//! all cores first**, 512 times fewer faults on as many cores. So [`host_zeros`] maps that way
//! (through the shim, which gives the tensor its memory and unmaps it) and [`pin_all`] faults in
//! every page from the rank's threads before registering. On a 2×H100 host, in one call
//! (docs/results/offload-and-hpz.md), t5-11b's 181 GB locked at 22.5-22.9 GB/s faulted in by
//! writing zeros, against 18.9 GB/s by a write per page that changes nothing (2.8 GB/s before
//! either); the first large allocation on a freshly started host was slower either way (6-7 GB/s;
//! most likely the virtual machine backing its memory on first touch). The pages are now faulted
//! in by the kernel (`MADV_POPULATE_WRITE`, Linux 5.14), which writes nothing from user space:
//! host state fresh from [`host_zeros`] is zero already, the kernel's own zeroing of each new page
//! is the only pass over it, and tensors that hold data keep it, so one way serves both. Measured
//! with `pin_bench first-touch` (bench/results/gpu-2026-11-26-first-touch.json) it is as fast as
//! either write or up to 20% faster on memory used before, and level with them on memory a freshly
//! started machine never had, whose first touch (4-17 GB/s, by host) no way of faulting in changes.
//! Kernels without that advice fall back to the write per page. Copies run at 55 GB/s either way.
//! Offload's host state registers only the tensors the device copies ([`pin_copied`]): its Adam
//! moments are faulted in in the same pass but not locked, which took its set-up on memory used
//! before from 12.6 to 7.5 s for t5-11b on a 2×H100 host.

use std::ffi::c_void;
use std::io;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Instant;

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
    #[error("faulting in {bytes} bytes of host memory: {source}")]
    FaultIn { bytes: usize, source: io::Error },
}

impl PinError {
    /// The bytes asked for, where the error is the host or the driver out of memory.
    pub fn out_of_memory_bytes(&self) -> Option<usize> {
        match self {
            PinError::Register { bytes, source } if source.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => Some(*bytes),
            PinError::FaultIn { bytes, source } if source.raw_os_error() == Some(libc::ENOMEM) => Some(*bytes),
            _ => None,
        }
    }
}

/// A host tensor of exactly `n` zeros, in transparent huge pages from 2 MiB up, whose pages the
/// kernel zeroes as they are first faulted in.
pub fn host_zeros(n: i64, kind: Kind) -> Result<Tensor, PinError> {
    Ok(shim::host_zeros(n, kind)?)
}

/// The smallest page: touching one byte in each faults them all in.
const PAGE: usize = 4096;

/// Pieces of the prefault, so that every thread gets work however the tensors' sizes are spread:
/// two huge pages. A gpt2-xl unit's host state (491 MB in five tensors) made 8 pieces of 64 MiB,
/// which kept 8 of a 16-core host's threads busy.
const PREFAULT_PIECE: usize = 4 << 20;

/// How a piece of a tensor is faulted in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FaultBy {
    /// The kernel faults the range in writable (`MADV_POPULATE_WRITE`, Linux 5.14) and nothing
    /// is written from user space.
    Populate,
    /// One byte of each page gets an atomic compare-and-swap of 0 for 0, which changes no byte
    /// but is a write access (x86-64's `lock cmpxchg` writes even when the comparison fails). It
    /// must be a write: a first read maps the shared (huge) zero page, and the write after it
    /// splits that into 4 KiB pages (tried on 2×H200: 6.7 GB/s for t5-11b's states); an atomic
    /// `fetch_or(0)` is compiled to a load (tried: 2.6 GB/s, as with no faulting in).
    Write,
}

impl FaultBy {
    /// [`FaultBy::Populate`] where the kernel knows the advice, else [`FaultBy::Write`]. The
    /// kernel checks the advice before the length, so an empty range asks without touching memory.
    fn of_this_kernel() -> FaultBy {
        static BY: std::sync::OnceLock<FaultBy> = std::sync::OnceLock::new();
        *BY.get_or_init(|| {
            let mut probe = [0u8; 2 * PAGE];
            let page = (probe.as_mut_ptr() as usize).next_multiple_of(PAGE);
            match populate(page, 0) {
                Ok(()) => FaultBy::Populate,
                Err(_) => FaultBy::Write,
            }
        })
    }
}

/// Page-locks every (contiguous, CPU) tensor of `tensors` in place, after faulting in every page
/// of them from the rank's threads (`fault_in`); what they hold is kept.
pub fn pin_all(gpu: &Gpu, tensors: &[&Tensor]) -> Result<Vec<Pinned>, PinError> {
    pin_copied(gpu, tensors, &[])
}

/// [`pin_all`] of `copied`, the tensors the device copies to or from, with the pages of
/// `host_only` faulted in in the same pass but not registered: the host alone reads and writes
/// them, at the same speed locked or not, and registering them would lock memory nothing copies
/// and cost time (gpt2-xl's whole state: 0.69 s registering against 1.0 s faulting in).
pub fn pin_copied(gpu: &Gpu, copied: &[&Tensor], host_only: &[&Tensor]) -> Result<Vec<Pinned>, PinError> {
    let t = Instant::now();
    fault_in(&[copied, host_only].concat())?;
    let fault_in_ms = t.elapsed().as_secs_f64() * 1e3;
    gpu.ctx.bind_to_thread().map_err(PinError::Context)?;
    let pins = copied.iter().filter_map(|t| register(t.shallow_clone()).transpose()).collect();
    tracing::debug!(
        bytes = copied.iter().chain(host_only).map(|t| bytes_of(t)).sum::<usize>(),
        locked_bytes = copied.iter().map(|t| bytes_of(t)).sum::<usize>(),
        tensors = copied.len() + host_only.len(),
        fault_in_ms,
        register_ms = t.elapsed().as_secs_f64() * 1e3 - fault_in_ms,
        "page-locked"
    );
    pins
}

/// Faults in every page of the (contiguous, CPU) `tensors` writable, from the rayon pool's
/// threads, changing no byte.
pub(crate) fn fault_in(tensors: &[&Tensor]) -> Result<(), PinError> {
    fault_in_by(tensors, FaultBy::of_this_kernel())
}

fn fault_in_by(tensors: &[&Tensor], by: FaultBy) -> Result<(), PinError> {
    let bytes = tensors.iter().map(|t| bytes_of(t)).sum();
    let pieces: Vec<(usize, usize)> = tensors
        .iter()
        .flat_map(|t| {
            let (addr, bytes) = (t.data_ptr() as usize, bytes_of(t));
            (0..bytes).step_by(PREFAULT_PIECE).map(move |off| (addr + off, PREFAULT_PIECE.min(bytes - off)))
        })
        .collect();
    pieces.par_iter().try_for_each(|&(addr, len)| match by {
        // The error names all that was being faulted in: an out-of-memory result's request.
        FaultBy::Populate => populate(addr, len).map_err(|source| PinError::FaultIn { bytes, source }),
        FaultBy::Write => {
            // SAFETY: a piece of a live tensor of `tensors`, which nothing else accesses during
            // this call; the pieces are disjoint.
            unsafe { write_each_page(addr, len) };
            Ok(())
        }
    })
}

/// The bytes a tensor's elements take.
pub(crate) fn bytes_of(t: &Tensor) -> usize {
    t.numel() * t.kind().elt_size_in_bytes()
}

/// `MADV_POPULATE_WRITE` over the pages holding `len` bytes at `addr`: the kernel faults them in
/// writable and no byte changes (the advice takes whole pages; those around a tensor's bytes belong
/// to the same live allocation). An unmapped or read-only range is an error.
/// `examples/pin_bench` times it as the engine calls it.
pub fn populate(addr: usize, len: usize) -> Result<(), io::Error> {
    let start = addr / PAGE * PAGE;
    let end = (addr + len).next_multiple_of(PAGE);
    // SAFETY: advice only: it faults pages in and writes nothing; the kernel checks the range.
    match unsafe { libc::madvise(start as *mut c_void, end - start, libc::MADV_POPULATE_WRITE) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// `FaultBy::Write` over `len` (> 0) bytes at `addr`: one byte per page from the first, and the
/// last byte (the range need not start on a page boundary). `examples/pin_bench` times it as the
/// engine calls it.
///
/// # Safety
/// The range is live, writable memory that no other thread accesses during the call.
pub unsafe fn write_each_page(addr: usize, len: usize) {
    for page in (addr..addr + len).step_by(PAGE).chain(std::iter::once(addr + len - 1)) {
        // SAFETY: a byte of the range, which the caller guarantees; one compare-and-swap each.
        let byte = unsafe { AtomicU8::from_ptr(page as *mut u8) };
        let _ = byte.compare_exchange(0, 0, Ordering::Relaxed, Ordering::Relaxed);
    }
}

/// Whether `t`'s memory is page-locked for CUDA (`cuMemHostGetFlags` answers for registered and
/// CUDA-allocated host memory, and refuses any other). Needs a current context.
pub fn is_locked(t: &Tensor) -> bool {
    let mut flags = 0u32;
    // SAFETY: a query; CUDA checks the pointer against its registrations and writes only `flags`.
    unsafe { sys::cuMemHostGetFlags(&mut flags, t.data_ptr()) }.result().is_ok()
}

fn register(t: Tensor) -> Result<Option<Pinned>, PinError> {
    assert!(t.device() == Device::Cpu && t.is_contiguous(), "only contiguous host tensors are page-locked");
    let bytes = bytes_of(&t);
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

    /// How many of the pages holding `t` are resident (`mincore`).
    fn resident_pages(t: &Tensor) -> (usize, usize) {
        let start = t.data_ptr() as usize / PAGE * PAGE;
        let end = (t.data_ptr() as usize + bytes_of(t)).next_multiple_of(PAGE);
        let mut vec = vec![0u8; (end - start) / PAGE];
        // SAFETY: the pages of a live tensor; `vec` has one byte per page.
        assert_eq!(unsafe { libc::mincore(start as *mut c_void, end - start, vec.as_mut_ptr()) }, 0);
        (vec.iter().filter(|&&b| b & 1 == 1).count(), vec.len())
    }

    /// The private anonymous bytes (`Anonymous:` in smaps) of the mapping that holds `addr`:
    /// pages written or faulted in writable, not the shared zero page a read maps.
    fn anonymous_bytes_at(addr: usize) -> usize {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ').filter(|(r, _)| r.contains('-') && !r.ends_with(':')) {
                let (lo, hi) = range.split_once('-').unwrap();
                let (lo, hi) = (usize::from_str_radix(lo, 16).unwrap(), usize::from_str_radix(hi, 16).unwrap());
                inside = (lo..hi).contains(&addr);
            } else if let Some(kb) = line.strip_prefix("Anonymous:").filter(|_| inside) {
                return kb.trim().trim_end_matches("kB").trim().parse::<usize>().unwrap() * 1024;
            }
        }
        panic!("no mapping holds {addr:#x}");
    }

    #[test]
    fn host_tensors_from_2_mib_up_start_on_a_huge_page_and_hold_what_is_written() {
        for (n, kind) in [(3_000_017i64, Kind::Float), (1_048_577, Kind::BFloat16), (1_048_576, Kind::Half)] {
            let t = host_zeros(n, kind).unwrap();
            assert_eq!((t.size(), t.kind(), t.device()), (vec![n], kind, Device::Cpu));
            assert_eq!(t.data_ptr() as usize % HUGE, 0, "{n} {kind:?} is not on a 2 MiB boundary");
            let _ = t.shallow_clone().fill_(1.5);
            assert_eq!(t.sum(Kind::Double).double_value(&[]), 1.5 * n as f64);
        }
        // Below a huge page: an ordinary tensor, still exactly `n` elements.
        let small = host_zeros(1000, Kind::Float).unwrap();
        assert_eq!(small.size(), vec![1000]);
    }

    #[test]
    fn a_host_tensor_maps_its_pages_and_no_more() {
        // 12,000,068 bytes: not whole pages, so the mapping's slack starts at the page after them.
        let t = host_zeros(3_000_017, Kind::Float).unwrap();
        let end = (t.data_ptr() as usize + bytes_of(&t)).next_multiple_of(PAGE);
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let after = format!("{end:08x}-");
        assert!(!maps.lines().any(|l| l.starts_with(&after)), "the slack after the tensor is still mapped");
    }

    #[test]
    fn host_tensors_are_untouched_zeros_until_faulted_in_and_then_all_resident() {
        let big = host_zeros(40_000_003, Kind::Float).unwrap();
        let small = host_zeros(5_000, Kind::BFloat16).unwrap();
        // Nothing wrote the mapping: no page is there yet (a write of zeros would fault them all).
        assert_eq!(resident_pages(&big).0, 0, "host_zeros touched its memory");
        fault_in(&[&big, &small]).unwrap();
        let (resident, pages) = resident_pages(&big);
        assert_eq!(resident, pages, "pages left out");
        // Faulted in writable: private pages of the process, not the zero page a read maps.
        assert!(anonymous_bytes_at(big.data_ptr() as usize) >= bytes_of(&big), "faulted in by a read");
        for t in [&big, &small] {
            assert_eq!(t.count_nonzero(0).int64_value(&[]), 0, "{:?} is not all zeros", t.size());
        }
    }

    #[test]
    fn faulting_in_keeps_every_byte_either_way() {
        for by in [FaultBy::Populate, FaultBy::Write] {
            // Sizes across the piece length and page boundaries; the small ones do not start on one.
            let tensors: Vec<Tensor> = [(40_000_003i64, Kind::BFloat16), (5_000, Kind::Float), (1, Kind::Half)]
                .into_iter()
                .map(|(n, kind)| {
                    let t = host_zeros(n, kind).unwrap();
                    t.shallow_clone().copy_(&Tensor::randn([n], (Kind::Float, Device::Cpu)).to_kind(kind));
                    t
                })
                .collect();
            let before: Vec<Tensor> = tensors.iter().map(Tensor::copy).collect();
            fault_in_by(&tensors.iter().collect::<Vec<_>>(), by).unwrap();
            for (t, b) in tensors.iter().zip(&before) {
                assert!(t.equal(b), "{by:?} changed a tensor of {:?}", t.size());
            }
        }
    }

    #[test]
    fn the_kernel_is_asked_whether_it_populates() {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        let mut v = release.split(|c: char| !c.is_ascii_digit()).filter_map(|x| x.parse::<u32>().ok());
        let (major, minor) = (v.next().unwrap(), v.next().unwrap());
        let expected = if (major, minor) >= (5, 14) { FaultBy::Populate } else { FaultBy::Write };
        assert_eq!(FaultBy::of_this_kernel(), expected, "kernel {release}");
    }

    #[test]
    fn writing_each_page_faults_fresh_memory_in_writable() {
        let t = host_zeros(40_000_003, Kind::Float).unwrap();
        fault_in_by(&[&t], FaultBy::Write).unwrap();
        let (resident, pages) = resident_pages(&t);
        assert_eq!(resident, pages, "pages left out");
        assert!(anonymous_bytes_at(t.data_ptr() as usize) >= bytes_of(&t), "faulted in by a read");
    }

    #[test]
    fn memory_that_cannot_be_faulted_in_writable_is_an_error_naming_its_bytes() {
        const LEN: usize = 1 << 20;
        // Beside a tensor that can be: the error names all that was being faulted in.
        let writable = host_zeros(3 << 20, Kind::Float).unwrap();
        let all = LEN + (12 << 20);
        // SAFETY: a new read-only anonymous mapping, unmapped at the end; the tensor over it is
        // dropped first and never written.
        unsafe {
            let p =
                libc::mmap(std::ptr::null_mut(), LEN, libc::PROT_READ, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0);
            assert_ne!(p, libc::MAP_FAILED);
            let t = Tensor::from_blob(p.cast(), &[LEN as i64], &[1], Kind::Uint8, Device::Cpu);
            let e = fault_in(&[&writable, &t]).unwrap_err();
            drop(t);
            libc::munmap(p, LEN);
            assert!(matches!(e, PinError::FaultIn { bytes, .. } if bytes == all), "{e:?}");
            let head = format!("faulting in {all} bytes of host memory: ");
            assert!(e.to_string().starts_with(&head), "{e}");
            match Failure::from(crate::zero::EngineError::Pin(e)) {
                Failure::Internal(m) => assert!(m.starts_with(&head), "{m}"),
                f => panic!("not an internal failure: {f:?}"),
            }
        }
        // The kernel out of memory while faulting in is an out-of-memory result with the bytes.
        let e = PinError::FaultIn { bytes: 1 << 40, source: io::Error::from_raw_os_error(libc::ENOMEM) };
        match Failure::from(crate::zero::EngineError::Pin(e)) {
            Failure::Oom { requested_bytes, .. } => assert_eq!(requested_bytes, Some(1 << 40)),
            f => panic!("not an out-of-memory result: {f:?}"),
        }
    }

    #[test]
    fn a_host_tensor_too_large_for_memory_is_an_out_of_memory_result() {
        let e = host_zeros(1 << 60, Kind::Float).unwrap_err();
        match Failure::from(crate::zero::EngineError::Pin(e)) {
            Failure::Oom { requested_bytes, .. } => assert_eq!(requested_bytes, Some(4 << 60)),
            f => panic!("not an out-of-memory result: {f:?}"),
        }
        assert!(host_zeros(10, Kind::Int64).is_err(), "only offload's element types");
    }
}
