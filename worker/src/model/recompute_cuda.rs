//! The layer norms and the memory-bound gradient reductions of [`super::recompute`]'s nodes as
//! CUDA kernels, compiled at start with NVRTC and called by the shim's autograd nodes on CUDA
//! tensors: the layer norm (forward, recomputed and backward, its input gradient together with its
//! weight and bias gradients), the linear layers' bias gradients (column sums), and the GELU's
//! gradient together with the bias gradient of the linear layer before it.
//!
//! libtorch computes a layer norm's weight and bias gradients in a kernel of their own that reads
//! the upstream gradient and the input again, and each bias gradient is a reduction over the rows
//! of a gradient some other kernel has just written. On gpt2 at micro-batch 16 (one H100, one
//! profiled step) the layer norms' weight gradients took 2.0 ms and the bias gradients' reductions
//! 2.0 ms, a fifth and two fifths of the memory's bandwidth for what they read, and the layer norm's
//! forward kernel ran at 1.4 TB/s. Here (docs/results/one-gpu.md has the measurements):
//!
//! * `ln_forward_*`: the layer norm, one warp per row held in registers, mean and variance in two
//!   passes over them; the nodes keep the per-row mean and reciprocal deviation (fp32).
//! * `ln_backward_*`: a thread per 16-byte vector of a row, four rows at a time, so `dy` and `x`
//!   are read once for all three gradients and for the normalised input, which the kernel writes
//!   again for the weight gradient of the product after the layer norm (from the kept mean and
//!   deviation, with the forward kernel's function: the same bits), instead of a forward kernel
//!   run again to recompute it. A thread's columns' sums of `dy·x̂` and `dy` stay in its registers
//!   over the block's rows, and each block writes one row of fp32 partial sums; the rows' sums go
//!   through shuffles and shared memory, warps added in order, so everything comes out the same
//!   every run. The row length is a compile-time constant (compiled per model width on first
//!   use). Where the layer norm's input is also the residual stream that skips the sub-block (the
//!   MLP's node and, through its last output, the attention's), the residual's gradient is added
//!   to the input gradient before it is rounded, in the same pass.
//! * `gelu_forward_*`: the MLP's tanh GELU in the forward pass.
//! * `col_sum_*` and `gelu_backward_col_sum_*`: 16-byte loads down the rows, two rows in flight
//!   per lane, fp32 sums per column (of the 16-bit values as they are stored, as libtorch sums
//!   them), one row of partial sums per block row; the last block of each column strip to finish
//!   adds the strip's partial sums into the gradient (a counter per strip, set back to zero by
//!   that block, so CUDA graphs replay it), which saves a reduction kernel per sum. The grid has
//!   as many block rows as keep all its blocks resident at once: at gpt2-xl's MLP width a grid of
//!   eight blocks per multiprocessor had run 1.6 waves of the GELU variant. The GELU
//!   variant writes `gelu'(h)·g` over `g` as it goes and, in the same pass, the recomputed
//!   `gelu(h)` the second layer's weight gradient needs (with the same function as the forward
//!   kernel: the same bits), so `h` is read once in the backward pass; both come from one `tanh`.
//!   The join variant (`join_col_sum_*`) writes the gradients of q, k and v side by side into the
//!   gradient of the product that made them and sums its columns as it copies them: in a gpt2-xl
//!   step autograd's join of the split (19.5 µs a block) and the bias gradient's column sum that
//!   read the joined gradient again (13.2 µs) were two passes over it (the join: 22.7 µs). Its
//!   grid comes from the same rule as the plain column sum's over the joined gradient (the block
//!   rows from the kernel's own resident blocks: at gpt2-xl's shape on an H200 both 19 × 41), and
//!   with the same grid the sums are added in the same order, to the same bits.
//! * `reduce_parts_*`: the layer norm's partial sums' rows added, in order, into the gradients'
//!   precision.
//! * `scale_*`: the LM head's node's gradients times the upstream gradient (one fp32 value on
//!   the device), the fp32 product rounded once. libtorch's `mul` of a 16-bit tensor by a 0-dim
//!   fp32 tensor rounds the factor to 16 bits first (an fp16 loss scale of 2^16 becomes infinite)
//!   and its kernel for mixed element types is not vectorised (0.31 ms a gpt2-xl step against
//!   0.09).
//!
//! Every kernel runs on the compute stream, which is libtorch's current stream in the forward
//! pass and in the autograd engine's device thread (the shim passes it; a call on any other
//! stream, or on tensors these kernels do not take, is declined, and the node uses libtorch's
//! operations instead).

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaFunction, CudaModule, LaunchConfig, PushKernelArg};
use tch::{Kind, Tensor};

use super::products_cuda::{LtProducts, ProductError};
use crate::runtime::cuda::Gpu;
use crate::runtime::kernels::{self, Instances, Precision};
use crate::runtime::shim::{self, CTensor, NodeKernelFns};

/// Rows of threads in the blocks of the column sums and of the parts' reduction, which are
/// (32, rows): declared once, here, for the launches ([`COL_SUM_ROWS`]) and the CUDA source
/// (`COL_SUM_ROWS`, defined at its top).
macro_rules! col_sum_rows {
    () => {
        8
    };
}

/// See [`col_sum_rows`].
const COL_SUM_ROWS: u32 = col_sum_rows!();

/// Threads per block of the column sums.
const COL_SUM_THREADS: u32 = 32 * COL_SUM_ROWS;

/// Rows a block of the layer norm's backward kernel takes at a time: declared once, here, for the
/// launches ([`LN_BACKWARD_ROWS`]) and the CUDA source (`LN_BW_ROWS`).
macro_rules! ln_backward_rows {
    () => {
        4
    };
}

/// See [`ln_backward_rows`].
const LN_BACKWARD_ROWS: i64 = ln_backward_rows!();

/// The kernels that do not depend on the row length, after [`kernels`]' shared conversions. Each
/// is instantiated for bf16, fp16 and fp32 (suffixes `bf16`, `f16`, `f32`), 16 bytes per load: 8
/// 16-bit values or 4 fp32 ones.
pub(crate) const SOURCE: &str = concat!(
    "#define COL_SUM_ROWS ",
    col_sum_rows!(),
    "\n",
    r#"
#define GELU_BETA 0.7978845608028654f   /* sqrt(2 / pi) */
#define GELU_KAPPA 0.044715f
/* The tanh in the tanh GELU, as libtorch's gelu computes it in fp32. */
__device__ __forceinline__ float gelu_tanh(float x) {
  return tanhf(GELU_BETA * (x + GELU_KAPPA * (x * x * x)));
}

/* The tanh GELU from its tanh t = gelu_tanh(x). */
__device__ __forceinline__ float gelu_of(float x, float t) { return 0.5f * x * (1.f + t); }

/* The tanh GELU's derivative times g from the same t, as libtorch's gelu_backward computes it. */
__device__ __forceinline__ float gelu_grad_of(float g, float x, float t) {
  float left = 0.5f * x, right = 1.f + t;
  return g * (0.5f * right + left * (1.f - t * t) * GELU_BETA * (1.f + 3.f * GELU_KAPPA * (x * x)));
}

__device__ __forceinline__ float gelu(float x) { return gelu_of(x, gelu_tanh(x)); }

/* a = gelu(h) over nv vectors: the MLP's forward pass and, fused below, its recomputation use
   this one function, so both give the same bits. */
#define GELU_FORWARD(NAME, T, VEC, N, LOAD, STORE)                                                    \
extern "C" __global__ void __launch_bounds__(256) NAME(const T* __restrict__ h, T* __restrict__ a,   \
    long long nv) {                                                                                   \
  const VEC* hv = reinterpret_cast<const VEC*>(h);                                                    \
  VEC* av = reinterpret_cast<VEC*>(a);                                                                \
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < nv;                        \
       i += (long long)gridDim.x * blockDim.x) {                                                      \
    VEC raw = hv[i], o;                                                                               \
    const T* he = reinterpret_cast<const T*>(&raw);                                                   \
    T* oe = reinterpret_cast<T*>(&o);                                                                 \
    _Pragma("unroll") for (int k = 0; k < N; ++k) oe[k] = STORE(gelu(LOAD(he[k])));                   \
    av[i] = o;                                                                                        \
  }                                                                                                   \
}

/* out = x * u over nv vectors, u one fp32 value read on the device: a gradient computed ahead times
   the upstream gradient, the product in fp32 and rounded once. u is not rounded to x's precision
   first (libtorch's mul of a 16-bit tensor by a 0-dim fp32 tensor rounds it so: 1/3 off in bf16, and
   an fp16 loss scale of 2^16 becomes infinite). */
