//! GPT-2's 16-bit matrix products on CUDA through cuBLASLt, each shape's algorithm timed at its
//! first product, and the pointwise work after two of them computed in cuBLASLt's epilogues.
//!
//! * [`LtProducts::matmul`]: the shim's nodes' other products, `a·b` with a bias or without: the
//!   backward's input and weight gradients of every linear layer, and the qkv projection's forward.
//! * [`LtProducts::gelu_up`] (`GELU_AUX_BIAS`), the MLP's first layer: one product writes the
//!   GELU's output `a = gelu_tanh(x·w1ᵀ + b1)` and its input `h = x·w1ᵀ + b1`, which the node keeps
//!   for the backward pass. Without it the product writes `h` and a kernel of its own reads it back
//!   to write `a`: in gpt2-xl's profiled step (micro-batch 4, one H100) that kernel took 2.0 ms,
//!   and the product with the epilogue takes 1.2 ms longer than the one without.
//! * [`LtProducts::residual`] (`BIAS` with `C` the residual stream and β = 1), the last product of
//!   each sub-block: `res + x·wᵀ + b` in one product, where otherwise a kernel reads the product
//!   and the residual again to write their sum (the residual additions took 2.2 ms of gpt2-xl's
//!   step, half of them in the forward pass).
//!
//! libtorch runs cuBLASLt's bias and GELU epilogue (`_addmm_activation`) but neither the form that
//! also writes the GELU's input nor a product whose `C` is another matrix than its output, and it
//! runs the first algorithm a heuristic names, so this module calls cuBLASLt itself (through
//! cudarc, loaded at run time).
//!
//! **Algorithms timed.** A plan (one per epilogue, element type, shape, transposition and
//! alignment) asks cuBLASLt's heuristic for up to 8 algorithms (`CANDIDATES`); for a product
//! without an epilogue of its own libtorch's call is a candidate too, since for some shapes it
//! picks a kernel none of those beats. The plan's first product outside a CUDA graph's capture
//! runs each candidate on the product's own operands, timed between CUDA events, and the plan
//! keeps the fastest where it beats the heuristic's first by 2% (`MARGIN`); the chosen candidate
//! then writes the result. On one H100 the fastest offered algorithm took
//! 0.82-0.97× as long as what the worker ran before (the heuristic's first, or libtorch's call) on
//! 10 of the 15 products of a gpt2-xl step (`examples/gemm_algos`), and with the products timed
//! gpt2-xl's step takes 0.982× as long (docs/results/one-gpu.md).
//! Timing runs each candidate ten times (up to 9 candidates, so up to 90 products) once per shape
//! and run, in the first (warm-up) step: at about 100 µs a product, about 0.1 s for gpt2-xl's 12
//! block shapes (estimated from the products' times, not measured). The choice is made per
//! run: two runs may choose differently where candidates are within a few percent of each other,
//! and then differ in the last bits of their products, as the runs of one build already differ in
//! the order of cuDNN's and libtorch's atomic sums.
//!
//! The backward pass keeps the worker's kernel for the GELU's gradient with the bias gradient
//! (`recompute_cuda`): cuBLASLt's `DGELU_BGRAD` epilogue, tried on the same shapes, ran as a
//! product and then a separate epilogue kernel that took 13.4 ms over gpt2-xl's 48 layers,
//! against 4.3 ms for the worker's kernel (docs/results/one-gpu.md).
//!
//! Numerics: an epilogue works on the fp32 sum and rounds once, where the nodes' other path rounds
//! the product first (then applies the GELU, or adds the residual, and rounds again). The backward
//! pass recomputes the GELU's output (for the second layer's weight gradient) from the rounded
//! `h`, so it may differ from the forward pass's `a` in the last bit. cuBLASLt computes the GELU
//! in its tanh form with its own arithmetic: against libtorch's tanh GELU composed on the same GPU,
//! the MLP node's bf16 output differs by 3-4e-3 (normwise; about half a bf16 rounding step) where
//! the worker's GELU kernel gave 1e-4. The GPU self-check holds the nodes to the composed
//! operations within 2e-2.
//!
//! cuBLASLt is column-major: a row-major `[r × c]` matrix is its `[c × r]` transpose, so the
//! row-major `out = a·b` is the column-major `outᵀ = bᵀ·aᵀ`: cuBLASLt's A is `b` and its B is
//! `a`, each transposed where it is a `.t()` view (a weight `w` in `x·wᵀ`). The epilogue's bias
//! runs along the result's rows in cuBLASLt's terms: the output's features.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

