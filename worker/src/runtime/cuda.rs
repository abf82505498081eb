//! The CUDA side of a rank: libtorch's compute stream, a stream for communication, and events.
//!
//! libtorch runs every kernel on the device's legacy default stream, unless the run replays its
//! steps from CUDA graphs: a graph can only be captured from a stream other than the legacy one,
//! so the compute stream is then one of the rank's own, made libtorch's current stream on the
//! main thread (the autograd engine runs each backward operator on its forward's stream, so
//! backward follows). cudarc's `CudaContext` retains the same primary context, so events recorded
//! through the driver API on the compute stream order against libtorch's work. Communication runs
//! on a non-blocking stream of its own; the two are ordered with events only where data flows
//! between them.

use std::sync::{Arc, Mutex};

use cudarc::driver::{result, sys, CudaContext, CudaStream, DriverError};

use super::shim;

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("CUDA: {0}")]
    Cuda(#[from] DriverError),
    #[error("libtorch's stream: {0}")]
    Torch(String),
}

/// A CUDA event from the pool. Timing is enabled so every event can serve as a timestamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event(sys::CUevent);

// SAFETY: CUDA events are plain handles usable from any thread bound to their context.
unsafe impl Send for Event {}

/// Which stream libtorch computes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ComputeStream {
    /// The legacy default stream, libtorch's own choice.
    Legacy,
    /// A non-blocking stream of the rank's own: CUDA graphs capture from it.
    Own,
}

/// The GPU this rank computes on.
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    /// libtorch's stream on the main thread (see [`ComputeStream`]).
    pub compute: Arc<CudaStream>,
    /// libtorch's index of this device.
    pub ordinal: usize,
    /// Where collectives run.
    pub comm: Arc<CudaStream>,
    /// Where host-to-device copies run (offload's parameters), beside `comm`: the link carries
    /// both directions at once, so an upload need not queue behind gradients going down.
    pub upload: Arc<CudaStream>,
    /// Where AdamW's update runs beside a replayed backward (`zero::beside`), at the default
    /// priority, which is the lowest.
    pub update: Arc<CudaStream>,
    /// A stream at the device's highest priority, where a backward beside which the update runs
    /// is replayed ([`Gpu::on_urgent`]).
    urgent: UrgentStream,
    free_events: Mutex<Vec<Event>>,
}

/// A non-blocking stream at the device's highest scheduling priority. Where kernels of two streams
/// wait for multiprocessors, the blocks of the higher priority's go first (nothing running is
/// preempted). cudarc creates its streams at the default priority only, so this is a raw handle.
struct UrgentStream(sys::CUstream);

// SAFETY: a stream handle is usable from any thread bound to its context.
unsafe impl Send for UrgentStream {}
// SAFETY: as above; the handle itself is never changed after its creation.
unsafe impl Sync for UrgentStream {}

impl UrgentStream {
    /// Creates the stream in the current context.
    fn new() -> Result<Self, DriverError> {
        let (mut least, mut greatest) = (0, 0);
        // SAFETY: out-pointers to ints; the context is current.
        unsafe { sys::cuCtxGetStreamPriorityRange(&mut least, &mut greatest) }.result()?;
        let mut stream: sys::CUstream = std::ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: an out-pointer to a stream handle, which this value then owns.
        unsafe { sys::cuStreamCreateWithPriority(&mut stream, flags, greatest) }.result()?;
        Ok(Self(stream))
    }
}

impl Gpu {
    /// Attaches to the primary context of CUDA device `ordinal` (as libtorch numbers it), with
    /// libtorch computing on `stream` from now on (on this thread).
    pub fn new(ordinal: usize, stream: ComputeStream) -> Result<Arc<Self>, GpuError> {
        let ctx = CudaContext::new(ordinal)?;
        // cudarc's per-slice event tracking is for its own allocations, which we do not use.
        // SAFETY: no cudarc slices exist yet.
        unsafe { ctx.disable_event_tracking() };
        let compute = match stream {
            ComputeStream::Legacy => ctx.default_stream(),
            ComputeStream::Own => {
                let s = ctx.new_stream()?;
                shim::cuda_set_stream(&s, ordinal).map_err(|e| GpuError::Torch(e.0))?;
                s
            }
        };
        let comm = ctx.new_stream()?;
        let update = ctx.new_stream()?;
        ctx.bind_to_thread()?;
        let urgent = UrgentStream::new()?;
        let upload = ctx.new_stream()?;
        Ok(Arc::new(Self { ctx, compute, ordinal, comm, upload, update, urgent, free_events: Mutex::new(Vec::new()) }))
    }