#define SCALE(NAME, T, VEC, N, LOAD, STORE)                                                           \
extern "C" __global__ void __launch_bounds__(256) NAME(const T* __restrict__ x,                      \
    const float* __restrict__ u, T* __restrict__ out, long long nv) {                                 \
  const float s = *u;                                                                                 \
  const VEC* xv = reinterpret_cast<const VEC*>(x);                                                    \
  VEC* ov = reinterpret_cast<VEC*>(out);                                                              \
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < nv;                        \
       i += (long long)gridDim.x * blockDim.x) {                                                      \
    VEC raw = xv[i], o;                                                                               \
    const T* xe = reinterpret_cast<const T*>(&raw);                                                   \
    T* oe = reinterpret_cast<T*>(&o);                                                                 \
    _Pragma("unroll") for (int k = 0; k < N; ++k) oe[k] = STORE(LOAD(xe[k]) * s);                     \
    ov[i] = o;                                                                                        \
  }                                                                                                   \
}

/* Block (32, COL_SUM_ROWS): lane x sums vector column blockIdx.x * 32 + x over rows y,
   y + COL_SUM_ROWS * gridDim.y, ...
   of block row blockIdx.y; part[blockIdx.y][cols] gets the block's sums. MODE 0: x's columns.
   MODE 1 (the GELU): h holds the GELU's input: act gets gelu(h) (the recomputed activation) and x
   (g) is overwritten with gelu'(h)·g, whose stored values are summed; one tanh serves both. MODE 2
   (a join): x gets the three matrices s0, s1, s2 (rows of nvs vectors each) side by side, and
   their columns are summed as they are copied. Two rows are loaded before either is used, so
   that each lane has four loads in flight rather than two. */
#define COL_SUM_ROW(T, VEC, N, LOAD, STORE, MODE, RAW, HR, R)                                        \
  {                                                                                                   \
    T* e = reinterpret_cast<T*>(&RAW);                                                                \
    if (MODE == 2) xv[(R) * nv + c] = RAW;                                                            \
    if (MODE == 1) {                                                                                  \
      VEC ar;                                                                                         \
      const T* he = reinterpret_cast<const T*>(&HR);                                                  \
      T* ae = reinterpret_cast<T*>(&ar);                                                              \
      _Pragma("unroll") for (int k = 0; k < N; ++k) {                                                 \
        float hk = LOAD(he[k]), t = gelu_tanh(hk);                                                    \
        ae[k] = STORE(gelu_of(hk, t));                                                                \
        e[k] = STORE(gelu_grad_of(LOAD(e[k]), hk, t));                                                \
      }                                                                                               \
      reinterpret_cast<VEC*>(act)[(R) * nv + c] = ar;                                                 \
      xv[(R) * nv + c] = RAW;                                                                         \
    }                                                                                                 \
    _Pragma("unroll") for (int k = 0; k < N; ++k) acc[k] += LOAD(e[k]);                               \
  }
#define COL_SUM(NAME, T, VEC, N, LOAD, STORE, MODE)                                                   \
extern "C" __global__ void __launch_bounds__(32 * COL_SUM_ROWS) NAME(T* __restrict__ x, const T* __restrict__ h, \
    T* __restrict__ act, const T* __restrict__ s0, const T* __restrict__ s1, const T* __restrict__ s2, \
    long long nvs, float* __restrict__ part, long long rows, long long nv,                             \
    unsigned int* __restrict__ done, T* __restrict__ out) {                                           \
  __shared__ float sm[COL_SUM_ROWS][32 * N];                                                          \
  __shared__ bool last;                                                                               \
  long long c = (long long)blockIdx.x * 32 + threadIdx.x;                                             \
  float acc[N];                                                                                       \
  _Pragma("unroll") for (int k = 0; k < N; ++k) acc[k] = 0.f;                                         \
  if (c < nv) {                                                                                       \
    VEC* xv = reinterpret_cast<VEC*>(x);                                                              \
    const VEC* hv = reinterpret_cast<const VEC*>(h);                                                  \
    /* Where this lane's column is read from: x itself, or (a join) its column of s0, s1 or s2. */    \
    const VEC* src = xv;                                                                              \
    long long sw = nv, sc = c;                                                                        \
    if (MODE == 2) {                                                                                  \
      const int j = (int)(c / nvs);                                                                   \
      src = reinterpret_cast<const VEC*>(j == 0 ? s0 : j == 1 ? s1 : s2);                             \
      sw = nvs;                                                                                       \
      sc = c - j * nvs;                                                                               \
    }                                                                                                 \
    long long step = (long long)gridDim.y * COL_SUM_ROWS;                                             \
    long long r = (long long)blockIdx.y * COL_SUM_ROWS + threadIdx.y;                                 \
    for (; r + step < rows; r += 2 * step) {                                                          \
      VEC raw0 = src[r * sw + sc], raw1 = src[(r + step) * sw + sc], hr0, hr1;                        \
      if (MODE == 1) { hr0 = hv[r * nv + c]; hr1 = hv[(r + step) * nv + c]; }                         \
      COL_SUM_ROW(T, VEC, N, LOAD, STORE, MODE, raw0, hr0, r)                                         \
      COL_SUM_ROW(T, VEC, N, LOAD, STORE, MODE, raw1, hr1, r + step)                                  \
    }                                                                                                 \
    if (r < rows) {                                                                                   \
      VEC raw0 = src[r * sw + sc], hr0;                                                               \
      if (MODE == 1) hr0 = hv[r * nv + c];                                                            \
      COL_SUM_ROW(T, VEC, N, LOAD, STORE, MODE, raw0, hr0, r)                                         \
    }                                                                                                 \
  }                                                                                                   \
  _Pragma("unroll") for (int k = 0; k < N; ++k) sm[threadIdx.y][threadIdx.x * N + k] = acc[k];        \
  __syncthreads();                                                                                    \
  long long cols = nv * N;                                                                            \
  for (int e = threadIdx.y * 32 + threadIdx.x; e < 32 * N; e += 32 * COL_SUM_ROWS) {                  \
    float s = 0.f;                                                                                    \
    _Pragma("unroll") for (int y = 0; y < COL_SUM_ROWS; ++y) s += sm[y][e];                           \
    long long col = (long long)blockIdx.x * 32 * N + e;                                               \
    if (col < cols) part[(long long)blockIdx.y * cols + col] = s;                                     \
  }                                                                                                   \
  /* The last block of the column strip to finish adds its gridDim.y rows of partial sums into out,  \
     in REDUCE's order, and sets the strip's counter back to zero for the next launch. */            \
  __threadfence();                                                                                    \
  __syncthreads();                                                                                    \
  if (threadIdx.x == 0 && threadIdx.y == 0) last = atomicAdd(&done[blockIdx.x], 1u) == gridDim.y - 1; \
  __syncthreads();                                                                                    \
  if (!last) return;                                                                                  \
  __threadfence();                                                                                    \
  /* As REDUCE adds them: lane (x, y) the rows y, y + COL_SUM_ROWS, ... of its N columns, in order;   \
     then each column's COL_SUM_ROWS sums in order of y. */                                           \
  float s8[N];                                                                                        \
  _Pragma("unroll") for (int k = 0; k < N; ++k) s8[k] = 0.f;                                          \
  if (c < nv) {                                                                                       \
    _Pragma("unroll 4") for (long long q = threadIdx.y; q < gridDim.y; q += COL_SUM_ROWS) {           \
      const float4* pr = reinterpret_cast<const float4*>(part + q * cols + c * N);                    \
      _Pragma("unroll") for (int k = 0; k < N / 4; ++k) {                                             \
        float4 v = __ldcg(pr + k);                                                                    \
        s8[4 * k] += v.x; s8[4 * k + 1] += v.y; s8[4 * k + 2] += v.z; s8[4 * k + 3] += v.w;           \
      }                                                                                               \
    }                                                                                                 \
  }                                                                                                   \
  _Pragma("unroll") for (int k = 0; k < N; ++k) sm[threadIdx.y][threadIdx.x * N + k] = s8[k];         \
  __syncthreads();                                                                                    \
  for (int e = threadIdx.y * 32 + threadIdx.x; e < 32 * N; e += 32 * COL_SUM_ROWS) {                  \
    long long col = (long long)blockIdx.x * 32 * N + e;                                               \
    if (col >= cols) continue;                                                                        \
    float t = 0.f;                                                                                    \
    _Pragma("unroll") for (int y = 0; y < COL_SUM_ROWS; ++y) t += sm[y][e];                           \
    out[col] = STORE(t);                                                                              \
  }                                                                                                   \
  if (threadIdx.x == 0 && threadIdx.y == 0) done[blockIdx.x] = 0;                                     \
}

