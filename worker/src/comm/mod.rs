//! Collectives over the ranks of a run, on flat contiguous tensors, always summing.
//!
//! [`Collectives`] is what the ZeRO engine calls. A call *issues* the operation after all work
//! already issued on the compute stream and returns a [`Pending`]; the engine calls
//! [`Collectives::wait`] before computation reads the result. On CPU over MPI a call completes
//! before it returns, so waiting is free and all communication is exposed. On GPUs over NCCL the
//! operation runs on its own stream and `wait` makes the compute stream wait for it, so the time
//! computation actually waited is the exposed communication. Either way each wait is reported to
//! the step clock ([`Collectives::set_clock`]), which charges it to the phase it happened in.
//!
//! Every call's bytes and duration are recorded per kind and handed over per step by
//! [`Collectives::take_stats`]. Bytes follow nccl-tests: the size of the whole array (all-reduce:
//! the buffer; reduce-scatter: the input; all-gather: the output; broadcast: the buffer).
//!
//! Offload's copies between device and host memory go through the same interface, on the same
//! stream, so a copy of a reduced gradient is ordered after its reduce-scatter and a copy of updated
//! parameters before their all-gather, without extra synchronisation.

pub mod gloo;
pub mod group;
pub mod mpi;
pub mod nccl;
pub mod peer_copy;
pub mod solo;
pub mod stats;

use std::time::Instant;

use tch::{Kind, Tensor};

use crate::metrics::clock::SharedClock;
use crate::metrics::timeline::{Mark, SharedTimeline, SpanInfo, Track};

pub use stats::{CollectiveKind, StepComm};

/// A copy between the device and host memory that host code (the CPU optimizer) waits for, from
/// any thread: until a download has landed in its host buffer, or an upload has read its host
/// buffer.
#[must_use = "wait for the copy before using the host buffer"]
pub enum HostCopy {
    /// Completed before the call returned.
    Done,
    /// Completed when the event has been reached; the waiter recycles the event.
    Event(std::sync::Arc<crate::runtime::cuda::Gpu>, crate::runtime::cuda::Event),
}

impl HostCopy {
    /// Gives the copy's event back unwaited, where a later copy on the same stream supersedes it
    /// (a copy dropped instead keeps its event out of the pool for good).
    pub fn release(self) {
        if let HostCopy::Event(g, e) = self {
            g.recycle(e);
        }
    }

    /// Blocks the calling thread until the copy has landed.
    pub fn wait(self) -> Result<(), CommError> {
        match self {
            HostCopy::Done => Ok(()),
            HostCopy::Event(g, e) => {
                let r = g
                    .synchronize_event(e)
                    .map_err(|err| CommError::Failed { op: "host copy", message: err.to_string() });
                g.recycle(e);
                r
            }
        }
    }
}

/// A collective that has been issued and may still be running.
#[must_use = "wait for a collective before reading its result"]
#[derive(Debug)]
pub struct Pending(pub(crate) Option<usize>);

