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
//! - `thp-register`: allocate aligned to 2 MiB, ask for transparent huge pages
//!   (`madvise(MADV_HUGEPAGE)`), register in one call: the kernel then faults 2 MiB pages, 512
//!   times fewer than 4 KiB ones.
//! - `thp-prefault-register`: the same, with every page written from all threads first.
//!
//! The first line says what the host's transparent huge pages are set to.
//!
//! `target/release/examples/pin_bench [GIB...]` (default 4); it needs a GPU and says so without.
//!
//! `pin_bench first-touch GIB` compares how offload's fresh host state can be faulted in, on memory
//! the process has never had: six regions of `GIB` each, mapped as the engine maps them (anonymous,
//! 2 MiB-aligned, `MADV_HUGEPAGE`) and kept until the end, faulted in from all threads in 64 MiB
//! pieces in the order zero, touch, populate, populate, touch, zero, then registered; then the same
//! once more after all six are unmapped (memory the process has had back). `zero` writes every
//! byte with 0, `touch` gives one byte per page a compare-and-swap of 0 for 0, `populate` asks the
//! kernel to fault the range in writable (`MADV_POPULATE_WRITE`, Linux 5.14) without a write from
//! user space. On a virtual machine that backs guest memory on its first touch, the first pass is
//! what a freshly started host pays.

use std::alloc::{alloc, dealloc, Layout};
use std::ffi::c_void;
use std::time::Instant;

use cudarc::driver::{sys, CudaContext};
use rayon::prelude::*;
use tch::Kind;
use zerobench_worker::runtime::pinned;

const PAGE: usize = 4096;
/// A transparent huge page on x86-64.
const HUGE: usize = 2 << 20;
/// The most of each buffer the copy check moves (the bandwidth is flat well below this).
const COPY_CAP: usize = 1 << 30;

#[derive(Clone, Copy, Debug)]
enum Method {
    Register,
    RegisterChunks,
    PrefaultRegister,
    HostAlloc,
    ThpRegister,
    ThpPrefaultRegister,
}

impl Method {
    const ALL: [Method; 6] = [
        Method::Register,
        Method::RegisterChunks,
        Method::PrefaultRegister,
        Method::HostAlloc,
        Method::ThpRegister,
        Method::ThpPrefaultRegister,
    ];

