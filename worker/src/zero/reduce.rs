//! How a unit's gradients get from backward into the shards its optimizer reads
//! (`zerobench_schema::memory::GradientPath`): stages 0 and 1, and 2 and 3 on one rank without
//! offload, gather whole units into buckets reduced at the last micro-step; stages 2 and 3
//! otherwise stage them into two buffers reduce-scattered every micro-step (one fills while the
//! other's collectives run). Offloaded units' reduced slices start for the host from here.

use tch::Tensor;
use zerobench_schema::config::ZeroStage;

use super::error::EngineError;
use super::unit::{len64, OptimState, Unit, UnitGrads};
use crate::comm::{Collectives, HostCopy, Pending};
use crate::runtime::shim;

/// How gradients are reduced, by their path, with the state each way needs.
pub(super) enum Reduction {
    /// `GradientPath::Buckets`: each unit's full buffer is all-reduced (stage 0) or
    /// reduce-scattered (the other stages) in buckets of units, at the last micro-step.
    Buckets(Buckets),
    /// `GradientPath::Staged` (stages 2 and 3): gradients are staged into two buffers and
    /// reduce-scattered every micro-step.
    Staged(Staging),
}

/// Full buffers: units whose gradients wait in them for the bucket to fill, and the reductions in
/// flight this step.
#[derive(Default)]
pub(super) struct Buckets {
    pub(super) units: Vec<usize>,
    pub(super) fill: usize,
    pub(super) reductions: Vec<Pending>,
}

/// Stage 2/3 staging for gradient reduce-scatter: two buffers used in turn, so one fills while the
/// other's collectives run.
pub(super) struct Staging {
    pub(super) buffers: [Tensor; 2],
    pub(super) current: usize,
    /// Next free element in the current buffer.
    pub(super) fill: usize,
    /// Collectives reading each buffer, and (unit, offset) regions whose reduced slice must still be
    /// added to the unit's gradient shard once they complete.
    pub(super) in_flight: [Vec<Pending>; 2],
    pub(super) to_accumulate: [Vec<(usize, usize)>; 2],
    /// Units staged in the current buffer and not yet reduced, with their offsets.
    pub(super) staged: Vec<(usize, usize)>,
}

impl Buckets {
    /// Where a unit's gradients go in its own buffer: its padding stays zero where `flush`
    /// all-reduces (stage 0: zeros sum to zeros) or runs over one rank (nothing moves); an in-place
    /// reduce-scatter over several ranks may use the buffer as scratch (MPI's leaves its result at
    /// the start), so there the padding is zeroed again.
    pub(super) fn own_place(stage: ZeroStage, world: usize) -> GradPlace {
        if stage == ZeroStage::Z0 || world == 1 {
            GradPlace::ZeroPadded
        } else {
            GradPlace::At(0)
        }
    }

    /// Reduces the gradients waiting in the bucket (stage 0: all-reduce; the others: reduce-scatter
    /// into this rank's slice); offloaded units' slices start for the host. Returns those copies.
    pub(super) fn flush(
        &mut self,
        stage: ZeroStage,
        units: &[Unit],
        comm: &mut dyn Collectives,
    ) -> Result<Vec<(usize, HostCopy)>, EngineError> {
        let mut landed = Vec::new();
        for u in std::mem::take(&mut self.units) {
            let unit = &units[u];
            let UnitGrads::Full { full, shard } = &unit.grads else {
                unreachable!("bucketed gradients have full buffers")
            };
            let p = match stage {
                ZeroStage::Z0 => comm.all_reduce(full)?,
                _ => comm.reduce_scatter(full, shard)?,
            };
            self.reductions.push(p);
            if let OptimState::Host(host) = &unit.optim {
                let (p, copy) = comm.copy_to_host(shard, &host.grad)?;
                self.reductions.push(p);
                landed.push((u, copy));
            }
        }
        self.fill = 0;
        Ok(landed)
    }
}

impl Staging {
    pub(super) fn capacity(&self) -> usize {
        self.buffers[0].numel()
    }