/* Block (32, COL_SUM_ROWS): column c of the nparts rows of part (cols each) summed; columns below split go
   to out0, the rest to out1. */
#define REDUCE(NAME, T, STORE)                                                                        \
extern "C" __global__ void NAME(const float* __restrict__ part, long long nparts, long long cols,     \
    long long split, T* __restrict__ out0, T* __restrict__ out1) {                                    \
  __shared__ float sm[COL_SUM_ROWS][33];                                                              \
  long long c = (long long)blockIdx.x * 32 + threadIdx.x;                                             \
  float s = 0.f;                                                                                      \
  if (c < cols) for (long long p = threadIdx.y; p < nparts; p += COL_SUM_ROWS) s += part[p * cols + c]; \
  sm[threadIdx.y][threadIdx.x] = s;                                                                   \
  __syncthreads();                                                                                    \
  if (threadIdx.y == 0 && c < cols) {                                                                 \
    float t = 0.f;                                                                                    \
    _Pragma("unroll") for (int y = 0; y < COL_SUM_ROWS; ++y) t += sm[y][threadIdx.x];                 \
    if (c < split) out0[c] = STORE(t); else out1[c - split] = STORE(t);                               \
  }                                                                                                   \
}

GELU_FORWARD(gelu_forward_bf16, unsigned short, uint4, 8, bf2f, f2bf)
GELU_FORWARD(gelu_forward_f16, unsigned short, uint4, 8, h2f, f2h)
GELU_FORWARD(gelu_forward_f32, float, float4, 4, f2f, f2f)
COL_SUM(col_sum_bf16, unsigned short, uint4, 8, bf2f, f2bf, 0)
COL_SUM(col_sum_f16, unsigned short, uint4, 8, h2f, f2h, 0)
COL_SUM(col_sum_f32, float, float4, 4, f2f, f2f, 0)
COL_SUM(gelu_backward_col_sum_bf16, unsigned short, uint4, 8, bf2f, f2bf, 1)
COL_SUM(gelu_backward_col_sum_f16, unsigned short, uint4, 8, h2f, f2h, 1)
COL_SUM(gelu_backward_col_sum_f32, float, float4, 4, f2f, f2f, 1)
COL_SUM(join_col_sum_bf16, unsigned short, uint4, 8, bf2f, f2bf, 2)
COL_SUM(join_col_sum_f16, unsigned short, uint4, 8, h2f, f2h, 2)
COL_SUM(join_col_sum_f32, float, float4, 4, f2f, f2f, 2)
REDUCE(reduce_parts_bf16, unsigned short, f2bf)
REDUCE(reduce_parts_f16, unsigned short, f2h)
REDUCE(reduce_parts_f32, float, f2f)
SCALE(scale_bf16, unsigned short, uint4, 8, bf2f, f2bf)
SCALE(scale_f16, unsigned short, uint4, 8, h2f, f2h)
SCALE(scale_f32, float, float4, 4, f2f, f2f)
"#
);

/// The kernels of [`SOURCE`], each in every precision: column sums, the GELU, the GELU's gradient
/// with column sums, a join of three matrices with column sums, the partial sums' reduction, the
/// scaling by a device value.
pub(crate) const INSTANCES: &[&str; 6] =
    &["col_sum", "gelu_forward", "gelu_backward_col_sum", "join_col_sum", "reduce_parts", "scale"];