impl Pending {
    /// A collective that completed before its call returned.
    pub fn done() -> Self {
        Pending(None)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CommError {
    #[error("{op}: unsupported tensor ({reason})")]
    BadTensor { op: &'static str, reason: String },
    #[error("{op} failed: {message}")]
    Failed { op: &'static str, message: String },
}

/// Which collectives a rank's world talks over. It is settled before any communicator is built,
/// so that the `start` record names it and a communicator that fails to start (NCCL's set-up, a
/// Gloo connection) is logged after that record, as every other failure is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// GPU ranks, one or several.
    Nccl,
    /// CPU ranks that `mpirun` started, more than one.
    Mpi,
    /// CPU ranks that met at a TCP store.
    Gloo,
    /// Nothing to talk to: one CPU rank under MPI, or one GPU rank replaying CUDA graphs (whose
    /// collectives the graphs capture as copies).
    None,
}

impl Backend {
    /// The backend of a rank that met the others over `host`, on a GPU or not, replaying CUDA
    /// graphs or not (the configuration's rules allow graphs on one rank only).
    pub fn of(host: &group::HostGroup, on_gpu: bool, cuda_graph: bool) -> Self {
        match (on_gpu, host) {
            (true, _) if cuda_graph => Backend::None,
            (true, _) => Backend::Nccl,
            (false, group::HostGroup::Store(_)) => Backend::Gloo,
            (false, group::HostGroup::Mpi(_)) if host.size() > 1 => Backend::Mpi,
            (false, group::HostGroup::Mpi(_)) => Backend::None,
        }
    }

    /// The name logs give it (`start.comm_backend`).
    pub fn name(self) -> &'static str {
        match self {
            Backend::Nccl => "nccl",
            Backend::Mpi => "mpi",
            Backend::Gloo => "gloo",
            Backend::None => "none",
        }
    }
}

/// The collectives of CPU ranks: MPI's, or c10d Gloo's for ranks that met at a store.
pub fn cpu_collectives(host: group::HostGroup) -> Result<Box<dyn Collectives>, CommError> {
    Ok(match host {
        group::HostGroup::Mpi(c) => Box::new(mpi::MpiCollectives::new(c)),
        group::HostGroup::Store(g) => Box::new(gloo::GlooCollectives::connect(g)?),
    })
}

/// The collectives the ZeRO engine needs.
pub trait Collectives {
    fn rank(&self) -> usize;
    fn world(&self) -> usize;
    /// `buf` := sum over ranks of `buf`.
    fn all_reduce(&mut self, buf: &Tensor) -> Result<Pending, CommError>;
    /// `output` := this rank's 1/world slice of the sum over ranks of `input`.
    /// `output` may be that very slice of `input` (in place).
    fn reduce_scatter(&mut self, input: &Tensor, output: &Tensor) -> Result<Pending, CommError>;
    /// `output` := the concatenation over ranks of `input`; `input` may be this rank's slice of
    /// `output` (in place).
    fn all_gather(&mut self, input: &Tensor, output: &Tensor) -> Result<Pending, CommError>;
    /// `buf` := `buf` of rank `root`.
    fn broadcast(&mut self, buf: &Tensor, root: usize) -> Result<Pending, CommError>;
    /// Makes computation wait for a pending collective.
    fn wait(&mut self, pending: Pending) -> Result<(), CommError>;
    fn barrier(&mut self) -> Result<(), CommError>;
    /// Copies the device tensor `src` into the (pinned) host tensor `dst`, after the
    /// communication already issued; `Pending` orders computation after it (before `src` is
    /// overwritten), `HostCopy` lets host code wait for `dst`.
    fn copy_to_host(&mut self, src: &Tensor, dst: &Tensor) -> Result<(Pending, HostCopy), CommError>;
    /// Copies the (pinned) host tensor `src` into the device tensor `dst`, after the computation
    /// issued so far and before any communication issued next that touches `dst`; it need not
    /// wait for the communication already issued (on a GPU it has a stream of its own).
    /// `Pending` orders computation after it; `HostCopy` lets host code wait until `src` has been
    /// read, before overwriting it.
    fn copy_to_device(&mut self, src: &Tensor, dst: &Tensor) -> Result<(Pending, HostCopy), CommError>;
    /// Copies one device tensor into another on the communication stream, after the
    /// communication already issued (hpZ keeps a slice of a just-gathered unit this way).
    fn copy_device(&mut self, src: &Tensor, dst: &Tensor) -> Result<Pending, CommError>;
    /// Sums a few fp32 control values (the step's loss, an overflow flag) over ranks, in place:
    /// on the CPU (MPI) or on the CPU or this rank's GPU (NCCL; a GPU result is ordered before
    /// later work on the compute stream). Not counted in the step's communication: it is
    /// bookkeeping of a few bytes.
    fn reduce_control(&mut self, buf: &Tensor) -> Result<(), CommError>;
    /// `values` := the element-wise maximum over ranks (host values: the run's step times at its
    /// end, not counted as communication).
    fn max_over_ranks(&mut self, values: &mut [f64]) -> Result<(), CommError>;
    /// What this step's collectives cost; resets the counters.
    fn take_stats(&mut self) -> Result<StepComm, CommError>;
    /// Draws every collective issued while the timeline records a step on its own track.
    fn set_timeline(&mut self, timeline: SharedTimeline);
    /// Reports every wait of computation for communication to `clock` (without one, waits are not
    /// timed).
    fn set_clock(&mut self, clock: SharedClock);
    /// Device memory the transport itself holds, outside libtorch's allocator (the copy-engine
    /// inboxes and flags); none for NCCL alone and MPI.
    fn transport_bytes(&self) -> u64 {
        0
    }
}

/// Element types a collective can carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elem {
    F32,
    Bf16,
    F16,
}

impl Elem {
    pub fn of(t: &Tensor, op: &'static str) -> Result<Elem, CommError> {
        match t.kind() {
            Kind::Float => Ok(Elem::F32),
            Kind::BFloat16 => Ok(Elem::Bf16),
            Kind::Half => Ok(Elem::F16),
            k => Err(CommError::BadTensor { op, reason: format!("element type {k:?}") }),
        }
    }
    pub fn size(self) -> usize {
        match self {
            Elem::F32 => 4,
            Elem::Bf16 | Elem::F16 => 2,
        }
    }
}

/// Checks that `t` is contiguous and returns its element type and length.
pub(crate) fn flat(t: &Tensor, op: &'static str) -> Result<(Elem, usize), CommError> {
    if !t.is_contiguous() {
        return Err(CommError::BadTensor { op, reason: "not contiguous".into() });
    }
    let e = Elem::of(t, op)?;
    Ok((e, t.numel()))
}

/// Checks that `src` can be copied into `dst` (both contiguous, of one element type and length)
/// and returns that type and length.
pub(crate) fn matching(src: &Tensor, dst: &Tensor, op: &'static str) -> Result<(Elem, usize), CommError> {
    let (e, n) = flat(src, op)?;
    let (eo, m) = flat(dst, op)?;
    if e != eo || n != m {
        return Err(CommError::BadTensor { op, reason: format!("{n} elements into {m}") });
    }
    Ok((e, n))
}

/// Whether `a` is exactly the `rank`-th of `world` equal slices of `whole`.
pub(crate) fn is_rank_slice(a: &Tensor, whole: &Tensor, rank: usize, world: usize) -> bool {
    let n = a.numel();
    n * world == whole.numel()
        && a.kind() == whole.kind()
        && a.data_ptr() as usize == whole.data_ptr() as usize + rank * n * Elem::of(a, "").map_or(0, Elem::size)
}

/// What a transport whose calls complete before they return (MPI, Gloo on CPUs) keeps of them:
/// every call is drawn on the timeline, counted, and all of it is exposed to computation.
#[derive(Default)]
pub(crate) struct Blocking {
    pub stats: StepComm,
    pub timeline: Option<SharedTimeline>,
    pub clock: Option<SharedClock>,
}

impl Blocking {
    /// Runs one call of `kind` moving `bytes` (nccl-tests' convention); `f`'s error is its message.
    pub fn timed(
        &mut self,
        kind: CollectiveKind,
        bytes: usize,
        f: impl FnOnce() -> Result<(), String>,
    ) -> Result<Pending, CommError> {
        let t0 = Instant::now();
        let r = f();
        let t1 = Instant::now();
        if let Some(t) = &self.timeline {
            let info = SpanInfo { segment: None, bytes: Some(bytes as u64) };
            t.lock().expect("timeline").span(
                Track::Comm(kind.name()),
                kind.name(),
                Mark::Host(t0),
                Mark::Host(t1),
                info,
            );
        }
        r.map_err(|message| CommError::Failed { op: kind.name(), message })?;
        self.stats.record(kind, bytes as u64, t1.duration_since(t0).as_secs_f64() * 1e3);
        // Blocking calls: computation waits for all of it.
        if let Some(c) = &self.clock {
            c.exposed(Mark::Host(t0), Mark::Host(t1));
        }
        Ok(Pending::done())
    }

    /// On a CPU rank "device" and "host" memory are the same: a plain copy, timed like the rest.
    pub fn host_copy(&mut self, kind: CollectiveKind, src: &Tensor, dst: &Tensor) -> Result<Pending, CommError> {
        let (e, n) = matching(src, dst, kind.name())?;
        let (s, d) = (src.data_ptr(), dst.data_ptr());
        self.timed(kind, n * e.size(), || {
            // SAFETY: contiguous CPU tensors of the same size and type; distinct buffers.
            unsafe { std::ptr::copy_nonoverlapping(s.cast::<u8>(), d.cast::<u8>(), n * e.size()) };
            Ok(())
        })
    }
}
