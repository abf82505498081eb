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
//! against 4.3 ms for the worker's kernel (docs/results/one-gpu.md). The linear layers' bias
//! gradients keep the worker's column sums for the same reason: cuBLASLt's `BGRADB` epilogue (the
//! bias gradient summed in the weight gradient's product), tried on gpt2-xl's shapes on one H200,
//! ran as a kernel of its own after each product, 1.52 ms over a step against 1.44 ms for the
//! column sums, and each product with it took 5-21 µs longer.
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
//! The timing runs on the GPU's compute stream between events of its pool ([`Gpu`]); a
//! product's checks read each tensor's address, sizes and strides once (`Matrix`). cuBLASLt's
//! handle, descriptors and product call ([`Handle`], [`Descriptors`]) are public so that
//! `examples/gemm_algos` times the calls the plans run.
//!
//! cuBLASLt is column-major: a row-major `[r × c]` matrix is its `[c × r]` transpose, so the
//! row-major `out = a·b` is the column-major `outᵀ = bᵀ·aᵀ`: cuBLASLt's A is `b` and its B is
//! `a`, each transposed where it is a `.t()` view (a weight `w` in `x·wᵀ`). The epilogue's bias
//! runs along the result's rows in cuBLASLt's terms: the output's features.

use std::collections::HashMap;
use std::convert::Infallible;
use std::ffi::c_void;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use cudarc::cublaslt::{result, sys};
use tch::{Device, Kind, Tensor};

use crate::runtime::cuda::Gpu;

/// The workspace cuBLASLt may use: 32 MiB, NVIDIA's recommendation for Hopper.
pub const WORKSPACE_BYTES: usize = 32 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ProductError {
    #[error("cuBLASLt: {0}")]
    Lt(#[from] result::CublasError),
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
    #[error("CUDA, timing cuBLASLt's algorithms: {0}")]
    Cuda(#[from] cudarc::driver::DriverError),
}

/// What an epilogue does after the product `p = op(A)·op(B)`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Epilogue {
    /// `p` as it is.
    None,
    /// `p + bias`.
    Bias,
    /// `gelu_tanh(p + bias)`, with `p + bias` written to the auxiliary matrix.
    GeluAux,
    /// `p + bias + C`.
    Residual,
}

/// One product in cuBLASLt's column-major terms, `D[m × n] = op(A)·op(B)` then the epilogue, with
/// `op(A)` `m × k` and `op(B)` `k × n`: what picks a plan. `align` is the alignment in bytes of A,
/// B, C and D, by which cuBLASLt chooses its kernels.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Shape {
    pub epilogue: Epilogue,
    pub bf16: bool,
    pub m: u64,
    pub n: u64,
    pub k: u64,
    /// Whether A is stored transposed (`[k × m]`); B likewise (`[n × k]`).
    pub ta: bool,
    pub tb: bool,
    pub align: [u32; 4],
}

/// The device addresses of one product's matrices in cuBLASLt's terms, each holding what its
/// [`Shape`] describes.
#[derive(Clone, Copy)]
pub struct Pointers {
    pub a: *const c_void,
    pub b: *const c_void,
    pub d: *mut c_void,
    pub side: SidePointers,
}

/// The epilogue's matrices beside D, by [`Epilogue`]: `R` what it reads, `W` what it writes (their
/// addresses in [`SidePointers`], the checked tensors while a product is checked).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Side<R, W> {
    None,
    Bias {
        bias: R,
    },
    GeluAux {
        bias: R,
        aux: W,
    },
    /// `C`, with D's layout, added with β = 1.
    Residual {
        bias: R,
        c: R,
    },
}

/// The epilogue's device addresses.
pub type SidePointers = Side<*const c_void, *mut c_void>;

impl<R, W> Side<R, W> {
    fn epilogue(&self) -> Epilogue {
        match self {
            Side::None => Epilogue::None,
            Side::Bias { .. } => Epilogue::Bias,
            Side::GeluAux { .. } => Epilogue::GeluAux,
            Side::Residual { .. } => Epilogue::Residual,
        }
    }
}

/// A cuBLASLt handle.
pub struct Handle(sys::cublasLtHandle_t);

// SAFETY: cuBLASLt allows a handle on any thread as long as calls on it do not overlap; every
// user here holds it under a mutex or on one thread.
unsafe impl Send for Handle {}

impl Handle {
    /// A new handle; `None` where libcublasLt cannot be loaded.
    pub fn new() -> Result<Option<Self>, result::CublasError> {
        // SAFETY: only looks for the library.
        if !unsafe { sys::is_culib_present() } {
            return Ok(None);
        }
        Ok(Some(Handle(result::create_handle()?)))
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: created by `Handle::new`, destroyed once. Descriptors do not refer to it.
        unsafe {
            let _ = result::destroy_handle(self.0);
        }
    }
}

/// cuBLASLt's descriptors of one [`Shape`]: the operation and the layouts of A, B and C/D. The
/// bias and auxiliary pointers are set on the operation before each product. A descriptor not
/// made yet is null, so that descriptors whose making failed halfway destroy only what was made.
pub struct Descriptors {
    shape: Shape,
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    d: sys::cublasLtMatrixLayout_t,
}

