//! How fast the fused AdamW update moves its 28 bytes a parameter, and whether another form of the
//! kernel moves them faster: gpt2-xl's shards (the embedding unit and 48 blocks, 1.56 B parameters,
//! bf16 gradients and parameter copies, fp32 master weights and moments) updated by
//!
//! * `worker`: the worker's kernel (`zero::adamw_cuda`), one launch per shard, as a step runs it;
//! * `resident`: the same kernel, as many blocks as fit at once (the worker launches up to 16
//!   blocks of 256 threads per multiprocessor, of which 8 fit);
//! * `streaming`: loads and stores with the evict-first hints (`__ldcs`/`__stcs`): every byte is
//!   touched once a step, so nothing it leaves in L2 is read again;
//! * `two`: two vectors a thread per iteration, their eight loads issued before either update;
//! * `one_launch`: the worker's kernel over one shard holding all the parameters (what a launch
//!   over every shard at once could reach).
//!
//! Each form starts from the same states and must give the worker's bits; times are the median of
//! 5 rounds of 10 updates between CUDA events. Prints one JSON object per form.
//!
//! `adamw_bw [PARAMS_PER_BLOCK BLOCKS EMBED_PARAMS]`, default gpt2-xl's 30740800 48 82063200.

use std::sync::Arc;

use cudarc::driver::CudaFunction;
use serde_json::json;
use tch::{Device, Kind, Tensor};
use zerobench_worker::runtime::cuda::{ComputeStream, Gpu};
use zerobench_worker::runtime::kernels;
use zerobench_worker::zero::adamw_cuda::{Coeffs, FusedAdamW, Lane, SOURCE, THREADS};

/// The variants, bf16 only, compiled after the worker's source (`zero::adamw_cuda::SOURCE`), whose
/// element update (`adamw_one`) and 16-bit packing (`LO`, `HI`, `PACK`) they use: the worker's
/// arithmetic, other loads and stores.
const VARIANTS: &str = r#"
#define ARGS float* __restrict__ p, float* __restrict__ m, float* __restrict__ v,                    \
    const unsigned short* __restrict__ g, unsigned short* __restrict__ out, long long n, float decay, \
    float omb1, float b2, float omb2, float step_size, float inv_bc2_sqrt, float eps, float gscale
#define UPDATE4(P, M, V, G)                                                                          \
  adamw_one(P.x, M.x, V.x, bf2f(LO(G.x)) * gscale, decay, omb1, b2, omb2, step_size, inv_bc2_sqrt, eps); \
  adamw_one(P.y, M.y, V.y, bf2f(HI(G.x)) * gscale, decay, omb1, b2, omb2, step_size, inv_bc2_sqrt, eps); \
  adamw_one(P.z, M.z, V.z, bf2f(LO(G.y)) * gscale, decay, omb1, b2, omb2, step_size, inv_bc2_sqrt, eps); \
  adamw_one(P.w, M.w, V.w, bf2f(HI(G.y)) * gscale, decay, omb1, b2, omb2, step_size, inv_bc2_sqrt, eps);

/* n a multiple of 4 (the bench's shards are). */
extern "C" __global__ void streaming(ARGS) {
  const long long nv = n / 4, stride = (long long)gridDim.x * blockDim.x;
  float4* P4 = reinterpret_cast<float4*>(p); float4* M4 = reinterpret_cast<float4*>(m);
  float4* V4 = reinterpret_cast<float4*>(v); const uint2* G2 = reinterpret_cast<const uint2*>(g);
  uint2* O2 = reinterpret_cast<uint2*>(out);
  for (long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x; j < nv; j += stride) {
    float4 P = __ldcs(P4 + j), M = __ldcs(M4 + j), V = __ldcs(V4 + j);
    uint2 G = __ldcs(G2 + j);
    UPDATE4(P, M, V, G)
    __stcs(P4 + j, P); __stcs(M4 + j, M); __stcs(V4 + j, V);
    __stcs(O2 + j, make_uint2(PACK(f2bf(P.x), f2bf(P.y)), PACK(f2bf(P.z), f2bf(P.w))));
  }
}

