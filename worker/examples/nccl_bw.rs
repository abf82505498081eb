//! Bus bandwidth of zerobench's NCCL collectives, measured like `bench/gpu/collectives.py`
//! measures torch.distributed's: bf16 buffers, 5 warm-up calls, then 20 back-to-back calls timed on
//! the host around a device synchronisation. One JSON line per (collective, size) on rank 0; then
//! the pinned host-device copy bandwidth (the engine's offload copies) of the largest size.
//!
//! `mpirun -np 2 target/release/examples/nccl_bw BYTES...`

use std::sync::Arc;
use std::time::Instant;

use mpi::topology::Communicator;
use tch::{Kind, Tensor};
use zerobench_worker::comm::nccl::NcclCollectives;
use zerobench_worker::comm::{CollectiveKind, Collectives};
use zerobench_worker::runtime::{cuda, device, identity, pinned};

const WARMUP: usize = 5;
const ITERS: usize = 20;

fn main() {
    // Before MPI starts, as the worker does: MPI may initialise CUDA.
    cuda::bind_local_gpu(identity::local_rank_hint().unwrap_or(0));
    let universe = mpi::initialize().expect("MPI");
    let world = universe.world();
    let (rank, n) = (world.rank() as usize, world.size() as usize);
    let dev = device::select(zerobench_schema::DeviceRequest::Cuda).expect("a GPU");
    let gpu = cuda::Gpu::new(0).expect("CUDA context");
    let mut c = NcclCollectives::new(world, Arc::clone(&gpu), None).expect("NCCL");
    let sizes: Vec<usize> = std::env::args().skip(1).map(|a| a.parse().expect("sizes in bytes")).collect();
    for &bytes in &sizes {
        let elems = (bytes / 2).div_ceil(n) * n;
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
            let busbw = size / (us * 1e-6) * kind.bus_factor(n) / 1e9;
            if rank == 0 {
                println!(
                    "{{\"impl\":\"zerobench\",\"op\":\"{}\",\"bytes\":{},\"ranks\":{n},\"us\":{us:.1},\"busbw_gbps\":{busbw:.2}}}",
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
        let host = pinned::host_empty(elems, Kind::BFloat16).expect("host buffer");
        let _pin = pinned::pin_all(&gpu, &[&host]).expect("page-locked");
        for kind in [CollectiveKind::DeviceToHost, CollectiveKind::HostToDevice] {
            let run = |c: &mut NcclCollectives| {
                let p = match kind {
                    CollectiveKind::DeviceToHost => {
                        let (p, landed) = c.copy_to_host(&dev_buf, &host).expect("copy");
                        landed.wait().expect("landed");
                        p
                    }
                    _ => c.copy_to_device(&host, &dev_buf).expect("copy"),
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
    let _ = c.take_stats();
    t0.elapsed().as_secs_f64() * 1e6 / ITERS as f64
}
