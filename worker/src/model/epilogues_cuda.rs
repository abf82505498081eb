//! GPT-2's matrix products with the pointwise work after them computed in cuBLASLt's epilogues,
//! for the forward passes of the shim's nodes on 16-bit CUDA tensors:
//!
//! * [`Epilogues::gelu_up`] (`GELU_AUX_BIAS`), the MLP's first layer: one product writes the
//!   GELU's output `a = gelu_tanh(x·w1ᵀ + b1)` and its input `h = x·w1ᵀ + b1`, which the node keeps
//!   for the backward pass. Without it the product writes `h` and a kernel of its own reads it back
//!   to write `a`: in gpt2-xl's profiled step (micro-batch 4, one H100) that kernel took 2.0 ms,
//!   and the product with the epilogue takes 1.2 ms longer than the one without.
//! * [`Epilogues::residual`] (`BIAS` with `C` the residual stream and β = 1), the last product of
//!   each sub-block: `res + x·wᵀ + b` in one product, where otherwise a kernel reads the product
//!   and the residual again to write their sum (the residual additions took 2.2 ms of gpt2-xl's
//!   step, half of them in the forward pass).
//!
//! libtorch runs cuBLASLt's bias and GELU epilogue (`_addmm_activation`) but neither the form that
//! also writes the GELU's input nor a product whose `C` is another matrix than its output, so this
//! module calls cuBLASLt itself (through cudarc, loaded at run time).
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
//! cuBLASLt is column-major: a row-major `[r × c]` matrix is its `[c × r]` transpose, so
//! `x·wᵀ` (`[T × f]`) is computed as the column-major `[f × T]` product of `w`, transposed
//! (`TRANSA = T`), and `x`. The epilogue's bias runs along the result's rows: the `f` features.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

use cudarc::cublaslt::{result, sys};
use tch::{Device, Kind, Tensor};

/// The workspace cuBLASLt may use: 32 MiB, NVIDIA's recommendation for Hopper.
const WORKSPACE_BYTES: usize = 32 << 20;

#[derive(Debug, thiserror::Error)]
pub enum EpilogueError {
    #[error("cuBLASLt: {0}")]
    Lt(#[from] result::CublasError),
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
}

/// What an epilogue does after the product `p = x·wᵀ`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Fused {
    /// `gelu_tanh(p + bias)`, with `p + bias` written to the auxiliary matrix.
    GeluAux,
    /// `p + bias + C`.
    Residual,
}

/// What picks a plan: the epilogue, the element type, the product's shape (`m × k` by `k × n`)
/// and the alignment in bytes of A, B, C and D (cuBLASLt chooses its kernels by them).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct Key {
    fused: Fused,
    bf16: bool,
    m: u64,
    n: u64,
    k: u64,
    align: [u32; 4],
}

