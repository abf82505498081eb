//! Choosing the compute device.
//!
//! The binary links libtorch_cpu only (the linker drops libtorch_cuda.so, which nothing references
//! by name), so CUDA looks absent until libtorch_cuda.so is loaded. When a GPU may be used, it is
//! loaded at start and kept loaded for the life of the process; the same binary still runs on hosts
//! without CUDA.

use std::sync::OnceLock;

use tch::Device;
use zerobench_schema::config::DeviceRequest;

static LIBTORCH_CUDA: OnceLock<Option<libloading::Library>> = OnceLock::new();

/// Loads libtorch_cuda.so once; returns whether CUDA is usable afterwards.
fn cuda_available() -> bool {
    let lib = LIBTORCH_CUDA.get_or_init(|| {
        // SAFETY: loading libtorch's own CUDA library runs its static initialisers, which register
        // the CUDA backend with the already-loaded libtorch_cpu/libc10; this is what libtorch does
        // itself when linked normally.
        unsafe { libloading::Library::new("libtorch_cuda.so") }.ok()
    });
    lib.is_some() && tch::Cuda::is_available()
}

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("--device cuda was requested but no CUDA device is usable (libtorch_cuda.so not loadable or no GPU)")]
    NoCuda,
}

/// The device this rank computes on. Each rank sees only its own GPU (see
/// `cuda::bind_local_gpu`), so a GPU is always ordinal 0.
pub fn select(request: DeviceRequest) -> Result<Device, DeviceError> {
    let want_cuda = match request {
        DeviceRequest::Cpu => false,
        DeviceRequest::Cuda => {
            if !cuda_available() {
                return Err(DeviceError::NoCuda);
            }
            true
        }
        DeviceRequest::Auto => cuda_available(),
    };
    if !want_cuda {
        return Ok(Device::Cpu);
    }
    Ok(Device::Cuda(0))
}
