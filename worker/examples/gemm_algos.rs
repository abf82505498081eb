//! How much of GPT-2's matrix-product time an autotuner could take back: for every product of one
//! training step (forward, backward, LM head; the shapes, layouts and epilogues the worker runs),
//! time each algorithm cuBLASLt's heuristic offers (up to 32) and compare the fastest with the
//! heuristic's first choice and with libtorch's own call. `today` in its output is what the worker
//! ran before its plans timed their candidates: the heuristic's first for the products with
//! epilogues, libtorch's call for the rest. The worker's plans now time up to 8 of the offered
//! algorithms, and libtorch's call for the plain products, at each shape's first product.
//!
//! The cuBLASLt handle, descriptors and product call are the worker's own
//! (`model::products_cuda`); only the timing is the probe's.
//!
//! `gemm_algos MODEL TOKENS`, e.g. `gemm_algos gpt2-xl 4096` (micro-batch 4 × sequence 1024).
//! Prints one JSON object per product and one summary. Each algorithm's result is compared with
//! the first one's (normwise, 2e-2: bf16 sums in another order); one that differs more is
//! reported and never counted as the fastest. Times are medians of 3 rounds of 30 calls, each
//! round rotating over 3 sets of operands so that the L2 cache does not hold them between calls;
//! the first choice and the fastest are then timed again in 5 alternating rounds, and those
//! medians are what the summary adds up.
//!
//! `gemm_algos MODEL TOKENS --hot MS`: whether the worker's choice, timed at a shape's first
//! product on a card that has just started, is the fastest on a card at its power limit, where a
//! step runs. For each product, after a second idle: the algorithms the worker's plans time,
//! timed and chosen as they do (`products_cuda::{CANDIDATES, TIMING_ROUNDS, TIMED_CALLS,
//! choose}`); then, after a second of the first algorithm back to back, each timed over about MS
//! milliseconds of back-to-back calls, twice, alternating. Prints one JSON object per product and
//! a summary of the step's product time at the cold choice against the hot fastest.

use std::time::Instant;

use cudarc::cublaslt::sys;
use serde_json::json;
use tch::{Cuda, Device, Kind, Tensor};
use zerobench_schema::models::{ModelPreset, ModelSpec};
use zerobench_worker::model::lm_head;
use zerobench_worker::model::products_cuda::{
    choose, Descriptors, Epilogue, Handle, Pointers, Shape, SidePointers, CANDIDATES, TIMED_CALLS, TIMING_ROUNDS,
    WORKSPACE_BYTES,
};

const SETS: usize = 3;
const CALLS: usize = 30;
const REQUESTED: usize = 32;

/// One column-major product `D[m × n] = op(A)·op(B)` (+ epilogue), as cuBLASLt sees it, and how
/// many times a step runs it.
struct Product {
    name: String,
    per_step: u64,
    m: u64,
    n: u64,
    k: u64,
    ta: bool,
    tb: bool,
    epi: Epilogue,
}

fn products(spec: &ModelSpec, tokens: u64) -> Vec<Product> {
    let ModelSpec::Gpt2(g) = spec else { panic!("GPT-2 presets only") };
    let (d, l) = (g.d_model, g.n_layer);
    let mut out = Vec::new();
    let mut push = |name: &str, per_step: u64, m, n, k, ta, tb, epi| {
        out.push(Product { name: name.into(), per_step, m, n, k, ta, tb, epi })
    };
    // The blocks' four linear layers: forward `x·wᵀ` (TN), the input's gradient `gy·w` (NN) and
    // the weight's gradient `gyᵀ·x` (NT).
    for (name, fan_in, fan_out, epi) in [
        ("qkv", d, 3 * d, Epilogue::Bias),
        ("attn_proj", d, d, Epilogue::Residual),
        ("mlp_up", d, 4 * d, Epilogue::GeluAux),
        ("mlp_down", 4 * d, d, Epilogue::Residual),
    ] {
        push(&format!("{name}.fwd"), l, fan_out, tokens, fan_in, true, false, epi);
        push(&format!("{name}.dx"), l, fan_in, tokens, fan_out, false, false, Epilogue::None);
        push(&format!("{name}.dw"), l, fan_in, fan_out, tokens, false, true, Epilogue::None);
    }
    // The LM head's rows and chunks as the worker's head runs them (bf16: 2 bytes a logit).
    let v_pad = lm_head::padded_vocab(g.vocab as i64) as u64;
    let rows = lm_head::chunk_rows(tokens as i64, v_pad as i64, 2, lm_head::CHUNK_BYTES) as u64;
    let (full, rest) = (tokens / rows, tokens % rows);
    for (chunk, count) in [(rows, full), (rest, 1)] {
        if chunk == 0 || count == 0 {
            continue;
        }
        push(&format!("head{chunk}.fwd"), count, v_pad, chunk, d, true, false, Epilogue::None);
        push(&format!("head{chunk}.dx"), count, d, chunk, v_pad, false, false, Epilogue::None);
        push(&format!("head{chunk}.dw"), count, d, v_pad, chunk, false, true, Epilogue::None);
    }
    out
}

