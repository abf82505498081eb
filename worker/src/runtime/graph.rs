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
//!
//! Before a captured graph is instantiated, its small memset nodes become kernel nodes that write
//! the same values ([`FILL_SOURCE`]). cuBLAS clears a few bytes of its workspace before most of its
//! matrix products (387 memsets of 4 bytes in a gpt2-xl step); replayed, each memset node cost the
//! step about 4 µs of idle GPU (1.5 µs between the kernel before it and the memset, 2.6 µs after
//! it, where a kernel node after a kernel node waits under 0.5 µs; one profiled replay on an
//! H200), and a kernel that writes the same bytes takes about 1 µs (median 1.03 µs there).

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys::{self, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{result, CudaStream, DriverError};

use super::cuda::Gpu;
use super::kernels;
use super::shim;

/// Pool ids of this process: far above the ones libtorch's own pools count up from 1.
static NEXT_POOL: AtomicU64 = AtomicU64::new(1 << 48);

#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    #[error("the work could not be captured into a CUDA graph: {0}")]
    Capture(String),
    #[error("the caching allocator's pool: {0}")]
    Pool(String),
    #[error("the captured graph's memsets as kernels: {0}")]
    Fill(String),
}

/// The kernel that stands for a memset node: `width` elements of `esize` bytes (1, 2 or 4) of
/// each of `height` rows `pitch` bytes apart, from `dst`, set to the low `esize` bytes of
/// `value` (what `cuMemsetD2D8/16/32` write).
pub const FILL_SOURCE: &str = r#"
extern "C" __global__ void graph_fill(unsigned long long dst, unsigned long long pitch, unsigned int value,
                                      unsigned int esize, unsigned long long width, unsigned long long height) {
  const unsigned long long n = width * height;
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x) {
    const unsigned long long at = dst + (i / width) * pitch + (i % width) * esize;
    if (esize == 4) *reinterpret_cast<unsigned int*>(at) = value;
    else if (esize == 2) *reinterpret_cast<unsigned short*>(at) = (unsigned short)value;
    else *reinterpret_cast<unsigned char*>(at) = (unsigned char)value;
  }
}
"#;

/// Memsets of at most this many bytes become kernel nodes; larger ones, which the copy engines
/// write at their bandwidth, stay.
pub const FILL_MAX_BYTES: usize = 1 << 16;

/// Threads per block of [`FILL_SOURCE`]'s kernel; its grid has at most [`FILL_MAX_BYTES`] / 256
/// blocks, a thread per element.
const FILL_THREADS: u32 = 256;

/// [`FILL_SOURCE`] loaded into the GPU's context, once per process (a rank has one GPU).
struct FillKernel {
    _module: sys::CUmodule,
    function: sys::CUfunction,
}

// SAFETY: a module and function handle of the process's context, only read after loading.
unsafe impl Send for FillKernel {}
// SAFETY: as for `Send`: nothing mutates them.
unsafe impl Sync for FillKernel {}

static FILL: OnceLock<Result<FillKernel, String>> = OnceLock::new();

fn fill_kernel(gpu: &Gpu) -> Result<sys::CUfunction, GraphError> {
    let loaded = FILL.get_or_init(|| {
        let load = || -> Result<FillKernel, String> {
            let arch = gpu.ctx.compute_capability().map_err(|e| e.to_string())?;
            let ptx = kernels::compile(FILL_SOURCE, arch).map_err(|e| e.to_string())?;
            let image = std::ffi::CString::new(ptx.to_src()).map_err(|e| e.to_string())?;
            gpu.ctx.bind_to_thread().map_err(|e| e.to_string())?;
            // SAFETY: a NUL-terminated PTX image; the module stays loaded for the process.
            let module = unsafe { result::module::load_data(image.as_ptr().cast()) }.map_err(|e| e.to_string())?;
            let name = std::ffi::CString::new("graph_fill").expect("no NUL");
            // SAFETY: a module just loaded, and one of its entries.
            let function = unsafe { result::module::get_function(module, name) }.map_err(|e| e.to_string())?;
            Ok(FillKernel { _module: module, function })
        };
        load()
    });
    loaded.as_ref().map(|k| k.function).map_err(|e| GraphError::Fill(e.clone()))
}

/// A graph captured from the compute stream (its small memsets as kernels), instantiated.
pub struct Graph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    stream: Arc<CudaStream>,
    /// Memset nodes the capture held that now are kernel nodes.
    pub memsets_as_kernels: usize,
    /// Why the rewrite stopped early, if it did (the rest stayed memsets).
    pub kept_memsets: Option<String>,
}

// SAFETY: graph handles may be launched and destroyed from any thread bound to their context.
unsafe impl Send for Graph {}

impl Drop for Graph {
    fn drop(&mut self) {
        let _ = self.stream.context().bind_to_thread();
        // SAFETY: handles this value owns, destroyed once.
        unsafe {
            let _ = sys::cuGraphExecDestroy(self.exec);
            let _ = sys::cuGraphDestroy(self.graph);
        }
    }
}