/// The descriptors and the algorithm of one [`Key`]; the bias and auxiliary pointers are set
/// on the descriptor before each product. A descriptor not made yet is null, so that a plan
/// whose making failed halfway destroys what it made.
struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    d: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
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
            algo: sys::cublasLtMatmulAlgo_t { data: [0; 8] },
        }
    }

    /// The descriptors of `key`, and cuBLASLt's first algorithm for them; `None` when it has none.
    fn new(handle: sys::cublasLtHandle_t, key: Key) -> Result<Option<Self>, result::CublasError> {
        use sys::cublasLtMatmulDescAttributes_t as D;
        use sys::cublasLtMatmulPreferenceAttributes_t as P;
        let dtype = if key.bf16 { sys::cudaDataType::CUDA_R_16BF } else { sys::cudaDataType::CUDA_R_16F };
        let (m, n, k) = (key.m, key.n, key.k);
        let mut plan = Plan::unmade();
        plan.desc =
            result::create_matmul_desc(sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, sys::cudaDataType::CUDA_R_32F)?;
        let desc = plan.desc;
        // A: w, [m × k] row-major, so [k × m] column-major, transposed; B: x, [k × T] column-major;
        // C (the residual, or D itself) and D: [m × T] column-major.
        plan.a = result::create_matrix_layout(dtype, k, m, k as i64)?;
        plan.b = result::create_matrix_layout(dtype, k, n, k as i64)?;
        plan.d = result::create_matrix_layout(dtype, m, n, m as i64)?;
        let epilogue = match key.fused {
            Fused::GeluAux => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
            Fused::Residual => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
        };
        // SAFETY: each attribute gets a value of its documented type (cublasOperation_t and the
        // epilogue are 32-bit enums, the auxiliary matrix's leading dimension an int64).
        unsafe {
            set_desc(desc, D::CUBLASLT_MATMUL_DESC_TRANSA, &1i32)?;
            set_desc(desc, D::CUBLASLT_MATMUL_DESC_TRANSB, &0i32)?;
            set_desc(desc, D::CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue)?;
            if key.fused == Fused::GeluAux {
                set_desc(desc, D::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &(m as i64))?;
            }
        }
        let pref = result::create_matmul_pref()?;
        let found = (|| {
            // SAFETY: as above: the workspace size is a uint64, the alignments uint32.
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
                result::get_matmul_algo_heuristic(handle, desc, plan.a, plan.b, plan.d, plan.d, pref)
            }
        })();
        // SAFETY: created above, used only by the query.
        unsafe { result::destroy_matmul_pref(pref) }?;
        match found {
            Ok(h) => {
                plan.algo = h.algo;
                Ok(Some(plan))
            }
            Err(result::CublasError(sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED)) => Ok(None),
            Err(e) => Err(e),
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

pub struct Epilogues {
    state: Mutex<State>,
}

// SAFETY: the handle and descriptors are used only under the mutex; cuBLASLt allows a handle on
// any thread as long as calls on it do not overlap.
unsafe impl Send for Epilogues {}
// SAFETY: as for `Send`: every use of the raw handles holds the mutex.
unsafe impl Sync for Epilogues {}

impl Drop for State {
    fn drop(&mut self) {
        self.plans.clear();
        // SAFETY: created by `Epilogues::new`, destroyed once, after its plans.
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

impl Epilogues {
    /// A cuBLASLt handle for CUDA device `ordinal`; `None` where libcublasLt cannot be loaded.
    pub fn new(ordinal: usize) -> Result<Option<Self>, EpilogueError> {
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
    ) -> Result<bool, EpilogueError> {
        // The auxiliary matrix's leading dimension must be a multiple of 8 and its address 16-byte
        // aligned (cuBLASLt's requirements).
        let f = dims(w1)[0];
        if f % 8 != 0 || alignment(h) < 16 || !is(h, x.kind(), &[dims(x)[0], f]) {
            return Ok(false);
        }
        self.product(Fused::GeluAux, x, w1, b1, Side::Aux(h), a, stream)
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
    ) -> Result<bool, EpilogueError> {
        let n = dims(w)[0];
        if !is(res, x.kind(), &[dims(x)[0], n]) {
            return Ok(false);
        }
        self.product(Fused::Residual, x, w, b, Side::Residual(res), out, stream)
    }

    /// `out = epilogue(x·wᵀ + b)` with the epilogue's other matrix `side`.
    #[allow(clippy::too_many_arguments)]
    fn product(
        &self,
        fused: Fused,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        side: Side<'_>,
        out: &Tensor,
        stream: *mut c_void,
    ) -> Result<bool, EpilogueError> {
        let (kind, [t, k], m) = (x.kind(), dims(x), dims(w)[0]);
        let bf16 = match kind {
            Kind::BFloat16 => true,
            Kind::Half => false,
            _ => return Ok(false),
        };
        let fits = is(x, kind, &[t, k]) && is(w, kind, &[m, k]) && is(b, kind, &[m]) && is(out, kind, &[t, m]);
        // The bias 16-byte aligned (cuBLASLt's requirement), and nothing empty.
        if !fits || t == 0 || k == 0 || m == 0 || alignment(b) < 16 {
            return Ok(false);
        }
        let (c, beta, aux) = match side {
            Side::Aux(h) => (out, 0f32, Some(h)),
            Side::Residual(res) => (res, 1f32, None),
        };
        let key = Key {
            fused,
            bf16,
            m: m as u64,
            n: t as u64,
            k: k as u64,
            align: [alignment(w), alignment(x), alignment(c), alignment(out)],
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
        let Some(plan) = plan.as_ref() else { return Ok(false) };
        let bias_ptr = b.data_ptr();
        let alpha = 1f32;
        // SAFETY: the tensors were checked above to hold the matrices the plan describes and are
        // alive for the call; the product runs on `stream`, in its order, as libtorch's would; the
        // workspace is `WORKSPACE_BYTES` on the same device.
        unsafe {
            use sys::cublasLtMatmulDescAttributes_t as D;
            set_desc(plan.desc, D::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr)?;
            if let Some(h) = aux {
                set_desc(plan.desc, D::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &h.data_ptr())?;
            }
            result::matmul(
                handle,
                plan.desc,
                (&alpha as *const f32).cast(),
                (&beta as *const f32).cast(),
                w.data_ptr(),
                plan.a,
                x.data_ptr(),
                plan.b,
                c.data_ptr(),
                plan.d,
                out.data_ptr(),
                plan.d,
                &plan.algo,
                workspace,
                WORKSPACE_BYTES,
                stream.cast(),
            )?;
        }
        Ok(true)
    }
}

/// The epilogue's matrix beside the output: the GELU's input it writes, or the residual it adds
/// (cuBLASLt's `C`, with the output's layout).
enum Side<'a> {
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
}
