//! Collectives on GPU tensors over NCCL (cudarc's dynamically loaded bindings), bootstrapped by
//! broadcasting NCCL's unique id from rank 0 over the run's host group: over MPI, or through the
//! rendezvous store for ranks launched with the environment convention ([`super::group`]).
//!
//! Each collective is ordered after the work already issued on the compute stream (an event
//! recorded there, waited on by the communication stream), runs on the communication stream
//! between two timing events, and hands back a [`Pending`] whose end event the compute stream
//! waits on before it reads the result. The time the compute stream spent in those waits is the
//! exposed communication: events recorded just before and just after each wait bracket it, and
//! the step clock reads them once the step has ended.
//!
//! Host-to-device copies run on a stream of their own (`Gpu::upload`), so that offload's
//! parameters go up while gradients go down on the communication stream. A later operation on
//! the communication stream that touches memory an upload still writes waits for that upload
//! first (`after_uploads`), which keeps the order the engine relies on (a copy from the host,
//! then the all-gather of what it wrote).
//!
//! The engine passes only persistent buffers (gradient buckets, gather slots, parameter and
//! gradient shards), so libtorch's caching allocator can never hand their memory to another
//! kernel while NCCL still uses it.

use std::ffi::c_int;
use std::mem::MaybeUninit;
use std::sync::Arc;

use cudarc::nccl::{result as nccl, sys as ncclsys};
use tch::{Device, Kind, Tensor};
use zerobench_schema::config::CopyEngines;

use super::group::HostGroup;
use super::peer_copy::PeerCopy;
use super::{flat, CollectiveKind, Collectives, CommError, Elem, HostCopy, Pending, StepComm};
use crate::metrics::clock::SharedClock;
use crate::metrics::timeline::{Mark, SharedTimeline, SpanInfo, Track};
use crate::runtime::cuda::{Event, Gpu};

/// One collective in flight or waiting to be accounted.
struct Op {
    kind: CollectiveKind,
    bytes: u64,
    start: Event,
    end: Event,
    /// The step a timeline was recording when it was issued.
    traced: Option<u32>,
}

pub struct NcclCollectives {
    comm: ncclsys::ncclComm_t,
    gpu: Arc<Gpu>,
    host: HostGroup,
    rank: usize,
    world: usize,
    /// By `Pending` id (never reused): issued and not yet accounted.
    ops: std::collections::BTreeMap<usize, Op>,
    next_op: usize,
    /// Where each compute-stream wait is reported, as (before, after) events.
    clock: Option<SharedClock>,
    control: Tensor,
    timeline: Option<SharedTimeline>,
    /// `--copy-engines`: the transport, and whether reductions (reduce-scatter, all-reduce) use it
    /// too or only all-gathers.
    peer_copy: Option<PeerCopy>,
    peer_copy_reductions: bool,
    /// Uploads that may still be running: the device bytes each writes, by `Pending` id.
    uploads: Vec<(std::ops::Range<usize>, usize)>,
}

/// Which stream an operation runs on.
#[derive(Clone, Copy)]
enum Lane {
    Comm,
    Upload,
}

/// Bytes of each inbox slot of the copy-engine transport (the largest piece it moves at once).
const PEER_COPY_SLOT_BYTES: usize = 64 << 20;

/// `NCCL_CONFIG_INITIALIZER` of nccl.h: every field "undefined" (NCCL's defaults), tagged with
/// the struct's size, magic number and the version of the headers the bindings come from.
fn default_config() -> ncclsys::ncclConfig_t {
    const UNDEF: c_int = c_int::MIN;
    ncclsys::ncclConfig_t {
        size: std::mem::size_of::<ncclsys::ncclConfig_t>(),
        magic: 0xcafe_beef,
        version: 22803, // NCCL_VERSION(2, 28, 3), the headers cudarc's bindings were made from
        blocking: UNDEF,
        cgaClusterSize: UNDEF,
        minCTAs: UNDEF,
        maxCTAs: UNDEF,
        netName: std::ptr::null(),
        splitShare: UNDEF,
        trafficClass: UNDEF,
        commName: std::ptr::null(),
        collnetEnable: UNDEF,
        CTAPolicy: UNDEF,
        shrinkShare: UNDEF,
        nvlsCTAs: UNDEF,
        nChannelsPerNetPeer: UNDEF,
        nvlinkCentricSched: UNDEF,
    }
}

