//! Safe wrappers over `shim/torch_shim.cpp` (what tch 0.24 lacks) and `shim/mpi_shim.c`.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::time::Duration;

use tch::{Kind, Tensor};

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct CudaStats {
    pub allocated: i64,
    pub peak_allocated: i64,
    pub reserved: i64,
    pub peak_reserved: i64,
    pub alloc_retries: i64,
    pub ooms: i64,
}

/// Whether two strings are equal, where a constant needs it.
const fn same_text(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

// The shim linked in was compiled from this checkout's sources. A target folder shared with
// another checkout (a worktree of an earlier commit) can otherwise link that checkout's shim
// silently: the nodes' C++ and the kernels' Rust then disagree on their arguments, and every
// layer-norm kernel declines (it happened once; docs/results/reproducing.md).
const _: () = assert!(
    same_text(env!("ZEROBENCH_SHIM_SOURCES"), env!("CARGO_MANIFEST_DIR")),
    "the C++ shim in this target folder was compiled from another checkout: touch worker/build.rs, \
     or give this checkout a target folder of its own (CARGO_TARGET_DIR)"
);

/// An `at::Tensor*`, which the shim's functions take and tch's `Tensor::as_ptr` returns.
pub type CTensor = *mut c_void;

/// The layer norm's backward kernel, as [`NodeKernelFns::ln_backward`] describes it.
pub type LnBackwardFn = unsafe extern "C" fn(
    CTensor,
    CTensor,
    CTensor,
    CTensor,
    CTensor,
    CTensor,
    CTensor,
    CTensor,
    CTensor,
    CTensor,
    CTensor,
    *mut c_void,
    *mut c_char,
    usize,
) -> c_int;

/// A kernel of one input and one output tensor: `(input, output, stream, err, cap)`.
pub type TwoTensorFn = unsafe extern "C" fn(CTensor, CTensor, *mut c_void, *mut c_char, usize) -> c_int;

/// A kernel of three tensors: `(x, u, out, stream, err, cap)` ([`NodeKernelFns::scale`]).
pub type ThreeTensorFn = unsafe extern "C" fn(CTensor, CTensor, CTensor, *mut c_void, *mut c_char, usize) -> c_int;

/// A kernel of four tensors: the GELU's fused backward ([`NodeKernelFns::gelu_backward_col_sum`])
/// and the matrix product ([`NodeKernelFns::matmul`]).
pub type FourTensorFn =
    unsafe extern "C" fn(CTensor, CTensor, CTensor, CTensor, *mut c_void, *mut c_char, usize) -> c_int;

/// The products with cuBLASLt's epilogues, as [`NodeKernelFns::gelu_up`] and
/// [`NodeKernelFns::residual`] describe them.
pub type FiveTensorFn =
    unsafe extern "C" fn(CTensor, CTensor, CTensor, CTensor, CTensor, *mut c_void, *mut c_char, usize) -> c_int;

/// The layer norm's forward kernel: `(x, gamma, beta, eps, y, mean, rstd, stream, err, cap)`.
pub type LnForwardFn = unsafe extern "C" fn(
    CTensor,
    CTensor,
    CTensor,
    f64,
    CTensor,
    CTensor,
    CTensor,
    *mut c_void,
    *mut c_char,
    usize,
) -> c_int;

/// The shim's `zb_node_kernels`: kernels its nodes ([`residual_linear`], [`ln_linear`],
/// [`residual_ln_gelu_mlp`]) call on CUDA tensors with libtorch's current stream, each returning 0
/// when it computed its outputs, 1 when it declines the tensors (the node then uses libtorch's
/// operations) and -1 with a message in the buffer (`err`, `cap` bytes) when it failed
/// (`model::recompute_cuda`).
#[repr(C)]
pub struct NodeKernelFns {
    /// The layer norm (forward and recomputed): `y`, `mean`, `rstd` from `x`, `gamma`, `beta`.
    pub ln_forward: Option<LnForwardFn>,
    /// `(dy, x, mean, rstd, gamma, beta, dres, dx, xn, dgamma, dbeta, stream, err, cap)`; `dres`,
    /// the residual's gradient added to `dx`, may be null; `xn` gets the forward pass's output
    /// again (recomputed from `x`, `mean` and `rstd`).
    pub ln_backward: Option<LnBackwardFn>,
    /// `(x, out, stream, err, cap)`: `out` = the sums of `x`'s columns.
    pub col_sum: Option<TwoTensorFn>,
    /// `(h, a, stream, err, cap)`: `a` = `gelu_tanh(h)`.
    pub gelu_forward: Option<TwoTensorFn>,
    /// `(g, h, act, out, stream, err, cap)`: `act` = `gelu_tanh(h)`, `g` = `gelu_tanh'(h) · g`,
    /// then `out` = its column sums.
    pub gelu_backward_col_sum: Option<FourTensorFn>,
    /// `(s0, s1, s2, x, out, stream, err, cap)`: `x` = `s0`, `s1` and `s2` side by side (rows of
    /// a third of `x`'s each), then `out` = its column sums.
    pub join_col_sum: Option<FiveTensorFn>,
    /// `(x, w1, b1, h, a, stream, err, cap)`: `h` = `x·w1ᵀ + b1`, `a` = `gelu_tanh(h)`.
    pub gelu_up: Option<FiveTensorFn>,
    /// `(res, x, w, b, out, stream, err, cap)`: `out` = `res + x·wᵀ + b`.
    pub residual: Option<FiveTensorFn>,
    /// `(a, b, bias, out, stream, err, cap)`: `out` = `a·b`, plus `bias` along its rows where
    /// `bias` is not null.
    pub matmul: Option<FourTensorFn>,
    /// `(x, u, out, stream, err, cap)`: `out` = `x · u` in `x`'s precision (the fp32 product
    /// rounded once), `u` a one-element fp32 tensor (the upstream gradient of the LM head's node).
    pub scale: Option<ThreeTensorFn>,
}

extern "C" {
    fn zb_last_error() -> *const c_char;
    fn zb_torch_version() -> *const c_char;
    fn zb_backward(outputs: *const CTensor, grads: *const CTensor, n: c_int) -> c_int;
    fn zb_run_in_backward(device: c_int, f: unsafe extern "C" fn(*mut c_void) -> c_int, data: *mut c_void) -> c_int;
    fn zb_clear_grad(t: CTensor) -> c_int;
    fn zb_grad_into(param: CTensor, buf: CTensor, offset: i64, accumulate: c_int) -> c_int;
    fn zb_take_grads(
        params: *const CTensor,
        offsets: *const i64,
        n: c_int,
        buf: CTensor,
        add: c_int,
        placed: *mut c_int,
    ) -> c_int;
    fn zb_storage_set(t: CTensor, data: *mut c_void, nbytes: usize) -> c_int;
    fn zb_storage_release(t: CTensor) -> c_int;
    fn zb_cuda_stats(device: c_int, out: *mut CudaStats) -> c_int;
    fn zb_cuda_reset_peak(device: c_int) -> c_int;
    fn zb_cuda_empty_cache() -> c_int;
    fn zb_cuda_set_stream(stream: *mut c_void, device: c_int) -> c_int;
    fn zb_cuda_current_stream(device: c_int, out: *mut *mut c_void) -> c_int;
    fn zb_cuda_pool_begin(device: c_int, pool: u64, stream: *mut c_void) -> c_int;
    fn zb_cuda_pool_end(device: c_int, pool: u64) -> c_int;
    fn zb_cuda_pool_release(device: c_int, pool: u64) -> c_int;
    fn zb_profiler_start(cuda: c_int) -> c_int;
    fn zb_profiler_stop(path: *const c_char) -> c_int;
    fn zb_mpi_in_place() -> *mut c_void;
    fn zb_store_open(
        host: *const c_char,
        port: u16,
        is_server: c_int,
        world: c_int,
        timeout_ms: i64,
        out: *mut *mut c_void,
    ) -> c_int;
    fn zb_store_set(store: *mut c_void, key: *const c_char, data: *const u8, len: usize) -> c_int;
    fn zb_store_get(store: *mut c_void, key: *const c_char, buf: *mut u8, cap: usize, len: *mut usize) -> c_int;
    fn zb_store_close(store: *mut c_void);
    fn zb_host_zeros(n: i64, scalar_type: c_int, out: *mut *mut c_void) -> c_int;
    fn zb_gloo_open(
        store: *mut c_void,
        prefix: *const c_char,
        host: *const c_char,
        rank: c_int,
        size: c_int,
        connect_ms: i64,
        op_ms: i64,
        out: *mut *mut c_void,
    ) -> c_int;
    fn zb_gloo_all_reduce(pg: *mut c_void, buf: CTensor) -> c_int;
    fn zb_gloo_reduce_scatter(pg: *mut c_void, input: CTensor, output: CTensor) -> c_int;
    fn zb_gloo_all_gather(pg: *mut c_void, input: CTensor, output: CTensor) -> c_int;
    fn zb_gloo_broadcast(pg: *mut c_void, buf: CTensor, root: c_int) -> c_int;
    fn zb_gloo_close(pg: *mut c_void);
    fn zb_set_node_kernels(k: *const NodeKernelFns) -> c_int;
    fn zb_residual_linear(res: CTensor, x: CTensor, w: CTensor, b: CTensor, out: *mut CTensor) -> c_int;
    fn zb_given_grads(loss: CTensor, h: CTensor, w: CTensor, gh: CTensor, gw: CTensor, out: *mut CTensor) -> c_int;
    fn zb_embedding(w: CTensor, indices: CTensor, out: *mut CTensor) -> c_int;
    fn zb_ln_linear(
        x: CTensor,
        gamma: CTensor,
        beta: CTensor,
        w: CTensor,
        b: CTensor,
        eps: f64,
        parts: i64,
        out: *mut CTensor,
        passed: *mut CTensor,
    ) -> c_int;
    #[allow(clippy::too_many_arguments)]
    fn zb_residual_ln_gelu_mlp(
        x: CTensor,
        gamma: CTensor,
        beta: CTensor,
        w1: CTensor,
        b1: CTensor,
        w2: CTensor,
        b2: CTensor,
        eps: f64,
        out: *mut CTensor,
    ) -> c_int;
}

/// A C++ exception caught by the shim.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ShimError(pub String);

/// Model code returns tch's error: a shim call inside it reports its message that way.
impl From<ShimError> for tch::TchError {
    fn from(e: ShimError) -> Self {
        tch::TchError::Torch(e.0)
    }
}

fn check(rc: c_int) -> Result<(), ShimError> {
    if rc == 0 {
        Ok(())
    } else {
        // SAFETY: zb_last_error returns a pointer to a thread-local NUL-terminated string.
        let msg = unsafe { CStr::from_ptr(zb_last_error()) };
        Err(ShimError(msg.to_string_lossy().into_owned()))
    }
}

/// libtorch's version string, e.g. `2.11.0`.
pub fn torch_version() -> String {
    // SAFETY: a static NUL-terminated string.
    unsafe { CStr::from_ptr(zb_torch_version()) }.to_string_lossy().into_owned()
}

/// Backward from `outputs` with upstream gradients `grads` (same length, same shapes).
pub fn backward(outputs: &[&Tensor], grads: &[&Tensor]) -> Result<(), ShimError> {
    assert_eq!(outputs.len(), grads.len());
    let o: Vec<CTensor> = outputs.iter().map(|t| t.as_ptr() as CTensor).collect();
    let g: Vec<CTensor> = grads.iter().map(|t| t.as_ptr() as CTensor).collect();
    let n = c_int::try_from(o.len()).expect("few outputs");
    // SAFETY: the pointers are live tch tensors for the duration of the call.
    check(unsafe { zb_backward(o.as_ptr(), g.as_ptr(), n) })
}

/// Runs `f` inside a backward pass on `device` (a CUDA index; None: the CPU), on the thread that
/// runs that device's backward passes: libtorch's autograd thread for a GPU, this thread for the
/// CPU, and returns what `f` returned. Backward passes `f` starts run there too, one after
/// another, each a reentrant backward on that thread rather than a hand-over to it and back (on a
/// virtual machine, waking a thread on another CPU is slow: docs/worker.md). This thread waits
/// until `f` has returned; a panic in `f` is resumed here.
pub fn run_in_backward<F: FnOnce() -> R, R>(device: Option<usize>, f: F) -> Result<R, ShimError> {
    /// The function, then what it returned or the panic it raised.
    enum Call<F, R> {
        Ready(F),
        Returned(R),
        Panicked(Box<dyn std::any::Any + Send>),
        Running,
    }
    unsafe extern "C" fn trampoline<F: FnOnce() -> R, R>(data: *mut c_void) -> c_int {
        // SAFETY: `data` is the `Call` below, alive until zb_run_in_backward returns, and only
        // this function touches it meanwhile: the calling thread is blocked in that call.
        let call = unsafe { &mut *data.cast::<Call<F, R>>() };
        let Call::Ready(f) = std::mem::replace(call, Call::Running) else { return -1 };
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
            Ok(r) => {
                *call = Call::Returned(r);
                0
            }
            Err(p) => {
                *call = Call::Panicked(p);
                -1
            }
        }
    }
    let mut call = Call::Ready(f);
    let device = device.map_or(-1, |d| c_int::try_from(d).unwrap_or(c_int::MAX));
    // SAFETY: `call` outlives the call, which returns only after the backward pass (and so `f`)
    // has finished; `f` runs on one thread at a time, with this one waiting for it.
    let rc = unsafe { zb_run_in_backward(device, trampoline::<F, R>, (&mut call as *mut Call<F, R>).cast()) };
    match call {
        Call::Panicked(p) => std::panic::resume_unwind(p),
        Call::Returned(r) => check(rc).map(|()| r),
        Call::Ready(_) | Call::Running => Err(check(rc)
            .err()
            .unwrap_or_else(|| ShimError("the backward pass returned without running the function".into()))),
    }
}

