//! How much of GPT-2's matrix-product time an autotuner could take back: for every product of one
//! training step (forward, backward, LM head; the shapes, layouts and epilogues the worker runs),
//! time each algorithm cuBLASLt's heuristic offers (up to 32) and compare the fastest with the
//! heuristic's first choice (what the worker's epilogue plans run) and with libtorch's own call
//! (what the worker runs for the other products).
//!
//! `gemm_algos MODEL TOKENS`, e.g. `gemm_algos gpt2-xl 4096` (micro-batch 4 × sequence 1024).
//! Prints one JSON object per product and one summary. Each algorithm's result is compared with
//! the first one's (normwise, 2e-2: bf16 sums in another order); one that differs more is
//! reported and never counted as the fastest. Times are medians of 3 rounds of 30 calls, each
//! round rotating over 3 sets of operands so that the L2 cache does not hold them between calls;
//! the first choice and the fastest are then timed again in 5 alternating rounds, and those
//! medians are what the summary adds up.

use std::ffi::c_void;
use std::time::Instant;

use cudarc::cublaslt::{result, sys};
use serde_json::json;
use tch::{Cuda, Device, Kind, Tensor};
use zerobench_schema::models::{ModelPreset, ModelSpec};

const WORKSPACE_BYTES: usize = 32 << 20;
const SETS: usize = 3;
const CALLS: usize = 30;
const REQUESTED: usize = 32;
/// Rows of the LM head, padded as the worker pads them (`lm_head.rs`).
const HEAD_ALIGN: u64 = 64;
/// Tokens of one chunk of the LM head: 512 MiB of bf16 logits (`lm_head.rs`).
const CHUNK_BYTES: u64 = 512 << 20;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Epi {
    None,
    Bias,
    GeluAuxBias,
    BiasResidual,
}

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
    epi: Epi,
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
        ("qkv", d, 3 * d, Epi::Bias),
        ("attn_proj", d, d, Epi::BiasResidual),
        ("mlp_up", d, 4 * d, Epi::GeluAuxBias),
        ("mlp_down", 4 * d, d, Epi::BiasResidual),
    ] {
        push(&format!("{name}.fwd"), l, fan_out, tokens, fan_in, true, false, epi);
        push(&format!("{name}.dx"), l, fan_in, tokens, fan_out, false, false, Epi::None);
        push(&format!("{name}.dw"), l, fan_in, fan_out, tokens, false, true, Epi::None);
    }
    let v_pad = g.vocab.div_ceil(HEAD_ALIGN) * HEAD_ALIGN;
    let rows = (CHUNK_BYTES / (v_pad * 2)).clamp(1, tokens);
    let (full, rest) = (tokens / rows, tokens % rows);
    for (chunk, count) in [(rows, full), (rest, 1)] {
        if chunk == 0 || count == 0 {
            continue;
        }
        push(&format!("head{chunk}.fwd"), count, v_pad, chunk, d, true, false, Epi::None);
        push(&format!("head{chunk}.dx"), count, d, chunk, v_pad, false, false, Epi::None);
        push(&format!("head{chunk}.dw"), count, d, v_pad, chunk, false, true, Epi::None);
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
            Epi::None => {
                let _ = bt.mm_out(&self.d, &at);
            }
            _ => {
                let _ = self.bias.addmm_out(&self.d, &bt, &at);
            }
        }
    }
}

struct Lt {
    handle: sys::cublasLtHandle_t,
    workspace: Tensor,
}

struct Described {
    desc: sys::cublasLtMatmulDesc_t,
    la: sys::cublasLtMatrixLayout_t,
    lb: sys::cublasLtMatrixLayout_t,
    ld: sys::cublasLtMatrixLayout_t,
}

impl Drop for Described {
    fn drop(&mut self) {
        // SAFETY: created in `describe`, destroyed once.
        unsafe {
            let _ = result::destroy_matrix_layout(self.la);
            let _ = result::destroy_matrix_layout(self.lb);
            let _ = result::destroy_matrix_layout(self.ld);
            let _ = result::destroy_matmul_desc(self.desc);
        }
    }
}

unsafe fn set<T>(desc: sys::cublasLtMatmulDesc_t, attr: sys::cublasLtMatmulDescAttributes_t, v: &T) {
    // SAFETY: the caller passes the attribute's type.
    unsafe { result::set_matmul_desc_attribute(desc, attr, (v as *const T).cast(), size_of::<T>()) }
        .expect("descriptor attribute");
}

impl Lt {
    fn describe(&self, p: &Product) -> Described {
        use sys::cublasLtMatmulDescAttributes_t as D;
        let bf = sys::cudaDataType::CUDA_R_16BF;
        let (m, n, k) = (p.m, p.n, p.k);
        let desc =
            result::create_matmul_desc(sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, sys::cudaDataType::CUDA_R_32F)
                .expect("matmul descriptor");
        let (ar, ac) = if p.ta { (k, m) } else { (m, k) };
        let (br, bc) = if p.tb { (n, k) } else { (k, n) };
        let la = result::create_matrix_layout(bf, ar, ac, ar as i64).expect("layout");
        let lb = result::create_matrix_layout(bf, br, bc, br as i64).expect("layout");
        let ld = result::create_matrix_layout(bf, m, n, m as i64).expect("layout");
        let epilogue = match p.epi {
            Epi::None => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT,
            Epi::Bias | Epi::BiasResidual => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
            Epi::GeluAuxBias => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
        };
        // SAFETY: each attribute gets its documented type.
        unsafe {
            set(desc, D::CUBLASLT_MATMUL_DESC_TRANSA, &(p.ta as i32));
            set(desc, D::CUBLASLT_MATMUL_DESC_TRANSB, &(p.tb as i32));
            set(desc, D::CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue);
            if p.epi == Epi::GeluAuxBias {
                set(desc, D::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &(m as i64));
            }
        }
        Described { desc, la, lb, ld }
    }

