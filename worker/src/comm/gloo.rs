//! Collectives on CPU tensors for ranks launched with the environment convention
//! (`--rendezvous env`): c10d's `ProcessGroupGloo`, the CPU backend of `torch.distributed`,
//! reached through the shim ([`crate::runtime::shim::GlooGroup`]).
//!
//! The ranks already share the run's c10d `TCPStore` ([`super::group`]); each group (the world,
//! and hpZ's groups) connects its Gloo process group under keys of its own there. Gloo sums 16-bit
//! floats one addition at a time, each rounded to the element type, as [`super::mpi`] does.
//!
//! Failure: a rank that dies closes its connections, and its peers' calls fail at once with
//! Gloo's error. A rank that hangs is the stall guard's (`--stall-timeout-s`) to stop: a
//! collective itself waits up to [`OP_TIMEOUT`], as long as any step may take.

use std::time::Duration;

use tch::{Device, Tensor};

use super::group::{first_line, HostGroup, StoreGroup};
use super::{flat, Blocking, CollectiveKind, Collectives, CommError, Elem, HostCopy, Pending, StepComm};
use crate::metrics::clock::SharedClock;
use crate::metrics::timeline::SharedTimeline;
use crate::runtime::shim::{GlooGroup, ShimError};

/// How long one collective may wait for the other ranks. Gloo has no "forever" (a timeout of 0 is
/// 0 ms), so a day stands for it; a run whose peers stop answering sooner is the stall guard's.
pub const OP_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

pub struct GlooCollectives {
    /// Dropped before `host`: a rank that stops closes its connections first, so its peers'
    /// calls fail at once instead of waiting on rank 0's store at exit.
    group: GlooGroup,
    host: HostGroup,
    rank: usize,
    world: usize,
    calls: Blocking,
}

fn failed(e: ShimError) -> String {
    first_line(&e.0)
}

impl GlooCollectives {
    /// Connects the ranks of `group`, within the group's rendezvous timeout.
    pub fn connect(group: StoreGroup) -> Result<Self, CommError> {
        let gloo = group.gloo(OP_TIMEOUT)?;
        let host = HostGroup::Store(group);
        let (rank, world) = (host.rank(), host.size());
        Ok(Self { group: gloo, host, rank, world, calls: Blocking::default() })
    }

    /// The element type and length of a contiguous CPU tensor of a summable type.
    fn cpu(t: &Tensor, op: &'static str) -> Result<(Elem, usize), CommError> {
        if t.device() != Device::Cpu {
            return Err(CommError::BadTensor { op, reason: "Gloo collectives move CPU tensors here".into() });
        }
        flat(t, op)
    }

    /// Checks that `small` holds one rank's share of `whole`, of the same type.
    fn shares(&self, op: &'static str, whole: &Tensor, small: &Tensor) -> Result<(Elem, usize), CommError> {
        let (e, n) = Self::cpu(whole, op)?;
        let (es, m) = Self::cpu(small, op)?;
        if e != es || m * self.world != n {
            return Err(CommError::BadTensor {
                op,
                reason: format!("{n} elements of {e:?} against {m} of {es:?} on {} ranks", self.world),
            });
        }
        Ok((e, n))
    }
}

impl Collectives for GlooCollectives {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.world
    }

    fn all_reduce(&mut self, buf: &Tensor) -> Result<Pending, CommError> {
        let (e, n) = Self::cpu(buf, "all_reduce")?;
        let group = &mut self.group;
        self.calls.timed(CollectiveKind::AllReduce, n * e.size(), || group.all_reduce(buf).map_err(failed))
    }

    fn reduce_scatter(&mut self, input: &Tensor, output: &Tensor) -> Result<Pending, CommError> {
        let (e, n) = self.shares("reduce_scatter", input, output)?;
        let group = &mut self.group;
        self.calls
            .timed(CollectiveKind::ReduceScatter, n * e.size(), || group.reduce_scatter(input, output).map_err(failed))
    }

    fn all_gather(&mut self, input: &Tensor, output: &Tensor) -> Result<Pending, CommError> {
        let (e, n) = self.shares("all_gather", output, input)?;
        let group = &mut self.group;
        self.calls.timed(CollectiveKind::AllGather, n * e.size(), || group.all_gather(input, output).map_err(failed))
    }

    fn broadcast(&mut self, buf: &Tensor, root: usize) -> Result<Pending, CommError> {
        const OP: &str = "broadcast";
        let (e, n) = Self::cpu(buf, OP)?;
        if root >= self.world {
            return Err(CommError::BadTensor { op: OP, reason: format!("root {root} of {} ranks", self.world) });
        }
        let group = &mut self.group;
        self.calls.timed(CollectiveKind::Broadcast, n * e.size(), || group.broadcast(buf, root).map_err(failed))
    }

    fn wait(&mut self, _pending: Pending) -> Result<(), CommError> {
        Ok(())
    }

    fn barrier(&mut self) -> Result<(), CommError> {
        self.host.barrier()
    }

    fn copy_to_host(&mut self, src: &Tensor, dst: &Tensor) -> Result<(Pending, HostCopy), CommError> {
        let p = self.calls.host_copy(CollectiveKind::DeviceToHost, src, dst)?;
        Ok((p, HostCopy::Done))
    }

    fn copy_to_device(&mut self, src: &Tensor, dst: &Tensor) -> Result<(Pending, HostCopy), CommError> {
        let p = self.calls.host_copy(CollectiveKind::HostToDevice, src, dst)?;
        Ok((p, HostCopy::Done))
    }

    fn copy_device(&mut self, src: &Tensor, dst: &Tensor) -> Result<Pending, CommError> {
        self.calls.host_copy(CollectiveKind::DeviceToDevice, src, dst)
    }

    fn reduce_control(&mut self, buf: &Tensor) -> Result<(), CommError> {
        const OP: &str = "reduce_control";
        let (e, _) = Self::cpu(buf, OP)?;
        if e != Elem::F32 {
            return Err(CommError::BadTensor { op: OP, reason: "control values are fp32 on the CPU".into() });
        }
        self.group.all_reduce(buf).map_err(|err| CommError::Failed { op: OP, message: failed(err) })
    }

    fn max_over_ranks(&mut self, values: &mut [f64]) -> Result<(), CommError> {
        self.host.max_f64(values)
    }

    fn take_stats(&mut self) -> Result<StepComm, CommError> {
        Ok(std::mem::take(&mut self.calls.stats))
    }

    fn set_timeline(&mut self, timeline: SharedTimeline) {
        self.calls.timeline = Some(timeline);
    }

    fn set_clock(&mut self, clock: SharedClock) {
        self.calls.clock = Some(clock);
    }
}