/// Drops the tensor's `.grad`, releasing its memory.
pub fn clear_grad(t: &Tensor) -> Result<(), ShimError> {
    // SAFETY: a live tensor.
    check(unsafe { zb_clear_grad(t.as_ptr() as CTensor) })
}

/// Until [`take_grads`], the nodes of this module ([`residual_linear`], [`ln_linear`],
/// [`residual_ln_gelu_mlp`]) write `param`'s gradient into `buf[offset .. offset + param.numel()]`
/// (a flat buffer of its kind and device), adding to what is there when `accumulate`, instead of
/// returning it to autograd: its `.grad` is then left alone. Other uses of `param` still reach its
/// `.grad`.
pub fn grad_into(param: &Tensor, buf: &Tensor, offset: usize, accumulate: bool) -> Result<(), ShimError> {
    let offset = i64::try_from(offset).map_err(|_| ShimError(format!("a gradient's place: offset {offset}")))?;
    // SAFETY: live tensors; the shim keeps its own reference to `buf`.
    check(unsafe { zb_grad_into(param.as_ptr() as CTensor, buf.as_ptr() as CTensor, offset, c_int::from(accumulate)) })
}

/// Moves the gradients of `params` into the flat `buf`, `params[i]`'s from element `offsets[i]`
/// on, added to what is there when `add`, and ends their places ([`grad_into`]): what the nodes
/// wrote there stays (plus what other uses left in `.grad`), the rest is copied from `.grad`
/// (zeros where none) in one launch. Every `.grad` is dropped. Returns how many the nodes wrote.
pub fn take_grads(params: &[Tensor], offsets: &[usize], buf: &Tensor, add: bool) -> Result<usize, ShimError> {
    assert_eq!(params.len(), offsets.len());
    let p: Vec<CTensor> = params.iter().map(|t| t.as_ptr() as CTensor).collect();
    let o = offsets
        .iter()
        .map(|&o| i64::try_from(o).map_err(|_| ShimError(format!("a gradient's place: offset {o}"))))
        .collect::<Result<Vec<_>, _>>()?;
    let n = c_int::try_from(p.len()).map_err(|_| ShimError(format!("{} parameters in one unit", p.len())))?;
    let mut placed: c_int = 0;
    // SAFETY: live tensors and arrays of `n` elements for the duration of the call.
    check(unsafe { zb_take_grads(p.as_ptr(), o.as_ptr(), n, buf.as_ptr() as CTensor, c_int::from(add), &mut placed) })?;
    Ok(usize::try_from(placed).unwrap_or(0))
}