/// The layer norm's forward pass and backward pass (which also recomputes the forward's output
/// for the weight gradient of the product after it), after `#define COLS <row length>` (a
/// multiple of 8, at most [`MAX_COLS`]) and [`kernels`]' conversions.
///
/// Forward: a warp per row, its columns held in registers; each warp issues its first row's loads
/// before its block stages gamma and beta in shared memory, so that the staging overlaps them.
///
/// Backward: a thread per 16-byte vector of a row (a block of `32 · ⌈vectors / 32⌉` threads: 224 at
/// gpt2-xl's 1600 columns in 16 bits), `LN_BW_ROWS` rows at a time. A thread keeps its columns'
/// gamma and beta and its columns' sums of `dy·x̂` and `dy` over the block's rows in registers, and
/// holds its vectors of the rows' x and dy from the first pass to the second; the rows' two sums
/// go through a warp's shuffles and then shared memory, the warps added in order, so everything
/// comes out in the same order every run. `part` gets one row of `2 · COLS` fp32 sums per block
/// (`dy·x̂`, then `dy`). A warp per row before (every warp adding its rows' column sums into a
/// slice of shared memory of its own) left two or three blocks of four warps on a multiprocessor
/// and ran at about 2 TB/s.
pub(crate) const LN_SOURCE: &str = concat!(
    "#define LN_BW_ROWS ",
    ln_backward_rows!(),
    "\n",
    r#"
/* A thread per vector of N values, in whole warps: the backward kernel's block, which the launches
   read from the compiled kernel (`Resident::at_launch_bounds`). */
#define LN_BW_THREADS(N) (32 * ((COLS / (N) + 31) / 32))

/* One element of the layer norm's output. The forward pass and the backward pass's recomputation
   both call it with the same fp32 mean and reciprocal deviation (the forward pass's, kept), so
   the recomputed output has the forward's bits. */
__device__ __forceinline__ float ln_out(float x, float mu, float rs, float g, float b) {
  return (x - mu) * rs * g + b;
}

/* Lane `lane`'s vectors (lane, lane + 32, ...) of row R of the [rows, COLS] array P into A. */
#define LN_LOAD(VEC, A, P, R)                                                                         \
  _Pragma("unroll") for (int v = 0; v < VPL; ++v) {                                                   \
    int c = lane + v * 32;                                                                            \
    if (c < NV) A[v] = reinterpret_cast<const VEC*>(P + (R) * COLS)[c];                               \
  }

/* Thread t takes vector t (columns t·N .. t·N + N - 1) of rows r0 .. r0 + LN_BW_ROWS - 1. */
#define LN_BACKWARD(NAME, T, VEC, N, LOAD, STORE)                                                     \
extern "C" __global__ void __launch_bounds__(LN_BW_THREADS(N)) NAME(                                  \
    const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ mean,                \
    const float* __restrict__ rstd, const T* __restrict__ gamma, const T* __restrict__ beta,          \
    const T* __restrict__ dres, T* __restrict__ dx, T* __restrict__ xn, float* __restrict__ part,     \
    long long rows) {                                                                                 \
  constexpr int NV = COLS / N;                /* vectors per row */                                   \
  constexpr int W = (NV + 31) / 32;           /* warps per block */                                   \
  constexpr int R = LN_BW_ROWS;                                                                       \
  /* Each warp's two sums of each row; two sets, used in turn, so one barrier a group suffices. */    \
  __shared__ float red[2][R][2][W];                                                                   \
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;                                            \
  const bool mine = t < NV;                                                                           \
  float g[N], b[N], sg[N], sb[N];                                                                     \
  if (mine) {                                                                                         \
    const VEC gv = reinterpret_cast<const VEC*>(gamma)[t], bv = reinterpret_cast<const VEC*>(beta)[t]; \
    const T* ge = reinterpret_cast<const T*>(&gv);                                                   \
    const T* be = reinterpret_cast<const T*>(&bv);                                                   \
    _Pragma("unroll") for (int k = 0; k < N; ++k) { g[k] = LOAD(ge[k]); b[k] = LOAD(be[k]); }        \
  }                                                                                                   \
  _Pragma("unroll") for (int k = 0; k < N; ++k) { sg[k] = 0.f; sb[k] = 0.f; }                         \
  int set = 0;                                                                                        \
  for (long long r0 = (long long)blockIdx.x * R; r0 < rows; r0 += (long long)gridDim.x * R) {         \
    VEC xa[R], da[R];                                                                                 \
    float mu[R], rs[R], s1[R], s2[R];                                                                 \
    _Pragma("unroll") for (int i = 0; i < R; ++i) {                                                   \
      const long long r = r0 + i;                                                                     \
      if (mine && r < rows) {                                                                         \
        xa[i] = reinterpret_cast<const VEC*>(x + r * COLS)[t];                                        \
        da[i] = reinterpret_cast<const VEC*>(dy + r * COLS)[t];                                       \
      }                                                                                               \
      mu[i] = r < rows ? mean[r] : 0.f;                                                               \
      rs[i] = r < rows ? rstd[r] : 0.f;                                                               \
    }                                                                                                 \
    /* First pass: the rows' sums, the columns' sums, and the recomputed output, which needs x. */   \
    _Pragma("unroll") for (int i = 0; i < R; ++i) {                                                   \
      const long long r = r0 + i;                                                                     \
      s1[i] = 0.f; s2[i] = 0.f;                                                                       \
      if (mine && r < rows) {                                                                         \
        const T* xe = reinterpret_cast<const T*>(&xa[i]);                                            \
        const T* de = reinterpret_cast<const T*>(&da[i]);                                            \
        VEC yo;                                                                                       \
        T* ye = reinterpret_cast<T*>(&yo);                                                            \
        _Pragma("unroll") for (int k = 0; k < N; ++k) {                                               \
          float xv = LOAD(xe[k]), xh = (xv - mu[i]) * rs[i], d = LOAD(de[k]), dyg = d * g[k];         \
          s1[i] += dyg * xh; s2[i] += dyg;                                                            \
          sg[k] += d * xh; sb[k] += d;                                                                \
          ye[k] = STORE(ln_out(xv, mu[i], rs[i], g[k], b[k]));                                        \
        }                                                                                             \
        reinterpret_cast<VEC*>(xn + r * COLS)[t] = yo;                                                \
      }                                                                                               \
    }                                                                                                 \
    _Pragma("unroll") for (int i = 0; i < R; ++i) {                                                   \
      _Pragma("unroll") for (int off = 16; off > 0; off >>= 1) {                                      \
        s1[i] += __shfl_xor_sync(0xffffffffu, s1[i], off);                                            \
        s2[i] += __shfl_xor_sync(0xffffffffu, s2[i], off);                                            \
      }                                                                                               \
      if (lane == 0) { red[set][i][0][warp] = s1[i]; red[set][i][1][warp] = s2[i]; }                  \
    }                                                                                                 \
    __syncthreads();                                                                                  \
    /* Second pass: the input's gradient, from the held vectors. */                                   \
    _Pragma("unroll") for (int i = 0; i < R; ++i) {                                                   \
      const long long r = r0 + i;                                                                     \
      float a1 = 0.f, a2 = 0.f;                                                                       \
      _Pragma("unroll") for (int w = 0; w < W; ++w) { a1 += red[set][i][0][w]; a2 += red[set][i][1][w]; } \
      a1 *= 1.f / COLS; a2 *= 1.f / COLS;                                                             \
      if (mine && r < rows) {                                                                         \
        const T* xe = reinterpret_cast<const T*>(&xa[i]);                                            \
        const T* de = reinterpret_cast<const T*>(&da[i]);                                            \
        VEC o, ra;                                                                                    \
        T* oe = reinterpret_cast<T*>(&o);                                                             \
        if (dres) ra = reinterpret_cast<const VEC*>(dres + r * COLS)[t];                              \
        const T* re = reinterpret_cast<const T*>(&ra);                                                \
        _Pragma("unroll") for (int k = 0; k < N; ++k) {                                               \
          float xh = (LOAD(xe[k]) - mu[i]) * rs[i], dyg = LOAD(de[k]) * g[k];                         \
          float v = rs[i] * (dyg - a2 - xh * a1);                                                     \
          oe[k] = STORE(dres ? v + LOAD(re[k]) : v);                                                  \
        }                                                                                             \
        reinterpret_cast<VEC*>(dx + r * COLS)[t] = o;                                                 \
      }                                                                                               \
    }                                                                                                 \
    set ^= 1;                                                                                         \
  }                                                                                                   \
  if (mine) {                                                                                         \
    float* out = part + (long long)blockIdx.x * 2 * COLS + t * N;                                     \
    _Pragma("unroll") for (int k = 0; k < N; ++k) { out[k] = sg[k]; out[COLS + k] = sb[k]; }          \
  }                                                                                                   \
}

/* The forward pass: a warp per row of x, held in registers; mean and variance in two passes over
   them (fp32), y = ln_out(x). */
#define LN_FORWARD(NAME, T, VEC, N, LOAD, STORE)                                                      \
extern "C" __global__ void __launch_bounds__(256) NAME(const T* __restrict__ x,                      \
    const T* __restrict__ gamma, const T* __restrict__ beta, float eps, T* __restrict__ y,            \
    float* __restrict__ mean, float* __restrict__ rstd, long long rows) {                             \
  constexpr int NV = COLS / N;                                                                        \
  constexpr int VPL = (NV + 31) / 32;                                                                 \
  __shared__ float g_s[COLS], b_s[COLS];                                                              \
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;                      \
  const long long stride = (long long)gridDim.x * warps;                                              \
  long long r = (long long)blockIdx.x * warps + warp;                                                 \
  VEC xa[VPL];                                                                                        \
  if (r < rows) { LN_LOAD(VEC, xa, x, r) }                                                            \
  for (int i = threadIdx.x; i < COLS; i += blockDim.x) {                                              \
    g_s[(i % N) * NV + i / N] = LOAD(gamma[i]);                                                       \
    b_s[(i % N) * NV + i / N] = LOAD(beta[i]);                                                        \
  }                                                                                                   \
  __syncthreads();                                                                                    \
  for (; r < rows; r += stride) {                                                                     \
    float s = 0.f;                                                                                    \
    _Pragma("unroll") for (int v = 0; v < VPL; ++v) {                                                 \
      int c = lane + v * 32;                                                                          \
      if (c < NV) {                                                                                   \
        const T* xe = reinterpret_cast<const T*>(&xa[v]);                                            \
        _Pragma("unroll") for (int k = 0; k < N; ++k) s += LOAD(xe[k]);                               \
      }                                                                                               \
    }                                                                                                 \
    _Pragma("unroll") for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off); \
    float mu = s * (1.f / COLS), q = 0.f;                                                             \
    _Pragma("unroll") for (int v = 0; v < VPL; ++v) {                                                 \
      int c = lane + v * 32;                                                                          \
      if (c < NV) {                                                                                   \
        const T* xe = reinterpret_cast<const T*>(&xa[v]);                                            \
        _Pragma("unroll") for (int k = 0; k < N; ++k) { float d = LOAD(xe[k]) - mu; q += d * d; }     \
      }                                                                                               \
    }                                                                                                 \
    _Pragma("unroll") for (int off = 16; off > 0; off >>= 1) q += __shfl_xor_sync(0xffffffffu, q, off); \
    float rs = rsqrtf(q * (1.f / COLS) + eps);                                                        \
    if (lane == 0) { mean[r] = mu; rstd[r] = rs; }                                                    \
    VEC* yr = reinterpret_cast<VEC*>(y + r * COLS);                                                   \
    _Pragma("unroll") for (int v = 0; v < VPL; ++v) {                                                 \
      int c = lane + v * 32;                                                                          \
      if (c < NV) {                                                                                   \
        const T* xe = reinterpret_cast<const T*>(&xa[v]);                                            \
        VEC o;                                                                                        \
        T* oe = reinterpret_cast<T*>(&o);                                                             \
        _Pragma("unroll") for (int k = 0; k < N; ++k)                                                 \
          oe[k] = STORE(ln_out(LOAD(xe[k]), mu, rs, g_s[k * NV + c], b_s[k * NV + c]));               \
        yr[c] = o;                                                                                    \
      }                                                                                               \
    }                                                                                                 \
    if (r + stride < rows) { LN_LOAD(VEC, xa, x, r + stride) }                                        \
  }                                                                                                   \
}

LN_FORWARD(ln_forward_bf16, unsigned short, uint4, 8, bf2f, f2bf)
LN_FORWARD(ln_forward_f16, unsigned short, uint4, 8, h2f, f2h)
LN_FORWARD(ln_forward_f32, float, float4, 4, f2f, f2f)
LN_BACKWARD(ln_backward_bf16, unsigned short, uint4, 8, bf2f, f2bf)
LN_BACKWARD(ln_backward_f16, unsigned short, uint4, 8, h2f, f2h)
LN_BACKWARD(ln_backward_f32, float, float4, 4, f2f, f2f)
"#
);

/// The kernels of [`LN_SOURCE`], forward then backward.
pub(crate) const LN_INSTANCES: &[&str; 2] = &["ln_forward", "ln_backward"];

/// Warps per block of the layer norm's forward kernel.
const LN_FORWARD_WARPS: u32 = 8;

/// The widest row the layer norm's kernels take: the forward kernel's lanes hold their columns of
/// a row of `x` in registers, and the backward kernel's block has a thread per vector of a row (512
/// in fp32 at 2048 columns).
pub const MAX_COLS: i64 = 2048;

/// A kernel in each precision with how many of its blocks fit on the GPU at once (blocks of
/// `threads` threads, no dynamic shared memory): the most blocks its grids get.
/// A grid of more would run a second, partial wave after the first, and the kernels that write a
/// row of partial sums per block would write more of them.
struct Resident {
    kernels: Instances,
    blocks: [u32; 3],
    threads: [u32; 3],
}