    fn name(self) -> &'static str {
        match self {
            Method::Register => "register",
            Method::RegisterChunks => "register-chunks",
            Method::PrefaultRegister => "prefault-register",
            Method::HostAlloc => "host-alloc",
            Method::ThpRegister => "thp-register",
            Method::ThpPrefaultRegister => "thp-prefault-register",
        }
    }

    /// The allocation's alignment: a huge page where huge pages are asked for.
    fn align(self) -> usize {
        match self {
            Method::ThpRegister | Method::ThpPrefaultRegister => HUGE,
            _ => PAGE,
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
    align: usize,
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
                dealloc(self.ptr, Layout::from_size_align(self.bytes, self.align).expect("layout"));
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
        return Locked { ptr: p.cast(), bytes, ranges: Vec::new(), host_alloc: true, align: PAGE };
    }
    let align = method.align();
    // SAFETY: a non-zero, page-aligned layout; freed in `Drop`.
    let ptr = unsafe { alloc(Layout::from_size_align(bytes, align).expect("layout")) };
    assert!(!ptr.is_null(), "allocating {bytes} bytes");
    let addr = ptr as usize;
    if align == HUGE {
        // SAFETY: advice on a range of our own allocation; it changes no contents.
        let rc = unsafe { libc::madvise(ptr.cast(), bytes, libc::MADV_HUGEPAGE) };
        assert_eq!(rc, 0, "madvise(MADV_HUGEPAGE): {}", std::io::Error::last_os_error());
    }
    if let Method::PrefaultRegister | Method::ThpPrefaultRegister = method {
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
    Locked { ptr, bytes, ranges, host_alloc: false, align }
}

/// GB/s of one synchronous host-to-device copy of `n` bytes from the start of `l`, or the driver's
/// error (a copy spanning two separately registered ranges is refused: CUDA_ERROR_INVALID_VALUE).
fn copy_gbps(l: &Locked, n: usize) -> Result<f64, String> {
    let ok = |r: sys::CUresult, what: &str| {
        if r == sys::CUresult::CUDA_SUCCESS {
            Ok(())
        } else {
            Err(format!("{what}: {r:?}"))
        }
    };
    let mut dev: sys::CUdeviceptr = 0;
    // SAFETY: out-pointer for a device allocation of `n` bytes, freed below; the host range is
    // `n` bytes of a live allocation.
    unsafe {
        ok(sys::cuMemAlloc_v2(&mut dev, n), "cuMemAlloc")?;
        let result = ok(sys::cuMemcpyHtoD_v2(dev, l.ptr.cast(), n), "warm-up copy").and_then(|()| {
            let t = Instant::now();
            ok(sys::cuMemcpyHtoD_v2(dev, l.ptr.cast(), n), "copy")?;
            Ok(n as f64 / t.elapsed().as_secs_f64() / 1e9)
        });
        let _ = sys::cuMemFree_v2(dev);
        result
    }
}

/// MiB of this process's memory in transparent huge pages (`AnonHugePages`), 0 if unknown.
fn anon_huge_mib() -> u64 {
    let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap_or_default();
    rollup
        .lines()
        .find_map(|l| l.strip_prefix("AnonHugePages:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib / 1024)
}

/// A copy figure as JSON: a number, or the error as a string.
fn json(r: &Result<f64, String>) -> String {
    match r {
        Ok(v) => format!("{v:.1}"),
        Err(e) => format!("{e:?}"),
    }
}

/// How `first-touch` faults a fresh region in before registering it.
#[derive(Clone, Copy, Debug)]
enum Touch {
    Zero,
    Cas,
    Populate,
}

impl Touch {
    fn name(self) -> &'static str {
        match self {
            Touch::Zero => "zero",
            Touch::Cas => "touch",
            Touch::Populate => "populate",
        }
    }

    /// Faults in `len` bytes at `addr` (a piece of a live mapping nothing else accesses), the
    /// last two as the engine does (`runtime::pinned`).
    fn apply(self, addr: usize, len: usize) {
        match self {
            // SAFETY: `len` bytes of a live private mapping; this piece is touched by one thread.
            Touch::Zero => unsafe { std::ptr::write_bytes(addr as *mut u8, 0, len) },
            // SAFETY: as above.
            Touch::Cas => unsafe { pinned::write_each_page(addr, len) },
            Touch::Populate => pinned::populate(addr, len).expect("madvise(MADV_POPULATE_WRITE)"),
        }
    }
}

/// The `first-touch` mode (see the module doc): one JSON line per region and pass.
fn first_touch(ctx: &CudaContext, gib: f64) {
    const PIECE: usize = 64 << 20;
    const ORDER: [Touch; 6] = [Touch::Zero, Touch::Cas, Touch::Populate, Touch::Populate, Touch::Cas, Touch::Zero];
    let bytes = ((gib * (1u64 << 30) as f64) as usize).next_multiple_of(HUGE);
    let threads = rayon::current_num_threads();
    for memory in ["never-had", "had-back"] {
        let mut kept = Vec::new();
        for (i, touch) in ORDER.into_iter().enumerate() {
            // Mapped as the engine maps its host state (fresh, 2 MiB-aligned, huge pages).
            let region = pinned::host_zeros(i64::try_from(bytes / 4).expect("size"), Kind::Float).expect("mapping");
            let addr = region.data_ptr() as usize;
            let t = Instant::now();
            let pieces: Vec<usize> = (0..bytes).step_by(PIECE).collect();
            pieces.par_iter().for_each(|&off| touch.apply(addr + off, PIECE.min(bytes - off)));
            let touch_s = t.elapsed().as_secs_f64();
            ctx.bind_to_thread().expect("CUDA context");
            let t = Instant::now();
            // SAFETY: a live mapping (`region`), unregistered below before it is unmapped.
            check(
                unsafe { sys::cuMemHostRegister_v2(addr as *mut c_void, bytes, sys::CU_MEMHOSTREGISTER_PORTABLE) },
                "cuMemHostRegister",
            );
            let register_s = t.elapsed().as_secs_f64();
            println!(
                "{{\"mode\":\"first-touch\",\"memory\":\"{memory}\",\"order\":{i},\"touch\":\"{}\",\"bytes\":{bytes},\"threads\":{threads},\"touch_s\":{touch_s:.3},\"register_s\":{register_s:.3},\"lock_gbps\":{:.2},\"anon_huge_mib\":{}}}",
                touch.name(),
                bytes as f64 / (touch_s + register_s) / 1e9,
                anon_huge_mib()
            );
            kept.push(region);
        }
        for region in &kept {
            // SAFETY: registered above.
            let _ = unsafe { sys::cuMemHostUnregister(region.data_ptr()) };
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let gib = |a: &String| a.parse::<f64>().unwrap_or_else(|_| panic!("sizes in GiB, not {a:?}"));
    // `first-touch GIB`, or the sizes to lock (default 4 GiB).
    let (first_touch_gib, sizes) = match args.split_first() {
        Some((mode, rest)) if mode == "first-touch" => {
            (Some(rest.first().map_or_else(|| panic!("first-touch GIB"), gib)), vec![])
        }
        _ if args.is_empty() => (None, vec![4.0]),
        _ => (None, args.iter().map(gib).collect()),
    };
    // SAFETY: only tries to load the driver library by its names (cudarc panics on first use
    // when it is absent, so ask first).
    if !unsafe { sys::is_culib_present() } {
        eprintln!("pin_bench needs a GPU: no CUDA driver library on this host");
        std::process::exit(2);
    }
    let ctx = match CudaContext::new(0) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("pin_bench needs a GPU: {e}");
            std::process::exit(2);
        }
    };
    let threads = rayon::current_num_threads();
    let thp = |f: &str| std::fs::read_to_string(format!("/sys/kernel/mm/transparent_hugepage/{f}")).unwrap_or_default();
    println!("{{\"thp_enabled\":{:?},\"thp_defrag\":{:?}}}", thp("enabled").trim(), thp("defrag").trim());
    if let Some(gib) = first_touch_gib {
        first_touch(&ctx, gib);
        return;
    }
    for gib in sizes {
        let bytes = ((gib * (1u64 << 30) as f64) as usize).next_multiple_of(HUGE);
        for m in Method::ALL {
            ctx.bind_to_thread().expect("CUDA context");
            let t = Instant::now();
            let l = lock(&ctx, m, bytes, threads);
            let s = t.elapsed().as_secs_f64();
            let huge = anon_huge_mib();
            // One copy as the engine makes them (up to COPY_CAP from the start, across ranges), and
            // one within the first registered range.
            let n = bytes.min(COPY_CAP);
            let first = l.ranges.first().map_or(n, |r| r.1.min(n));
            let (h2d, h2d_first) = (copy_gbps(&l, n), copy_gbps(&l, first));
            println!(
                "{{\"method\":\"{}\",\"bytes\":{bytes},\"threads\":{threads},\"setup_s\":{s:.3},\"lock_gbps\":{:.2},\"h2d_gbps\":{},\"h2d_first_range_gbps\":{},\"anon_huge_mib\":{huge}}}",
                m.name(),
                bytes as f64 / s / 1e9,
                json(&h2d),
                json(&h2d_first)
            );
            let t = Instant::now();
            drop(l);
            eprintln!("{}: released in {:.3} s", m.name(), t.elapsed().as_secs_f64());
        }
    }
}