/// The operands of one product, row-major libtorch tensors holding the column-major matrices.
struct Operands {
    a: Tensor,
    b: Tensor,
    c: Tensor,
    d: Tensor,
    bias: Tensor,
    aux: Tensor,
}

impl Operands {
    fn new(p: &Product) -> Self {
        let o = (Kind::BFloat16, Device::Cuda(0));
        let (m, n, k) = (p.m as i64, p.n as i64, p.k as i64);
        // A column-major `[r × c]` matrix is a row-major `[c × r]` tensor.
        let a = if p.ta { Tensor::randn([m, k], o) } else { Tensor::randn([k, m], o) } / (k as f64).sqrt();
        let b = if p.tb { Tensor::randn([k, n], o) } else { Tensor::randn([n, k], o) };
        Operands {
            a,
            b,
            c: Tensor::randn([n, m], o),
            d: Tensor::zeros([n, m], o),
            bias: Tensor::randn([m], o),
            aux: Tensor::zeros([n, m], o),
        }
    }

    /// libtorch's call for the same product: `D = op(B)ᵀ·op(A)ᵀ` in row-major terms.
    fn torch(&self, p: &Product) {
        let at = if p.ta { self.a.tr() } else { self.a.shallow_clone() };
        let bt = if p.tb { self.b.tr() } else { self.b.shallow_clone() };
        match p.epi {
            Epilogue::None => {
                let _ = bt.mm_out(&self.d, &at);
            }
            _ => {
                let _ = self.bias.addmm_out(&self.d, &bt, &at);
            }
        }
    }
}

/// The product's matrices as the worker's plans take them.
fn pointers(p: &Product, o: &Operands) -> Pointers {
    let bias = o.bias.data_ptr().cast_const();
    Pointers {
        a: o.a.data_ptr().cast_const(),
        b: o.b.data_ptr().cast_const(),
        d: o.d.data_ptr(),
        side: match p.epi {
            Epilogue::None => SidePointers::None,
            Epilogue::Bias => SidePointers::Bias { bias },
            Epilogue::GeluAux => SidePointers::GeluAux { bias, aux: o.aux.data_ptr() },
            Epilogue::Residual => SidePointers::Residual { bias, c: o.c.data_ptr().cast_const() },
        },
    }
}

/// The product's shape as the worker keys its plans; the alignments are those cuBLASLt assumes
/// when none is given (libtorch's allocations are aligned further).
fn shape(p: &Product) -> Shape {
    Shape { epilogue: p.epi, bf16: true, m: p.m, n: p.n, k: p.k, ta: p.ta, tb: p.tb, align: [256; 4] }
}

fn run(lt: &Lt, p: &Product, dd: &Descriptors, algo: &sys::cublasLtMatmulAlgo_t, o: &Operands) {
    // SAFETY: the operands hold the matrices `shape(p)` describes, on device 0 with the
    // workspace; the legacy default stream is libtorch's here.
    unsafe { dd.run(&lt.handle, algo, pointers(p, o), lt.workspace.data_ptr(), std::ptr::null_mut()) }.expect("matmul");
}

struct Lt {
    handle: Handle,
    workspace: Tensor,
}