// SAFETY: descriptors are host objects cuBLASLt allows on any thread; every user here holds
// them under a mutex or on one thread.
unsafe impl Send for Descriptors {}

impl Drop for Descriptors {
    fn drop(&mut self) {
        // SAFETY: each non-null descriptor was created by `Descriptors::new` and is destroyed once.
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

/// Sets one attribute of an operation's descriptor from a value.
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

impl Descriptors {
    /// Descriptors not made yet: every one null, nothing to destroy.
    fn unmade(shape: Shape) -> Self {
        let null = std::ptr::null_mut();
        Descriptors { shape, desc: null, a: null.cast(), b: null.cast(), d: null.cast() }
    }

    pub fn new(shape: Shape) -> Result<Self, result::CublasError> {
        use sys::cublasLtMatmulDescAttributes_t as D;
        let dtype = if shape.bf16 { sys::cudaDataType::CUDA_R_16BF } else { sys::cudaDataType::CUDA_R_16F };
        let Shape { m, n, k, ta, tb, .. } = shape;
        let mut made = Descriptors::unmade(shape);
        made.desc =
            result::create_matmul_desc(sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, sys::cudaDataType::CUDA_R_32F)?;
        // Column-major layouts: a transposed A is stored `[k × m]`, a transposed B `[n × k]`; C (the
        // residual, or D itself) and D are `[m × n]`.
        let (ar, ac) = if ta { (k, m) } else { (m, k) };
        let (br, bc) = if tb { (n, k) } else { (k, n) };
        made.a = result::create_matrix_layout(dtype, ar, ac, ar as i64)?;
        made.b = result::create_matrix_layout(dtype, br, bc, br as i64)?;
        made.d = result::create_matrix_layout(dtype, m, n, m as i64)?;
        let epilogue = match shape.epilogue {
            Epilogue::None => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT,
            Epilogue::Bias | Epilogue::Residual => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
            Epilogue::GeluAux => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
        };
        // SAFETY: each attribute gets a value of its documented type (cublasOperation_t and the
        // epilogue are 32-bit enums, the auxiliary matrix's leading dimension an int64).
        unsafe {
            set_desc(made.desc, D::CUBLASLT_MATMUL_DESC_TRANSA, &i32::from(ta))?;
            set_desc(made.desc, D::CUBLASLT_MATMUL_DESC_TRANSB, &i32::from(tb))?;
            set_desc(made.desc, D::CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue)?;
            if shape.epilogue == Epilogue::GeluAux {
                set_desc(made.desc, D::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &(m as i64))?;
            }
        }
        Ok(made)
    }

    /// Up to `up_to` of the algorithms cuBLASLt's heuristic offers for these descriptors, with
    /// [`WORKSPACE_BYTES`] of workspace, its first choice first; none where it has none.
    pub fn algorithms(
        &self,
        handle: &Handle,
        up_to: usize,
    ) -> Result<Vec<sys::cublasLtMatmulHeuristicResult_t>, result::CublasError> {
        use sys::cublasLtMatmulPreferenceAttributes_t as P;
        let pref = result::create_matmul_pref()?;
        // SAFETY: an array of plain C structs, for which all zeros is a valid value.
        let mut found = vec![unsafe { std::mem::zeroed::<sys::cublasLtMatmulHeuristicResult_t>() }; up_to];
        let mut count = 0i32;
        let status = (|| {
            // SAFETY: as above: the workspace size is a uint64, the alignments uint32; `found`
            // holds `up_to` results.
            unsafe {
                let ws = WORKSPACE_BYTES as u64;
                result::set_matmul_pref_attribute(
                    pref,
                    P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                    (&ws as *const u64).cast(),
                    8,
                )?;
                let align = self.shape.align;
                for (attr, align) in [
                    (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align[0]),
                    (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align[1]),
                    (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align[2]),
                    (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align[3]),
                ] {
                    result::set_matmul_pref_attribute(pref, attr, (&align as *const u32).cast(), 4)?;
                }
                sys::cublasLtMatmulAlgoGetHeuristic(
                    handle.0,
                    self.desc,
                    self.a,
                    self.b,
                    self.d,
                    self.d,
                    pref,
                    i32::try_from(up_to).unwrap_or(i32::MAX),
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
            Err(result::CublasError(sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED)) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        }
        found.truncate(usize::try_from(count).unwrap_or(0));
        found.retain(|h| h.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS);
        Ok(found)
    }

    /// One product with `algo` on `stream`.
    ///
    /// # Safety
    /// The pointers hold the matrices the [`Shape`] describes, with the shape's epilogue, on the
    /// device `workspace` (of [`WORKSPACE_BYTES`]) is on, and stay alive until the product has
    /// run on `stream`; `algo` is one of [`Self::algorithms`]'.
    pub unsafe fn run(
        &self,
        handle: &Handle,
        algo: &sys::cublasLtMatmulAlgo_t,
        p: Pointers,
        workspace: *mut c_void,
        stream: sys::cudaStream_t,
    ) -> Result<(), result::CublasError> {
        use sys::cublasLtMatmulDescAttributes_t as D;
        assert_eq!(p.side.epilogue(), self.shape.epilogue, "the pointers of another epilogue");
        let (alpha, mut beta, mut c) = (1f32, 0f32, p.d.cast_const());
        // SAFETY: the bias and auxiliary pointers are device addresses (void*), as documented; the
        // rest as the caller promises.
        unsafe {
            match p.side {
                SidePointers::None => {}
                SidePointers::Bias { bias } => set_desc(self.desc, D::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias)?,
                SidePointers::GeluAux { bias, aux } => {
                    set_desc(self.desc, D::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias)?;
                    set_desc(self.desc, D::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux)?;
                }
                SidePointers::Residual { bias, c: residual } => {
                    set_desc(self.desc, D::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias)?;
                    (beta, c) = (1.0, residual);
                }
            }
            result::matmul(
                handle.0,
                self.desc,
                (&alpha as *const f32).cast(),
                (&beta as *const f32).cast(),
                p.a,
                self.a,
                p.b,
                self.b,
                c,
                self.d,
                p.d,
                self.d,
                algo,
                workspace,
                WORKSPACE_BYTES,
                stream,
            )
        }
    }
}

/// How many algorithms of cuBLASLt's heuristic a plan times at its first product: asked for up to
/// 32, the heuristic offered 5-8 for each of gpt2-xl's and gpt2's products on an H100
/// (`examples/gemm_algos`), so 8 leaves none of them out there.
pub const CANDIDATES: usize = 8;

/// Each candidate's time is the least of this many rounds of [`TIMED_CALLS`] products.
pub const TIMING_ROUNDS: usize = 3;
pub const TIMED_CALLS: usize = 3;

/// A candidate replaces the heuristic's first choice only when it is faster by this share, so that
/// near-ties stay with the heuristic's choice instead of following the timings' noise. The share
/// is a judgement, not a measured optimum.
pub const MARGIN: f64 = 0.02;

/// What computes a plan's products: one of its algorithms, or libtorch's own call (`mm`, or
/// `addmm` with the bias). `L` is `()` for the plans of plain products, where libtorch's call is a
/// candidate (for some shapes it picks a kernel none of the heuristic's algorithms beats), and
/// [`Infallible`] for the epilogues, which libtorch has no one call for.
#[derive(Clone, Copy, Debug)]
enum Runner<L> {
    /// The plan's algorithm of this index.
    Lt(usize),
    Libtorch(L),
}

/// One [`Shape`]'s descriptors, the algorithms it times, and what it runs: the heuristic's first
/// until the plan's first product outside a CUDA graph's capture (a capture cannot wait for the
/// device) times the candidates, then the fastest.
struct Plan<L> {
    descriptors: Descriptors,
    /// The heuristic's algorithms, its first choice first; never empty.
    candidates: Vec<sys::cublasLtMatmulAlgo_t>,
    chosen: Option<Runner<L>>,
}

impl<L: Copy> Plan<L> {
    /// The plan of `shape`; `None` where cuBLASLt has no algorithm for it.
    fn new(handle: &Handle, shape: Shape) -> Result<Option<Self>, result::CublasError> {
        let descriptors = Descriptors::new(shape)?;
        let candidates: Vec<_> = descriptors.algorithms(handle, CANDIDATES)?.into_iter().map(|h| h.algo).collect();
        Ok((!candidates.is_empty()).then_some(Plan { descriptors, candidates, chosen: None }))
    }

    fn runner(&self) -> Runner<L> {
        self.chosen.unwrap_or(Runner::Lt(0))
    }
}

/// The index of the candidate to keep, given each one's time (the heuristic's first at 0; a
/// candidate refused at run time infinite): the fastest where it beats the first by [`MARGIN`],
/// otherwise the first.
pub fn choose(times: &[f64]) -> usize {
    let fastest = (0..times.len()).min_by(|&i, &j| times[i].total_cmp(&times[j])).unwrap_or(0);
    match times.first() {
        Some(&first) if times[fastest] < first * (1.0 - MARGIN) => fastest,
        _ => 0,
    }
}

/// The handle, its workspace (a libtorch tensor, so that the caching allocator counts it; allocated
/// at the first product, so models without these nodes never hold it) and the plans by shape
/// (`None`: cuBLASLt has no algorithm for it, and the node's other path runs), those of the plain
/// products apart from the epilogues'.
struct State {
    // Declared first so that it is dropped last, after the plans' descriptors.
    plain: HashMap<Shape, Option<Plan<()>>>,
    fused: HashMap<Shape, Option<Plan<Infallible>>>,
    workspace: Option<Tensor>,
    handle: Handle,
}

/// GPT-2's 16-bit matrix products on the compute stream of one GPU.
pub struct LtProducts {
    gpu: Arc<Gpu>,
    state: Mutex<State>,
}

/// A tensor's facts as a product needs them, read once: each read is a call into libtorch, and a
/// product's checks (layout, alignment, overlap) would otherwise read each operand several times.
/// A vector is a matrix of one row.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Matrix {
    addr: usize,
    kind: Kind,
    rank: usize,
    rows: i64,
    cols: i64,
    strides: [i64; 2],
}

/// How a row-major matrix `[r × c]` lies in memory: rows of `c` (contiguous), or the transpose of
/// a contiguous `[c × r]` (a `.t()` view, as libtorch's linear layers pass their weights).
#[derive(Clone, Copy, PartialEq, Debug)]
enum Lies {
    Rows,
    Transposed,
}

impl Matrix {
    /// `None` for a tensor of more than two dimensions or none.
    fn read(t: &Tensor) -> Option<Self> {
        let (size, stride) = (t.size(), t.stride());
        let (rank, rows, cols, strides) = match (&size[..], &stride[..]) {
            (&[c], &[s]) => (1, 1, c, [c * s, s]),
            (&[r, c], &[sr, sc]) => (2, r, c, [sr, sc]),
            _ => return None,
        };
        Some(Matrix { addr: t.data_ptr() as usize, kind: t.kind(), rank, rows, cols, strides })
    }

    /// The same memory read as its transpose (what `.t()` gives).
    fn transposed(self) -> Self {
        Matrix { rows: self.cols, cols: self.rows, strides: [self.strides[1], self.strides[0]], ..self }
    }

    /// How the matrix lies, if as rows or transposed rows; `None` for anything else (another
    /// element type, a vector, an empty matrix, a strided slice).
    fn lies(&self, kind: Kind) -> Option<Lies> {
        let (r, c) = (self.rows, self.cols);
        if self.kind != kind || self.rank != 2 || r == 0 || c == 0 {
            return None;
        }
        match self.strides {
            [sr, 1] if sr == c || r == 1 => Some(Lies::Rows),
            [1, sc] if sc == r || c == 1 => Some(Lies::Transposed),
            _ => None,
        }
    }

    /// Whether this is a contiguous `[rows × cols]` of `kind` (a vector: `rows` 1, `rank` 1).
    fn is(&self, kind: Kind, rank: usize, rows: i64, cols: i64) -> bool {
        self.kind == kind
            && self.rank == rank
            && (self.rows, self.cols) == (rows, cols)
            && (cols <= 1 || self.strides[1] == 1)
            && (rows <= 1 || self.strides[0] == cols)
    }

    /// The largest power of two, up to 256, that divides the address.
    fn alignment(&self) -> u32 {
        if self.addr == 0 {
            256
        } else {
            1u32 << self.addr.trailing_zeros().min(8)
        }
    }

    /// The bytes spanned, from the first element's address to the end of the last.
    fn span(&self) -> (usize, usize) {
        let last = (self.rows.max(1) - 1) * self.strides[0] + (self.cols.max(1) - 1) * self.strides[1];
        (self.addr, self.addr + (last as usize + 1) * self.kind.elt_size_in_bytes())
    }

    fn overlaps(&self, other: &Matrix) -> bool {
        let ((s1, e1), (s2, e2)) = (self.span(), other.span());
        s1 < e2 && s2 < e1
    }

    fn ptr(&self) -> *mut c_void {
        self.addr as *mut c_void
    }
}

/// The epilogue's tensors beside the product, as the callers give them.
enum Form<'a> {
    /// A bias at most: libtorch's `mm` or `addmm` computes the same.
    Plain { bias: Option<&'a Tensor> },
    /// The GELU's input `h` it writes.
    GeluAux { bias: &'a Tensor, h: &'a Tensor },
    /// The residual it adds.
    Residual { bias: &'a Tensor, res: &'a Tensor },
}

impl Form<'_> {
    /// The epilogue's matrices for an `[r × c]` product of `kind`, read once: the bias a
    /// contiguous `[c]`, the GELU's input or the residual a contiguous `[r × c]` like the output;
    /// `None` where a tensor is not that.
    fn side(&self, kind: Kind, r: i64, c: i64) -> Option<Side<Matrix, Matrix>> {
        let read = |t: &Tensor, rank: usize, rows: i64| Matrix::read(t).filter(|m| m.is(kind, rank, rows, c));
        Some(match *self {
            Form::Plain { bias: None } => Side::None,
            Form::Plain { bias: Some(bias) } => Side::Bias { bias: read(bias, 1, 1)? },
            Form::GeluAux { bias, h } => Side::GeluAux { bias: read(bias, 1, 1)?, aux: read(h, 2, r)? },
            Form::Residual { bias, res } => Side::Residual { bias: read(bias, 1, 1)?, c: read(res, 2, r)? },
        })
    }
}

impl Side<Matrix, Matrix> {
    /// The matrices it reads, and the one it writes beside D.
    fn read_written(&self) -> ([Option<Matrix>; 2], Option<Matrix>) {
        match *self {
            Side::None => ([None, None], None),
            Side::Bias { bias } => ([Some(bias), None], None),
            Side::GeluAux { bias, aux } => ([Some(bias), None], Some(aux)),
            Side::Residual { bias, c } => ([Some(bias), Some(c)], None),
        }
    }

    fn pointers(&self) -> SidePointers {
        match *self {
            Side::None => Side::None,
            Side::Bias { bias } => Side::Bias { bias: bias.ptr() },
            Side::GeluAux { bias, aux } => Side::GeluAux { bias: bias.ptr(), aux: aux.ptr() },
            Side::Residual { bias, c } => Side::Residual { bias: bias.ptr(), c: c.ptr() },
        }
    }
}

impl LtProducts {
    /// A cuBLASLt handle for `gpu`, whose compute stream the products run on; `None` where
    /// libcublasLt cannot be loaded.
    pub fn new(gpu: Arc<Gpu>) -> Result<Option<Self>, ProductError> {
        let Some(handle) = Handle::new()? else { return Ok(None) };
        let state = State { plain: HashMap::new(), fused: HashMap::new(), workspace: None, handle };
        Ok(Some(Self { gpu, state: Mutex::new(state) }))
    }

    /// `h = x·w1ᵀ + b1` and `a = gelu_tanh(h)` in one product: `x` is `[T × d]`, `w1` `[f × d]`,
    /// `b1` `[f]`, `h` and `a` `[T × f]`, contiguous, all of one 16-bit kind. `false` (nothing
    /// written) for tensors it does not take.
    pub fn gelu_up(&self, x: &Tensor, w1: &Tensor, b1: &Tensor, h: &Tensor, a: &Tensor) -> Result<bool, ProductError> {
        self.product(x, Matrix::read(w1).map(Matrix::transposed), Form::GeluAux { bias: b1, h }, a, None)
    }

    /// `out = res + x·wᵀ + b` in one product: `x` is `[T × k]`, `w` `[n × k]`, `b` `[n]`, `res`
    /// and `out` `[T × n]`, as [`Self::gelu_up`].
    pub fn residual(
        &self,
        res: &Tensor,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        out: &Tensor,
    ) -> Result<bool, ProductError> {
        self.product(x, Matrix::read(w).map(Matrix::transposed), Form::Residual { bias: b, res }, out, None)
    }

    /// `out = a·b`, plus `bias` along its rows where given: `a` is `[r × k]`, `b` `[k × c]`, each
    /// rows of its own or the transpose of a contiguous matrix (a `.t()` view), `bias` `[c]` and
    /// `out` `[r × c]` contiguous, all of one 16-bit kind, `out` apart from the others. `false`
    /// (nothing written) for tensors it does not take.
    pub fn matmul(&self, a: &Tensor, b: &Tensor, bias: Option<&Tensor>, out: &Tensor) -> Result<bool, ProductError> {
        let torch = LibtorchProduct { a, b, bias, out };
        self.product(a, Matrix::read(b), Form::Plain { bias }, out, Some(torch))
    }

    /// `out = epilogue(a·b)`. In cuBLASLt's column-major terms the row-major `out = a·b` is
    /// `outᵀ = bᵀ·aᵀ`: cuBLASLt's A is `b`, its B is `a`, and a row-major matrix is the
    /// column-major transpose of itself. `torch` is libtorch's call for the same product, where
    /// libtorch has one (`Form::Plain`).
    fn product(
        &self,
        a: &Tensor,
        b: Option<Matrix>,
        form: Form<'_>,
        out: &Tensor,
        torch: Option<LibtorchProduct<'_>>,
    ) -> Result<bool, ProductError> {
        let (Some(ma), Some(mb), Some(mo)) = (Matrix::read(a), b, Matrix::read(out)) else { return Ok(false) };
        let kind = ma.kind;
        let bf16 = match kind {
            Kind::BFloat16 => true,
            Kind::Half => false,
            _ => return Ok(false),
        };
        let (Some(la), Some(lb)) = (ma.lies(kind), mb.lies(kind)) else { return Ok(false) };
        let (r, k, c) = (ma.rows, ma.cols, mb.cols);
        if mb.rows != k || !mo.is(kind, 2, r, c) {
            return Ok(false);
        }
        let Some(side) = form.side(kind, r, c) else { return Ok(false) };
        let ([bias, residual], aux) = side.read_written();
        // cuBLASLt's requirements: a bias 16-byte aligned; the auxiliary matrix 16-byte aligned
        // with a leading dimension a multiple of 8.
        if bias.is_some_and(|m| m.alignment() < 16) || aux.is_some_and(|h| h.alignment() < 16 || c % 8 != 0) {
            return Ok(false);
        }
        if writes_what_it_reads(&[Some(ma), Some(mb), bias, residual], &mo, aux.as_ref()) {
            return Ok(false);
        }
        let shape = Shape {
            epilogue: side.epilogue(),
            bf16,
            m: c as u64,
            n: r as u64,
            k: k as u64,
            ta: lb == Lies::Transposed,
            tb: la == Lies::Transposed,
            align: [mb.alignment(), ma.alignment(), residual.unwrap_or(mo).alignment(), mo.alignment()],
        };
        let pointers = Pointers { a: mb.ptr(), b: ma.ptr(), d: mo.ptr(), side: side.pointers() };
        let mut guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let state = &mut *guard;
        let workspace = match &state.workspace {
            Some(w) => w.data_ptr(),
            None => {
                let w = Tensor::f_empty([WORKSPACE_BYTES as i64], (Kind::Uint8, Device::Cuda(self.gpu.ordinal)))?;
                state.workspace.insert(w).data_ptr()
            }
        };
        let lt = Lt { gpu: &self.gpu, handle: &state.handle, workspace, shape, pointers };
        match torch {
            Some(torch) => lt.run(&mut state.plain, Some(()), |()| torch.run()),
            None => lt.run(&mut state.fused, None, |never: Infallible| match never {}),
        }
    }
}

/// Whether a product writing `out` (and `aux`) would write memory it reads from `inputs`, or
/// write one place twice. The candidates are timed writing the outputs, so an output that is also
/// an input would give a later candidate what an earlier one wrote.
fn writes_what_it_reads(inputs: &[Option<Matrix>], out: &Matrix, aux: Option<&Matrix>) -> bool {
    let written = |m: &Matrix| out.overlaps(m) || aux.is_some_and(|h| h.overlaps(m));
    inputs.iter().flatten().any(written) || aux.is_some_and(|h| h.overlaps(out))
}

/// libtorch's call for a plain product, on its current stream (the compute stream, as the shim
/// passes it).
struct LibtorchProduct<'a> {
    a: &'a Tensor,
    b: &'a Tensor,
    bias: Option<&'a Tensor>,
    out: &'a Tensor,
}

impl LibtorchProduct<'_> {
    fn run(&self) -> Result<(), ProductError> {
        let _out = match self.bias {
            Some(c) => c.f_addmm_out(self.out, self.a, self.b)?,
            None => self.a.f_mm_out(self.out, self.b)?,
        };
        Ok(())
    }
}

/// One checked product, ready to run through its shape's plan.
struct Lt<'a> {
    gpu: &'a Gpu,
    handle: &'a Handle,
    workspace: *mut c_void,
    shape: Shape,
    pointers: Pointers,
}

