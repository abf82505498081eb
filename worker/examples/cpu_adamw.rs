//! The CPU AdamW that ZeRO-Offload runs, against this host's memory bandwidth.
//!
//! Bandwidth is measured with STREAM's triad (McCalpin) `a = b + s·c` over arrays far larger than
//! the caches, on every thread, best of several runs. STREAM counts 12 bytes per element; the
//! memory system moves 16, because the store to `a` first reads the line (write-allocate). The
//! AdamW update of a bf16 shard moves 28 bytes per parameter: master weights, m and v read and
//! written back (24: their stores hit lines just read, so no extra allocate), the bf16 gradient read
//! (2) and the bf16 parameter written (2). The fraction reported is the update's rate over the
//! triad's true rate (16 bytes per element), the stricter of the two bounds. Prints one JSON object.
//!
//! `cpu_adamw [PARAMS] [THREADS]` (defaults: 100M parameters, all cores)

use std::time::Instant;

use rayon::prelude::*;
use tch::{Device, Kind, Tensor};
use zerobench_schema::config::OptimConfig;
use zerobench_worker::zero::adamw::{step_cpu, AdamW, Shard};

const REPS: usize = 7;

fn best<F: FnMut()>(mut f: F) -> f64 {
    (0..REPS)
        .map(|_| {
            let t0 = Instant::now();
            f();
            t0.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map_or(100_000_000, |a| a.parse().expect("parameter count"));
    let threads: usize = args
        .next()
        .map_or_else(|| std::thread::available_parallelism().map_or(1, |c| c.get()), |a| a.parse().expect("threads"));
    rayon::ThreadPoolBuilder::new().num_threads(threads).build_global().expect("thread pool");
    tch::set_num_threads(threads as i32);

    // STREAM triad.
    let chunk = 1 << 16;
    let b = vec![1.0f32; n];
    let c = vec![2.0f32; n];
    let mut a = vec![0.0f32; n];
    let triad_s = best(|| {
        a.par_chunks_mut(chunk).zip(b.par_chunks(chunk)).zip(c.par_chunks(chunk)).for_each(|((a, b), c)| {
            for i in 0..a.len() {
                a[i] = b[i] + 3.0 * c[i];
            }
        })
    });
    std::hint::black_box(&a);
    drop((a, b, c));
    let triad_stream_gbps = 12.0 * n as f64 / triad_s / 1e9;
    let triad_gbps = 16.0 * n as f64 / triad_s / 1e9;

    // AdamW on a bf16 shard.
    let f32s = |v: f64| Tensor::full([n as i64], v, (Kind::Float, Device::Cpu));
    let (master, m, v) = (f32s(0.5), f32s(0.0), f32s(0.0));
    let grad = Tensor::full([n as i64], 0.01, (Kind::BFloat16, Device::Cpu));
    let out = Tensor::zeros([n as i64], (Kind::BFloat16, Device::Cpu));
    let shard = Shard { master: &master, exp_avg: &m, exp_avg_sq: &v, grad: &grad, param_out: Some(&out) };
    let mut t = 0u64;
    let adam_s = best(|| {
        t += 1;
        step_cpu(&AdamW::coeffs_for(&OptimConfig::default(), t, 1.0), &shard);
    });
    let adam_gbps = 28.0 * n as f64 / adam_s / 1e9;
    // What the worker reports in its `setup` record for the same update.
    let implementation = AdamW::new(OptimConfig::default(), None).implementation(Device::Cpu);
    println!(
        "{}",
        serde_json::json!({
            "benchmark": "cpu-adamw",
            "cpu": zerobench_worker::runtime::machine::cpu_name(),
            "threads": threads,
            "params": n,
            "avx2_fma": implementation == "rust-cpu-avx2",
            "triad_stream_gbps": (triad_stream_gbps * 100.0).round() / 100.0,
            "triad_gbps_with_write_allocate": (triad_gbps * 100.0).round() / 100.0,
            "adamw_ms": (adam_s * 1e5).round() / 100.0,
            "adamw_params_per_s": (n as f64 / adam_s).round(),
            "adamw_gbps": (adam_gbps * 100.0).round() / 100.0,
            "fraction_of_bandwidth": (adam_gbps / triad_gbps * 1000.0).round() / 1000.0,
        })
    );
}