/// Microseconds per call: the median of `rounds` rounds of `CALLS` calls over the operand sets.
fn time_us(sets: &[Operands], rounds: usize, mut f: impl FnMut(&Operands)) -> Vec<f64> {
    for s in sets {
        f(s);
    }
    Cuda::synchronize(0);
    (0..rounds).map(|_| time_calls(sets, CALLS, &mut f) * 1e6).collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Seconds per call of `calls` back-to-back calls over the operand sets, until the device has run them.
fn time_calls(sets: &[Operands], calls: usize, mut f: impl FnMut(&Operands)) -> f64 {
    let t0 = Instant::now();
    for i in 0..calls {
        f(&sets[i % sets.len()]);
    }
    Cuda::synchronize(0);
    t0.elapsed().as_secs_f64() / calls as f64
}

/// `--hot MS`: the cold choice against the fastest at the power limit (see the module's doc).
fn hot(lt: &Lt, spec: &ModelSpec, model: &str, tokens: u64, hot_ms: f64) {
    let (mut first_ms, mut cold_choice_ms, mut hot_best_ms) = (0.0, 0.0, 0.0);
    for p in products(spec, tokens) {
        let sets: Vec<Operands> = (0..SETS).map(|_| Operands::new(&p)).collect();
        let dd = Descriptors::new(shape(&p)).expect("descriptors");
        let algos: Vec<_> =
            dd.algorithms(&lt.handle, CANDIDATES).expect("the heuristic").into_iter().map(|h| h.algo).collect();
        if algos.is_empty() {
            continue;
        }
        let (p, dd, algos) = (&p, &dd, &algos);
        let go = |i: usize| move |o: &Operands| run(lt, p, dd, &algos[i], o);
        for i in 0..algos.len() {
            go(i)(&sets[0]);
        }
        Cuda::synchronize(0);
        std::thread::sleep(std::time::Duration::from_secs(1));
        // Out of idle (its clock far below the step's) into a clock as at a run's start.
        time_calls(&sets, 50, go(0));
        // As the worker: the least of its rounds of its calls, one candidate after another.
        let cold: Vec<f64> = (0..algos.len())
            .map(|i| {
                (0..TIMING_ROUNDS).map(|_| time_calls(&sets, TIMED_CALLS, go(i)) * 1e6).fold(f64::INFINITY, f64::min)
            })
            .collect();
        let chosen = choose(&cold);
        // The card at its limit: a second of back-to-back products, then each candidate over about
        // `hot_ms`, twice, alternating.
        let heat = (1.0 / (cold[0] * 1e-6)).ceil() as usize;
        time_calls(&sets, heat, go(0));
        let mut rounds = vec![Vec::new(); algos.len()];
        for _ in 0..2 {
            for (i, r) in rounds.iter_mut().enumerate() {
                let calls = ((hot_ms * 1e3 / cold[i]).ceil() as usize).max(10);
                r.push(time_calls(&sets, calls, go(i)) * 1e6);
            }
        }
        let hot_us: Vec<f64> = rounds.iter().map(|r| r.iter().copied().fold(f64::INFINITY, f64::min)).collect();
        let hot_best = (0..hot_us.len()).min_by(|&a, &b| hot_us[a].total_cmp(&hot_us[b])).unwrap_or(0);
        let c = p.per_step as f64;
        first_ms += c * hot_us[0] / 1e3;
        cold_choice_ms += c * hot_us[chosen] / 1e3;
        hot_best_ms += c * hot_us[hot_best] / 1e3;
        println!(
            "{}",
            json!({
                "product": p.name, "per_step": p.per_step, "m": p.m, "n": p.n, "k": p.k,
                "epilogue": format!("{:?}", p.epi), "cold_us": cold, "cold_choice": chosen,
                "hot_us": hot_us, "hot_rounds_us": rounds, "hot_best": hot_best,
                "hot_best_over_cold_choice": hot_us[hot_best] / hot_us[chosen],
            })
        );
    }
    println!(
        "{}",
        json!({
            "summary": true, "mode": "hot", "hot_ms": hot_ms, "model": model, "tokens": tokens,
            "hot_first_ms": first_ms, "hot_cold_choice_ms": cold_choice_ms, "hot_best_ms": hot_best_ms,
            "hot_best_over_cold_choice": hot_best_ms / cold_choice_ms,
        })
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (model, tokens, hot_ms) = match &args[..] {
        [model, tokens] => (model, tokens, None),
        [model, tokens, flag, ms] if flag == "--hot" => (model, tokens, Some(ms.parse::<f64>().expect("--hot MS"))),
        _ => panic!("usage: gemm_algos MODEL TOKENS [--hot MS]"),
    };
    let preset: ModelPreset = model.parse().expect("a model preset");
    let tokens: u64 = tokens.parse().expect("tokens");
    let spec = preset.spec();
    let dev = zerobench_worker::runtime::device::select(zerobench_schema::DeviceRequest::Cuda).expect("a GPU");
    assert_eq!(dev, Device::Cuda(0));
    tch::manual_seed(0);
    let lt = Lt {
        handle: Handle::new().expect("cuBLASLt").expect("libcublasLt loads"),
        workspace: Tensor::empty([WORKSPACE_BYTES as i64], (Kind::Uint8, Device::Cuda(0))),
    };
    if let Some(ms) = hot_ms {
        hot(&lt, &spec, model, tokens, ms);
        return;
    }
    let (mut today_ms, mut first_ms, mut best_ms, mut torch_ms) = (0.0, 0.0, 0.0, 0.0);
    let mut flops = 0.0;
    for p in products(&spec, tokens) {
        let sets: Vec<Operands> = (0..SETS).map(|_| Operands::new(&p)).collect();
        let dd = Descriptors::new(shape(&p)).expect("descriptors");
        let algos = dd.algorithms(&lt.handle, REQUESTED).expect("the heuristic");
        if algos.is_empty() {
            eprintln!("{}: no algorithm", p.name);
        }
        let gflop = 2.0 * (p.m * p.n * p.k) as f64 / 1e9;
        // libtorch's call, where libtorch has the same product (not the GELU-aux or residual ones).
        let torch_us =
            matches!(p.epi, Epilogue::None | Epilogue::Bias).then(|| median(time_us(&sets, 3, |o| o.torch(&p))));
        let mut reference: Option<Tensor> = None;
        let mut rows = Vec::new();
        for (i, h) in algos.iter().enumerate() {
            let o = &sets[0];
            let _ = o.d.shallow_clone().zero_();
            run(&lt, &p, &dd, &h.algo, o);
            Cuda::synchronize(0);
            let out = o.d.to_kind(Kind::Float);
            let ok = match &reference {
                None => {
                    reference = Some(out);
                    true
                }
                Some(r) => {
                    let err = (&out - r).norm().double_value(&[]) / r.norm().double_value(&[]).max(1e-30);
                    err <= 2e-2
                }
            };
            let us = median(time_us(&sets, 3, |o| run(&lt, &p, &dd, &h.algo, o)));
            rows.push((i, us, ok, h.workspaceSize, h.wavesCount));
        }
        if rows.is_empty() {
            println!("{}", json!({"product": p.name, "algos": 0}));
            continue;
        }
        let best = rows.iter().filter(|r| r.2).min_by(|a, b| a.1.total_cmp(&b.1)).expect("the first is ok");
        let (first_algo, best_algo) = (algos[0].algo, algos[best.0].algo);
        // The first choice and the fastest head to head, alternating.
        let (mut f, mut b) = (Vec::new(), Vec::new());
        for _ in 0..5 {
            f.extend(time_us(&sets, 1, |o| run(&lt, &p, &dd, &first_algo, o)));
            b.extend(time_us(&sets, 1, |o| run(&lt, &p, &dd, &best_algo, o)));
        }
        let first_us = median(f);
        let best_us = median(b).min(first_us);
        // What the worker ran before its plans were timed: the heuristic's first for the epilogue products
        // it makes itself, libtorch's call for the rest.
        let today_us = match p.epi {
            Epilogue::GeluAux | Epilogue::Residual => first_us,
            _ => torch_us.unwrap_or(first_us),
        };
        let c = p.per_step as f64;
        today_ms += c * today_us / 1e3;
        first_ms += c * first_us / 1e3;
        best_ms += c * best_us.min(today_us) / 1e3;
        torch_ms += c * torch_us.unwrap_or(first_us) / 1e3;
        flops += c * gflop;
        let bad: Vec<usize> = rows.iter().filter(|r| !r.2).map(|r| r.0).collect();
        println!(
            "{}",
            json!({
                "product": p.name, "per_step": p.per_step, "m": p.m, "n": p.n, "k": p.k,
                "op": format!("{}{}", if p.ta { "T" } else { "N" }, if p.tb { "T" } else { "N" }),
                "epilogue": format!("{:?}", p.epi), "algos": rows.len(), "differing_algos": bad,
                "torch_us": torch_us, "first_us": first_us, "best_us": best_us, "best_index": best.0,
                "today_us": today_us, "best_over_today": best_us.min(today_us) / today_us,
                "best_tflops": gflop / best_us * 1e3,
                "all_us": rows.iter().map(|r| r.1).collect::<Vec<_>>(),
            })
        );
    }
    println!(
        "{}",
        json!({
            "summary": true, "model": model, "tokens": tokens,
            "today_ms": today_ms, "heuristic_first_ms": first_ms, "torch_ms": torch_ms, "best_ms": best_ms,
            "best_over_today": best_ms / today_ms, "gflop": flops,
            "today_tflops": flops / today_ms, "best_tflops": flops / best_ms,
        })
    );
}