    /// Whether libtorch's current stream on the calling thread, for this device, is the compute
    /// stream: the worker's own kernels and products run there, so only then are they ordered
    /// with libtorch's operations on the same tensors.
    pub fn computes_here(&self) -> Result<bool, shim::ShimError> {
        Ok(self.is_compute_stream(shim::cuda_current_stream(self.ordinal)?))
    }

    /// Whether `stream` (a CUstream handle, as libtorch names its streams) is the compute stream.
    pub fn is_compute_stream(&self, stream: *mut std::ffi::c_void) -> bool {
        self.compute.cu_stream().cast() == stream
    }

    /// An event, reused from the pool when one is free.
    pub fn event(&self) -> Result<Event, DriverError> {
        if let Some(e) = self.free_events.lock().expect("event pool").pop() {
            return Ok(e);
        }
        self.ctx.bind_to_thread()?;
        Ok(Event(result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)?))
    }

    /// Returns an event to the pool once nothing will read it again.
    pub fn recycle(&self, e: Event) {
        self.free_events.lock().expect("event pool").push(e);
    }

    /// Records `e` on `stream`.
    pub fn record(&self, e: Event, stream: &CudaStream) -> Result<(), DriverError> {
        // SAFETY: a live event of this context and a live stream of it.
        unsafe { result::event::record(e.0, stream.cu_stream()) }
    }

    /// Makes `stream` wait for the work recorded in `e`.
    pub fn wait(&self, stream: &CudaStream, e: Event) -> Result<(), DriverError> {
        // SAFETY: as above.
        unsafe { result::stream::wait_event(stream.cu_stream(), e.0, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT) }
    }

    /// Records `e` on `stream` as a node of the graph `stream` is capturing, which every replay of
    /// the graph records: work outside the graph waits for that point of each replay.
    pub fn record_in_capture(&self, e: Event, stream: &CudaStream) -> Result<(), DriverError> {
        let flags = sys::CUevent_record_flags::CU_EVENT_RECORD_EXTERNAL as u32;
        // SAFETY: a live event of this context and a live stream of it.
        unsafe { sys::cuEventRecordWithFlags(e.0, stream.cu_stream(), flags) }.result()
    }

    /// Whether `stream` is capturing a graph.
    pub fn is_capturing(&self, stream: &CudaStream) -> Result<bool, DriverError> {
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: a live stream of this context and an out-pointer to its status.
        unsafe { sys::cuStreamIsCapturing(stream.cu_stream(), &mut status) }.result()?;
        Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    /// Runs `launch` on the urgent stream (the device's highest priority) in the compute stream's
    /// order: after what the compute stream holds, before what it is given next.
    pub fn on_urgent(&self, launch: impl FnOnce(sys::CUstream) -> Result<(), DriverError>) -> Result<(), DriverError> {
        let (before, after) = (self.mark(&self.compute)?, self.event()?);
        let urgent = self.urgent.0;
        let wait = sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT;
        // SAFETY: live events and streams of this context. An event is reused only after every
        // wait on it is issued: a wait holds the record made before it.
        let ran = unsafe {
            result::stream::wait_event(urgent, before.0, wait)
                .and_then(|()| launch(urgent))
                .and_then(|()| result::event::record(after.0, urgent))
                .and_then(|()| result::stream::wait_event(self.compute.cu_stream(), after.0, wait))
        };
        self.recycle(before);
        self.recycle(after);
        ran
    }

    /// The urgent stream's priority and the default one's (lower numbers run first).
    pub fn priorities(&self) -> Result<(i32, i32), DriverError> {
        let (mut urgent, mut default) = (0, 0);
        // SAFETY: live streams of this context and out-pointers to ints.
        unsafe {
            sys::cuStreamGetPriority(self.urgent.0, &mut urgent).result()?;
            sys::cuStreamGetPriority(self.update.cu_stream(), &mut default).result()?;
        }
        Ok((urgent, default))
    }

    /// A fresh event recorded now on `stream`.
    pub fn mark(&self, stream: &CudaStream) -> Result<Event, DriverError> {
        let e = self.event()?;
        self.record(e, stream)?;
        Ok(e)
    }

    /// Milliseconds from `a` to `b`, waiting for both to complete.
    pub fn elapsed_ms(&self, a: Event, b: Event) -> Result<f64, DriverError> {
        // SAFETY: live events of this context.
        unsafe {
            result::event::synchronize(b.0)?;
            Ok(f64::from(result::event::elapsed(a.0, b.0)?))
        }
    }

    /// Blocks the calling thread (any thread) until the work recorded in `e` has finished.
    pub fn synchronize_event(&self, e: Event) -> Result<(), DriverError> {
        self.ctx.bind_to_thread()?;
        // SAFETY: a live event of this context.
        unsafe { result::event::synchronize(e.0) }
    }

    /// Blocks until every stream of the context (libtorch's, communication, copies) has finished
    /// the work issued so far: the end of a step.
    pub fn synchronize(&self) -> Result<(), DriverError> {
        // CudaContext::synchronize binds the context to this thread and calls cuCtxSynchronize.
        self.ctx.synchronize()
    }

    /// Whether the work recorded in `e` has finished.
    pub fn is_done(&self, e: Event) -> bool {
        // SAFETY: a live event.
        unsafe { result::event::query(e.0) }.is_ok()
    }

    /// Device name and total memory, for the `start` record.
    pub fn describe(&self) -> (String, Option<u64>) {
        let name = self.ctx.name().unwrap_or_else(|_| "cuda".into());
        let total = result::mem_get_info().ok().map(|(_, t)| t as u64);
        (name, total)
    }

    /// The device's UUID as NVML prints it (`GPU-xxxxxxxx-xxxx-...`).
    pub fn uuid(&self) -> Option<String> {
        let u = self.ctx.uuid().ok()?;
        let b: Vec<u8> = u.bytes.iter().map(|&c| c as u8).collect();
        let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
        Some(format!("GPU-{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32]))
    }

    /// The CUDA driver's version, e.g. `13.0`.
    pub fn driver_version(&self) -> Option<String> {
        let mut v = 0;
        // SAFETY: out-pointer to an int.
        unsafe { sys::cuDriverGetVersion(&mut v) }.result().ok()?;
        Some(format!("{}.{}", v / 1000, (v % 1000) / 10))
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: the stream this value owns, with nothing left on it (callers synchronise
        // before dropping the GPU), destroyed once.
        let _ = unsafe { sys::cuStreamDestroy_v2(self.urgent.0) };
        for e in self.free_events.get_mut().expect("event pool").drain(..) {
            // SAFETY: pooled events are not in use.
            let _ = unsafe { result::event::destroy(e.0) };
        }
    }
}

/// Restricts this process to one GPU, chosen by local rank, before CUDA starts: each rank then
/// sees exactly one device (ordinal 0), and libtorch, cudarc and NCCL cannot disagree on which.
/// With `CUDA_VISIBLE_DEVICES` already set (Slurm, a launcher), the local rank picks from that
/// list; otherwise it is the physical index. Returns the value set.
pub fn bind_local_gpu(local_rank: u32) -> String {
    let chosen = match std::env::var("CUDA_VISIBLE_DEVICES") {
        Ok(list) if !list.trim().is_empty() => {
            let ids: Vec<&str> = list.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
            ids[local_rank as usize % ids.len()].to_string()
        }
        _ => local_rank.to_string(),
    };
    // Set before libtorch_cuda or cudarc initialise CUDA, which read it once at cuInit.
    std::env::set_var("CUDA_VISIBLE_DEVICES", &chosen);
    chosen
}