/// Points the tensor's storage (shared by all its views) at `data`, which the caller owns and
/// keeps alive, and which holds at least `nbytes`.
///
/// # Safety
/// `data` must stay valid, on the tensor's device, for as long as the storage may be read.
pub unsafe fn storage_set(t: &Tensor, data: *mut c_void, nbytes: usize) -> Result<(), ShimError> {
    // SAFETY: forwarded contract.
    check(unsafe { zb_storage_set(t.as_ptr() as CTensor, data, nbytes) })
}

/// Detaches the tensor's storage from any memory (freeing it if the storage owned it).
pub fn storage_release(t: &Tensor) -> Result<(), ShimError> {
    // SAFETY: a live tensor; views keep their metadata, only the data pointer goes.
    check(unsafe { zb_storage_release(t.as_ptr() as CTensor) })
}

/// Gives the CUDA caching allocator's free blocks back to the driver (`emptyCache`).
pub fn cuda_empty_cache() -> Result<(), ShimError> {
    // SAFETY: no arguments; the allocator's own lock guards it.
    check(unsafe { zb_cuda_empty_cache() })
}

/// libtorch's current stream on the calling thread becomes `stream`, a stream of this process's
/// context on CUDA device `device`.
pub fn cuda_set_stream(stream: &cudarc::driver::CudaStream, device: usize) -> Result<(), ShimError> {
    let dev = device_index(device);
    // SAFETY: a live stream of this process's context; libtorch only records the handle (the
    // rank's `Gpu` keeps the stream alive as long as libtorch computes on it).
    check(unsafe { zb_cuda_set_stream(stream.cu_stream().cast(), dev) })
}