extern "C" __global__ void two(ARGS) {
  const long long nv = n / 4, stride = (long long)gridDim.x * blockDim.x;
  float4* P4 = reinterpret_cast<float4*>(p); float4* M4 = reinterpret_cast<float4*>(m);
  float4* V4 = reinterpret_cast<float4*>(v); const uint2* G2 = reinterpret_cast<const uint2*>(g);
  uint2* O2 = reinterpret_cast<uint2*>(out);
  long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  for (; j + stride < nv; j += 2 * stride) {
    const long long k = j + stride;
    float4 P = P4[j], M = M4[j], V = V4[j], Q = P4[k], N = M4[k], W = V4[k];
    uint2 G = G2[j], H = G2[k];
    UPDATE4(P, M, V, G)
    UPDATE4(Q, N, W, H)
    P4[j] = P; M4[j] = M; V4[j] = V; P4[k] = Q; M4[k] = N; V4[k] = W;
    O2[j] = make_uint2(PACK(f2bf(P.x), f2bf(P.y)), PACK(f2bf(P.z), f2bf(P.w)));
    O2[k] = make_uint2(PACK(f2bf(Q.x), f2bf(Q.y)), PACK(f2bf(Q.z), f2bf(Q.w)));
  }
  if (j < nv) {
    float4 P = P4[j], M = M4[j], V = V4[j];
    uint2 G = G2[j];
    UPDATE4(P, M, V, G)
    P4[j] = P; M4[j] = M; V4[j] = V;
    O2[j] = make_uint2(PACK(f2bf(P.x), f2bf(P.y)), PACK(f2bf(P.z), f2bf(P.w)));
  }
}
"#;

/// One shard's states.
struct Shard {
    p: Tensor,
    m: Tensor,
    v: Tensor,
    g: Tensor,
    out: Tensor,
}

impl Shard {
    fn new(n: i64, seed: i64) -> Self {
        let cuda = Device::Cuda(0);
        tch::manual_seed(seed);
        let f = (Kind::Float, cuda);
        Shard {
            p: Tensor::randn([n], f) * 0.02,
            m: Tensor::randn([n], f) * 1e-3,
            v: Tensor::rand([n], f) * 1e-6,
            g: (Tensor::randn([n], f) * 1e-3).to_kind(Kind::BFloat16),
            out: Tensor::empty([n], (Kind::BFloat16, cuda)),
        }
    }

    fn copy(&self) -> Self {
        Shard { p: self.p.copy(), m: self.m.copy(), v: self.v.copy(), g: self.g.copy(), out: self.out.copy() }
    }

    fn same_bits(&self, o: &Shard) -> bool {
        self.p.equal(&o.p) && self.m.equal(&o.m) && self.v.equal(&o.v) && self.out.equal(&o.out)
    }
}

const COEFFS: Coeffs = Coeffs {
    decay: 1.0 - 6e-4 * 0.1,
    one_minus_b1: 0.1,
    b2: 0.95,
    one_minus_b2: 0.05,
    step_size: 6e-4,
    inv_bc2_sqrt: 1.0,
    eps: 1e-8,
    grad_scale: 1.0,
};