impl Resident {
    fn new(kernels: Instances, threads: u32, sms: u32) -> Result<Self, NodeKernelError> {
        Self::with_threads(kernels, [threads; 3], sms)
    }

    /// Blocks of as many threads as each kernel's `__launch_bounds__` allows (the kernel's own
    /// statement of its block size, which the launch then takes from here).
    fn at_launch_bounds(kernels: Instances, sms: u32) -> Result<Self, NodeKernelError> {
        let mut threads = [0; 3];
        for (f, t) in kernels.all().iter().zip(threads.iter_mut()) {
            *t = f.max_threads_per_block()? as u32;
        }
        Self::with_threads(kernels, threads, sms)
    }

    fn with_threads(kernels: Instances, threads: [u32; 3], sms: u32) -> Result<Self, NodeKernelError> {
        let mut blocks = [0; 3];
        for ((f, b), t) in kernels.all().iter().zip(blocks.iter_mut()).zip(threads) {
            *b = f.occupancy_max_active_blocks_per_multiprocessor(t, 0, None)?.max(1) * sms;
        }
        Ok(Self { kernels, blocks, threads })
    }

    /// The kernel in precision `p` and its resident blocks.
    fn get(&self, p: Precision) -> (&CudaFunction, u32) {
        (self.kernels.get(p), self.blocks[p as usize])
    }

    /// The threads of a block of the kernel in precision `p`.
    fn threads(&self, p: Precision) -> u32 {
        self.threads[p as usize]
    }
}

/// The layer norm's kernels for one row length.
struct LnKernels {
    _module: Arc<CudaModule>,
    forward: Resident,
    backward: Resident,
}

pub struct NodeKernels {
    gpu: Arc<Gpu>,
    _module: Arc<CudaModule>,
    col_sum: Resident,
    gelu_forward: Instances,
    gelu_col_sum: Resident,
    join_col_sum: Resident,
    reduce: Instances,
    scale: Instances,
    /// A counter per column strip of the column sums (zero between launches; see [`COL_SUM_STRIPS`]).
    strips_done: StripCounters,
    sms: u32,
    /// Compiled on first use per row length (the first forward pass of a width).
    ln: Mutex<HashMap<i64, Arc<LnKernels>>>,
    /// GPT-2's 16-bit matrix products through cuBLASLt (with the GELU or the residual addition
    /// in their epilogues where the node has one), where libcublasLt loads.
    products: Option<LtProducts>,
}