/// libtorch's current stream on the calling thread for CUDA device `device` (a CUstream handle,
/// to compare with the streams the worker's own kernels run on).
pub fn cuda_current_stream(device: usize) -> Result<*mut c_void, ShimError> {
    let dev = device_index(device);
    let mut out = std::ptr::null_mut();
    // SAFETY: `out` is a valid place for one pointer; libtorch only reads its stream table.
    check(unsafe { zb_cuda_current_stream(dev, &mut out) })?;
    Ok(out)
}

/// What libtorch allocates on `stream` comes from the private pool `pool` until
/// [`cuda_pool_end`]; each call is one use of the pool, given back by [`cuda_pool_release`].
pub fn cuda_pool_begin(device: usize, pool: u64, stream: &cudarc::driver::CudaStream) -> Result<(), ShimError> {
    let dev = device_index(device);
    // SAFETY: the handle is only compared with the streams libtorch allocates on.
    check(unsafe { zb_cuda_pool_begin(dev, pool, stream.cu_stream().cast()) })
}

/// Ends [`cuda_pool_begin`]: allocations go to the allocator's shared pools again.
pub fn cuda_pool_end(device: usize, pool: u64) -> Result<(), ShimError> {
    let dev = device_index(device);
    // SAFETY: no pointers.
    check(unsafe { zb_cuda_pool_end(dev, pool) })
}