/// A driver call's result as a `Result`.
fn check(r: sys::CUresult) -> Result<(), GraphError> {
    r.result().map_err(|e: DriverError| GraphError::Fill(e.to_string()))
}

/// The nodes a query of `f` lists (a count first, then the nodes).
fn nodes(f: impl Fn(*mut sys::CUgraphNode, *mut usize) -> sys::CUresult) -> Result<Vec<sys::CUgraphNode>, GraphError> {
    let mut n = 0usize;
    check(f(std::ptr::null_mut(), &mut n))?;
    if n == 0 {
        return Ok(Vec::new());
    }
    let mut out = vec![std::ptr::null_mut(); n];
    check(f(out.as_mut_ptr(), &mut n))?;
    out.truncate(n);
    Ok(out)
}

/// The edges a query of `f` lists: the nodes at their other ends and each edge's data.
type Edges = Vec<(sys::CUgraphNode, sys::CUgraphEdgeData)>;

fn edges(
    f: impl Fn(*mut sys::CUgraphNode, *mut sys::CUgraphEdgeData, *mut usize) -> sys::CUresult,
) -> Result<Edges, GraphError> {
    let mut n = 0usize;
    check(f(std::ptr::null_mut(), std::ptr::null_mut(), &mut n))?;
    if n == 0 {
        return Ok(Vec::new());
    }
    let mut ends = vec![std::ptr::null_mut(); n];
    // SAFETY: plain bytes, for which zero is a valid value (a default edge).
    let mut data = vec![unsafe { std::mem::zeroed::<sys::CUgraphEdgeData>() }; n];
    check(f(ends.as_mut_ptr(), data.as_mut_ptr(), &mut n))?;
    Ok(ends.into_iter().zip(data).take(n).collect())
}

/// Replaces every memset node of `graph` of at most [`FILL_MAX_BYTES`] by a node of `fill` that
/// writes the same bytes, with the same edges to the nodes before and after it. A node it cannot
/// replace stays a memset (the kernel node added for it is removed again) and ends the rewrite:
/// the graph is whole either way. Returns how many it replaced, and the error that ended it early.
///
/// # Safety
/// `graph` is a graph of the current context, not instantiated yet; `fill` is [`FILL_SOURCE`]'s
/// kernel in that context.
unsafe fn memsets_as_kernels(graph: sys::CUgraph, fill: sys::CUfunction) -> (usize, Option<GraphError>) {
    // SAFETY: the caller's graph; the query writes into a buffer sized by the count it gave.
    let all = match nodes(|out, n| unsafe { sys::cuGraphGetNodes(graph, out, n) }) {
        Ok(all) => all,
        Err(e) => return (0, Some(e)),
    };
    let mut replaced = 0;
    for node in all {
        // SAFETY: the caller's: a node of a graph of the current context, not instantiated.
        match unsafe { memset_as_kernel(graph, node, fill) } {
            Ok(true) => replaced += 1,
            Ok(false) => {}
            Err(e) => return (replaced, Some(e)),
        }
    }
    (replaced, None)
}

