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
//!
//! Those few bytes need not be cleared where they are, though: a library call that asks for
//! [`capture_scratch`] while a stream captures gets memory of its own in the graph, which nothing
//! else in it touches. A small memset into such scratch may then run at any time before the one
//! call after it, so before the graph is instantiated every one of them leaves its place in the
//! graph for one kernel at the graph's start that writes them all ([`FILL_SOURCE`]'s table),
//! and the call's node waits for that kernel instead (`memsets_hoisted`). Each replay clears them
//! again before its calls, as the memsets did.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys::{self, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{result, CudaStream, DriverError};
use tch::{Device, Kind, Tensor};

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
///
/// `graph_fill_table` writes `n` such memsets, each a [`FillEntry`], a block per entry.
pub const FILL_SOURCE: &str = r#"
__device__ __forceinline__ void fill_at(unsigned long long dst, unsigned long long pitch, unsigned int value,
                                        unsigned int esize, unsigned long long width, unsigned long long i) {
  const unsigned long long at = dst + (i / width) * pitch + (i % width) * esize;
  if (esize == 4) *reinterpret_cast<unsigned int*>(at) = value;
  else if (esize == 2) *reinterpret_cast<unsigned short*>(at) = (unsigned short)value;
  else *reinterpret_cast<unsigned char*>(at) = (unsigned char)value;
}

extern "C" __global__ void graph_fill(unsigned long long dst, unsigned long long pitch, unsigned int value,
                                      unsigned int esize, unsigned long long width, unsigned long long height) {
  const unsigned long long n = width * height;
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x) {
    fill_at(dst, pitch, value, esize, width, i);
  }
}

struct FillEntry {
  unsigned long long dst, pitch;
  unsigned int value, esize;
  unsigned long long width, height;
};

extern "C" __global__ void graph_fill_table(const FillEntry* entries, unsigned int n) {
  for (unsigned int e = blockIdx.x; e < n; e += gridDim.x) {
    const FillEntry f = entries[e];
    const unsigned long long count = f.width * f.height;
    for (unsigned long long i = threadIdx.x; i < count; i += blockDim.x) {
      fill_at(f.dst, f.pitch, f.value, f.esize, f.width, i);
    }
  }
}
"#;

/// One memset as `graph_fill_table` reads it: the layout of `FillEntry` in [`FILL_SOURCE`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FillEntry {
    pub dst: u64,
    pub pitch: u64,
    pub value: u32,
    pub esize: u32,
    pub width: u64,
    pub height: u64,
}

impl FillEntry {
    /// The memset of a node's parameters, where it is one the fill kernels write: elements of 1, 2
    /// or 4 bytes, at least one, at most [`FILL_MAX_BYTES`] of them.
    fn of(m: &sys::CUDA_MEMSET_NODE_PARAMS) -> Option<Self> {
        let elements = m.width * m.height;
        if !matches!(m.elementSize, 1 | 2 | 4) || elements == 0 || elements * m.elementSize as usize > FILL_MAX_BYTES {
            return None;
        }
        Some(FillEntry {
            dst: m.dst,
            pitch: m.pitch as u64,
            value: m.value,
            esize: m.elementSize,
            width: m.width as u64,
            height: m.height as u64,
        })
    }

    /// From its first byte to the end of its last row's last byte.
    fn span(&self) -> (u64, u64) {
        (self.dst, self.dst + (self.height - 1) * self.pitch + self.width * u64::from(self.esize))
    }

    /// The bytes it writes lie within `[start, end)`.
    fn within(&self, start: u64, end: u64) -> bool {
        let (first, last) = self.span();
        first >= start && last <= end
    }
}

/// For each memset, whether its span meets no other's. A call that clears the same bytes twice
/// (before two kernels, say) needs them cleared again between the two, so neither may move.
fn apart(entries: &[FillEntry]) -> Vec<bool> {
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_by_key(|&i| entries[i].span());
    let mut alone = vec![true; entries.len()];
    // The furthest end so far, and whose it is.
    let mut reach: Option<(u64, usize)> = None;
    for &i in &order {
        let (start, end) = entries[i].span();
        if let Some((far, j)) = reach {
            if start < far {
                alone[i] = false;
                alone[j] = false;
            }
        }
        if reach.is_none_or(|(far, _)| end > far) {
            reach = Some((end, i));
        }
    }
    alone
}