/// Gives back one use of private pool `pool`; after the last its memory is the allocator's again.
pub fn cuda_pool_release(device: usize, pool: u64) -> Result<(), ShimError> {
    let dev = device_index(device);
    // SAFETY: no pointers.
    check(unsafe { zb_cuda_pool_release(dev, pool) })
}

/// Starts libtorch's profiler (Kineto) on this thread: every operator on the host, and with
/// `cuda` every CUDA kernel and copy.
pub fn profiler_start(cuda: bool) -> Result<(), ShimError> {
    // SAFETY: no pointers; libtorch keeps the profiler's state.
    check(unsafe { zb_profiler_start(c_int::from(cuda)) })
}

/// Stops the profiler [`profiler_start`] started and writes its Chrome trace to `path`.
pub fn profiler_stop(path: &std::path::Path) -> Result<(), ShimError> {
    let c = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| ShimError(format!("a NUL byte in {}", path.display())))?;
    // SAFETY: `c` is a NUL-terminated string that outlives the call.
    check(unsafe { zb_profiler_stop(c.as_ptr()) })
}

/// A CUDA device index as the shim takes it.
fn device_index(device: usize) -> c_int {
    c_int::try_from(device).expect("small device index")
}

/// The caching allocator's statistics for a CUDA device.
pub fn cuda_stats(device: usize) -> Result<CudaStats, ShimError> {
    let mut s = CudaStats::default();
    let dev = device_index(device);
    // SAFETY: `s` is a valid out-pointer.
    check(unsafe { zb_cuda_stats(dev, &mut s) })?;
    Ok(s)
}

pub fn cuda_reset_peak(device: usize) -> Result<(), ShimError> {
    let dev = device_index(device);
    // SAFETY: plain call.
    check(unsafe { zb_cuda_reset_peak(dev) })
}

/// MPI_IN_PLACE of the MPI this binary links.
pub fn mpi_in_place() -> *mut c_void {
    // SAFETY: returns a constant.
    unsafe { zb_mpi_in_place() }
}

/// A CPU tensor of `n` zeros of `kind` (fp32, bf16 or fp16) whose memory, from 2 MiB up, is a
/// fresh anonymous mapping starting on a 2 MiB boundary, advised into transparent huge pages
/// (`MADV_HUGEPAGE`) and not yet touched: the kernel zeroes each page as it is first faulted in.
/// It is unmapped with the tensor.
pub fn host_zeros(n: i64, kind: Kind) -> Result<Tensor, ShimError> {
    // c10::ScalarType's values, which tch keeps private.
    let scalar_type = match kind {
        Kind::Half => 5,
        Kind::Float => 6,
        Kind::BFloat16 => 15,
        k => return Err(ShimError(format!("host tensors of {k:?} are not offloaded"))),
    };
    let mut out = std::ptr::null_mut();
    // SAFETY: `out` is a valid out-pointer.
    check(unsafe { zb_host_zeros(n, scalar_type, &mut out) })?;
    // SAFETY: on success the shim wrote a new tensor there.
    Ok(unsafe { owned(out) })
}

/// The tensor a shim call left in `out`.
///
/// # Safety
/// `out` must be what the shim wrote on success: a heap-allocated `at::Tensor`, which tch owns and
/// frees from here.
unsafe fn owned(out: CTensor) -> Tensor {
    // SAFETY: as the caller promises.
    unsafe { Tensor::from_ptr(out.cast()) }
}

