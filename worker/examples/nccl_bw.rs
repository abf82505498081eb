//! Bus bandwidth of zerobench's NCCL collectives, measured like `bench/gpu/collectives.py`
//! measures torch.distributed's: bf16 buffers, 5 warm-up calls, then 20 back-to-back calls timed on
//! the host around a device synchronisation. One JSON line per (collective, size) on rank 0; then
//! the pinned host-device copy bandwidth (the engine's offload copies) of the largest size.
//!
//! With `--copy-engines`, every collective goes through the copy-engine transport
//! (`zerobench-worker --copy-engines all`) and is labelled `zerobench-ce`. Before timing a size, each
//! collective is checked once against its closed form (rank r contributes r + 1); a wrong result
//! ends the program with a panic.
//!
//! `mpirun -np 2 target/release/examples/nccl_bw [--copy-engines] BYTES...`, or, with NCCL's id
//! passed through the rendezvous store instead of MPI, one process per GPU with `RANK`,
//! `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR` and `MASTER_PORT` set.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tch::{Kind, Tensor};
use zerobench_schema::config::CopyEngines;
use zerobench_worker::comm::nccl::NcclCollectives;
use zerobench_worker::comm::{CollectiveKind, Collectives};
use zerobench_worker::runtime::{cuda, device, identity, pinned, rendezvous};

const WARMUP: usize = 5;
const ITERS: usize = 20;

fn main() {
    // Before MPI starts, as the worker does: MPI may initialise CUDA.
    cuda::bind_local_gpu(identity::local_rank_hint().unwrap_or(0));
    // `_mpi` keeps MPI initialised to the end, for ranks that mpirun started.
    let rendezvous::Ranks { host, mpi: _mpi, .. } =
        rendezvous::join(zerobench_worker::runtime::launch_env::Rendezvous::Auto, Duration::from_secs(60))
            .expect("the ranks meet");
    let (rank, n) = (host.rank(), host.size());
    let dev = device::select(zerobench_schema::DeviceRequest::Cuda).expect("a GPU");
    let gpu = cuda::Gpu::new(0, cuda::ComputeStream::Legacy).expect("CUDA context");
    let args: Vec<String> = std::env::args().skip(1).collect();
    let copy_engines = args.iter().any(|a| a == "--copy-engines").then_some(CopyEngines::All);
    let label = if copy_engines.is_some() { "zerobench-ce" } else { "zerobench" };
    let mut c = NcclCollectives::new(host, Arc::clone(&gpu), None, copy_engines).expect("NCCL");
    let sizes: Vec<usize> =
        args.iter().filter(|a| !a.starts_with("--")).map(|a| a.parse().expect("sizes in bytes")).collect();
    for &bytes in &sizes {
        let elems = (bytes / 2).div_ceil(n) * n;
        check(&mut c, elems, rank, n, dev);
        let full = Tensor::ones([elems as i64], (Kind::BFloat16, dev));
        let shard = full.narrow(0, (rank * elems / n) as i64, (elems / n) as i64);
        for kind in [CollectiveKind::AllReduce, CollectiveKind::ReduceScatter, CollectiveKind::AllGather] {
            let run = |c: &mut NcclCollectives| {
                let p = match kind {
                    CollectiveKind::AllReduce => c.all_reduce(&full),
                    CollectiveKind::ReduceScatter => c.reduce_scatter(&full, &shard),
                    _ => c.all_gather(&shard, &full),
                }
                .expect("collective");
                c.wait(p).expect("wait");
            };
            let us = time_us(&mut c, &gpu, run);
            let size = (elems * 2) as f64;
            // On one rank a collective moves nothing over a link: bus bandwidth 0.
            let busbw = size / (us * 1e-6) * kind.bus_factor(n).unwrap_or(0.0) / 1e9;
            if rank == 0 {
                println!(
                    "{{\"impl\":\"{label}\",\"op\":\"{}\",\"bytes\":{},\"ranks\":{n},\"us\":{us:.1},\"busbw_gbps\":{busbw:.2}}}",
                    kind.name(),
                    elems * 2
                );
            }
        }
    }
    // Offload's copies: a pinned host buffer to and from the device.
    if let Some(&bytes) = sizes.iter().max() {
        let elems = (bytes / 2) as i64;
        let dev_buf = Tensor::ones([elems], (Kind::BFloat16, dev));
        // Page-locked as the engine's offload state is.
        let host = pinned::host_zeros(elems, Kind::BFloat16).expect("host buffer");
        let _pin = pinned::pin_all(&gpu, &[&host]).expect("page-locked");
        for kind in [CollectiveKind::DeviceToHost, CollectiveKind::HostToDevice] {
            let run = |c: &mut NcclCollectives| {
                let p = match kind {
                    CollectiveKind::DeviceToHost => {
                        let (p, landed) = c.copy_to_host(&dev_buf, &host).expect("copy");
                        landed.wait().expect("landed");
                        p
                    }
                    _ => {
                        let (p, read) = c.copy_to_device(&host, &dev_buf).expect("copy");
                        read.wait().expect("read");
                        p
                    }
                };
                c.wait(p).expect("wait");
            };
            let us = time_us(&mut c, &gpu, run);
            if rank == 0 {
                println!(
                    "{{\"impl\":\"zerobench\",\"op\":\"{}\",\"bytes\":{},\"us\":{us:.1},\"gbps\":{:.2}}}",
                    kind.name(),
                    elems * 2,
                    (elems * 2) as f64 / (us * 1e-6) / 1e9
                );
            }
        }
    }
}