/// Memsets of at most this many bytes become kernel nodes; larger ones, which the copy engines
/// write at their bandwidth, stay.
pub const FILL_MAX_BYTES: usize = 1 << 16;

/// Threads per block of [`FILL_SOURCE`]'s kernels; `graph_fill`'s grid has at most
/// [`FILL_MAX_BYTES`] / 256 blocks, a thread per element.
const FILL_THREADS: u32 = 256;

/// The most blocks of `graph_fill_table`'s grid (each loops over entries beyond it).
const FILL_TABLE_BLOCKS: u32 = 1024;

/// The arena a pool's captures hand scratch out of ([`capture_scratch`]), allocated at its first
/// capture: 32 MiB, as much as cuBLASLt's shared workspace. Beyond it callers get none and use
/// their shared memory as outside a capture.
pub const SCRATCH_ARENA_BYTES: usize = 32 << 20;

/// Each piece of scratch starts this many bytes into the arena, or a multiple (cuBLASLt asks
/// 256-byte alignment of its workspace).
const SCRATCH_ALIGN: usize = 256;

/// [`FILL_SOURCE`] loaded into the GPU's context, once per process (a rank has one GPU).
struct FillKernel {
    _module: sys::CUmodule,
    function: sys::CUfunction,
    table: sys::CUfunction,
}

// SAFETY: a module and function handle of the process's context, only read after loading.
unsafe impl Send for FillKernel {}
// SAFETY: as for `Send`: nothing mutates them.
unsafe impl Sync for FillKernel {}

static FILL: OnceLock<Result<FillKernel, String>> = OnceLock::new();

fn fill_kernel(gpu: &Gpu) -> Result<&'static FillKernel, GraphError> {
    let loaded = FILL.get_or_init(|| {
        let load = || -> Result<FillKernel, String> {
            let arch = gpu.ctx.compute_capability().map_err(|e| e.to_string())?;
            let ptx = kernels::compile(FILL_SOURCE, arch).map_err(|e| e.to_string())?;
            let image = std::ffi::CString::new(ptx.to_src()).map_err(|e| e.to_string())?;
            gpu.ctx.bind_to_thread().map_err(|e| e.to_string())?;
            // SAFETY: a NUL-terminated PTX image; the module stays loaded for the process.
            let module = unsafe { result::module::load_data(image.as_ptr().cast()) }.map_err(|e| e.to_string())?;
            let entry = |name: &str| {
                let name = std::ffi::CString::new(name).expect("no NUL");
                // SAFETY: a module just loaded, and one of its entries.
                unsafe { result::module::get_function(module, name) }.map_err(|e| e.to_string())
            };
            Ok(FillKernel { _module: module, function: entry("graph_fill")?, table: entry("graph_fill_table")? })
        };
        load()
    });
    loaded.as_ref().map_err(|e| GraphError::Fill(e.clone()))
}

/// What the capture in progress hands scratch out of ([`capture_scratch`]): `None` while no stream
/// captures (a rank captures one graph at a time, from one GPU).
static SCRATCH: Mutex<Option<Handout>> = Mutex::new(None);

/// The arena `[base, base + len)` and the pieces handed out of it, in order.
struct Handout {
    base: u64,
    len: usize,
    pieces: Vec<(u64, u64)>,
}

fn scratch_lock() -> std::sync::MutexGuard<'static, Option<Handout>> {
    SCRATCH.lock().unwrap_or_else(|e| e.into_inner())
}

/// `bytes` of device memory for one library call inside the graph being captured, which no other
/// node of that graph reads or writes: the call's own workspace, where small memsets may be
/// hoisted to the graph's start ([module](self)). It is a piece of the pool's arena, allocated
/// before the pool's first capture and kept by the pool, so that no tensor the graph's other
/// nodes use, before or after the call, ever had that memory (the caching allocator hands a
/// capture blocks freed earlier in the same capture). The pool's graphs replay one at a time,
/// so each graph's pieces start at the arena's start. `None` where no capture is in progress,
/// `bytes` is 0, or the rest of the arena is too small: the caller then uses what it uses outside
/// a capture.
pub fn capture_scratch(bytes: usize) -> Option<*mut c_void> {
    let mut guard = scratch_lock();
    let handout = guard.as_mut()?;
    let start =
        handout.pieces.last().map_or(0, |&(_, end)| (end - handout.base) as usize).next_multiple_of(SCRATCH_ALIGN);
    if bytes == 0 || start + bytes > handout.len {
        return None;
    }
    let piece = (handout.base + start as u64, handout.base + (start + bytes) as u64);
    handout.pieces.push(piece);
    Some(piece.0 as *mut c_void)
}