/// `res + x·wᵀ + b` over the last dimension (a sub-block's output projection and its residual
/// addition), as one autograd node: on 16-bit CUDA tensors one matrix product adds the residual in
/// its epilogue (`model::products_cuda`), and the bias gradient is the worker's column-sum kernel
/// (`model::recompute_cuda`).
pub fn residual_linear(res: &Tensor, x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor, ShimError> {
    let p = |t: &Tensor| t.as_ptr() as CTensor;
    let mut out = std::ptr::null_mut();
    // SAFETY: live tensors and a valid out-pointer.
    check(unsafe { zb_residual_linear(p(res), p(x), p(w), p(b), &mut out) })?;
    // SAFETY: on success the shim wrote a new tensor there.
    Ok(unsafe { owned(out) })
}

/// `loss` (a value without history) as an autograd node whose backward gives `h` and `w` the
/// gradients `gh` and `gw` (their shapes) times the upstream gradient: for a loss whose gradients
/// were computed beside it, as the LM head's are.
pub fn given_grads(loss: &Tensor, h: &Tensor, w: &Tensor, gh: &Tensor, gw: &Tensor) -> Result<Tensor, ShimError> {
    let p = |t: &Tensor| t.as_ptr() as CTensor;
    let mut out = std::ptr::null_mut();
    // SAFETY: live tensors and a valid out-pointer.
    check(unsafe { zb_given_grads(p(loss), p(h), p(w), p(gh), p(gw), &mut out) })?;
    // SAFETY: on success the shim wrote a new tensor there.
    Ok(unsafe { owned(out) })
}

/// `w[indices]` (an embedding lookup) as an autograd node whose backward adds the output
/// gradient's rows to `w`'s gradient where it already lies: in `.grad`, or in the place the engine
/// gave it ([`grad_into`]) after the tied LM head's product. The same bits either way; where
/// neither holds a gradient of this micro-step, the rows' sum goes to autograd as a gradient of
/// its own.
pub fn embedding(w: &Tensor, indices: &Tensor) -> Result<Tensor, ShimError> {
    let p = |t: &Tensor| t.as_ptr() as CTensor;
    let mut out = std::ptr::null_mut();
    // SAFETY: live tensors and a valid out-pointer.
    check(unsafe { zb_embedding(p(w), p(indices), &mut out) })?;
    // SAFETY: on success the shim wrote a new tensor there.
    Ok(unsafe { owned(out) })
}

/// What [`ln_linear`] returns: the product, and `x` passed on for the residual addition after the
/// sub-block.
#[derive(Debug)]
pub struct LnLinear {
    /// `linear(layer_norm(x, gamma, beta, eps), w, b)` as the equal blocks of its columns asked
    /// for (views of one output; GPT-2's q, k and v): the node joins their gradients itself, with
    /// the bias gradient's column sums in the same pass on CUDA.
    pub y: Vec<Tensor>,
    /// `x`, as the node's last output (a view of it): its gradient reaches the node's backward,
    /// which adds it to `x`'s in the layer norm's backward kernel. Take the residual from here,
    /// not from `x`, or autograd sums the two gradients in a kernel of its own.
    pub residual: Tensor,
}

/// `linear(layer_norm(x, gamma, beta, eps), w, b)` over the last dimension in `parts` blocks of
/// its columns (at least one, dividing `w`'s rows), as one autograd node whose backward recomputes
/// the normalised `x` (`model::recompute` says why), with `x` passed on for the residual addition
/// ([`LnLinear`]).
pub fn ln_linear(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    w: &Tensor,
    b: &Tensor,
    eps: f64,
    parts: usize,
) -> Result<LnLinear, ShimError> {
    let p = |t: &Tensor| t.as_ptr() as CTensor;
    let mut out = vec![std::ptr::null_mut(); parts];
    let mut passed = std::ptr::null_mut();
    let n = i64::try_from(parts).map_err(|_| ShimError(format!("ln_linear: {parts} parts")))?;
    // SAFETY: live tensors and valid out-pointers, `parts` of them for the blocks.
    check(unsafe { zb_ln_linear(p(x), p(gamma), p(beta), p(w), p(b), eps, n, out.as_mut_ptr(), &mut passed) })?;
    // SAFETY: on success the shim wrote a new tensor to each.
    Ok(unsafe { LnLinear { y: out.into_iter().map(|t| owned(t)).collect(), residual: owned(passed) } })
}

/// Hands the nodes [`residual_linear`], [`ln_linear`] and [`residual_ln_gelu_mlp`] kernels of the
/// worker's own (the shim copies the table; set once, before any forward pass).
pub fn set_node_kernels(k: NodeKernelFns) {
    // SAFETY: a valid table; the shim only copies it (and cannot fail beyond allocating).
    let _ = unsafe { zb_set_node_kernels(&k) };
}

/// A layer norm's parameters and an MLP's: `[gamma, beta, w1, b1, w2, b2]`.
pub type LnMlpParams<'a> = [&'a Tensor; 6];