use cudarc::cublaslt::{result, sys};
use tch::{Device, Kind, Tensor};

/// The workspace cuBLASLt may use: 32 MiB, NVIDIA's recommendation for Hopper.
const WORKSPACE_BYTES: usize = 32 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ProductError {
    #[error("cuBLASLt: {0}")]
    Lt(#[from] result::CublasError),
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
    #[error("CUDA, timing cuBLASLt's algorithms: {0}")]
    Cuda(#[from] cudarc::driver::DriverError),
}

/// What an epilogue does after the product `p = a·b`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Fused {
    /// `p` as it is.
    None,
    /// `p + bias`.
    Bias,
    /// `gelu_tanh(p + bias)`, with `p + bias` written to the auxiliary matrix.
    GeluAux,
    /// `p + bias + C`.
    Residual,
}

/// What picks a plan: the epilogue, the element type, the product's shape in cuBLASLt's terms
/// (`op(A)`, `m × k`, by `op(B)`, `k × n`), whether A and B are transposed, and the alignment in
/// bytes of A, B, C and D (cuBLASLt chooses its kernels by them).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct Key {
    fused: Fused,
    bf16: bool,
    m: u64,
    n: u64,
    k: u64,
    ta: bool,
    tb: bool,
    align: [u32; 4],
}

/// How many algorithms of cuBLASLt's heuristic a plan times at its first product: asked for up to
/// 32, the heuristic offered 5-8 for each of gpt2-xl's and gpt2's products on an H100
/// (`examples/gemm_algos`), so 8 leaves none of them out there.
const CANDIDATES: usize = 8;

/// Each candidate's time is the least of this many rounds of [`TIMED_CALLS`] products.
const TIMING_ROUNDS: usize = 3;
const TIMED_CALLS: usize = 3;

/// A candidate replaces the heuristic's first choice only when it is faster by this share, so that
/// near-ties stay with the heuristic's choice instead of following the timings' noise. The share
/// is a judgement, not a measured optimum.
const MARGIN: f32 = 0.02;

/// What computes a plan's products.
#[derive(Clone, Copy, Debug)]
enum Runner {
    /// The plan's candidate algorithm of this index.
    Lt(usize),
    /// libtorch's own call (`mm`, or `addmm` with the bias), a candidate of the plain products
    /// only: for some shapes it picks a kernel none of the heuristic's algorithms beats.
    Libtorch,
}

/// What a plan runs.
#[derive(Clone, Copy)]
enum Choice {
    /// The heuristic's first, until the plan's first product outside a CUDA graph's capture
    /// times the candidates (a capture cannot wait for the device).
    Untimed,
    /// The fastest candidate, timed on the plan's first product.
    Timed(Runner),
}

/// The descriptors and the algorithms of one [`Key`]; the bias and auxiliary pointers are set
/// on the descriptor before each product. A descriptor not made yet is null, so that a plan
/// whose making failed halfway destroys what it made.
struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    d: sys::cublasLtMatrixLayout_t,
    /// The heuristic's algorithms, its first choice first; never empty once made.
    candidates: Vec<sys::cublasLtMatmulAlgo_t>,
    choice: Choice,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: each non-null descriptor was created by `Plan::new` and is destroyed once, here.
        unsafe {
            for layout in [self.a, self.b, self.d] {
                if !layout.is_null() {
                    let _ = result::destroy_matrix_layout(layout);
                }
            }
            if !self.desc.is_null() {
                let _ = result::destroy_matmul_desc(self.desc);
            }
        }
    }
}

/// Sets one attribute of a descriptor from a value.
///
/// # Safety
/// `T` must be the attribute's type.
unsafe fn set_desc<T>(
    desc: sys::cublasLtMatmulDesc_t,
    attr: sys::cublasLtMatmulDescAttributes_t,
    value: &T,
) -> Result<(), result::CublasError> {
    // SAFETY: as the caller promises.
    unsafe { result::set_matmul_desc_attribute(desc, attr, (value as *const T).cast(), size_of::<T>()) }
}