/// A graph captured from the compute stream (its small memsets into scratch hoisted, the other
/// small ones as kernels), instantiated.
pub struct Graph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    stream: Arc<CudaStream>,
    /// The hoisted memsets' table, which the graph's first kernel reads (0: none).
    table: sys::CUdeviceptr,
    /// The pool's arena, which its calls' scratch is part of: freed after the graph.
    _arena: Option<Arc<Arena>>,
    /// Bytes of scratch its calls were given ([`capture_scratch`]).
    pub scratch_bytes: usize,
    /// Memset nodes into scratch that became entries of one kernel at the graph's start.
    pub memsets_hoisted: usize,
    /// Memset nodes the capture held that now are kernel nodes.
    pub memsets_as_kernels: usize,
    /// Why a rewrite stopped early, if one did (the rest stayed memsets where they were).
    pub kept_memsets: Option<String>,
}

// SAFETY: graph handles may be launched and destroyed from any thread bound to their context.
unsafe impl Send for Graph {}

impl Drop for Graph {
    fn drop(&mut self) {
        let _ = self.stream.context().bind_to_thread();
        // SAFETY: handles and memory this value owns, destroyed once; the table after the graph
        // that reads it.
        unsafe {
            let _ = sys::cuGraphExecDestroy(self.exec);
            let _ = sys::cuGraphDestroy(self.graph);
            if self.table != 0 {
                let _ = result::free_sync(self.table);
            }
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

/// The memset a node is, where it is a memset of at most [`FILL_MAX_BYTES`] ([`FillEntry::of`]).
///
/// # Safety
/// `node` is a node of a graph of the current context.
unsafe fn small_memset(node: sys::CUgraphNode) -> Result<Option<FillEntry>, GraphError> {
    // SAFETY: the caller's node; the parameters are written into a plain struct.
    unsafe {
        let mut kind = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
        check(sys::cuGraphNodeGetType(node, &mut kind))?;
        if kind != sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEMSET {
            return Ok(None);
        }
        let mut m: sys::CUDA_MEMSET_NODE_PARAMS = std::mem::zeroed();
        check(sys::cuGraphMemsetNodeGetParams(node, &mut m))?;
        Ok(FillEntry::of(&m))
    }
}

/// Hoists every memset node of `graph` of at most [`FILL_MAX_BYTES`] that writes only within one
/// of `scratch`'s ranges (`[start, end)`, each used by no other node than the one after its
/// memsets, [`capture_scratch`]) into one node of `table_fill` at the graph's start, which writes
/// them all from a table in device memory: each node after such a memset waits for that kernel and
/// for the nodes the memset waited for, and the memset goes. Returns how many it hoisted, the
/// table (0 where none: then the graph is unchanged), and the error that ended it early: a memset
/// whose edges could not all be made stays where it was (the edges made are harmless: its
/// dependents wait for more, and what it writes is written twice), so the graph is whole either
/// way.
///
/// # Safety
/// As [`memsets_as_kernels`]; `table_fill` is [`FILL_SOURCE`]'s `graph_fill_table` in the current
/// context.
unsafe fn hoist_scratch_memsets(
    graph: sys::CUgraph,
    table_fill: sys::CUfunction,
    scratch: &[(u64, u64)],
) -> (usize, sys::CUdeviceptr, Option<GraphError>) {
    let mut found = Vec::new();
    let listed = (|| {
        // SAFETY: the caller's graph; the query writes into a buffer sized by the count it gave.
        for node in nodes(|out, n| unsafe { sys::cuGraphGetNodes(graph, out, n) })? {
            // SAFETY: a node of the caller's graph.
            if let Some(f) = unsafe { small_memset(node) }? {
                if scratch.iter().any(|&(start, end)| f.within(start, end)) {
                    found.push((node, f));
                }
            }
        }
        Ok::<_, GraphError>(())
    })();
    if let Err(e) = listed {
        return (0, 0, Some(e));
    }
    let alone = apart(&found.iter().map(|&(_, f)| f).collect::<Vec<_>>());
    let found: Vec<_> = found.into_iter().zip(alone).filter_map(|(f, alone)| alone.then_some(f)).collect();
    if found.is_empty() {
        return (0, 0, None);
    }
    let entries: Vec<FillEntry> = found.iter().map(|&(_, f)| f).collect();
    // SAFETY: memory of the current context, written with the entries' bytes (plain `repr(C)`
    // values) before any graph reads it; freed below where no node comes to read it.
    let table = match unsafe { result::malloc_sync(entries.len() * size_of::<FillEntry>()) } {
        Ok(t) => t,
        Err(e) => return (0, 0, Some(GraphError::Fill(e.to_string()))),
    };
    let first = (|| {
        // SAFETY: as above.
        unsafe { result::memcpy_htod_sync(table, &entries) }.map_err(|e| GraphError::Fill(e.to_string()))?;
        let (mut table_arg, mut n) = (table, entries.len() as u32);
        let mut args: [*mut c_void; 2] = [(&mut table_arg as *mut u64).cast(), (&mut n as *mut u32).cast()];
        // SAFETY: a plain struct, zeros valid; the parameters are copied when the node is added.
        let mut p: sys::CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
        p.func = table_fill;
        p.gridDimX = n.min(FILL_TABLE_BLOCKS);
        (p.gridDimY, p.gridDimZ) = (1, 1);
        (p.blockDimX, p.blockDimY, p.blockDimZ) = (FILL_THREADS, 1, 1);
        p.kernelParams = args.as_mut_ptr();
        let mut kernel: sys::CUgraphNode = std::ptr::null_mut();
        // SAFETY: a root node (no dependencies) of the caller's graph.
        check(unsafe { sys::cuGraphAddKernelNode_v2(&mut kernel, graph, std::ptr::null(), 0, &p) })?;
        Ok::<_, GraphError>(kernel)
    })();
    let kernel = match first {
        Ok(k) => k,
        Err(e) => {
            // SAFETY: allocated above; no node reads it.
            let _ = unsafe { result::free_sync(table) };
            return (0, 0, Some(e));
        }
    };
    let mut hoisted = 0;
    for (node, _) in found {
        // SAFETY: a memset node of the caller's graph and the kernel node just added to it.
        match unsafe { hoist(graph, node, kernel) } {
            Ok(()) => hoisted += 1,
            Err(e) => return (hoisted, table, Some(e)),
        }
    }
    (hoisted, table, None)
}

/// [`hoist_scratch_memsets`] for one memset node: its dependents wait for `kernel` and for what it
/// waited for, then it goes.
///
/// # Safety
/// `node` and `kernel` are nodes of `graph`, a graph of the current context not instantiated yet.
unsafe fn hoist(graph: sys::CUgraph, node: sys::CUgraphNode, kernel: sys::CUgraphNode) -> Result<(), GraphError> {
    // SAFETY: the caller's; every query writes into buffers sized by the count it gave first.
    unsafe {
        let before = edges(|out, data, n| sys::cuGraphNodeGetDependencies_v2(node, out, data, n))?;
        let after = edges(|out, data, n| sys::cuGraphNodeGetDependentNodes_v2(node, out, data, n))?;
        for (to, data) in &after {
            let waits = edges(|out, d, n| sys::cuGraphNodeGetDependencies_v2(*to, out, d, n))?;
            let waits_for = |from: sys::CUgraphNode| waits.iter().any(|(w, _)| *w == from);
            for (from, _) in before.iter().chain([(kernel, *data)].iter()) {
                if !waits_for(*from) {
                    check(sys::cuGraphAddDependencies_v2(graph, from, to, data, 1))?;
                }
            }
        }
        check(sys::cuGraphDestroyNode(node))
    }
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
        let Some(mut f) = small_memset(node)? else { return Ok(false) };
        let before = edges(|out, data, n| sys::cuGraphNodeGetDependencies_v2(node, out, data, n))?;
        let after = edges(|out, data, n| sys::cuGraphNodeGetDependentNodes_v2(node, out, data, n))?;
        let elements = f.width * f.height;
        let mut args: [*mut c_void; 6] = [
            (&mut f.dst as *mut u64).cast(),
            (&mut f.pitch as *mut u64).cast(),
            (&mut f.value as *mut u32).cast(),
            (&mut f.esize as *mut u32).cast(),
            (&mut f.width as *mut u64).cast(),
            (&mut f.height as *mut u64).cast(),
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

/// The memory scratch is handed out of ([`capture_scratch`]): a tensor of the caching allocator,
/// so that it counts as allocated.
struct Arena(Tensor);

// SAFETY: a tensor nothing reads or writes through this value: it only keeps the memory allocated
// until the last graph holding it goes.
unsafe impl Sync for Arena {}

/// A private pool of the caching allocator and the graphs captured into it.
pub struct GraphPool {
    gpu: Arc<Gpu>,
    id: u64,
    /// Captures begun: each holds one use of the pool.
    uses: u32,
    /// [`SCRATCH_ARENA_BYTES`], allocated before the first capture.
    arena: Option<Arc<Arena>>,
}

impl GraphPool {
    pub fn new(gpu: Arc<Gpu>) -> Self {
        Self { gpu, id: NEXT_POOL.fetch_add(1, Ordering::Relaxed), uses: 0, arena: None }
    }

    /// Captures what `work` issues on the compute stream (from any thread, as the autograd engine
    /// does) into a graph, without running it; `work`'s result comes back beside it. Tensors
    /// `work` allocates live in this pool. Where `work` fails, its own error comes back (an
    /// allocation that does not fit stays an out-of-memory error, say).
    pub fn capture<T, E: From<GraphError>>(&mut self, work: impl FnOnce() -> Result<T, E>) -> Result<(Graph, T), E> {
        if self.arena.is_none() {
            // Outside the pool: the arena is the graphs' own from the start, never a block another
            // tensor of a capture used.
            let bytes = SCRATCH_ARENA_BYTES as i64;
            let t = Tensor::f_empty([bytes], (Kind::Uint8, Device::Cuda(self.gpu.ordinal)))
                .map_err(|e| GraphError::Pool(e.to_string()))?;
            self.arena = Some(Arc::new(Arena(t)));
        }
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
        *scratch_lock() =
            self.arena.as_ref().map(|a| Handout { base: a.0.data_ptr() as u64, len: a.0.numel(), pieces: Vec::new() });
        let began = stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL).map_err(capture_err);
        let value = began.map(|()| work());
        // Whatever happened, no later call gets scratch outside a capture.
        let ranges = scratch_lock().take().map(|h| h.pieces).unwrap_or_default();
        let value = value?;
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
        let scratch_bytes = ranges.iter().map(|(start, end)| (end - start) as usize).sum();
        // SAFETY: a graph just captured in the current context, not instantiated; the kernels are
        // the fill kernels of that context; each range is scratch one node of this graph alone
        // uses after its memsets.
        let (memsets_hoisted, table, hoist_stopped) = unsafe { hoist_scratch_memsets(graph, fill.table, &ranges) };
        // SAFETY: as above.
        let (memsets_as_kernels, stopped) = unsafe { memsets_as_kernels(graph, fill.function) };
        let kept_memsets = hoist_stopped.or(stopped).map(|e| e.to_string());
        if let Some(e) = &kept_memsets {
            tracing::warn!(memsets_hoisted, memsets_as_kernels, "a captured graph keeps memset nodes: {e}");
        }
        // libtorch's allocations during the capture are not graph allocations, so the flag
        // changes nothing for them.
        let flags = CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH as u64;
        let mut exec: sys::CUgraphExec = std::ptr::null_mut();
        // SAFETY: the graph captured above, in the current context.
        let instantiated = check(unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, flags) });
        match instantiated {
            Ok(()) => {
                let graph = Graph {
                    graph,
                    exec,
                    stream: Arc::clone(stream),
                    table,
                    _arena: self.arena.clone(),
                    scratch_bytes,
                    memsets_hoisted,
                    memsets_as_kernels,
                    kept_memsets,
                };
                Ok((graph, value))
            }
            Err(e) => {
                // SAFETY: the graph captured above, not instantiated, and the table only it reads.
                unsafe {
                    let _ = sys::cuGraphDestroy(graph);
                    if table != 0 {
                        let _ = result::free_sync(table);
                    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn memset(dst: u64, pitch: usize, esize: u32, width: usize, height: usize) -> sys::CUDA_MEMSET_NODE_PARAMS {
        // SAFETY: a plain C struct, zeros valid.
        let mut m: sys::CUDA_MEMSET_NODE_PARAMS = unsafe { std::mem::zeroed() };
        (m.dst, m.pitch, m.value, m.elementSize, m.width, m.height) = (dst, pitch, 5, esize, width, height);
        m
    }

    /// The fill kernels take memsets of 1-, 2- and 4-byte elements, at least one and at most
    /// `FILL_MAX_BYTES` of them; a 2-D one by its elements, not its pitch.
    #[test]
    fn small_memsets_only() {
        assert!(FillEntry::of(&memset(4096, 0, 4, 1, 1)).is_some());
        assert!(FillEntry::of(&memset(4096, 1 << 20, 1, 100, 64)).is_some(), "6400 bytes in rows 1 MiB apart");
        assert!(FillEntry::of(&memset(4096, 0, 4, FILL_MAX_BYTES / 4, 1)).is_some());
        assert!(FillEntry::of(&memset(4096, 0, 4, FILL_MAX_BYTES / 4 + 1, 1)).is_none(), "over the limit");
        assert!(FillEntry::of(&memset(4096, 0, 8, 1, 1)).is_none(), "8-byte elements");
        assert!(
            FillEntry::of(&memset(4096, 0, 4, 0, 1)).is_none() && FillEntry::of(&memset(4096, 0, 4, 1, 0)).is_none()
        );
        let f = FillEntry::of(&memset(4096, 64, 2, 3, 2)).unwrap();
        assert_eq!(f, FillEntry { dst: 4096, pitch: 64, value: 5, esize: 2, width: 3, height: 2 });
    }

    /// A memset lies within scratch where its first byte and its last row's last byte do: the
    /// bytes between rows are not its.
    #[test]
    fn within_scratch_by_first_and_last_byte() {
        let f = |dst, pitch, esize, width, height| FillEntry::of(&memset(dst, pitch, esize, width, height)).unwrap();
        assert!(f(1000, 0, 4, 4, 1).within(1000, 1016), "exactly the range");
        assert!(!f(1000, 0, 4, 4, 1).within(1000, 1015), "one byte past its end");
        assert!(!f(999, 0, 4, 4, 1).within(1000, 1100), "one byte before its start");
        assert!(f(1000, 100, 1, 10, 3).within(1000, 1210), "the last row ends at 1000 + 200 + 10");
        assert!(!f(1000, 100, 1, 10, 3).within(1000, 1209));
        assert!(f(1000, 100, 1, 10, 1).within(1000, 1010), "one row: its pitch does not count");
    }

    /// Memsets whose spans meet stay where they are, every one of them; those apart move.
    #[test]
    fn memsets_of_the_same_bytes_stay() {
        let e = |dst, width, height| FillEntry { dst, pitch: 100, value: 0, esize: 1, width, height };
        assert_eq!(apart(&[e(0, 4, 1), e(4, 4, 1), e(200, 4, 1)]), [true, true, true], "touching is not meeting");
        assert_eq!(apart(&[e(200, 4, 1), e(0, 4, 1), e(2, 4, 1)]), [true, false, false]);
        assert_eq!(apart(&[e(0, 4, 1), e(0, 4, 1)]), [false, false], "the same bytes twice");
        // A long one reaching over a short one after another short one.
        assert_eq!(apart(&[e(0, 50, 1), e(10, 4, 1), e(30, 4, 1), e(60, 4, 1)]), [false, false, false, true]);
        // A 2-D memset spans its rows: one starting between them meets it.
        assert_eq!(apart(&[e(0, 4, 3), e(150, 4, 1)]), [false, false]);
        assert_eq!(apart(&[]), Vec::<bool>::new());
    }
}
