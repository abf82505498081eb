//! CUDA graphs of libtorch's work: what the compute stream is given between the start and the end
//! of a capture becomes a graph that replays those kernels, copies and memsets with one launch,
//! on the same buffers.
//!
//! Everything libtorch allocates during a capture comes from a private pool of the caching
//! allocator (as `at::cuda::CUDAGraph` arranges it), which nothing outside the pool's graphs uses,
//! so the memory a replay writes stays theirs between replays. Graphs sharing a pool must replay
//! in the order they were captured (a block one freed, a later one may reuse). The pool keeps its
//! memory until it is dropped, after its graphs.
//!
//! What a capture cannot hold fails it: a synchronisation with the host (reading a value, a
//! pageable copy), work on the legacy stream, a stream that does not join back. The capture then
//! ends with the error, and nothing of it runs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::CudaGraph;

use super::cuda::Gpu;
use super::shim;

/// Pool ids of this process: far above the ones libtorch's own pools count up from 1.
static NEXT_POOL: AtomicU64 = AtomicU64::new(1 << 48);

#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    #[error("the work could not be captured into a CUDA graph: {0}")]
    Capture(String),
    #[error("the caching allocator's pool: {0}")]
    Pool(String),
}

/// A private pool of the caching allocator and the graphs captured into it.
pub struct GraphPool {
    gpu: Arc<Gpu>,
    id: u64,
    /// Captures begun: each holds one use of the pool.
    uses: u32,
}

impl GraphPool {
    pub fn new(gpu: Arc<Gpu>) -> Self {
        Self { gpu, id: NEXT_POOL.fetch_add(1, Ordering::Relaxed), uses: 0 }
    }

    /// Captures what `work` issues on the compute stream (from any thread, as the autograd engine
    /// does) into a graph, without running it; `work`'s result comes back beside it. Tensors
    /// `work` allocates live in this pool. Where `work` fails, its own error comes back (an
    /// allocation that does not fit stays an out-of-memory error, say).
    pub fn capture<T, E: From<GraphError>>(
        &mut self,
        work: impl FnOnce() -> Result<T, E>,
    ) -> Result<(CudaGraph, T), E> {
        // Before the capture starts, so that no free of the autograd engine's threads records an
        // event on a stream that already captures (at::cuda::CUDAGraph's order).
        shim::cuda_pool_begin(self.gpu.ordinal, self.id, &self.gpu.compute).map_err(|e| GraphError::Pool(e.0))?;
        self.uses += 1;
        let captured = self.capture_on_stream(work);
        let pool_end = shim::cuda_pool_end(self.gpu.ordinal, self.id);
        let captured = captured?;
        pool_end.map_err(|e| GraphError::Pool(e.0))?;
        Ok(captured)
    }

    /// The capture itself, always ended once begun so the stream leaves capture mode.
    fn capture_on_stream<T, E: From<GraphError>>(
        &self,
        work: impl FnOnce() -> Result<T, E>,
    ) -> Result<(CudaGraph, T), E> {
        let stream = &self.gpu.compute;
        let capture_err = |e: cudarc::driver::DriverError| GraphError::Capture(e.to_string());
        stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL).map_err(capture_err)?;
        let value = work();
        // libtorch's allocations during the capture are not graph allocations, so the flag
        // changes nothing for them; cudarc wants one.
        let ended = stream.end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
        let value = value?;
        match ended.map_err(capture_err)? {
            Some(graph) => Ok((graph, value)),
            None => Err(GraphError::Capture("nothing was captured".into()).into()),
        }
    }

    /// Replays `graph` on the compute stream (asynchronously, as any launch).
    pub fn replay(&self, graph: &CudaGraph) -> Result<(), GraphError> {
        graph.launch().map_err(|e| GraphError::Capture(e.to_string()))
    }
}

impl Drop for GraphPool {
    fn drop(&mut self) {
        // Replays still running read and write the pool: they finish first.
        let _ = self.gpu.synchronize();
        for _ in 0..self.uses {
            let _ = shim::cuda_pool_release(self.gpu.ordinal, self.id);
        }
    }
}
