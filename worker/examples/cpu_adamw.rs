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
//! With RANKS (a list such as `2,4`), it also measures what each of N ranks sharing the host gets,
//! as the worker's ranks do under offload: N processes at once, each with THREADS/N threads and an
//! AdamW over its own PARAMS parameters, started together; each reports the median of its updates
//! (best-of would pick the runs where the others had paused). `ranks` lists, per N, the mean of
//! the N processes' rates (`adamw_params_per_s_per_rank`) and their sum.
//!
//! `cpu_adamw [PARAMS] [THREADS] [RANKS]` (defaults: 100M parameters, all cores, none)

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Instant;

use rayon::prelude::*;
use tch::{Device, Kind, Tensor};
use zerobench_schema::config::OptimConfig;
use zerobench_worker::zero::adamw::{step_cpu, AdamW, Shard};

const REPS: usize = 7;

/// `REPS` timings of `f`, seconds, fastest first.
fn timings<F: FnMut()>(mut f: F) -> Vec<f64> {
    let mut v: Vec<f64> = (0..REPS)
        .map(|_| {
            let t0 = Instant::now();
            f();
            t0.elapsed().as_secs_f64()
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v
}

/// The fastest of `REPS` timings of `f`, seconds.
fn best<F: FnMut()>(f: F) -> f64 {
    timings(f)[0]
}

/// Marks a process started as one of several ranks ([`shared`]).
const RANK_ENV: &str = "ZB_CPU_ADAMW_RANK";

/// The median of `REPS` timings of `f`, seconds.
fn median<F: FnMut()>(f: F) -> f64 {
    timings(f)[REPS / 2]
}

/// A bf16 shard of `n` parameters with its fp32 master weights and moments, as offload keeps them.
struct State {
    master: Tensor,
    m: Tensor,
    v: Tensor,
    grad: Tensor,
    out: Tensor,
}

impl State {
    fn new(n: usize) -> State {
        let f32s = |v: f64| Tensor::full([n as i64], v, (Kind::Float, Device::Cpu));
        State {
            master: f32s(0.5),
            m: f32s(0.0),
            v: f32s(0.0),
            grad: Tensor::full([n as i64], 0.01, (Kind::BFloat16, Device::Cpu)),
            out: Tensor::zeros([n as i64], (Kind::BFloat16, Device::Cpu)),
        }
    }

    fn step(&self, t: u64) {
        let shard = Shard {
            master: &self.master,
            exp_avg: &self.m,
            exp_avg_sq: &self.v,
            grad: &self.grad,
            param_out: Some(&self.out),
        };
        step_cpu(&AdamW::coeffs_for(&OptimConfig::default(), t, 1.0), &shard);
    }
}

/// One of several ranks: allocates, says `ready`, waits for a line on stdin, then prints its rate
/// (parameters per second, the median of its updates).
fn rank(n: usize) {
    let state = State::new(n);
    state.step(1);
    println!("ready");
    std::io::stdout().flush().expect("stdout");
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).expect("stdin");
    let mut t = 1u64;
    let s = median(|| {
        t += 1;
        state.step(t);
    });
    println!("{}", n as f64 / s);
}

/// Each of `ranks` processes' rate with all of them at once, parameters per second.
fn shared(n: usize, threads: usize, ranks: usize) -> Vec<f64> {
    let exe = std::env::current_exe().expect("own path");
    let per = (threads / ranks).max(1);
    let mut children: Vec<_> = (0..ranks)
        .map(|_| {
            Command::new(&exe)
                .args([n.to_string(), per.to_string()])
                .env(RANK_ENV, "1")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("start a rank")
        })
        .collect();
    let mut outs: Vec<_> = children.iter_mut().map(|c| BufReader::new(c.stdout.take().expect("stdout"))).collect();
    for o in &mut outs {
        let mut line = String::new();
        o.read_line(&mut line).expect("a rank's ready line");
        assert_eq!(line.trim(), "ready", "a rank did not start");
    }
    // All allocated: start them together.
    for c in &mut children {
        c.stdin.as_mut().expect("stdin").write_all(b"go\n").expect("start");
    }
    let rates = outs
        .iter_mut()
        .map(|o| {
            let mut line = String::new();
            o.read_line(&mut line).expect("a rank's rate");
            line.trim().parse::<f64>().expect("a rate")
        })
        .collect();
    for mut c in children {
        assert!(c.wait().expect("a rank").success(), "a rank failed");
    }
    rates
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map_or(100_000_000, |a| a.parse().expect("parameter count"));
    let threads: usize = args
        .next()
        .map_or_else(|| std::thread::available_parallelism().map_or(1, |c| c.get()), |a| a.parse().expect("threads"));
    let ranks: Vec<usize> = args.next().map_or_else(Vec::new, |a| {
        a.split(',').map(|r| r.parse().expect("a list of rank counts, such as 2,4")).filter(|&r| r > 1).collect()
    });
    rayon::ThreadPoolBuilder::new().num_threads(threads).build_global().expect("thread pool");
    tch::set_num_threads(threads as i32);
    if std::env::var_os(RANK_ENV).is_some() {
        return rank(n);
    }

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
    let state = State::new(n);
    let mut t = 0u64;
    let adam_s = best(|| {
        t += 1;
        state.step(t);
    });
    drop(state);
    let adam_gbps = 28.0 * n as f64 / adam_s / 1e9;
    let per_ranks: serde_json::Map<String, serde_json::Value> = ranks
        .iter()
        .map(|&r| {
            let rates = shared(n, threads, r);
            let sum: f64 = rates.iter().sum();
            let v = serde_json::json!({
                "threads_per_rank": (threads / r).max(1),
                "adamw_params_per_s_per_rank": (sum / r as f64).round(),
                "adamw_params_per_s_sum": sum.round(),
            });
            (r.to_string(), v)
        })
        .collect();
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
            "ranks": per_ranks,
        })
    );
}