impl Plan {
    /// A plan before its first descriptor: every descriptor null, nothing to destroy.
    fn unmade() -> Self {
        Plan {
            desc: std::ptr::null_mut(),
            a: std::ptr::null_mut(),
            b: std::ptr::null_mut(),
            d: std::ptr::null_mut(),
            candidates: Vec::new(),
            choice: Choice::Untimed,
        }
    }

    /// The descriptors of `key`, and cuBLASLt's algorithms for them; `None` when it has none.
    fn new(handle: sys::cublasLtHandle_t, key: Key) -> Result<Option<Self>, result::CublasError> {
        use sys::cublasLtMatmulDescAttributes_t as D;
        use sys::cublasLtMatmulPreferenceAttributes_t as P;
        let dtype = if key.bf16 { sys::cudaDataType::CUDA_R_16BF } else { sys::cudaDataType::CUDA_R_16F };
        let (m, n, k) = (key.m, key.n, key.k);
        let mut plan = Plan::unmade();
        plan.desc =
            result::create_matmul_desc(sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, sys::cudaDataType::CUDA_R_32F)?;
        let desc = plan.desc;
        // Column-major layouts: a transposed A is stored `[k × m]`, a transposed B `[n × k]`; C (the
        // residual, or D itself) and D are `[m × n]`.
        let (ar, ac) = if key.ta { (k, m) } else { (m, k) };
        let (br, bc) = if key.tb { (n, k) } else { (k, n) };
        plan.a = result::create_matrix_layout(dtype, ar, ac, ar as i64)?;
        plan.b = result::create_matrix_layout(dtype, br, bc, br as i64)?;
        plan.d = result::create_matrix_layout(dtype, m, n, m as i64)?;
        let epilogue = match key.fused {
            Fused::None => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT,
            Fused::Bias | Fused::Residual => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
            Fused::GeluAux => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
        };
        // SAFETY: each attribute gets a value of its documented type (cublasOperation_t and the
        // epilogue are 32-bit enums, the auxiliary matrix's leading dimension an int64).
        unsafe {
            set_desc(desc, D::CUBLASLT_MATMUL_DESC_TRANSA, &i32::from(key.ta))?;
            set_desc(desc, D::CUBLASLT_MATMUL_DESC_TRANSB, &i32::from(key.tb))?;
            set_desc(desc, D::CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue)?;
            if key.fused == Fused::GeluAux {
                set_desc(desc, D::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &(m as i64))?;
            }
        }
        let pref = result::create_matmul_pref()?;
        // SAFETY: an array of plain C structs, for which all zeros is a valid value.
        let mut found = vec![unsafe { std::mem::zeroed::<sys::cublasLtMatmulHeuristicResult_t>() }; CANDIDATES];
        let mut count = 0i32;
        let status = (|| {
            // SAFETY: as above: the workspace size is a uint64, the alignments uint32; `found`
            // holds `CANDIDATES` results.
            unsafe {
                let ws = WORKSPACE_BYTES as u64;
                result::set_matmul_pref_attribute(
                    pref,
                    P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                    (&ws as *const u64).cast(),
                    8,
                )?;
                for (attr, align) in [
                    (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align[0]),
                    (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align[1]),
                    (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align[2]),
                    (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align[3]),
                ] {
                    result::set_matmul_pref_attribute(pref, attr, (&align as *const u32).cast(), 4)?;
                }
                sys::cublasLtMatmulAlgoGetHeuristic(
                    handle,
                    desc,
                    plan.a,
                    plan.b,
                    plan.d,
                    plan.d,
                    pref,
                    CANDIDATES as i32,
                    found.as_mut_ptr(),
                    &mut count,
                )
                .result()
            }
        })();
        // SAFETY: created above, used only by the query.
        unsafe { result::destroy_matmul_pref(pref) }?;
        match status {
            Ok(()) => {}
            Err(result::CublasError(sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED)) => return Ok(None),
            Err(e) => return Err(e),
        }
        found.truncate(usize::try_from(count).unwrap_or(0));
        plan.candidates = found
            .into_iter()
            .filter(|h| h.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
            .map(|h| h.algo)
            .collect();
        Ok((!plan.candidates.is_empty()).then_some(plan))
    }

    /// What computes the plan's products now.
    fn runner(&self) -> Runner {
        match self.choice {
            Choice::Untimed => Runner::Lt(0),
            Choice::Timed(r) => r,
        }
    }
}

/// The handle, its workspace (a libtorch tensor, so that the caching allocator counts it; allocated
/// at the first product, so models without these nodes never hold it) and the plans by shape
/// (`None`: cuBLASLt has no algorithm for it, and the node's other path runs).
struct State {
    handle: sys::cublasLtHandle_t,
    ordinal: usize,
    workspace: Option<Tensor>,
    plans: HashMap<Key, Option<Plan>>,
}

pub struct LtProducts {
    state: Mutex<State>,
}

// SAFETY: the handle and descriptors are used only under the mutex; cuBLASLt allows a handle on
// any thread as long as calls on it do not overlap.
unsafe impl Send for LtProducts {}
// SAFETY: as for `Send`: every use of the raw handles holds the mutex.
unsafe impl Sync for LtProducts {}

impl Drop for State {
    fn drop(&mut self) {
        self.plans.clear();
        // SAFETY: created by `LtProducts::new`, destroyed once, after its plans.
        unsafe {
            let _ = result::destroy_handle(self.handle);
        }
    }
}

/// The largest power of two, up to 256, that divides `t`'s address.
fn alignment(t: &Tensor) -> u32 {
    let p = t.data_ptr() as usize;
    if p == 0 {
        256
    } else {
        (1u32 << p.trailing_zeros().min(8)).min(256)
    }
}

/// Whether `t` is a contiguous matrix of `shape` and `kind`.
fn is(t: &Tensor, kind: Kind, shape: &[i64]) -> bool {
    t.kind() == kind && t.size() == shape && t.is_contiguous()
}

/// How a row-major operand `[r × c]` lies in memory: rows of `c` (contiguous), or the transpose
/// of a contiguous `[c × r]` (a `.t()` view, as libtorch's linear layers pass their weights).
/// `None` for anything else.
fn lies(t: &Tensor, kind: Kind) -> Option<Lies> {
    let ([r, c], strides) = (dims(t), t.stride());
    if t.kind() != kind || t.size().len() != 2 || r == 0 || c == 0 {
        return None;
    }
    match strides[..] {
        [sr, 1] if sr == c || r == 1 => Some(Lies::Rows),
        [1, sc] if sc == r || c == 1 => Some(Lies::Transposed),
        _ => None,
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Lies {
    Rows,
    Transposed,
}

/// Milliseconds per product of `run` on `stream`: the least of [`TIMING_ROUNDS`] rounds of
/// [`TIMED_CALLS`], between two events.
fn time_ms(stream: *mut c_void, mut run: impl FnMut() -> Result<(), ProductError>) -> Result<f32, ProductError> {
    use cudarc::driver::result::event;
    let flags = cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT;
    let (start, end) = (event::create(flags)?, event::create(flags)?);
    let timed = (|| {
        let mut best = f32::INFINITY;
        run()?;
        for _ in 0..TIMING_ROUNDS {
            // SAFETY: the events were made above and `stream` is the caller's live stream.
            unsafe { event::record(start, stream.cast()) }?;
            for _ in 0..TIMED_CALLS {
                run()?;
            }
            // SAFETY: as above.
            let ms = unsafe {
                event::record(end, stream.cast())?;
                event::synchronize(end)?;
                event::elapsed(start, end)?
            };
            best = best.min(ms / TIMED_CALLS as f32);
        }
        Ok::<_, ProductError>(best)
    })();
    // SAFETY: made above; nothing waits on them any more (`synchronize` returned, or an error
    // ended the timing, after which they are only destroyed).
    unsafe {
        let _ = event::destroy(start);
        let _ = event::destroy(end);
    }
    timed
}

/// Whether `stream` is being captured into a CUDA graph (where nothing may wait for the device).
fn capturing(stream: *mut c_void) -> Result<bool, ProductError> {
    use cudarc::driver::sys::CUstreamCaptureStatus as S;
    // SAFETY: `stream` is the caller's live stream.
    let status = unsafe { cudarc::driver::result::stream::is_capturing(stream.cast()) }?;
    Ok(status != S::CU_STREAM_CAPTURE_STATUS_NONE)
}

impl LtProducts {
    /// A cuBLASLt handle for CUDA device `ordinal`; `None` where libcublasLt cannot be loaded.
    pub fn new(ordinal: usize) -> Result<Option<Self>, ProductError> {
        // SAFETY: only looks for the library.
        if !unsafe { sys::is_culib_present() } {
            return Ok(None);
        }
        let handle = result::create_handle()?;
        Ok(Some(Self { state: Mutex::new(State { handle, ordinal, workspace: None, plans: HashMap::new() }) }))
    }

    /// `h = x·w1ᵀ + b1` and `a = gelu_tanh(h)` in one product, on `stream`: `x` is `[T × d]`,
    /// `w1` `[f × d]`, `b1` `[f]`, `h` and `a` `[T × f]`, all contiguous, of one 16-bit kind.
    /// `false` (nothing written) for tensors it does not take.
    pub fn gelu_up(
        &self,
        x: &Tensor,
        w1: &Tensor,
        b1: &Tensor,
        h: &Tensor,
        a: &Tensor,
        stream: *mut c_void,
    ) -> Result<bool, ProductError> {
        // The auxiliary matrix's leading dimension must be a multiple of 8 and its address 16-byte
        // aligned (cuBLASLt's requirements).
        let f = dims(w1)[0];
        if f % 8 != 0 || alignment(h) < 16 || !is(h, x.kind(), &[dims(x)[0], f]) || !w1.is_contiguous() {
            return Ok(false);
        }
        self.product(x, &w1.tr(), Some(b1), Side::Aux(h), a, stream)
    }

    /// `out = res + x·wᵀ + b` in one product, on `stream`: `x` is `[T × k]`, `w` `[n × k]`, `b`
    /// `[n]`, `res` and `out` `[T × n]`, as [`Self::gelu_up`].
    pub fn residual(
        &self,
        res: &Tensor,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        out: &Tensor,
        stream: *mut c_void,
    ) -> Result<bool, ProductError> {
        let n = dims(w)[0];
        if !is(res, x.kind(), &[dims(x)[0], n]) || !w.is_contiguous() {
            return Ok(false);
        }
        self.product(x, &w.tr(), Some(b), Side::Residual(res), out, stream)
    }

    /// `out = a·b`, plus `bias` along its rows where given, on `stream`: `a` is `[r × k]`, `b`
    /// `[k × c]`, each rows of its own or the transpose of a contiguous matrix (a `.t()` view),
    /// `bias` `[c]` and `out` `[r × c]` contiguous, all of one 16-bit kind, `out` apart from the
    /// others. `false` (nothing written) for tensors it does not take.
    pub fn matmul(
        &self,
        a: &Tensor,
        b: &Tensor,
        bias: Option<&Tensor>,
        out: &Tensor,
        stream: *mut c_void,
    ) -> Result<bool, ProductError> {
        self.product(a, b, bias, Side::None, out, stream)
    }

    /// `out = epilogue(a·b + bias)` with the epilogue's other matrix `side` (the epilogues with one
    /// are given a bias). In cuBLASLt's column-major terms the row-major `out = a·b` is
    /// `outᵀ = bᵀ·aᵀ`: cuBLASLt's A is `b`, its B is `a`, and a row-major matrix is the
    /// column-major transpose of itself.
    fn product(
        &self,
        a: &Tensor,
        b: &Tensor,
        bias: Option<&Tensor>,
        side: Side<'_>,
        out: &Tensor,
        stream: *mut c_void,
    ) -> Result<bool, ProductError> {
        let kind = a.kind();
        let bf16 = match kind {
            Kind::BFloat16 => true,
            Kind::Half => false,
            _ => return Ok(false),
        };
        let ([r, k], [k2, c]) = (dims(a), dims(b));
        let (Some(la), Some(lb)) = (lies(a, kind), lies(b, kind)) else { return Ok(false) };
        if k != k2 || !is(out, kind, &[r, c]) {
            return Ok(false);
        }
        // The bias 16-byte aligned (cuBLASLt's requirement).
        if let Some(bias) = bias {
            if !is(bias, kind, &[c]) || alignment(bias) < 16 {
                return Ok(false);
            }
        }
        let (fused, cm, beta, aux) = match side {
            Side::None if bias.is_some() => (Fused::Bias, out, 0f32, None),
            Side::None => (Fused::None, out, 0f32, None),
            Side::Aux(h) => (Fused::GeluAux, out, 0f32, Some(h)),
            Side::Residual(res) => (Fused::Residual, res, 1f32, None),
        };
        if fused != Fused::None && bias.is_none() {
            return Ok(false);
        }
        // The candidates are timed writing `out` (and the auxiliary matrix): none of them may be
        // an input, or a later candidate would read what an earlier one wrote, nor may the two
        // outputs share memory.
        let inputs = [Some(a), Some(b), bias, (beta != 0.0).then_some(cm)];
        let written = |t: &Tensor| overlaps(t, out) || aux.is_some_and(|h| overlaps(t, h));
        if inputs.iter().flatten().any(|t| written(t)) || aux.is_some_and(|h| overlaps(h, out)) {
            return Ok(false);
        }
        let key = Key {
            fused,
            bf16,
            m: c as u64,
            n: r as u64,
            k: k as u64,
            ta: lb == Lies::Transposed,
            tb: la == Lies::Transposed,
            align: [alignment(b), alignment(a), alignment(cm), alignment(out)],
        };
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let handle = state.handle;
        let workspace = match &state.workspace {
            Some(w) => w.data_ptr(),
            None => {
                let w = Tensor::f_empty([WORKSPACE_BYTES as i64], (Kind::Uint8, Device::Cuda(state.ordinal)))?;
                state.workspace.insert(w).data_ptr()
            }
        };
        let plan = match state.plans.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(Plan::new(handle, key)?),
        };
        let Some(plan) = plan.as_mut() else { return Ok(false) };
        let bias_ptr = bias.map_or(std::ptr::null_mut(), |b| b.data_ptr());
        let alpha = 1f32;
        let run = |plan: &Plan, algo: &sys::cublasLtMatmulAlgo_t| {
            // SAFETY: the tensors were checked above to hold the matrices the plan describes and
            // are alive for the call; the product runs on `stream`, in its order, as libtorch's
            // would; the workspace is `WORKSPACE_BYTES` on the same device.
            unsafe {
                use sys::cublasLtMatmulDescAttributes_t as D;
                if fused != Fused::None {
                    set_desc(plan.desc, D::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr)?;
                }
                if let Some(h) = aux {
                    set_desc(plan.desc, D::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &h.data_ptr())?;
                }
                result::matmul(
                    handle,
                    plan.desc,
                    (&alpha as *const f32).cast(),
                    (&beta as *const f32).cast(),
                    b.data_ptr(),
                    plan.a,
                    a.data_ptr(),
                    plan.b,
                    cm.data_ptr(),
                    plan.d,
                    out.data_ptr(),
                    plan.d,
                    algo,
                    workspace,
                    WORKSPACE_BYTES,
                    stream.cast(),
                )
            }
        };
        // libtorch's call for the same product, on its current stream (`stream`, as the shim
        // passes it).
        let libtorch = matches!(fused, Fused::None | Fused::Bias).then_some(|| -> Result<(), ProductError> {
            let _out = match bias {
                Some(c) => c.f_addmm_out(out, a, b)?,
                None => a.f_mm_out(out, b)?,
            };
            Ok(())
        });
        let run_as = |plan: &Plan, runner: Runner| match (runner, &libtorch) {
            (Runner::Libtorch, Some(torch)) => torch(),
            (Runner::Lt(i), _) => Ok(run(plan, &plan.candidates[i])?),
            // Never chosen where libtorch has no such product (the epilogues).
            (Runner::Libtorch, None) => Ok(run(plan, &plan.candidates[0])?),
        };
        let pool = plan.candidates.len() + usize::from(libtorch.is_some());
        if matches!(plan.choice, Choice::Untimed) && pool > 1 && !capturing(stream)? {
            let runners: Vec<Runner> = (0..plan.candidates.len())
                .map(Runner::Lt)
                .chain(libtorch.is_some().then_some(Runner::Libtorch))
                .collect();
            let mut times = Vec::with_capacity(runners.len());
            for &r in &runners {
                // A candidate cuBLASLt or libtorch refuses at run time is left out, not fatal.
                times.push(match time_ms(stream, || run_as(plan, r)) {
                    Ok(ms) => ms,
                    Err(e @ (ProductError::Lt(_) | ProductError::Torch(_))) => {
                        tracing::debug!(?key, ?r, "candidate refused: {e}");
                        f32::INFINITY
                    }
                    Err(e) => return Err(e),
                });
            }
            let fastest = (0..times.len()).min_by(|&i, &j| times[i].total_cmp(&times[j])).unwrap_or(0);
            let chosen = if times[fastest] < times[0] * (1.0 - MARGIN) { runners[fastest] } else { Runner::Lt(0) };
            tracing::debug!(?key, ?times, ?chosen, "matrix-product candidates timed");
            plan.choice = Choice::Timed(chosen);
        }
        // The chosen candidate writes the result last, whatever the timing ran.
        run_as(plan, plan.runner())?;
        Ok(true)
    }
}

/// Whether the memory of `t` and `u` overlaps (each from its first element's address to its last's).
fn overlaps(t: &Tensor, u: &Tensor) -> bool {
    let span = |t: &Tensor| {
        let start = t.data_ptr() as usize;
        let last = t.size().iter().zip(t.stride()).map(|(&n, s)| (n.max(1) - 1) * s).sum::<i64>();
        (start, start + (last as usize + 1) * t.kind().elt_size_in_bytes())
    };
    let ((s1, e1), (s2, e2)) = (span(t), span(u));
    s1 < e2 && s2 < e1
}

/// The epilogue's matrix beside the output: none, the GELU's input it writes, or the residual it
/// adds (cuBLASLt's `C`, with the output's layout).
enum Side<'a> {
    None,
    Aux(&'a Tensor),
    Residual(&'a Tensor),
}

/// A matrix's rows and columns (`[0, 0]` for anything else).
fn dims(t: &Tensor) -> [i64; 2] {
    match t.size()[..] {
        [r, c] => [r, c],
        _ => [0, 0],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plan whose making failed before its first descriptor holds only nulls, and dropping it
    /// calls nothing in cuBLASLt. Where the library is absent (a CPU host), any call would load it
    /// and panic.
    #[test]
    fn a_plan_made_of_nothing_destroys_nothing() {
        drop(Plan::unmade());
    }

    /// The layouts a product takes: rows, and the transpose of a contiguous matrix; not a
    /// strided slice, another element type, a vector or an empty matrix.
    #[test]
    fn operands_lie_as_rows_or_transposed() {
        let o = (Kind::BFloat16, Device::Cpu);
        let m = Tensor::zeros([6, 4], o);
        assert!(lies(&m, Kind::BFloat16) == Some(Lies::Rows));
        assert!(lies(&m.tr(), Kind::BFloat16) == Some(Lies::Transposed));
        assert!(lies(&m.narrow(1, 0, 2), Kind::BFloat16).is_none(), "rows of 2 in rows of 4");
        assert!(lies(&m.slice(0, 0, 6, 2), Kind::BFloat16).is_none(), "every other row");
        assert!(lies(&m, Kind::Half).is_none());
        assert!(lies(&Tensor::zeros([6], o), Kind::BFloat16).is_none());
        assert!(lies(&Tensor::zeros([0, 4], o), Kind::BFloat16).is_none());
        // One row or one column is both; it is taken either way.
        assert!(lies(&Tensor::zeros([1, 4], o), Kind::BFloat16).is_some());
        assert!(lies(&Tensor::zeros([4, 1], o), Kind::BFloat16).is_some());
    }

    /// Overlap is by the memory each view spans: a view and its base overlap, two halves do not.
    #[test]
    fn overlap_is_by_memory_spanned() {
        let t = Tensor::zeros([8, 4], (Kind::BFloat16, Device::Cpu));
        let (top, bottom) = (t.narrow(0, 0, 4), t.narrow(0, 4, 4));
        assert!(overlaps(&t, &top) && overlaps(&bottom, &t));
        assert!(!overlaps(&top, &bottom) && !overlaps(&bottom, &top));
        assert!(overlaps(&t.tr(), &bottom), "a transposed view spans the same memory");
        assert!(!overlaps(&t, &Tensor::zeros([8, 4], (Kind::BFloat16, Device::Cpu))));
    }
}
