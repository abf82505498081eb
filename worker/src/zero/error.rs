//! What can stop the engine.

use tch::TchError;

use crate::comm::CommError;
use crate::metrics::clock::ClockError;
use crate::runtime::pinned::PinError;
use crate::runtime::shim::ShimError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Torch(#[from] TchError),
    #[error(transparent)]
    Comm(#[from] CommError),
    #[error("libtorch shim: {0}")]
    Shim(#[from] ShimError),
    #[error("{0}")]
    Offload(String),
    #[error(transparent)]
    Pin(#[from] PinError),
    #[error(transparent)]
    Clock(#[from] ClockError),
    #[error("CUDA: {0}")]
    Cuda(#[from] cudarc::driver::DriverError),
}