    /// Reduce-scatters every unit staged in the current buffer and makes the other buffer current
    /// (the caller drains it before filling it). `accumulate`: a later micro-step, whose reduced
    /// slices add to the shards. Returns the offloaded units' copies to the host, which have
    /// started.
    pub(super) fn flush(
        &mut self,
        units: &[Unit],
        comm: &mut dyn Collectives,
        world: usize,
        rank: usize,
        accumulate: bool,
    ) -> Result<Vec<(usize, HostCopy)>, EngineError> {
        let cur = self.current;
        let mut landed = Vec::new();
        for (u, offset) in std::mem::take(&mut self.staged) {
            let unit = &units[u];
            let padded = len64(unit.layout.padded);
            let region = self.buffers[cur].f_narrow(0, len64(offset), padded)?;
            let len = padded / world as i64;
            let slice = region.f_narrow(0, rank as i64 * len, len)?;
            match (&unit.grads, &unit.optim) {
                (UnitGrads::OnHost, OptimState::Host(host)) => {
                    // Offload: reduce in place and copy the rank's slice straight to the host; the
                    // bucket is reused only after the copy has left it.
                    let p = comm.reduce_scatter(&region, &slice)?;
                    self.in_flight[cur].push(p);
                    let (p, copy) = comm.copy_to_host(&slice, &host.grad)?;
                    self.in_flight[cur].push(p);
                    landed.push((u, copy));
                }
                (UnitGrads::Shard(_), _) if accumulate => {
                    // Reduce in place; the rank's slice is added to the shard once it is done.
                    let p = comm.reduce_scatter(&region, &slice)?;
                    self.in_flight[cur].push(p);
                    self.to_accumulate[cur].push((u, offset));
                }
                (UnitGrads::Shard(shard), _) => {
                    let p = comm.reduce_scatter(&region, shard)?;
                    self.in_flight[cur].push(p);
                }
                _ => unreachable!("stages 2 and 3 keep a device shard, or send it to the host's optimizer"),
            }
        }
        self.current = 1 - cur;
        self.fill = 0;
        Ok(landed)
    }

    /// Waits for the collectives reading buffer `b` and adds their results to the shards.
    pub(super) fn drain(
        &mut self,
        b: usize,
        units: &[Unit],
        comm: &mut dyn Collectives,
        world: usize,
        rank: usize,
    ) -> Result<(), EngineError> {
        let _guard = tch::no_grad_guard();
        for p in std::mem::take(&mut self.in_flight[b]) {
            comm.wait(p)?;
        }
        for (u, offset) in std::mem::take(&mut self.to_accumulate[b]) {
            let unit = &units[u];
            let n = len64(unit.layout.padded / world);
            let start = len64(offset) + len64(rank) * n;
            let reduced = self.buffers[b].f_narrow(0, start, n)?;
            let UnitGrads::Shard(shard) = &unit.grads else {
                unreachable!("only units with a device shard accumulate on the device")
            };
            let _ = shard.shallow_clone().f_add_(&reduced)?;
        }
        Ok(())
    }
}

/// Where in a buffer a unit's gradients are written, and whether its padding is zero there already.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum GradPlace {
    /// From element 0 of the unit's own buffer (`UnitGrads::Full`), whose padding is zero and
    /// stays so: allocated zeroed, and written only at the parameters' places and by collectives
    /// that leave zeros there ([`Buckets::own_place`]).
    ZeroPadded,
    /// From this element on, with the padding after the unit zeroed: a staging buffer that other
    /// units used before, or a unit's own buffer a collective may have written there.
    At(usize),
}

/// Moves a unit's gradients into `buf` at `place`, each parameter's at its place in the unit's
/// layout, added to what is there when `add` (a later micro-step), with the unit's padding zero.
/// Those backward's nodes wrote in place stay (`Engine::place_grads`); the rest are copied from
/// `.grad`, which is dropped. Returns how many were in place.
pub(super) fn write_grads(unit: &Unit, buf: &Tensor, place: GradPlace, add: bool) -> Result<usize, EngineError> {
    let layout = &unit.layout;
    let offset = match place {
        GradPlace::ZeroPadded => 0,
        GradPlace::At(offset) => offset,
    };
    let offsets: Vec<usize> = layout.params.iter().map(|s| offset + s.offset).collect();
    let placed = shim::take_grads(&unit.params, &offsets, buf, add)?;
    if matches!(place, GradPlace::At(_)) && layout.padded > layout.numel {
        let _ = buf.f_narrow(0, len64(offset + layout.numel), len64(layout.padded - layout.numel))?.f_zero_()?;
    }
    Ok(placed)
}