/// `x + linear(gelu_tanh(linear(layer_norm(x, gamma, beta, eps), w1, b1)), w2, b2)` over the last
/// dimension (GPT-2's MLP sub-block with its residual addition), as one autograd node whose
/// backward recomputes the normalised `x` and the GELU's output (see `model::recompute`); on 16-bit
/// CUDA tensors the GELU and the residual addition run in the products' epilogues
/// (`model::products_cuda`).
pub fn residual_ln_gelu_mlp(x: &Tensor, params: LnMlpParams<'_>, eps: f64) -> Result<Tensor, ShimError> {
    let p = |t: &Tensor| t.as_ptr() as CTensor;
    let [gamma, beta, w1, b1, w2, b2] = params;
    let mut out = std::ptr::null_mut();
    // SAFETY: live tensors and a valid out-pointer.
    check(unsafe { zb_residual_ln_gelu_mlp(p(x), p(gamma), p(beta), p(w1), p(b1), p(w2), p(b2), eps, &mut out) })?;
    // SAFETY: on success the shim wrote a new tensor there.
    Ok(unsafe { owned(out) })
}

/// A client of c10d's `TCPStore` (and, on rank 0, its server): a key-value store every rank of an
/// environment-launched run reaches at `MASTER_ADDR:MASTER_PORT`.
pub struct TcpStore(*mut c_void);

// SAFETY: TCPStore's client serialises its requests under its own lock; the pointer is owned.
unsafe impl Send for TcpStore {}
// SAFETY: as above: every method of TCPStore may be called from any thread.
unsafe impl Sync for TcpStore {}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn c_string(what: &str, s: &str) -> Result<CString, ShimError> {
    CString::new(s).map_err(|_| ShimError(format!("{what} {s:?} holds a NUL byte")))
}

impl TcpStore {
    /// Connects to the store at `host:port`, hosting it first when `server`; returns once all
    /// `world` ranks have connected (the server) or this one has (a client), or fails at `timeout`.
    pub fn open(host: &str, port: u16, server: bool, world: u32, timeout: Duration) -> Result<Self, ShimError> {
        let host = c_string("host", host)?;
        let world = c_int::try_from(world).map_err(|_| ShimError(format!("{world} ranks are too many")))?;
        let mut out = std::ptr::null_mut();
        // SAFETY: `host` is NUL-terminated and outlives the call; `out` is a valid out-pointer.
        check(unsafe { zb_store_open(host.as_ptr(), port, c_int::from(server), world, millis(timeout), &mut out) })?;
        Ok(Self(out))
    }

    pub fn set(&self, key: &str, value: &[u8]) -> Result<(), ShimError> {
        let key = c_string("key", key)?;
        // SAFETY: a live store; `value` is readable for its length.
        check(unsafe { zb_store_set(self.0, key.as_ptr(), value.as_ptr(), value.len()) })
    }

    /// The value of `key`, once some rank has set it (at most `cap` bytes), or an error at the
    /// store's timeout.
    pub fn get(&self, key: &str, cap: usize) -> Result<Vec<u8>, ShimError> {
        let key = c_string("key", key)?;
        let mut buf = vec![0u8; cap];
        let mut len = 0usize;
        // SAFETY: a live store; `buf` is writable for `cap` bytes; `len` is a valid out-pointer.
        check(unsafe { zb_store_get(self.0, key.as_ptr(), buf.as_mut_ptr(), cap, &mut len) })?;
        buf.truncate(len);
        Ok(buf)
    }
}

impl Drop for TcpStore {
    fn drop(&mut self) {
        // SAFETY: the pointer came from zb_store_open and is dropped once.
        unsafe { zb_store_close(self.0) }
    }
}

/// c10d's `ProcessGroupGloo`: collectives on CPU tensors between ranks that met at a [`TcpStore`].
/// Each call returns once the collective has completed on this rank.
pub struct GlooGroup(*mut c_void);

// SAFETY: the pointer is owned; ProcessGroupGloo queues work from any thread under its own lock.
unsafe impl Send for GlooGroup {}