    /// The heuristic's algorithms for `p`, best first by its own ranking.
    fn algos(&self, p: &Product, dd: &Described) -> Vec<sys::cublasLtMatmulHeuristicResult_t> {
        use sys::cublasLtMatmulPreferenceAttributes_t as P;
        let pref = result::create_matmul_pref().expect("preference");
        let ws = WORKSPACE_BYTES as u64;
        // SAFETY: a plain C struct of integers and floats, for which all zeros is a valid value.
        let mut found = vec![unsafe { std::mem::zeroed::<sys::cublasLtMatmulHeuristicResult_t>() }; REQUESTED];
        let mut count = 0i32;
        // SAFETY: the workspace size is a uint64; the array holds `REQUESTED` results.
        unsafe {
            result::set_matmul_pref_attribute(
                pref,
                P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&ws as *const u64).cast(),
                8,
            )
            .expect("preference");
            let status = sys::cublasLtMatmulAlgoGetHeuristic(
                self.handle,
                dd.desc,
                dd.la,
                dd.lb,
                dd.ld,
                dd.ld,
                pref,
                REQUESTED as i32,
                found.as_mut_ptr(),
                &mut count,
            );
            let _ = result::destroy_matmul_pref(pref);
            if status != sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                eprintln!("{}: no algorithm ({status:?})", p.name);
                return Vec::new();
            }
        }
        found.truncate(count.max(0) as usize);
        found.retain(|h| h.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS);
        found
    }

    fn run(&self, p: &Product, dd: &Described, algo: &sys::cublasLtMatmulAlgo_t, o: &Operands) {
        use sys::cublasLtMatmulDescAttributes_t as D;
        let alpha = 1f32;
        let (c, beta) = if p.epi == Epi::BiasResidual { (&o.c, 1f32) } else { (&o.d, 0f32) };
        // SAFETY: the operands match the layouts `describe` made for `p`; all on device 0.
        unsafe {
            if p.epi != Epi::None {
                set(dd.desc, D::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &o.bias.data_ptr());
            }
            if p.epi == Epi::GeluAuxBias {
                set(dd.desc, D::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &o.aux.data_ptr());
            }
            result::matmul(
                self.handle,
                dd.desc,
                (&alpha as *const f32).cast(),
                (&beta as *const f32).cast(),
                o.a.data_ptr(),
                dd.la,
                o.b.data_ptr(),
                dd.lb,
                c.data_ptr(),
                dd.ld,
                o.d.data_ptr(),
                dd.ld,
                algo,
                self.workspace.data_ptr(),
                WORKSPACE_BYTES,
                std::ptr::null_mut::<c_void>().cast(),
            )
            .expect("matmul");
        }
    }
}

/// Microseconds per call: the median of `rounds` rounds of `CALLS` calls over the operand sets.
fn time_us(sets: &[Operands], rounds: usize, mut f: impl FnMut(&Operands)) -> Vec<f64> {
    for s in sets {
        f(s);
    }
    Cuda::synchronize(0);
    (0..rounds)
        .map(|_| {
            let t0 = Instant::now();
            for i in 0..CALLS {
                f(&sets[i % sets.len()]);
            }
            Cuda::synchronize(0);
            t0.elapsed().as_secs_f64() * 1e6 / CALLS as f64
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [model, tokens] = &args[..] else { panic!("usage: gemm_algos MODEL TOKENS") };
    let preset: ModelPreset = model.parse().expect("a model preset");
    let tokens: u64 = tokens.parse().expect("tokens");
    let spec = preset.spec();
    let dev = zerobench_worker::runtime::device::select(zerobench_schema::DeviceRequest::Cuda).expect("a GPU");
    assert_eq!(dev, Device::Cuda(0));
    tch::manual_seed(0);
    let lt = Lt {
        handle: result::create_handle().expect("cuBLASLt"),
        workspace: Tensor::empty([WORKSPACE_BYTES as i64], (Kind::Uint8, Device::Cuda(0))),
    };
    let (mut today_ms, mut first_ms, mut best_ms, mut torch_ms) = (0.0, 0.0, 0.0, 0.0);
    let mut flops = 0.0;
    for p in products(&spec, tokens) {
        let sets: Vec<Operands> = (0..SETS).map(|_| Operands::new(&p)).collect();
        let dd = lt.describe(&p);
        let algos = lt.algos(&p, &dd);
        let gflop = 2.0 * (p.m * p.n * p.k) as f64 / 1e9;
        // libtorch's call, where libtorch has the same product (not the GELU-aux or residual ones).
        let torch_us = matches!(p.epi, Epi::None | Epi::Bias).then(|| median(time_us(&sets, 3, |o| o.torch(&p))));
        let mut reference: Option<Tensor> = None;
        let mut rows = Vec::new();
        for (i, h) in algos.iter().enumerate() {
            let o = &sets[0];
            let _ = o.d.shallow_clone().zero_();
            lt.run(&p, &dd, &h.algo, o);
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
            let us = median(time_us(&sets, 3, |o| lt.run(&p, &dd, &h.algo, o)));
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
            f.extend(time_us(&sets, 1, |o| lt.run(&p, &dd, &first_algo, o)));
            b.extend(time_us(&sets, 1, |o| lt.run(&p, &dd, &best_algo, o)));
        }
        let first_us = median(f);
        let best_us = median(b).min(first_us);
        // What the worker runs today: its plan (the heuristic's first) for the epilogue products
        // it makes itself, libtorch's call for the rest.
        let today_us = match p.epi {
            Epi::GeluAuxBias | Epi::BiasResidual => first_us,
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