/// NCCL's failure with its words for it: the result's name and NCCL's last error message (its
/// reason, e.g. no socket interface matching `NCCL_SOCKET_IFNAME`), where it has one.
fn nccl_err(op: &'static str, e: nccl::NcclError) -> CommError {
    let text = |p: *const std::ffi::c_char| {
        // SAFETY: NCCL returns a null pointer or a NUL-terminated string it owns and keeps.
        (!p.is_null()).then(|| unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().trim().to_string())
    };
    // SAFETY: both only read NCCL's state; a null communicator asks for the last error of any.
    let (name, last) =
        unsafe { (text(ncclsys::ncclGetErrorString(e.0)), text(ncclsys::ncclGetLastError(std::ptr::null_mut()))) };
    let mut message = format!("{:?}", e.0);
    for part in [name, last].into_iter().flatten().filter(|s| !s.is_empty()) {
        message.push_str(": ");
        message.push_str(&part);
    }
    CommError::Failed { op, message }
}

fn cuda_err(op: &'static str, e: cudarc::driver::DriverError) -> CommError {
    CommError::Failed { op, message: format!("CUDA: {e}") }
}

impl NcclCollectives {
    /// Creates the NCCL communicator of all ranks of `host` on this rank's GPU; `max_ctas` caps the
    /// thread blocks of each collective; `copy_engines` moves the data of those collectives with
    /// peer copies ([`PeerCopy`]; every rank must be on this host).
    pub fn new(
        mut host: HostGroup,
        gpu: Arc<Gpu>,
        max_ctas: Option<u32>,
        copy_engines: Option<CopyEngines>,
    ) -> Result<Self, CommError> {
        let (rank, world) = (host.rank(), host.size());
        let mut id_bytes = [0u8; 128];
        if rank == 0 {
            let id = nccl::get_uniqueid().map_err(|e| nccl_err("ncclGetUniqueId", e))?;
            for (b, c) in id_bytes.iter_mut().zip(id.internal.iter()) {
                *b = *c as u8;
            }
        }
        host.broadcast_bytes(&mut id_bytes, 0)?;
        let mut id = ncclsys::ncclUniqueId { internal: [0; 128] };
        for (c, b) in id.internal.iter_mut().zip(id_bytes.iter()) {
            *c = *b as std::ffi::c_char;
        }
        gpu.ctx.bind_to_thread().map_err(|e| cuda_err("bind", e))?;
        let mut comm = MaybeUninit::uninit();
        // Both calls: every rank passes the same id and its own rank; the current device is this
        // rank's GPU (the only one it sees).
        match max_ctas {
            // SAFETY: as above.
            None => unsafe { nccl::comm_init_rank(comm.as_mut_ptr(), world as c_int, id, rank as c_int) }
                .map_err(|e| nccl_err("ncclCommInitRank", e))?,
            Some(c) => {
                let mut config = default_config();
                config.maxCTAs = c_int::try_from(c).unwrap_or(c_int::MAX);
                // SAFETY: as above; `config` is initialised as NCCL_CONFIG_INITIALIZER.
                unsafe {
                    nccl::comm_init_rank_config(comm.as_mut_ptr(), world as c_int, id, rank as c_int, &mut config)
                }
                .map_err(|e| nccl_err("ncclCommInitRankConfig", e))?
            }
        };
        // SAFETY: initialised by the successful call above.
        let comm = unsafe { comm.assume_init() };
        crate::runtime::guard::watch_nccl(comm as usize);
        let control = Tensor::zeros([2], (Kind::Float, Device::Cuda(0)));
        let peer_copy = if copy_engines.is_some() {
            let hosts = host.host_names()?;
            let local = hosts.iter().filter(|h| **h == hosts[rank]).count();
            if local != world {
                return Err(CommError::Failed {
                    op: "copy-engine setup",
                    message: format!("--copy-engines needs every rank on one host; {local} of {world} share this one"),
                });
            }
            Some(PeerCopy::new(&mut host, Arc::clone(&gpu), PEER_COPY_SLOT_BYTES)?)
        } else {
            None
        };
        Ok(Self {
            comm,
            gpu,
            host,
            rank,
            world,
            ops: Default::default(),
            next_op: 0,
            clock: None,
            control,
            timeline: None,
            peer_copy,
            peer_copy_reductions: copy_engines == Some(CopyEngines::All),
            uploads: Vec::new(),
        })
    }

