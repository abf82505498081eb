//! Safe wrappers over `shim/torch_shim.cpp` (what tch 0.24 lacks) and `shim/mpi_shim.c`.

use std::ffi::{c_char, c_int, c_void, CStr};

use tch::Tensor;

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

// The shim's functions take `at::Tensor*`, which is what tch's `Tensor::as_ptr` returns.
type CTensor = *mut c_void;

extern "C" {
    fn zb_last_error() -> *const c_char;
    fn zb_torch_version() -> *const c_char;
    fn zb_backward(outputs: *const CTensor, grads: *const CTensor, n: c_int) -> c_int;
    fn zb_clear_grad(t: CTensor) -> c_int;
    fn zb_storage_set(t: CTensor, data: *mut c_void, nbytes: usize) -> c_int;
    fn zb_storage_release(t: CTensor) -> c_int;
    fn zb_cuda_stats(device: c_int, out: *mut CudaStats) -> c_int;
    fn zb_cuda_reset_peak(device: c_int) -> c_int;
    fn zb_mpi_in_place() -> *mut c_void;
}

/// A C++ exception caught by the shim.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ShimError(pub String);

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

/// Drops the tensor's `.grad`, releasing its memory.
pub fn clear_grad(t: &Tensor) -> Result<(), ShimError> {
    // SAFETY: a live tensor.
    check(unsafe { zb_clear_grad(t.as_ptr() as CTensor) })
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

/// The caching allocator's statistics for a CUDA device.
pub fn cuda_stats(device: usize) -> Result<CudaStats, ShimError> {
    let mut s = CudaStats::default();
    let dev = c_int::try_from(device).expect("small device index");
    // SAFETY: `s` is a valid out-pointer.
    check(unsafe { zb_cuda_stats(dev, &mut s) })?;
    Ok(s)
}

pub fn cuda_reset_peak(device: usize) -> Result<(), ShimError> {
    let dev = c_int::try_from(device).expect("small device index");
    // SAFETY: plain call.
    check(unsafe { zb_cuda_reset_peak(dev) })
}

/// MPI_IN_PLACE of the MPI this binary links.
pub fn mpi_in_place() -> *mut c_void {
    // SAFETY: returns a constant.
    unsafe { zb_mpi_in_place() }
}