impl Lt<'_> {
    /// Runs the product through its shape's plan in `plans`, making the plan at the shape's first
    /// product and timing its candidates (the algorithms, and libtorch's call where `offered`) at
    /// the first outside a capture. `false` where cuBLASLt has no algorithm for the shape.
    fn run<L: Copy + Debug>(
        &self,
        plans: &mut HashMap<Shape, Option<Plan<L>>>,
        offered: Option<L>,
        libtorch: impl Fn(L) -> Result<(), ProductError>,
    ) -> Result<bool, ProductError> {
        let plan = match plans.entry(self.shape) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(Plan::new(self.handle, self.shape)?),
        };
        let Some(plan) = plan.as_mut() else { return Ok(false) };
        let run_as = |plan: &Plan<L>, runner: Runner<L>| match runner {
            // SAFETY: the pointers were checked to hold the matrices the shape describes and
            // their tensors are alive for the call; the product runs on the compute stream, in
            // its order, as libtorch's would; the workspace is `WORKSPACE_BYTES` on the same device.
            Runner::Lt(i) => Ok(unsafe {
                plan.descriptors.run(
                    self.handle,
                    &plan.candidates[i],
                    self.pointers,
                    self.workspace,
                    self.gpu.compute.cu_stream().cast(),
                )
            }?),
            Runner::Libtorch(l) => libtorch(l),
        };
        // Until the plan has chosen (a product is then one call), time every candidate at the
        // first product outside a capture.
        if plan.chosen.is_none() {
            let runners: Vec<Runner<L>> =
                (0..plan.candidates.len()).map(Runner::Lt).chain(offered.map(Runner::Libtorch)).collect();
            if runners.len() == 1 {
                // Nothing to time: the heuristic's one algorithm.
                plan.chosen = Some(Runner::Lt(0));
            } else if !capturing(self.gpu)? {
                let mut times = Vec::with_capacity(runners.len());
                for &r in &runners {
                    // A candidate cuBLASLt or libtorch refuses at run time is left out, not fatal.
                    times.push(match time_ms(self.gpu, || run_as(plan, r)) {
                        Ok(ms) => ms,
                        Err(e @ (ProductError::Lt(_) | ProductError::Torch(_))) => {
                            tracing::debug!(shape = ?self.shape, runner = ?r, "candidate refused: {e}");
                            f64::INFINITY
                        }
                        Err(e) => return Err(e),
                    });
                }
                let chosen = runners[choose(&times)];
                tracing::debug!(shape = ?self.shape, ?times, ?chosen, "matrix-product candidates timed");
                plan.chosen = Some(chosen);
            }
        }
        // The chosen candidate writes the result last, whatever the timing ran.
        run_as(plan, plan.runner())?;
        Ok(true)
    }
}

