//! How fast host memory can be page-locked for offload, by four methods, on one GPU host. Offload's
//! set-up page-locks its whole host state (`runtime::pinned`: exact-size allocation, then one
//! `cuMemHostRegister` per tensor on one thread, about 2 GB/s on the H200 hosts), and the
//! `setup` record's `host_state_setup_ms` shows what that costs a run. For each size this prints
//! one JSON line per method with the set-up seconds, the GB/s they amount to, and the bandwidth
//! of one host-to-device copy of the buffer (at most 1 GiB of it): a method that sets up fast but
//! copies at pageable speed has not page-locked what the copy reads.
//!
//! - `register`: what the engine does now: allocate, register the buffer in one call.
//! - `register-chunks`: allocate, register it as one range per thread, in parallel (separately
//!   registered ranges: the copy shows whether a copy spanning them still runs at pinned speed).
//! - `prefault-register`: allocate, write every page from all threads (the kernel's page faults
//!   are what registering a fresh allocation waits for), then register in one call.
//! - `host-alloc`: `cuMemHostAlloc` (cudaHostAlloc), CUDA's own page-locked allocation.
//!
//! `target/release/examples/pin_bench [GIB...]` (default 4); it needs a GPU and says so without.

use std::alloc::{alloc, dealloc, Layout};
use std::ffi::c_void;
use std::time::Instant;

use cudarc::driver::{sys, CudaContext};
use rayon::prelude::*;

const PAGE: usize = 4096;
/// The most of each buffer the copy check moves (the bandwidth is flat well below this).
const COPY_CAP: usize = 1 << 30;

#[derive(Clone, Copy, Debug)]
enum Method {
    Register,
    RegisterChunks,
    PrefaultRegister,
    HostAlloc,
}

impl Method {
    const ALL: [Method; 4] = [Method::Register, Method::RegisterChunks, Method::PrefaultRegister, Method::HostAlloc];

    fn name(self) -> &'static str {
        match self {
            Method::Register => "register",
            Method::RegisterChunks => "register-chunks",
            Method::PrefaultRegister => "prefault-register",
            Method::HostAlloc => "host-alloc",
        }
    }
}

/// A page-locked host buffer and how to give it back.
struct Locked {
    ptr: *mut u8,
    bytes: usize,
    /// The ranges registered (empty for `host-alloc`, which frees with `cuMemFreeHost`).
    ranges: Vec<(usize, usize)>,
    host_alloc: bool,
}

impl Drop for Locked {
    fn drop(&mut self) {
        // SAFETY: the ranges were registered and the allocation made by `lock` below, once each.
        unsafe {
            for &(off, _) in &self.ranges {
                let _ = sys::cuMemHostUnregister(self.ptr.add(off).cast());
            }
            if self.host_alloc {
                let _ = sys::cuMemFreeHost(self.ptr.cast());
            } else {
                dealloc(self.ptr, Layout::from_size_align(self.bytes, PAGE).expect("layout"));
            }
        }
    }
}

fn check(r: sys::CUresult, what: &str) {
    assert!(r == sys::CUresult::CUDA_SUCCESS, "{what}: {r:?}");
}

fn lock(ctx: &CudaContext, method: Method, bytes: usize, threads: usize) -> Locked {
    let flags = sys::CU_MEMHOSTREGISTER_PORTABLE;
    if let Method::HostAlloc = method {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: an out-pointer for one allocation of `bytes`.
        check(unsafe { sys::cuMemHostAlloc(&mut p, bytes, sys::CU_MEMHOSTALLOC_PORTABLE) }, "cuMemHostAlloc");
        return Locked { ptr: p.cast(), bytes, ranges: Vec::new(), host_alloc: true };
    }
    // SAFETY: a non-zero, page-aligned layout; freed in `Drop`.
    let ptr = unsafe { alloc(Layout::from_size_align(bytes, PAGE).expect("layout")) };
    assert!(!ptr.is_null(), "allocating {bytes} bytes");
    let addr = ptr as usize;
    if let Method::PrefaultRegister = method {
        // SAFETY: the allocation is `bytes` long and only written here, by disjoint chunks.
        let buf = unsafe { std::slice::from_raw_parts_mut(ptr, bytes) };
        buf.par_chunks_mut(bytes.div_ceil(threads).next_multiple_of(PAGE)).for_each(|c| c.fill(0));
    }
    let ranges: Vec<(usize, usize)> = match method {
        Method::RegisterChunks => {
            let chunk = bytes.div_ceil(threads).next_multiple_of(PAGE);
            (0..bytes).step_by(chunk).map(|off| (off, chunk.min(bytes - off))).collect()
        }
        _ => vec![(0, bytes)],
    };
    ranges.par_iter().for_each(|&(off, len)| {
        ctx.bind_to_thread().expect("CUDA context on a pool thread");
        // SAFETY: a live range of the allocation above, registered once and unregistered in Drop.
        check(unsafe { sys::cuMemHostRegister_v2((addr + off) as *mut c_void, len, flags) }, "cuMemHostRegister");
    });
    Locked { ptr, bytes, ranges, host_alloc: false }
}

/// GB/s of one synchronous host-to-device copy of the first `COPY_CAP` bytes of `l`.
fn copy_gbps(l: &Locked) -> f64 {
    let n = l.bytes.min(COPY_CAP);
    let mut dev: sys::CUdeviceptr = 0;
    // SAFETY: out-pointer for a device allocation of `n` bytes, freed below; the host range is
    // `n` bytes of a live allocation.
    unsafe {
        check(sys::cuMemAlloc_v2(&mut dev, n), "cuMemAlloc");
        check(sys::cuMemcpyHtoD_v2(dev, l.ptr.cast(), n), "warm-up copy");
        let t = Instant::now();
        check(sys::cuMemcpyHtoD_v2(dev, l.ptr.cast(), n), "copy");
        let s = t.elapsed().as_secs_f64();
        check(sys::cuMemFree_v2(dev), "cuMemFree");
        n as f64 / s / 1e9
    }
}

fn main() {
    let sizes: Vec<f64> =
        std::env::args().skip(1).map(|a| a.parse().unwrap_or_else(|_| panic!("sizes in GiB, not {a:?}"))).collect();
    let sizes = if sizes.is_empty() { vec![4.0] } else { sizes };
    let ctx = match CudaContext::new(0) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("pin_bench needs a GPU: {e}");
            std::process::exit(2);
        }
    };
    let threads = rayon::current_num_threads();
    for gib in sizes {
        let bytes = ((gib * (1u64 << 30) as f64) as usize).next_multiple_of(PAGE);
        for m in Method::ALL {
            ctx.bind_to_thread().expect("CUDA context");
            let t = Instant::now();
            let l = lock(&ctx, m, bytes, threads);
            let s = t.elapsed().as_secs_f64();
            let h2d = copy_gbps(&l);
            println!(
                "{{\"method\":\"{}\",\"bytes\":{bytes},\"threads\":{threads},\"setup_s\":{s:.3},\"lock_gbps\":{:.2},\"h2d_gbps\":{h2d:.1}}}",
                m.name(),
                bytes as f64 / s / 1e9
            );
            let t = Instant::now();
            drop(l);
            eprintln!("{}: released in {:.3} s", m.name(), t.elapsed().as_secs_f64());
        }
    }
}