    /// NCCL's version, e.g. `2.28.9`.
    pub fn version() -> Option<String> {
        let v = nccl::get_nccl_version().ok()?;
        Some(format!("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100))
    }

    fn dtype(e: Elem) -> ncclsys::ncclDataType_t {
        match e {
            Elem::F32 => ncclsys::ncclDataType_t::ncclFloat32,
            Elem::Bf16 => ncclsys::ncclDataType_t::ncclBfloat16,
            Elem::F16 => ncclsys::ncclDataType_t::ncclFloat16,
        }
    }

    /// Makes the communication stream wait for every upload still running that writes memory
    /// of `touched` (device tensors the next operation there reads or writes), and forgets the
    /// uploads that have finished.
    fn after_uploads(&mut self, op: &'static str, touched: &[&Tensor]) -> Result<(), CommError> {
        let g = Arc::clone(&self.gpu);
        // An upload no longer listed in `ops` has been accounted, so it has completed.
        self.uploads.retain(|(_, id)| self.ops.get(id).is_some_and(|o| !g.is_done(o.end)));
        for (range, id) in &self.uploads {
            let overlaps = touched.iter().any(|t| {
                let lo = t.data_ptr() as usize;
                let hi = lo + t.numel() * t.kind().elt_size_in_bytes();
                lo < range.end && range.start < hi
            });
            if overlaps {
                g.wait(&g.comm, self.ops[id].end).map_err(|e| cuda_err(op, e))?;
            }
        }
        Ok(())
    }

    /// Orders an operation after the compute stream's work, runs `launch` on `lane`'s stream
    /// between timing events, and returns its `Pending`. On the communication stream it first
    /// waits for the uploads that write memory of `touched` (see [`Self::after_uploads`]).
    fn issue(
        &mut self,
        kind: CollectiveKind,
        bytes: usize,
        lane: Lane,
        touched: &[&Tensor],
        launch: impl FnOnce(ncclsys::cudaStream_t) -> Result<(), CommError>,
    ) -> Result<Pending, CommError> {
        let op = kind.name();
        if let Lane::Comm = lane {
            self.after_uploads(op, touched)?;
        }
        let g = &self.gpu;
        let stream = match lane {
            Lane::Comm => &g.comm,
            Lane::Upload => &g.upload,
        };
        let ready = g.mark(&g.compute).map_err(|e| cuda_err(op, e))?;
        g.wait(stream, ready).map_err(|e| cuda_err(op, e))?;
        let start = g.mark(stream).map_err(|e| cuda_err(op, e))?;
        launch(stream.cu_stream() as ncclsys::cudaStream_t)?;
        let end = g.mark(stream).map_err(|e| cuda_err(op, e))?;
        // `ready` has been consumed by the wait: the stream holds its own reference to the
        // recorded work, so the event may be reused.
        g.recycle(ready);
        let traced = self.timeline.as_ref().and_then(|t| t.lock().expect("timeline").recording_step());
        let id = self.next_op;
        self.next_op += 1;
        self.ops.insert(id, Op { kind, bytes: bytes as u64, start, end, traced });
        Ok(Pending(Some(id)))
    }

    /// Issues a collective that the copy-engine transport carries out.
    fn through_peer_copy(
        &mut self,
        kind: CollectiveKind,
        bytes: usize,
        touched: &[&Tensor],
        run: impl FnOnce(&mut PeerCopy) -> Result<(), CommError>,
    ) -> Result<Pending, CommError> {
        let mut pc = self.peer_copy.take().expect("called with the copy-engine transport");
        let pending = self.issue(kind, bytes, Lane::Comm, touched, |_| run(&mut pc));
        self.peer_copy = Some(pc);
        pending
    }

    fn ptr(t: &Tensor) -> *mut std::ffi::c_void {
        t.data_ptr()
    }
}

impl Collectives for NcclCollectives {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.world
    }

    fn all_reduce(&mut self, buf: &Tensor) -> Result<Pending, CommError> {
        const OP: &str = "all_reduce";
        let (e, n) = flat(buf, OP)?;
        let (p, comm) = (Self::ptr(buf), self.comm);
        if self.peer_copy_reductions && n % self.world == 0 {
            // A reduce-scatter into this rank's slice, then an all-gather of the slices, in place.
            let (whole, m) = (Self::ptr(buf) as u64, n / self.world);
            let mine = whole + (self.rank * m * e.size()) as u64;
            return self.through_peer_copy(CollectiveKind::AllReduce, n * e.size(), &[buf], |pc| {
                pc.reduce_scatter(whole, mine, m, e)?;
                pc.all_gather(mine, whole, m, e)
            });
        }
        self.issue(CollectiveKind::AllReduce, n * e.size(), Lane::Comm, &[buf], |s| {
            // SAFETY: a contiguous device tensor of `n` elements of type `e`, kept alive by the
            // engine until the collective is waited on.
            unsafe { nccl::all_reduce(p, p, n, Self::dtype(e), ncclsys::ncclRedOp_t::ncclSum, comm, s) }
                .map(|_| ())
                .map_err(|err| nccl_err(OP, err))
        })
    }

    fn reduce_scatter(&mut self, input: &Tensor, output: &Tensor) -> Result<Pending, CommError> {
        const OP: &str = "reduce_scatter";
        let (e, n) = flat(input, OP)?;
        let (eo, m) = flat(output, OP)?;
        if e != eo || m * self.world != n {
            return Err(CommError::BadTensor {
                op: OP,
                reason: format!("input {n} and output {m} elements on {} ranks", self.world),
            });
        }
        if self.peer_copy_reductions {
            return self.through_peer_copy(CollectiveKind::ReduceScatter, n * e.size(), &[input, output], |pc| {
                pc.reduce_scatter(Self::ptr(input) as u64, Self::ptr(output) as u64, m, e)
            });
        }
        let (i, o, comm) = (Self::ptr(input), Self::ptr(output), self.comm);
        self.issue(CollectiveKind::ReduceScatter, n * e.size(), Lane::Comm, &[input, output], |s| {
            // SAFETY: contiguous device tensors of the checked sizes; NCCL allows the output to be
            // the rank's slice of the input.
            unsafe { nccl::reduce_scatter(i, o, m, Self::dtype(e), ncclsys::ncclRedOp_t::ncclSum, comm, s) }
                .map(|_| ())
                .map_err(|err| nccl_err(OP, err))
        })
    }

    fn all_gather(&mut self, input: &Tensor, output: &Tensor) -> Result<Pending, CommError> {
        const OP: &str = "all_gather";
        let (e, n) = flat(input, OP)?;
        let (eo, m) = flat(output, OP)?;
        if e != eo || n * self.world != m {
            return Err(CommError::BadTensor {
                op: OP,
                reason: format!("input {n} and output {m} elements on {} ranks", self.world),
            });
        }
        if self.peer_copy.is_some() {
            return self.through_peer_copy(CollectiveKind::AllGather, m * e.size(), &[input, output], |pc| {
                pc.all_gather(Self::ptr(input) as u64, Self::ptr(output) as u64, n, e)
            });
        }
        let (i, o, comm) = (Self::ptr(input), Self::ptr(output), self.comm);
        self.issue(CollectiveKind::AllGather, m * e.size(), Lane::Comm, &[input, output], |s| {
            // SAFETY: as for reduce-scatter; the input may be the rank's slice of the output.
            unsafe { nccl::all_gather(i, o, n, Self::dtype(e), comm, s) }.map(|_| ()).map_err(|err| nccl_err(OP, err))
        })
    }

    fn broadcast(&mut self, buf: &Tensor, root: usize) -> Result<Pending, CommError> {
        const OP: &str = "broadcast";
        let (e, n) = flat(buf, OP)?;
        let (p, comm) = (Self::ptr(buf), self.comm);
        self.issue(CollectiveKind::Broadcast, n * e.size(), Lane::Comm, &[buf], |s| {
            // SAFETY: a contiguous device tensor of `n` elements.
            unsafe { nccl::broadcast(p, p, n, Self::dtype(e), root as c_int, comm, s) }
                .map(|_| ())
                .map_err(|err| nccl_err(OP, err))
        })
    }

    fn wait(&mut self, pending: Pending) -> Result<(), CommError> {
        let Some(id) = pending.0 else { return Ok(()) };
        // Accounted already: it has completed, nothing to wait for.
        let Some(op) = self.ops.get(&id) else { return Ok(()) };
        let end = op.end;
        let g = &self.gpu;
        match &self.clock {
            Some(c) => {
                let before = g.mark(&g.compute).map_err(|e| cuda_err("wait", e))?;
                g.wait(&g.compute, end).map_err(|e| cuda_err("wait", e))?;
                let after = g.mark(&g.compute).map_err(|e| cuda_err("wait", e))?;
                c.exposed(Mark::Device(before), Mark::Device(after));
            }
            None => g.wait(&g.compute, end).map_err(|e| cuda_err("wait", e))?,
        }
        Ok(())
    }

    fn max_over_ranks(&mut self, values: &mut [f64]) -> Result<(), CommError> {
        self.host.max_f64(values)
    }

    fn barrier(&mut self) -> Result<(), CommError> {
        self.gpu.comm.synchronize().map_err(|e| cuda_err("barrier", e))?;
        self.gpu.upload.synchronize().map_err(|e| cuda_err("barrier", e))?;
        self.host.barrier()
    }

    fn copy_to_host(&mut self, src: &Tensor, dst: &Tensor) -> Result<(Pending, HostCopy), CommError> {
        const OP: &str = "d2h";
        let (e, n) = flat(src, OP)?;
        let (eo, m) = flat(dst, OP)?;
        if e != eo || n != m || dst.device() != Device::Cpu {
            return Err(CommError::BadTensor { op: OP, reason: format!("{n} device elements into {m} host elements") });
        }
        let (s, d, bytes) = (Self::ptr(src) as u64, Self::ptr(dst), n * e.size());
        let p = self.issue(CollectiveKind::DeviceToHost, bytes, Lane::Comm, &[src], |stream| {
            // SAFETY: a contiguous device tensor and a pinned host tensor of `bytes`, both kept alive
            // by the engine until the copy is waited on.
            unsafe { cudarc::driver::sys::cuMemcpyDtoHAsync_v2(d, s, bytes, stream as _) }
                .result()
                .map_err(|err| CommError::Failed { op: OP, message: err.to_string() })
        })?;
        let g = &self.gpu;
        let landed = g.mark(&g.comm).map_err(|err| cuda_err(OP, err))?;
        Ok((p, HostCopy::Event(Arc::clone(g), landed)))
    }

    fn copy_to_device(&mut self, src: &Tensor, dst: &Tensor) -> Result<(Pending, HostCopy), CommError> {
        const OP: &str = "h2d";
        let (e, n) = flat(src, OP)?;
        let (eo, m) = flat(dst, OP)?;
        if e != eo || n != m || src.device() != Device::Cpu {
            return Err(CommError::BadTensor { op: OP, reason: format!("{n} host elements into {m} device elements") });
        }
        let (s, d, bytes) = (Self::ptr(src), Self::ptr(dst) as u64, n * e.size());
        let p = self.issue(CollectiveKind::HostToDevice, bytes, Lane::Upload, &[], |stream| {
            // SAFETY: a pinned host tensor and a contiguous device tensor of `bytes`, alive until
            // the copy is waited on.
            unsafe { cudarc::driver::sys::cuMemcpyHtoDAsync_v2(d, s, bytes, stream as _) }
                .result()
                .map_err(|err| CommError::Failed { op: OP, message: err.to_string() })
        })?;
        if let Some(id) = p.0 {
            self.uploads.push((d as usize..d as usize + bytes, id));
        }
        let g = &self.gpu;
        let read = g.mark(&g.upload).map_err(|err| cuda_err(OP, err))?;
        Ok((p, HostCopy::Event(Arc::clone(g), read)))
    }

    fn copy_device(&mut self, src: &Tensor, dst: &Tensor) -> Result<Pending, CommError> {
        const OP: &str = "d2d";
        let (e, n) = flat(src, OP)?;
        let (eo, m) = flat(dst, OP)?;
        if e != eo || n != m {
            return Err(CommError::BadTensor { op: OP, reason: format!("{n} elements into {m}") });
        }
        let (s, d, bytes) = (Self::ptr(src) as u64, Self::ptr(dst) as u64, n * e.size());
        self.issue(CollectiveKind::DeviceToDevice, bytes, Lane::Comm, &[src, dst], |stream| {
            // SAFETY: contiguous device tensors of `bytes`, alive until the copy is waited on.
            unsafe { cudarc::driver::sys::cuMemcpyDtoDAsync_v2(d, s, bytes, stream as _) }
                .result()
                .map_err(|err| CommError::Failed { op: OP, message: err.to_string() })
        })
    }

    fn reduce_control(&mut self, buf: &Tensor) -> Result<(), CommError> {
        const OP: &str = "reduce_control";
        let n = buf.numel();
        if buf.kind() != Kind::Float || n > 2 {
            return Err(CommError::BadTensor { op: OP, reason: "at most two fp32 control values".into() });
        }
        let dev = self.control.narrow(0, 0, n as i64);
        dev.shallow_clone().copy_(buf);
        let g = &self.gpu;
        let ready = g.mark(&g.compute).map_err(|e| cuda_err(OP, e))?;
        g.wait(&g.comm, ready).map_err(|e| cuda_err(OP, e))?;
        let p = Self::ptr(&dev);
        // SAFETY: the persistent 2-element control buffer.
        unsafe {
            nccl::all_reduce(
                p,
                p,
                n,
                ncclsys::ncclDataType_t::ncclFloat32,
                ncclsys::ncclRedOp_t::ncclSum,
                self.comm,
                g.comm.cu_stream() as _,
            )
        }
        .map_err(|e| nccl_err(OP, e))?;
        let done = g.mark(&g.comm).map_err(|e| cuda_err(OP, e))?;
        g.wait(&g.compute, done).map_err(|e| cuda_err(OP, e))?;
        g.recycle(ready);
        buf.shallow_clone().copy_(&dev);
        g.recycle(done);
        Ok(())
    }

    fn take_stats(&mut self) -> Result<StepComm, CommError> {
        let mut stats = StepComm::default();
        let g = Arc::clone(&self.gpu);
        // Collectives still running (the post-step parameter all-gathers overlap the next forward)
        // are accounted in the step in which they have completed.
        let done: Vec<usize> = self.ops.iter().filter(|(_, op)| g.is_done(op.end)).map(|(id, _)| *id).collect();
        for id in done {
            let op = self.ops.remove(&id).expect("listed");
            let ms = g.elapsed_ms(op.start, op.end).map_err(|e| cuda_err("timing", e))?;
            stats.record(op.kind, op.bytes, ms);
            match (op.traced, &self.timeline) {
                (Some(step), Some(t)) => {
                    // The timeline reads and recycles the events.
                    let info = SpanInfo { segment: None, bytes: Some(op.bytes) };
                    let name = op.kind.name();
                    t.lock().expect("timeline").span_in(
                        step,
                        Track::Comm(name),
                        name,
                        Mark::Device(op.start),
                        Mark::Device(op.end),
                        info,
                    );
                }
                _ => {
                    g.recycle(op.start);
                    g.recycle(op.end);
                }
            }
        }
        Ok(stats)
    }

    fn set_clock(&mut self, clock: SharedClock) {
        self.clock = Some(clock);
    }

    fn set_timeline(&mut self, timeline: SharedTimeline) {
        self.timeline = Some(timeline);
    }

    fn transport_bytes(&self) -> u64 {
        self.peer_copy.as_ref().map_or(0, PeerCopy::bytes)
    }
}

impl Drop for NcclCollectives {
    fn drop(&mut self) {
        crate::runtime::guard::unwatch_nccl(self.comm as usize);
        // SAFETY: the communicator is ours; abort does not wait for peers that may be gone.
        let _ = unsafe { nccl::comm_abort(self.comm) };
    }
}