#[derive(Debug, thiserror::Error)]
pub enum NodeKernelError {
    #[error("the layer-norm and gradient kernels: {0}")]
    Kernel(#[from] kernels::KernelError),
    #[error("CUDA: {0}")]
    Cuda(#[from] cudarc::driver::DriverError),
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
    #[error("a matrix product through cuBLASLt: {0}")]
    Product(#[from] ProductError),
    #[error("libtorch's current stream: {0}")]
    Stream(#[from] shim::ShimError),
}

/// What a kernel does with the tensors it is given.
enum Outcome {
    Done,
    /// Not tensors these kernels take (layout, precision, stream): libtorch's operations run.
    Declined,
}

impl Outcome {
    /// The outcome of a product through cuBLASLt, counted in `counter` ([`epilogue_products`],
    /// [`plain_products`]).
    fn product(ran: bool, counter: &AtomicU64) -> Self {
        if ran {
            counter.fetch_add(1, Ordering::Relaxed);
            Outcome::Done
        } else {
            Outcome::Declined
        }
    }
}

impl NodeKernels {
    /// Compiles the kernels that do not depend on a row length for this GPU's architecture.
    pub fn new(gpu: Arc<Gpu>) -> Result<Self, NodeKernelError> {
        let module = kernels::load(&gpu, SOURCE)?;
        let [col_sum, gelu_forward, gelu_col_sum, join_col_sum, reduce, scale] =
            INSTANCES.map(|name| Instances::load(&module, name));
        let sms = kernels::multiprocessors(&gpu)?;
        Ok(Self {
            col_sum: Resident::new(col_sum?, COL_SUM_THREADS, sms)?,
            gelu_forward: gelu_forward?,
            gelu_col_sum: Resident::new(gelu_col_sum?, COL_SUM_THREADS, sms)?,
            join_col_sum: Resident::new(join_col_sum?, COL_SUM_THREADS, sms)?,
            reduce: reduce?,
            scale: scale?,
            strips_done: StripCounters::new(&gpu)?,
            _module: module,
            sms,
            ln: Mutex::new(HashMap::new()),
            products: LtProducts::new(Arc::clone(&gpu))?,
            gpu,
        })
    }

    fn ln_kernels(&self, cols: i64) -> Result<Arc<LnKernels>, NodeKernelError> {
        let mut cache = self.ln.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = cache.get(&cols) {
            return Ok(Arc::clone(k));
        }
        let module = kernels::load(&self.gpu, &format!("#define COLS {cols}\n{LN_SOURCE}"))?;
        let [forward, backward] = LN_INSTANCES.map(|name| Instances::load(&module, name));
        let (forward, backward) = (forward?, backward?);
        let k = Arc::new(LnKernels {
            _module: module,
            forward: Resident::new(forward, LN_FORWARD_WARPS * 32, self.sms)?,
            backward: Resident::at_launch_bounds(backward, self.sms)?,
        });
        cache.insert(cols, Arc::clone(&k));
        Ok(k)
    }

    /// Runs `f` (a product of [`LtProducts`]) on the compute stream, counted in `counter`;
    /// declined where libcublasLt is missing.
    fn with_products(
        &self,
        counter: &AtomicU64,
        f: impl FnOnce(&LtProducts) -> Result<bool, ProductError>,
    ) -> Result<Outcome, NodeKernelError> {
        let Some(e) = &self.products else { return Ok(Outcome::Declined) };
        Ok(Outcome::product(f(e)?, counter))
    }

    /// `y = layer_norm(x) · gamma + beta` over rows of `cols`, with each row's mean and reciprocal
    /// standard deviation (fp32).
    #[allow(clippy::too_many_arguments)]
    fn ln_forward(
        &self,
        x: &Tensor,
        gamma: &Tensor,
        beta: &Tensor,
        eps: f64,
        y: &Tensor,
        mean: &Tensor,
        rstd: &Tensor,
    ) -> Result<Outcome, NodeKernelError> {
        let Some((p, rows, cols)) = ln_rows(x) else { return Ok(Outcome::Declined) };
        if ![x, y].iter().all(|t| holds(t, x.kind(), rows * cols) && aligned(t))
            || ![gamma, beta].iter().all(|t| holds(t, x.kind(), cols))
            || ![mean, rstd].iter().all(|t| holds(t, Kind::Float, rows))
        {
            return Ok(Outcome::Declined);
        }
        let k = self.ln_kernels(cols)?;
        let (forward, most) = k.forward.get(p);
        let grid = grid_for(most, rows, LN_FORWARD_WARPS);
        let cfg =
            LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (LN_FORWARD_WARPS * 32, 1, 1), shared_mem_bytes: 0 };
        let (xp, gp, bp, yp, mp, rp) = (ptr(x), ptr(gamma), ptr(beta), ptr(y), ptr(mean), ptr(rstd));
        let eps = eps as f32;
        let mut launch = self.gpu.compute.launch_builder(forward);
        launch.arg(&xp).arg(&gp).arg(&bp).arg(&eps).arg(&yp).arg(&mp).arg(&rp).arg(&rows);
        // SAFETY: contiguous device tensors of the kernel's types and sizes, 16-byte aligned where
        // loaded by vector (checked above), alive until the kernel has run (stream order).
        unsafe { launch.launch(cfg) }?;
        Ok(Outcome::Done)
    }

    /// `dx`, `dgamma`, `dbeta` of `y = layer_norm(x) · gamma + beta` over rows of `cols`, from
    /// `dy`, `x` and the forward pass's per-row mean and reciprocal deviation (fp32); `dres`, where
    /// given, is added to `dx`; `xn` gets `y` again, as the forward kernel computed it from the
    /// same mean and deviation.
    #[allow(clippy::too_many_arguments)]
    fn ln_backward(
        &self,
        dy: &Tensor,
        x: &Tensor,
        mean: &Tensor,
        rstd: &Tensor,
        gamma: &Tensor,
        beta: &Tensor,
        dres: Option<&Tensor>,
        dx: &Tensor,
        xn: &Tensor,
        dgamma: &Tensor,
        dbeta: &Tensor,
    ) -> Result<Outcome, NodeKernelError> {
        let Some((p, rows, cols)) = ln_rows(x) else { return Ok(Outcome::Declined) };
        if ![dy, x, dx, xn].iter().chain(dres.as_ref()).all(|t| holds(t, x.kind(), rows * cols) && aligned(t))
            || ![gamma, beta, dgamma, dbeta].iter().all(|t| holds(t, x.kind(), cols))
            || ![mean, rstd].iter().all(|t| holds(t, Kind::Float, rows))
        {
            return Ok(Outcome::Declined);
        }
        let k = self.ln_kernels(cols)?;
        let (backward, most) = k.backward.get(p);
        let grid = balanced_grid(most, (rows + LN_BACKWARD_ROWS - 1) / LN_BACKWARD_ROWS);
        let part = Tensor::f_empty([i64::from(grid), 2 * cols], (Kind::Float, x.device()))?;
        let cfg =
            LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (k.backward.threads(p), 1, 1), shared_mem_bytes: 0 };
        let (dyp, xp, mp, rp, gp, bp) = (ptr(dy), ptr(x), ptr(mean), ptr(rstd), ptr(gamma), ptr(beta));
        let (dresp, dxp, xnp, pp) = (dres.map_or(0, ptr), ptr(dx), ptr(xn), ptr(&part));
        let mut launch = self.gpu.compute.launch_builder(backward);
        launch
            .arg(&dyp)
            .arg(&xp)
            .arg(&mp)
            .arg(&rp)
            .arg(&gp)
            .arg(&bp)
            .arg(&dresp)
            .arg(&dxp)
            .arg(&xnp)
            .arg(&pp)
            .arg(&rows);
        // SAFETY: contiguous device tensors of the kernel's types and sizes, 16-byte aligned where
        // loaded by vector (checked above), alive until the kernel has run: libtorch frees them in
        // stream order, on this stream.
        unsafe { launch.launch(cfg) }?;
        self.reduce(p, &part, i64::from(grid), 2 * cols, cols, dgamma, dbeta)?;
        Ok(Outcome::Done)
    }

    /// `a = gelu_tanh(h)`, elementwise.
    fn gelu_forward(&self, h: &Tensor, a: &Tensor) -> Result<Outcome, NodeKernelError> {
        let Some(p) = Precision::of(h.kind()) else { return Ok(Outcome::Declined) };
        let n = h.numel() as i64;
        if n == 0 || n % p.vector() != 0 || ![h, a].iter().all(|t| holds(t, h.kind(), n) && aligned(t)) {
            return Ok(Outcome::Declined);
        }
        let nv = n / p.vector();
        let blocks = u32::try_from((nv + 255) / 256).unwrap_or(u32::MAX).min(self.sms * 16);
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let (hp, ap) = (ptr(h), ptr(a));
        let mut launch = self.gpu.compute.launch_builder(self.gelu_forward.get(p));
        launch.arg(&hp).arg(&ap).arg(&nv);
        // SAFETY: as in `ln_forward`.
        unsafe { launch.launch(cfg) }?;
        Ok(Outcome::Done)
    }

    /// `out = x · u` elementwise in `x`'s precision, `u` a one-element fp32 tensor read on the
    /// device (the upstream gradient the LM head's node multiplies its gradients by): the fp32
    /// product, rounded once.
    fn scale(&self, x: &Tensor, u: &Tensor, out: &Tensor) -> Result<Outcome, NodeKernelError> {
        let Some(p) = Precision::of(x.kind()) else { return Ok(Outcome::Declined) };
        let n = x.numel() as i64;
        if n == 0
            || n % p.vector() != 0
            || ![x, out].iter().all(|t| holds(t, x.kind(), n) && aligned(t))
            || !holds(u, Kind::Float, 1)
            || u.device() != x.device()
        {
            return Ok(Outcome::Declined);
        }
        let nv = n / p.vector();
        let blocks = u32::try_from((nv + 255) / 256).unwrap_or(u32::MAX).min(self.sms * 16);
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let (xp, up, op) = (ptr(x), ptr(u), ptr(out));
        let mut launch = self.gpu.compute.launch_builder(self.scale.get(p));
        launch.arg(&xp).arg(&up).arg(&op).arg(&nv);
        // SAFETY: as in `ln_forward`; `u` holds one float on the same device.
        unsafe { launch.launch(cfg) }?;
        Ok(Outcome::Done)
    }

    /// `out` = the column sums of `x` (rows of `out.numel()`), after what `with` writes to `x`.
    fn col_sum(&self, x: &Tensor, with: SumOf<'_>, out: &Tensor) -> Result<Outcome, NodeKernelError> {
        let Some(p) = Precision::of(x.kind()) else { return Ok(Outcome::Declined) };
        let cols = out.numel() as i64;
        let rows = if cols > 0 { x.numel() as i64 / cols } else { 0 };
        let n = x.numel() as i64;
        let ok = |t: &Tensor, n: i64| holds(t, x.kind(), n) && aligned(t);
        let taken = match with {
            SumOf::X => true,
            SumOf::GeluGrad { h, act } => ok(h, n) && ok(act, n),
            // Each part's rows of whole vectors.
            SumOf::Join(parts) => cols % (3 * p.vector()) == 0 && parts.iter().all(|t| ok(t, n / 3)),
        };
        if rows == 0 || n != rows * cols || cols % p.vector() != 0 || !ok(x, n) || !taken || !holds(out, x.kind(), cols)
        {
            return Ok(Outcome::Declined);
        }
        let nv = cols / p.vector();
        let blocks_x = u32::try_from((nv + 31) / 32).unwrap_or(u32::MAX);
        // A strip's last block adds its partial sums; past the strips' counters, libtorch sums.
        if blocks_x > COL_SUM_STRIPS {
            return Ok(Outcome::Declined);
        }
        let ((func, resident), hp, actp, sp, nvs) = match with {
            SumOf::X => (self.col_sum.get(p), 0, 0, [0; 3], 0),
            SumOf::GeluGrad { h, act } => (self.gelu_col_sum.get(p), ptr(h), ptr(act), [0; 3], 0),
            SumOf::Join(parts) => (self.join_col_sum.get(p), 0, 0, parts.map(ptr), nv / 3),
        };
        let blocks_y = col_sum_block_rows(resident, blocks_x, rows);
        let part = Tensor::f_empty([i64::from(blocks_y), cols], (Kind::Float, x.device()))?;
        let cfg = LaunchConfig {
            grid_dim: (blocks_x, blocks_y, 1),
            block_dim: (32, COL_SUM_THREADS / 32, 1),
            shared_mem_bytes: 0,
        };
        let (xp, pp, done, outp) = (ptr(x), ptr(&part), self.strips_done.ptr, ptr(out));
        let mut launch = self.gpu.compute.launch_builder(func);
        launch.arg(&xp).arg(&hp).arg(&actp).arg(&sp[0]).arg(&sp[1]).arg(&sp[2]).arg(&nvs);
        launch.arg(&pp).arg(&rows).arg(&nv).arg(&done).arg(&outp);
        // SAFETY: as in `ln_backward`; `h` and `act` are touched only by the GELU's kernel and the
        // parts only by the join's (each `rows · nvs` vectors); `done` holds a counter for each of
        // the `blocks_x` strips, every one zero between launches on this (the only) stream that
        // runs them; `out` holds `cols` values of the kernel's precision.
        unsafe { launch.launch(cfg) }?;
        Ok(Outcome::Done)
    }

    /// Adds the `nparts` rows of `part` (`cols` fp32 each): columns below `split` into `out0`, the
    /// rest into `out1`.
    #[allow(clippy::too_many_arguments)]
    fn reduce(
        &self,
        p: Precision,
        part: &Tensor,
        nparts: i64,
        cols: i64,
        split: i64,
        out0: &Tensor,
        out1: &Tensor,
    ) -> Result<(), NodeKernelError> {
        let blocks = u32::try_from((cols + 31) / 32).unwrap_or(u32::MAX);
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (32, COL_SUM_ROWS, 1), shared_mem_bytes: 0 };
        let (pp, o0, o1) = (ptr(part), ptr(out0), ptr(out1));
        let mut launch = self.gpu.compute.launch_builder(self.reduce.get(p));
        launch.arg(&pp).arg(&nparts).arg(&cols).arg(&split).arg(&o0).arg(&o1);
        // SAFETY: `part` holds `nparts · cols` floats; `out0` `split` and `out1` `cols - split`
        // values of the kernel's precision (the callers' checks).
        unsafe { launch.launch(cfg) }?;
        Ok(())
    }
}

/// What a column sum writes to the matrix it sums, before summing it.
#[derive(Clone, Copy)]
enum SumOf<'a> {
    /// Nothing: the matrix's own columns.
    X,
    /// The GELU's gradient: the matrix (the GELU's output gradient) becomes `gelu_tanh'(h)` times
    /// itself, and `act` gets the GELU's output `gelu_tanh(h)`.
    GeluGrad { h: &'a Tensor, act: &'a Tensor },
    /// A join: the matrix gets the three matrices side by side (the gradients of q, k and v into
    /// that of their product), each a third of its columns.
    Join([&'a Tensor; 3]),
}

/// The precision and the rows and row length of `x` (over its last dimension) when the layer
/// norm's kernels take them: a precision they have, rows of whole 16-byte vectors, at most
/// [`MAX_COLS`] long, at least one row.
fn ln_rows(x: &Tensor) -> Option<(Precision, i64, i64)> {
    let p = Precision::of(x.kind())?;
    let cols = *x.size().last()?;
    let rows = if cols > 0 { x.numel() as i64 / cols } else { 0 };
    (rows > 0 && cols % p.vector() == 0 && cols <= MAX_COLS).then_some((p, rows, cols))
}

/// A grid of at most `most` blocks of `warps` warps, a warp per row: no more blocks than `rows`
/// fill (a block without rows would only stage gamma).
fn grid_for(most: u32, rows: i64, warps: u32) -> u32 {
    let warps = i64::from(warps.max(1));
    u32::try_from((rows + warps - 1) / warps).map_or(most, |needed| needed.clamp(1, most.max(1)))
}

/// A grid of at most `most` blocks for `groups` groups of rows, a block taking every `grid`-th
/// group: as few blocks as take no more groups each than `most` blocks would (so fewer rows of
/// partial sums, no longer a kernel), at least one (`most` 0 counts as one).
fn balanced_grid(most: u32, groups: i64) -> u32 {
    let most = i64::from(most.max(1));
    let per_block = ((groups + most - 1) / most).max(1);
    u32::try_from((groups + per_block - 1) / per_block).map_or(1, |g| g.max(1))
}

/// The block rows of a column sum's grid of `blocks_x` column strips: as many as leave every block
/// resident at once (`resident` blocks: one wave), at most one per 64 rows, at least one.
fn col_sum_block_rows(resident: u32, blocks_x: u32, rows: i64) -> u32 {
    let by_rows = u32::try_from((rows + 63) / 64).unwrap_or(u32::MAX);
    (resident / blocks_x.max(1)).min(by_rows).max(1)
}

/// Whether `t` is a contiguous tensor of `n` elements of `kind`.
fn holds(t: &Tensor, kind: Kind, n: i64) -> bool {
    t.kind() == kind && t.is_contiguous() && t.numel() as i64 == n
}

fn ptr(t: &Tensor) -> u64 {
    t.data_ptr() as u64
}

/// 16-byte loads need 16-byte aligned rows (the row lengths are whole vectors).
fn aligned(t: &Tensor) -> bool {
    t.data_ptr() as usize % 16 == 0
}

/// The column strips (of 32 vectors) a column sum may have for its last blocks to add its partial
/// sums: rows of up to 262,144 16-bit values (GPT-2's widest bias has 4·1600). A wider sum is
/// declined: libtorch's operations sum it.
const COL_SUM_STRIPS: u32 = 1024;

/// The column sums' counters: a device array of [`COL_SUM_STRIPS`] `u32`, zero between launches
/// (each strip's last block sets its counter back), held by libtorch's caching allocator.
struct StripCounters {
    ptr: u64,
    // Tensor is Send but not Sync; the kernels are shared between the main thread and the
    // autograd engine's, and only the pointer is read.
    _tensor: Mutex<Tensor>,
}

impl StripCounters {
    fn new(gpu: &Gpu) -> Result<Self, NodeKernelError> {
        let t = Tensor::f_zeros([i64::from(COL_SUM_STRIPS)], (Kind::Int, tch::Device::Cuda(gpu.ordinal)))?;
        // The zeros are written on libtorch's current stream; the kernels run on the compute
        // stream, so the fill has finished before either does.
        tch::Cuda::synchronize(gpu.ordinal as i64);
        Ok(Self { ptr: ptr(&t), _tensor: Mutex::new(t) })
    }
}

static KERNELS: OnceLock<NodeKernels> = OnceLock::new();

/// Calls that ran a kernel, and calls declined (libtorch's operations ran), since start.
static RAN: AtomicU64 = AtomicU64::new(0);
static DECLINED: AtomicU64 = AtomicU64::new(0);

/// Of them, the products with cuBLASLt's epilogues.
static EPILOGUE_PRODUCTS: AtomicU64 = AtomicU64::new(0);

/// Of them, the products without an epilogue of their own (a bias at most) through the timed
/// plans (cuBLASLt's algorithms, or libtorch's call where a plan timed it fastest).
static PLAIN_PRODUCTS: AtomicU64 = AtomicU64::new(0);

/// How many of the nodes' calls ran a product with cuBLASLt's epilogues since start (the GPU
/// self-check holds that GPT-2's nodes use them).
pub fn epilogue_products() -> u64 {
    EPILOGUE_PRODUCTS.load(Ordering::Relaxed)
}

/// How many of the nodes' other products (the forward's with a bias at most, the backward's) ran
/// through the timed plans since start.
pub fn plain_products() -> u64 {
    PLAIN_PRODUCTS.load(Ordering::Relaxed)
}

/// `out = a·b` through the timed plans (the LM head's products), counted with the plain products,
/// where the kernels are installed and take the tensors; `false` (nothing written) otherwise. The
/// plans run on the compute stream, so only where libtorch computes there on the calling thread
/// ([`Gpu::computes_here`]), as the shim's nodes check for theirs.
pub(crate) fn matmul_into(a: &Tensor, b: &Tensor, out: &Tensor) -> Result<bool, NodeKernelError> {
    let Some(k) = KERNELS.get() else { return Ok(false) };
    if out.device() != tch::Device::Cuda(k.gpu.ordinal) || !k.gpu.computes_here()? {
        return Ok(false);
    }
    Ok(matches!(k.with_products(&PLAIN_PRODUCTS, |e| e.matmul(a, b, None, out))?, Outcome::Done))
}

/// Whether the products with epilogues are available (libcublasLt loaded).
pub fn epilogues_installed() -> bool {
    KERNELS.get().is_some_and(|k| k.products.is_some())
}

/// How many of the nodes' calls ran these kernels, and how many were declined, since start (the
/// GPU self-check holds that GPT-2's nodes use the kernels).
pub fn calls() -> (u64, u64) {
    (RAN.load(Ordering::Relaxed), DECLINED.load(Ordering::Relaxed))
}

/// The layer norm of `x` (rows of its last dimension) by the forward kernel, and its output again
/// as the backward kernel recomputes it from the forward's mean and deviation (its gradients, for
/// a zero upstream gradient, are discarded): the self-check holds the two bit-identical. `None`
/// where the kernels are not installed or decline the tensors.
pub fn ln_forward_and_recomputed(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    eps: f64,
) -> Result<Option<(Tensor, Tensor)>, NodeKernelError> {
    let Some(k) = KERNELS.get() else { return Ok(None) };
    // The kernels run on the compute stream: only where libtorch, which fills `dy`, computes there.
    let Some((_, rows, _)) = ln_rows(x).filter(|_| k.gpu.computes_here().unwrap_or(false)) else { return Ok(None) };
    let stats = || Tensor::f_empty([rows], (Kind::Float, x.device()));
    let (y, xn, dx, mean, rstd) = (x.f_empty_like()?, x.f_empty_like()?, x.f_empty_like()?, stats()?, stats()?);
    let (dgamma, dbeta, dy) = (gamma.f_empty_like()?, beta.f_empty_like()?, x.f_zeros_like()?);
    let done = matches!(k.ln_forward(x, gamma, beta, eps, &y, &mean, &rstd)?, Outcome::Done)
        && matches!(k.ln_backward(&dy, x, &mean, &rstd, gamma, beta, None, &dx, &xn, &dgamma, &dbeta)?, Outcome::Done);
    Ok(done.then_some((y, xn)))
}

/// What a compiled kernel takes per thread.
pub struct KernelResources {
    /// As loaded: `ln_forward_bf16`, ...
    pub name: String,
    pub registers: i32,
    /// Local memory: registers spilled, bytes.
    pub local_bytes: i32,
}

/// The layer norm's kernels for rows of `cols`, forward then backward, in each precision; `None`
/// where the kernels are not installed.
pub fn ln_resources(cols: i64) -> Result<Option<Vec<KernelResources>>, NodeKernelError> {
    let Some(k) = KERNELS.get() else { return Ok(None) };
    let ln = k.ln_kernels(cols)?;
    let mut out = Vec::new();
    for (name, instances) in LN_INSTANCES.iter().zip([&ln.forward.kernels, &ln.backward.kernels]) {
        for (f, suffix) in instances.all().iter().zip(kernels::Precision::SUFFIX) {
            out.push(KernelResources {
                name: format!("{name}_{suffix}"),
                registers: f.num_regs()?,
                local_bytes: f.local_size_bytes()?,
            });
        }
    }
    Ok(Some(out))
}

/// Whether the kernels are compiled and registered with the shim's nodes.
pub fn installed() -> bool {
    KERNELS.get().is_some()
}

/// Compiles the kernels for this rank's GPU and hands them to the shim's nodes; without them (or if
/// NVRTC fails) the nodes use libtorch's operations, with the same results up to the order of the
/// fp32 sums.
pub fn install(gpu: &Arc<Gpu>) {
    if installed() {
        return;
    }
    match NodeKernels::new(Arc::clone(gpu)) {
        Ok(k) => {
            if KERNELS.set(k).is_ok() {
                shim::set_node_kernels(NodeKernelFns {
                    ln_forward: Some(ln_forward_cb),
                    ln_backward: Some(ln_backward_cb),
                    col_sum: Some(col_sum_cb),
                    gelu_forward: Some(gelu_forward_cb),
                    gelu_backward_col_sum: Some(gelu_backward_col_sum_cb),
                    join_col_sum: Some(join_col_sum_cb),
                    gelu_up: Some(gelu_up_cb),
                    residual: Some(residual_cb),
                    matmul: Some(matmul_cb),
                    scale: Some(scale_cb),
                });
            }
        }
        Err(e) => tracing::warn!("{e}; GPT-2's layer norms, GELU and bias gradients use libtorch's operations"),
    }
}

/// Runs `f` on the installed kernels for the shim: 0 when the kernel ran, 1 when it declined,
/// -1 with the message in `err` (NUL-terminated, at most `cap` bytes) when it failed.
fn answer(
    stream: *mut c_void,
    err: *mut c_char,
    cap: usize,
    f: impl FnOnce(&NodeKernels) -> Result<Outcome, NodeKernelError>,
) -> c_int {
    let declined = || {
        DECLINED.fetch_add(1, Ordering::Relaxed);
        1
    };
    let Some(k) = KERNELS.get().filter(|k| k.gpu.is_compute_stream(stream)) else { return declined() };
    let message = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(k))) {
        Ok(Ok(Outcome::Done)) => {
            RAN.fetch_add(1, Ordering::Relaxed);
            return 0;
        }
        Ok(Ok(Outcome::Declined)) => return declined(),
        Ok(Err(e)) => e.to_string(),
        Err(_) => "a layer-norm or gradient kernel panicked".to_string(),
    };
    if cap > 0 && !err.is_null() {
        let n = message.len().min(cap - 1);
        // SAFETY: the shim passes a buffer of `cap` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(message.as_ptr(), err.cast::<u8>(), n);
            *err.add(n) = 0;
        }
    }
    -1
}