/// Milliseconds per product of `run` on the compute stream: the least of [`TIMING_ROUNDS`] rounds
/// of [`TIMED_CALLS`], between two of the GPU's events.
fn time_ms(gpu: &Gpu, mut run: impl FnMut() -> Result<(), ProductError>) -> Result<f64, ProductError> {
    let (start, end) = (gpu.event()?, gpu.event()?);
    let timed = (|| {
        let mut best = f64::INFINITY;
        run()?;
        for _ in 0..TIMING_ROUNDS {
            gpu.record(start, &gpu.compute)?;
            for _ in 0..TIMED_CALLS {
                run()?;
            }
            gpu.record(end, &gpu.compute)?;
            best = best.min(gpu.elapsed_ms(start, end)? / TIMED_CALLS as f64);
        }
        Ok::<_, ProductError>(best)
    })();
    // Nothing reads them again: `elapsed_ms` waited for `end`, or an error ended the timing.
    gpu.recycle(start);
    gpu.recycle(end);
    timed
}

/// Whether the compute stream is being captured into a CUDA graph (where nothing may wait for the
/// device).
fn capturing(gpu: &Gpu) -> Result<bool, ProductError> {
    use cudarc::driver::sys::CUstreamCaptureStatus as S;
    // SAFETY: the GPU's live compute stream.
    let status = unsafe { cudarc::driver::result::stream::is_capturing(gpu.compute.cu_stream()) }?;
    Ok(status != S::CU_STREAM_CAPTURE_STATUS_NONE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> Shape {
        Shape { epilogue: Epilogue::None, bf16: true, m: 8, n: 8, k: 8, ta: false, tb: false, align: [256; 4] }
    }

    /// Descriptors whose making failed before the first one hold only nulls, and dropping them
    /// calls nothing in cuBLASLt. Where the library is absent (a CPU host), any call would load it
    /// and panic.
    #[test]
    fn descriptors_made_of_nothing_destroy_nothing() {
        drop(Descriptors::unmade(shape()));
    }

    /// The layouts a product takes: rows, and the transpose of a contiguous matrix; not a
    /// strided slice, another element type, a vector or an empty matrix.
    #[test]
    fn operands_lie_as_rows_or_transposed() {
        let o = (Kind::BFloat16, Device::Cpu);
        let lies = |t: &Tensor, kind| Matrix::read(t).and_then(|m| m.lies(kind));
        let m = Tensor::zeros([6, 4], o);
        assert_eq!(lies(&m, Kind::BFloat16), Some(Lies::Rows));
        assert_eq!(lies(&m.tr(), Kind::BFloat16), Some(Lies::Transposed));
        assert_eq!(Matrix::read(&m).map(Matrix::transposed), Matrix::read(&m.tr()), "transposed as `.t()` is");
        assert_eq!(lies(&m.narrow(1, 0, 2), Kind::BFloat16), None, "rows of 2 in rows of 4");
        assert_eq!(lies(&m.narrow(1, 0, 2).tr(), Kind::BFloat16), None, "the transpose of such rows");
        assert_eq!(lies(&m.slice(0, 0, 6, 2), Kind::BFloat16), None, "every other row");
        assert_eq!(lies(&m, Kind::Half), None);
        assert_eq!(lies(&Tensor::zeros([6], o), Kind::BFloat16), None);
        assert_eq!(lies(&Tensor::zeros([0, 4], o), Kind::BFloat16), None);
        assert!(Matrix::read(&Tensor::zeros([2, 3, 4], o)).is_none(), "three dimensions");
        // One row or one column is both; it is taken either way.
        assert!(lies(&Tensor::zeros([1, 4], o), Kind::BFloat16).is_some());
        assert!(lies(&Tensor::zeros([4, 1], o), Kind::BFloat16).is_some());
    }

    /// `is`: contiguous, of the kind, rank and size asked; a vector is a row.
    #[test]
    fn contiguous_matrices_and_vectors() {
        let o = (Kind::BFloat16, Device::Cpu);
        let m = Matrix::read(&Tensor::zeros([6, 4], o)).unwrap();
        assert!(m.is(Kind::BFloat16, 2, 6, 4));
        assert!(!m.is(Kind::BFloat16, 2, 4, 6) && !m.is(Kind::Half, 2, 6, 4) && !m.is(Kind::BFloat16, 1, 6, 4));
        assert!(!m.transposed().is(Kind::BFloat16, 2, 4, 6), "a transposed view is not rows");
        let narrow = Matrix::read(&Tensor::zeros([6, 4], o).narrow(1, 0, 2)).unwrap();
        assert!(!narrow.is(Kind::BFloat16, 2, 6, 2), "rows of 2 in rows of 4");
        let v = Matrix::read(&Tensor::zeros([4], o)).unwrap();
        assert!(v.is(Kind::BFloat16, 1, 1, 4) && !v.is(Kind::BFloat16, 2, 1, 4));
        let strided = Matrix::read(&Tensor::zeros([8], o).slice(0, 0, 8, 2)).unwrap();
        assert!(!strided.is(Kind::BFloat16, 1, 1, 4), "every other element");
    }

    /// Overlap is by the memory each view spans: a view and its base overlap, two halves do not.
    #[test]
    fn overlap_is_by_memory_spanned() {
        let t = Tensor::zeros([8, 4], (Kind::BFloat16, Device::Cpu));
        let m = |t: &Tensor| Matrix::read(t).unwrap();
        let (top, bottom) = (m(&t.narrow(0, 0, 4)), m(&t.narrow(0, 4, 4)));
        assert!(m(&t).overlaps(&top) && bottom.overlaps(&m(&t)));
        assert!(!top.overlaps(&bottom) && !bottom.overlaps(&top));
        assert!(m(&t.tr()).overlaps(&bottom), "a transposed view spans the same memory");
        assert!(m(&t.get(7)).overlaps(&bottom) && !m(&t.get(0)).overlaps(&bottom), "a row of it");
        assert!(!m(&t).overlaps(&m(&Tensor::zeros([8, 4], (Kind::BFloat16, Device::Cpu)))));
    }

    /// A product is declined where an output is an input, or its two outputs share memory; apart,
    /// it is taken.
    #[test]
    fn outputs_apart_from_inputs_and_each_other() {
        let t = Tensor::zeros([8, 4], (Kind::BFloat16, Device::Cpu));
        let m = |t: &Tensor| Matrix::read(t).unwrap();
        let (a, b, c, d) = (m(&t.narrow(0, 0, 2)), m(&t.narrow(0, 2, 2)), m(&t.narrow(0, 4, 2)), m(&t.narrow(0, 6, 2)));
        assert!(!writes_what_it_reads(&[Some(a), Some(b), None], &c, None));
        assert!(!writes_what_it_reads(&[Some(a), Some(b)], &c, Some(&d)));
        assert!(writes_what_it_reads(&[Some(a), Some(c)], &c, None), "the output is an input");
        assert!(writes_what_it_reads(&[None, Some(b)], &d, Some(&b)), "the auxiliary output is an input");
        assert!(writes_what_it_reads(&[Some(a)], &c, Some(&m(&t.narrow(0, 5, 2)))), "the outputs share a row");
    }

    /// The epilogue's tensors are taken as its matrices where each is the contiguous shape of its
    /// role: a bias `[c]`, the GELU's input and the residual `[r × c]`, all of the product's kind.
    #[test]
    fn the_epilogues_tensors_of_their_roles() {
        let o = (Kind::BFloat16, Device::Cpu);
        let (bias, side) = (Tensor::zeros([4], o), Tensor::zeros([6, 4], o));
        let m = |t: &Tensor| Matrix::read(t).unwrap();
        let read = |form: Form<'_>| form.side(Kind::BFloat16, 6, 4);
        assert_eq!(read(Form::Plain { bias: None }), Some(Side::None));
        assert_eq!(read(Form::Plain { bias: Some(&bias) }), Some(Side::Bias { bias: m(&bias) }));
        let aux = Side::GeluAux { bias: m(&bias), aux: m(&side) };
        assert_eq!(read(Form::GeluAux { bias: &bias, h: &side }), Some(aux));
        assert_eq!(aux.read_written(), ([Some(m(&bias)), None], Some(m(&side))), "the GELU's input is written");
        let res = Side::Residual { bias: m(&bias), c: m(&side) };
        assert_eq!(read(Form::Residual { bias: &bias, res: &side }), Some(res));
        assert_eq!(res.read_written(), ([Some(m(&bias)), Some(m(&side))], None), "the residual is read");
        let long = Tensor::zeros([6], o);
        assert_eq!(read(Form::Plain { bias: Some(&long) }), None, "a bias of another length");
        assert_eq!(read(Form::Residual { bias: &side, res: &side }), None, "a matrix as the bias");
        assert_eq!(read(Form::GeluAux { bias: &bias, h: &side.tr() }), None, "a transposed GELU input");
        assert_eq!(read(Form::Residual { bias: &bias, res: &side.narrow(0, 0, 5) }), None, "too few rows");
        let half = Tensor::zeros([4], (Kind::Half, Device::Cpu));
        assert_eq!(read(Form::Plain { bias: Some(&half) }), None, "another kind");
    }

    /// Alignment is the largest power of two dividing the address, at most 256.
    #[test]
    fn alignment_of_an_address() {
        let t = Tensor::zeros([64], (Kind::BFloat16, Device::Cpu));
        let base = Matrix::read(&t).unwrap();
        let at = |i: i64| Matrix::read(&t.narrow(0, i, 1)).unwrap().alignment();
        assert!(base.alignment() >= 16, "libtorch's allocations are aligned");
        let aligned = base.alignment().min(256);
        assert_eq!(at(1), 2, "one bf16 element in");
        assert_eq!(at(4), 8.min(aligned));
        assert_eq!(Matrix { addr: 1 << 20, ..base }.alignment(), 256);
    }

    /// A candidate replaces the heuristic's first only when faster by the margin; a refused one
    /// (infinite) never; where the first is refused, the fastest of the rest.
    #[test]
    fn the_fastest_candidate_beyond_the_margin() {
        assert_eq!(choose(&[1.0, 0.99, 1.2]), 0, "within the margin");
        assert_eq!(choose(&[1.0, 0.99, 0.97]), 2);
        assert_eq!(choose(&[1.0, f64::INFINITY]), 0);
        assert_eq!(choose(&[f64::INFINITY, 3.0, 2.0]), 2);
        assert_eq!(choose(&[f64::INFINITY, f64::INFINITY]), 0);
        assert_eq!(choose(&[1.0]), 0);
        assert_eq!(choose(&[]), 0);
    }
}
