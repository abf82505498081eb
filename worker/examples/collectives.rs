//! Checks the CPU collectives against closed forms, rsmpi-style: run it under several rank counts,
//! over MPI (`mpirun -np N target/release/examples/collectives`) or over Gloo (N processes with
//! `RANK`, `WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT` set, as the worker's `--rendezvous env`
//! reads them); every rank asserts, and the process exits non-zero on the first wrong value. The
//! end-to-end tests run it with 1 to 4 ranks each way.
//!
//! Rank r fills its buffers with values that depend on r, so the sums are known:
//! sum over r of (r + 1) = n(n + 1)/2.

use std::time::Duration;

use tch::{Device, Kind, Tensor};
use zerobench_worker::comm::{cpu_collectives, Backend};
use zerobench_worker::runtime::launch_env::Rendezvous;
use zerobench_worker::runtime::rendezvous::{join, Ranks};

fn check(what: &str, got: &Tensor, want: &Tensor, tol: f64) {
    let diff = (got.to_kind(Kind::Float) - want.to_kind(Kind::Float)).abs().max().double_value(&[]);
    assert!(diff <= tol, "{what}: off by {diff}");
}

fn main() {
    // `_mpi` keeps MPI initialised to the end, for ranks that mpirun started.
    let Ranks { host, mpi: _mpi, .. } = join(Rendezvous::Auto, Duration::from_secs(60)).expect("the ranks meet");
    let backend = Backend::of(&host, false, false);
    let mut c = cpu_collectives(host).expect("collectives");
    let (r, n) = (c.rank() as i64, c.world() as i64);
    let tri = (n * (n + 1) / 2) as f64;
    for kind in [Kind::Float, Kind::BFloat16, Kind::Half] {
        let cpu = (kind, Device::Cpu);
        // 16-bit floats hold integers up to 256 exactly; the sums here stay well below.
        let tol = 0.0;
        let len = 4 * n * 33; // divisible by n, not a power of two

        // all-reduce in place: every element becomes n(n+1)/2 · (i mod 7 + 1).
        let pattern = Tensor::arange(len, (Kind::Float, Device::Cpu)).remainder(7) + 1.0;
        let buf = (&pattern * (r + 1) as f64).to_kind(kind);
        let p = c.all_reduce(&buf).unwrap();
        c.wait(p).unwrap();
        check("all_reduce", &buf, &(&pattern * tri), tol);

        // reduce-scatter out of place and in place: this rank's slice of the sum.
        let shard = len / n;
        let input = (&pattern * (r + 1) as f64).to_kind(kind);
        let want = (&pattern * tri).narrow(0, r * shard, shard);
        let out = Tensor::zeros([shard], cpu);
        let p = c.reduce_scatter(&input, &out).unwrap();
        c.wait(p).unwrap();
        check("reduce_scatter", &out, &want, tol);
        let inplace = input.narrow(0, r * shard, shard);
        let p = c.reduce_scatter(&input, &inplace).unwrap();
        c.wait(p).unwrap();
        check("reduce_scatter in place", &inplace, &want, tol);

        // all-gather out of place and in place: slice k holds k + 1.
        let mine = Tensor::full([shard], (r + 1) as f64, cpu);
        let full = Tensor::zeros([len], cpu);
        let p = c.all_gather(&mine, &full).unwrap();
        c.wait(p).unwrap();
        let want = Tensor::arange(n, (Kind::Float, Device::Cpu)).repeat_interleave_self_int(shard, 0, None) + 1.0;
        check("all_gather", &full, &want, tol);
        let full = Tensor::zeros([len], cpu);
        let _ = full.narrow(0, r * shard, shard).fill_((r + 1) as f64);
        let p = c.all_gather(&full.narrow(0, r * shard, shard), &full).unwrap();
        c.wait(p).unwrap();
        check("all_gather in place", &full, &want, tol);

        // broadcast from the last rank.
        let b = Tensor::full([5], r as f64, cpu);
        let p = c.broadcast(&b, (n - 1) as usize).unwrap();
        c.wait(p).unwrap();
        check("broadcast", &b, &Tensor::full([5], (n - 1) as f64, (Kind::Float, Device::Cpu)), tol);
    }
    c.barrier().unwrap();

    // Fewer values than ranks (a step's loss and overflow flag): some ranks hold no chunk of them.
    let few = Tensor::from_slice(&[(r + 1) as f32, 1.0]);
    c.reduce_control(&few).unwrap();
    check("reduce_control", &few, &Tensor::from_slice(&[tri as f32, n as f32]), 0.0);

    // Every call was counted, with nccl-tests' byte convention.
    let stats = c.take_stats().unwrap();
    let calls: u64 = stats.by_kind.values().map(|s| s.calls).sum();
    assert_eq!(calls, 3 * 6, "collective calls recorded");
    let ar = &stats.by_kind[&zerobench_worker::comm::CollectiveKind::AllReduce];
    assert_eq!(ar.bytes as i64, 4 * n * 33 * (4 + 2 + 2), "all-reduce bytes");
    // Host-side maxima (the run's step times), the same on every rank.
    let mut m = [r as f64, -(r as f64)];
    c.max_over_ranks(&mut m).unwrap();
    assert_eq!(m, [(n - 1) as f64, 0.0], "max over ranks");
    if r == 0 {
        println!("{} collectives ok on {n} rank(s)", backend.name());
    }
}