/// A tensor the shim lends for the call (tch's own handle on the same tensor).
///
/// # Safety
/// `t` must point at a live `at::Tensor`.
unsafe fn lent(t: CTensor) -> Tensor {
    // SAFETY: as the caller promises; the clone is a new handle, dropped here.
    unsafe { Tensor::clone_from_ptr(t.cast()) }
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn ln_forward_cb(
    x: CTensor,
    gamma: CTensor,
    beta: CTensor,
    eps: f64,
    y: CTensor,
    mean: CTensor,
    rstd: CTensor,
    stream: *mut c_void,
    err: *mut c_char,
    cap: usize,
) -> c_int {
    answer(stream, err, cap, |k| {
        // SAFETY: the shim passes live tensors.
        let t = |p| unsafe { lent(p) };
        k.ln_forward(&t(x), &t(gamma), &t(beta), eps, &t(y), &t(mean), &t(rstd))
    })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn ln_backward_cb(
    dy: CTensor,
    x: CTensor,
    mean: CTensor,
    rstd: CTensor,
    gamma: CTensor,
    beta: CTensor,
    dres: CTensor,
    dx: CTensor,
    xn: CTensor,
    dgamma: CTensor,
    dbeta: CTensor,
    stream: *mut c_void,
    err: *mut c_char,
    cap: usize,
) -> c_int {
    answer(stream, err, cap, |k| {
        // SAFETY: the shim passes live tensors.
        let t = |p| unsafe { lent(p) };
        // The residual's gradient is optional: a null pointer when there is none.
        let dres = (!dres.is_null()).then(|| t(dres));
        k.ln_backward(
            &t(dy),
            &t(x),
            &t(mean),
            &t(rstd),
            &t(gamma),
            &t(beta),
            dres.as_ref(),
            &t(dx),
            &t(xn),
            &t(dgamma),
            &t(dbeta),
        )
    })
}

/// A callback of the shim's form for tensors that are never null: `(t0, .., stream, err, cap)`,
/// answering with `$body`, in which each named tensor is the shim's, lent (`NodeKernelFns` names
/// them).
macro_rules! tensors_cb {
    ($name:ident($($t:ident),+) => |$k:ident| $body:expr) => {
        #[allow(clippy::too_many_arguments)]
        unsafe extern "C" fn $name($($t: CTensor,)+ stream: *mut c_void, err: *mut c_char, cap: usize) -> c_int {
            answer(stream, err, cap, |$k| {
                // SAFETY: the shim passes live tensors.
                $(let $t = unsafe { lent($t) };)+
                $body
            })
        }
    };
}

tensors_cb!(col_sum_cb(x, out) => |k| k.col_sum(&x, SumOf::X, &out));
tensors_cb!(scale_cb(x, u, out) => |k| k.scale(&x, &u, &out));
tensors_cb!(gelu_forward_cb(h, a) => |k| k.gelu_forward(&h, &a));
tensors_cb!(gelu_backward_col_sum_cb(g, h, act, out) => |k| k.col_sum(&g, SumOf::GeluGrad { h: &h, act: &act }, &out));
tensors_cb!(join_col_sum_cb(s0, s1, s2, x, out) => |k| k.col_sum(&x, SumOf::Join([&s0, &s1, &s2]), &out));
tensors_cb!(gelu_up_cb(x, w1, b1, h, a) => |k| {
    k.with_products(&EPILOGUE_PRODUCTS, |e| e.gelu_up(&x, &w1, &b1, &h, &a))
});
tensors_cb!(residual_cb(res, x, w, b, out) => |k| {
    k.with_products(&EPILOGUE_PRODUCTS, |e| e.residual(&res, &x, &w, &b, &out))
});

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn matmul_cb(
    a: CTensor,
    b: CTensor,
    bias: CTensor,
    out: CTensor,
    stream: *mut c_void,
    err: *mut c_char,
    cap: usize,
) -> c_int {
    answer(stream, err, cap, |k| {
        // SAFETY: the shim passes live tensors.
        let t = |p| unsafe { lent(p) };
        // The bias is optional: a null pointer when there is none.
        let bias = (!bias.is_null()).then(|| t(bias));
        k.with_products(&PLAIN_PRODUCTS, |e| e.matmul(&t(a), &t(b), bias.as_ref(), &t(out)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// gpt2-xl's MLP gradient (6400 columns: 25 strips of 32 vectors) on an H200 (132
    /// multiprocessors, five blocks of the GELU's variant each): 26 block rows, 650 blocks, all
    /// resident; fewer rows or more resident blocks are bounded by the rows.
    #[test]
    fn a_column_sum_grid_is_one_wave_of_at_least_64_rows_a_block_row() {
        assert_eq!(col_sum_block_rows(5 * 132, 25, 4096), 26);
        assert_eq!(col_sum_block_rows(6 * 132, 7, 4096), 64);
        assert_eq!(col_sum_block_rows(6 * 132, 7, 1000), 16);
        assert_eq!(col_sum_block_rows(6 * 132, 7, 1), 1);
        // More strips than resident blocks: one block row, the grid past one wave.
        assert_eq!(col_sum_block_rows(660, 1024, 4096), 1);
    }

    /// gpt2-xl's layer norm gradient (4096 rows, 1024 groups of four) with three blocks resident on
    /// each of 132 multiprocessors: 396 blocks would take two or three groups each, 342 take three
    /// (the last two); fewer groups than blocks take a block each; never no block.
    #[test]
    fn a_balanced_grid_takes_as_many_groups_a_block_in_fewer_blocks() {
        assert_eq!(balanced_grid(396, 1024), 342);
        assert_eq!(balanced_grid(396, 396), 396);
        assert_eq!(balanced_grid(396, 397), 199);
        assert_eq!(balanced_grid(396, 10), 10);
        assert_eq!(balanced_grid(396, 0), 1);
        assert_eq!(balanced_grid(0, 5), 1);
    }
}