/// [`memsets_as_kernels`] for one node: whether it was a memset it replaced.
///
/// # Safety
/// As [`memsets_as_kernels`]; `node` is one of `graph`'s.
unsafe fn memset_as_kernel(
    graph: sys::CUgraph,
    node: sys::CUgraphNode,
    fill: sys::CUfunction,
) -> Result<bool, GraphError> {
    // SAFETY: the caller's; every query writes into buffers sized by the count it gave first, and
    // the kernel node's parameters are copied when the node is added.
    unsafe {
        let mut kind = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
        check(sys::cuGraphNodeGetType(node, &mut kind))?;
        if kind != sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEMSET {
            return Ok(false);
        }
        let mut m: sys::CUDA_MEMSET_NODE_PARAMS = std::mem::zeroed();
        check(sys::cuGraphMemsetNodeGetParams(node, &mut m))?;
        let elements = m.width * m.height;
        if !matches!(m.elementSize, 1 | 2 | 4) || elements == 0 || elements * m.elementSize as usize > FILL_MAX_BYTES {
            return Ok(false);
        }
        let before = edges(|out, data, n| sys::cuGraphNodeGetDependencies_v2(node, out, data, n))?;
        let after = edges(|out, data, n| sys::cuGraphNodeGetDependentNodes_v2(node, out, data, n))?;
        let (mut dst, mut pitch, mut value, mut esize, mut width, mut height) =
            (m.dst, m.pitch as u64, m.value, m.elementSize, m.width as u64, m.height as u64);
        let mut args: [*mut c_void; 6] = [
            (&mut dst as *mut u64).cast(),
            (&mut pitch as *mut u64).cast(),
            (&mut value as *mut u32).cast(),
            (&mut esize as *mut u32).cast(),
            (&mut width as *mut u64).cast(),
            (&mut height as *mut u64).cast(),
        ];
        let mut p: sys::CUDA_KERNEL_NODE_PARAMS = std::mem::zeroed();
        p.func = fill;
        p.gridDimX = (elements as u32).div_ceil(FILL_THREADS);
        (p.gridDimY, p.gridDimZ) = (1, 1);
        (p.blockDimX, p.blockDimY, p.blockDimZ) = (FILL_THREADS, 1, 1);
        p.kernelParams = args.as_mut_ptr();
        let mut kernel: sys::CUgraphNode = std::ptr::null_mut();
        check(sys::cuGraphAddKernelNode_v2(&mut kernel, graph, std::ptr::null(), 0, &p))?;
        let joined = before
            .iter()
            .try_for_each(|(from, data)| check(sys::cuGraphAddDependencies_v2(graph, from, &kernel, data, 1)))
            .and_then(|()| {
                after
                    .iter()
                    .try_for_each(|(to, data)| check(sys::cuGraphAddDependencies_v2(graph, &kernel, to, data, 1)))
            });
        if let Err(e) = joined {
            // The memset node still has all its edges: the graph is as captured without the kernel.
            let _ = sys::cuGraphDestroyNode(kernel);
            return Err(e);
        }
        check(sys::cuGraphDestroyNode(node))?;
        Ok(true)
    }
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
    pub fn capture<T, E: From<GraphError>>(&mut self, work: impl FnOnce() -> Result<T, E>) -> Result<(Graph, T), E> {
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

    /// The capture itself, always ended once begun so the stream leaves capture mode; then its
    /// small memsets become kernels and it is instantiated.
    fn capture_on_stream<T, E: From<GraphError>>(&self, work: impl FnOnce() -> Result<T, E>) -> Result<(Graph, T), E> {
        let stream = &self.gpu.compute;
        let capture_err = |e: DriverError| GraphError::Capture(e.to_string());
        // Loaded before the capture: loading a module is not allowed while a stream captures.
        let fill = fill_kernel(&self.gpu)?;
        stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL).map_err(capture_err)?;
        let value = work();
        stream.context().bind_to_thread().map_err(capture_err)?;
        // SAFETY: the stream began capturing above; the graph it returns is this value's.
        let ended = unsafe { result::stream::end_capture(stream.cu_stream()) };
        let (value, graph) = match (value, ended) {
            (Ok(v), Ok(g)) if !g.is_null() => (v, g),
            (value, ended) => {
                if let Ok(g) = ended {
                    if !g.is_null() {
                        // SAFETY: the graph the capture returned, not instantiated, dropped here.
                        unsafe {
                            let _ = sys::cuGraphDestroy(g);
                        }
                    }
                }
                // `work`'s own error first: the capture's is often only its consequence.
                value?;
                ended.map_err(capture_err)?;
                return Err(GraphError::Capture("nothing was captured".into()).into());
            }
        };
        // SAFETY: a graph just captured in the current context, not instantiated; `fill` is the
        // fill kernel of that context.
        let (memsets_as_kernels, stopped) = unsafe { memsets_as_kernels(graph, fill) };
        let kept_memsets = stopped.map(|e| e.to_string());
        if let Some(e) = &kept_memsets {
            tracing::warn!(replaced = memsets_as_kernels, "a captured graph keeps memset nodes: {e}");
        }
        // libtorch's allocations during the capture are not graph allocations, so the flag
        // changes nothing for them.
        let flags = CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH as u64;
        let mut exec: sys::CUgraphExec = std::ptr::null_mut();
        // SAFETY: the graph captured above, in the current context.
        let instantiated = check(unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, flags) });
        match instantiated {
            Ok(()) => Ok((Graph { graph, exec, stream: Arc::clone(stream), memsets_as_kernels, kept_memsets }, value)),
            Err(e) => {
                // SAFETY: the graph captured above, not instantiated.
                unsafe {
                    let _ = sys::cuGraphDestroy(graph);
                }
                Err(GraphError::Capture(e.to_string()).into())
            }
        }
    }

    /// Replays `graph` on the compute stream (asynchronously, as any launch).
    pub fn replay(&self, graph: &Graph) -> Result<(), GraphError> {
        let launch_err = |e: DriverError| GraphError::Capture(e.to_string());
        graph.stream.context().bind_to_thread().map_err(launch_err)?;
        // SAFETY: an instantiated graph of this context, launched on the stream it was captured on.
        unsafe { sys::cuGraphLaunch(graph.exec, graph.stream.cu_stream()) }.result().map_err(launch_err)
    }

    /// Replays `graph` on the GPU's urgent stream, in the compute stream's order
    /// ([`Gpu::on_urgent`]): a backward beside which AdamW's update runs at a lower priority.
    pub fn replay_urgent(&self, graph: &Graph) -> Result<(), GraphError> {
        let launch_err = |e: DriverError| GraphError::Capture(e.to_string());
        graph.stream.context().bind_to_thread().map_err(launch_err)?;
        // SAFETY: an instantiated graph of this context; a graph may be launched on any stream of
        // it, and the urgent one is ordered with the compute stream on both sides.
        self.gpu.on_urgent(|s| unsafe { sys::cuGraphLaunch(graph.exec, s) }.result()).map_err(launch_err)
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