/// One update of `s` by `f` (a kernel of the worker's argument list) through the worker's launch,
/// at most `blocks_cap` blocks, each thread `vectors_per_thread` vectors of four.
fn launch(fused: &FusedAdamW, f: &CudaFunction, s: &Shard, blocks_cap: u32, vectors_per_thread: i64) {
    let n = s.p.numel() as i64;
    let ptr = |t: &Tensor| t.data_ptr() as u64;
    let per_block = vectors_per_thread * i64::from(THREADS);
    let blocks = u32::try_from((n / 4 + per_block - 1) / per_block).unwrap_or(u32::MAX).min(blocks_cap);
    // SAFETY: contiguous fp32 states and bf16 gradient and copy of `n` elements (a multiple of 4),
    // 16-byte aligned (libtorch's allocations), alive until the bench synchronizes.
    unsafe { fused.launch(f, blocks, &COEFFS, [ptr(&s.p), ptr(&s.m), ptr(&s.v), ptr(&s.g), ptr(&s.out)], n) }
        .expect("launch");
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Milliseconds per update of all `shards` by `run`: the median of 5 rounds of 10.
fn time_ms(gpu: &Gpu, shards: &[Shard], run: &dyn Fn(&Shard)) -> f64 {
    for s in shards {
        run(s);
    }
    let (a, b) = (gpu.event().expect("event"), gpu.event().expect("event"));
    let rounds = (0..5)
        .map(|_| {
            gpu.record(a, &gpu.compute).expect("record");
            for _ in 0..10 {
                for s in shards {
                    run(s);
                }
            }
            gpu.record(b, &gpu.compute).expect("record");
            gpu.elapsed_ms(a, b).expect("elapsed") / 10.0
        })
        .collect();
    median(rounds)
}

fn main() {
    let args: Vec<i64> = std::env::args().skip(1).map(|a| a.parse().expect("a count")).collect();
    let (per_block, blocks, embed) = match args[..] {
        [a, b, c] => (a, b, c),
        [] => (30_740_800, 48, 82_063_200),
        _ => panic!("usage: adamw_bw [PARAMS_PER_BLOCK BLOCKS EMBED_PARAMS]"),
    };
    assert!(per_block % 4 == 0 && embed % 4 == 0, "shards of whole vectors");
    let dev = zerobench_worker::runtime::device::select(zerobench_schema::DeviceRequest::Cuda).expect("a GPU");
    assert_eq!(dev, Device::Cuda(0));
    let gpu: Arc<Gpu> = Gpu::new(0, ComputeStream::Legacy).expect("CUDA context");
    let fused = FusedAdamW::new(Arc::clone(&gpu)).expect("the worker's kernel");
    let module = kernels::load(&gpu, &format!("{SOURCE}\n{VARIANTS}")).expect("the variants");
    let (streaming, two) = (module.load_function("streaming").expect("f"), module.load_function("two").expect("f"));
    let sms = kernels::multiprocessors(&gpu).expect("SMs");
    let worker_kernel =
        |s: &Shard| fused.step(&COEFFS, &s.p, &s.m, &s.v, &s.g, Some(&s.out), Lane::InOrder).expect("update");
    let sizes: Vec<i64> = std::iter::once(embed).chain(std::iter::repeat_n(per_block, blocks as usize)).collect();
    let params: i64 = sizes.iter().sum();
    let bytes = 28.0 * params as f64;

    // The bits: every form's one update of the first block's shard against the worker's.
    let start = Shard::new(per_block, 1);
    let reference = start.copy();
    worker_kernel(&reference);
    let resident_fn = module.load_function("adamw_vec_bf16").expect("f");
    type Form<'a> = (&'a str, Box<dyn Fn(&Shard) + 'a>);
    let forms: Vec<Form> = vec![
        ("worker", Box::new(worker_kernel)),
        ("resident", Box::new(|s: &Shard| launch(&fused, &resident_fn, s, sms * 8, 1))),
        ("streaming", Box::new(|s: &Shard| launch(&fused, &streaming, s, sms * 16, 1))),
        ("streaming_resident", Box::new(|s: &Shard| launch(&fused, &streaming, s, sms * 8, 1))),
        ("two", Box::new(|s: &Shard| launch(&fused, &two, s, sms * 16, 2))),
    ];
    let shards: Vec<Shard> = sizes.iter().enumerate().map(|(i, &n)| Shard::new(n, 10 + i as i64)).collect();
    for (name, run) in &forms {
        let mine = start.copy();
        run(&mine);
        let same = mine.same_bits(&reference);
        let ms = time_ms(&gpu, &shards, run.as_ref());
        println!(
            "{}",
            json!({"form": name, "shards": shards.len(), "params": params, "same_bits_as_worker": same,
                   "ms": ms, "tb_per_s": bytes / ms / 1e9})
        );
    }
    drop(shards);
    // All parameters in one shard, one launch of the worker's kernel.
    let one = [Shard::new(params - params % 4, 99)];
    let ms = time_ms(&gpu, &one, &worker_kernel);
    println!(
        "{}",
        json!({"form": "one_launch", "shards": 1, "params": params, "ms": ms, "tb_per_s": bytes / ms / 1e9})
    );
}