/// Each collective once against its closed form: rank r contributes (i mod 13) + r + 1 at index
/// i (small integers, exact in bf16 for up to 8 ranks), so a misplaced element shows. All-reduce
/// runs in place, reduce-scatter and all-gather between separate buffers.
fn check(c: &mut NcclCollectives, elems: usize, rank: usize, n: usize, dev: tch::Device) {
    let pattern = |len: i64| Tensor::arange(len, (Kind::Int64, dev)).remainder(13);
    let contribution = |len: i64, r: usize| (pattern(len) + (r + 1) as i64).to_kind(Kind::BFloat16);
    let m = (elems / n) as i64;
    let ranks_sum = (n * (n + 1) / 2) as i64;
    let summed = |len: i64| (pattern(len) * n as i64 + ranks_sum).to_kind(Kind::BFloat16);
    let full = contribution(elems as i64, rank);
    let p = c.all_reduce(&full).expect("all_reduce");
    c.wait(p).expect("wait");
    assert_eq!(count_diff(&full, &summed(elems as i64)), 0, "all_reduce");
    let full = contribution(elems as i64, rank);
    let out = Tensor::zeros([m], (Kind::BFloat16, dev));
    let p = c.reduce_scatter(&full, &out).expect("reduce_scatter");
    c.wait(p).expect("wait");
    assert_eq!(count_diff(&out, &summed(elems as i64).narrow(0, rank as i64 * m, m)), 0, "reduce_scatter");
    let shard = contribution(m, rank);
    let gathered = Tensor::zeros([elems as i64], (Kind::BFloat16, dev));
    let p = c.all_gather(&shard, &gathered).expect("all_gather");
    c.wait(p).expect("wait");
    for r in 0..n {
        assert_eq!(
            count_diff(&gathered.narrow(0, r as i64 * m, m), &contribution(m, r)),
            0,
            "all_gather: rank {r}'s slice"
        );
    }
}

/// How many elements of `a` differ from `b`.
fn count_diff(a: &Tensor, b: &Tensor) -> i64 {
    a.ne_tensor(b).sum(Kind::Int64).int64_value(&[])
}

/// Microseconds per call of `run`: WARMUP calls, then ITERS back to back, timed on the host
/// around a device synchronisation (after a barrier, so that every rank starts together).
fn time_us(c: &mut NcclCollectives, gpu: &cuda::Gpu, run: impl Fn(&mut NcclCollectives)) -> f64 {
    for _ in 0..WARMUP {
        run(c);
    }
    gpu.compute.synchronize().expect("sync");
    c.barrier().expect("barrier");
    let t0 = Instant::now();
    for _ in 0..ITERS {
        run(c);
    }
    gpu.compute.synchronize().expect("sync");
    let us = t0.elapsed().as_secs_f64() * 1e6 / ITERS as f64;
    // Outside the timed loop: reading back the events of every call costs host time.
    let _ = c.take_stats();
    us
}