fn rank_int(what: &str, v: usize) -> Result<c_int, ShimError> {
    c_int::try_from(v).map_err(|_| ShimError(format!("{what} {v} is too large")))
}

impl GlooGroup {
    /// Connects the `size` ranks of a group (this one `rank`), which meet under `prefix` in
    /// `store` and listen on `host`'s address. Connecting may take `connect`, each collective
    /// after it `op`.
    pub fn open(
        store: &TcpStore,
        prefix: &str,
        host: &str,
        rank: usize,
        size: usize,
        connect: Duration,
        op: Duration,
    ) -> Result<Self, ShimError> {
        let (prefix, host) = (c_string("store prefix", prefix)?, c_string("host", host)?);
        let (rank, size) = (rank_int("rank", rank)?, rank_int("group size", size)?);
        let mut out = std::ptr::null_mut();
        // SAFETY: a live store; NUL-terminated strings that outlive the call; a valid out-pointer.
        check(unsafe {
            zb_gloo_open(store.0, prefix.as_ptr(), host.as_ptr(), rank, size, millis(connect), millis(op), &mut out)
        })?;
        Ok(Self(out))
    }

    /// `buf` := the sum over ranks of `buf` (a contiguous CPU tensor).
    pub fn all_reduce(&mut self, buf: &Tensor) -> Result<(), ShimError> {
        // SAFETY: a live group and a live tensor.
        check(unsafe { zb_gloo_all_reduce(self.0, buf.as_ptr() as CTensor) })
    }

    /// `output` := this rank's slice of the sum over ranks of `input`; `output` may be that slice.
    pub fn reduce_scatter(&mut self, input: &Tensor, output: &Tensor) -> Result<(), ShimError> {
        // SAFETY: a live group and live tensors.
        check(unsafe { zb_gloo_reduce_scatter(self.0, input.as_ptr() as CTensor, output.as_ptr() as CTensor) })
    }

    /// `output` := every rank's `input` in rank order; `input` may be this rank's slice of it.
    pub fn all_gather(&mut self, input: &Tensor, output: &Tensor) -> Result<(), ShimError> {
        // SAFETY: a live group and live tensors.
        check(unsafe { zb_gloo_all_gather(self.0, input.as_ptr() as CTensor, output.as_ptr() as CTensor) })
    }

    /// `buf` := `buf` of rank `root`.
    pub fn broadcast(&mut self, buf: &Tensor, root: usize) -> Result<(), ShimError> {
        let root = rank_int("root", root)?;
        // SAFETY: a live group and a live tensor.
        check(unsafe { zb_gloo_broadcast(self.0, buf.as_ptr() as CTensor, root) })
    }
}

impl Drop for GlooGroup {
    fn drop(&mut self) {
        // SAFETY: the pointer came from zb_gloo_open and is dropped once.
        unsafe { zb_gloo_close(self.0) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Kind;

    /// The function runs inside a backward pass with gradients on: it can build a graph and run
    /// a backward pass of its own, whose gradients land.
    #[test]
    fn a_function_run_in_backward_can_run_backward_itself() {
        let w = Tensor::from_slice(&[2.0f32, 3.0]).set_requires_grad(true);
        let ran = run_in_backward(None, || {
            (&w * &w).sum(Kind::Float).backward();
            "ran"
        });
        assert_eq!(ran.unwrap(), "ran");
        assert_eq!(Vec::<f32>::try_from(w.grad()).unwrap(), [4.0, 6.0]);
    }

    /// On the CPU the backward pass, and so the function, runs on the calling thread (for a GPU,
    /// on libtorch's autograd thread: the GPU self-check's concern).
    #[test]
    fn on_the_cpu_the_function_runs_on_the_calling_thread() {
        let ran_on = run_in_backward(None, || std::thread::current().id()).unwrap();
        assert_eq!(ran_on, std::thread::current().id());
    }

    /// What the function returns comes back as it was: the trainer's failures keep their class.
    #[test]
    fn what_the_function_returns_reaches_the_caller_unchanged() {
        let r: Result<Result<u8, std::io::ErrorKind>, ShimError> =
            run_in_backward(None, || Err(std::io::ErrorKind::OutOfMemory));
        assert_eq!(r.unwrap(), Err(std::io::ErrorKind::OutOfMemory));
    }

    #[test]
    fn a_panic_in_backward_reaches_the_caller() {
        let r = std::panic::catch_unwind(|| run_in_backward(None, || -> u8 { panic!("inside") }));
        let p = r.unwrap_err();
        assert_eq!(p.downcast_ref::<&str>(), Some(&"inside"));
    }
}
