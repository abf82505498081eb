//! One unit's buffers on a rank, by stage family: its parameters (whole, or this rank's shard and
//! a gather slot while sharded stage 3 uses it), its gradients (a full buffer, a reduced shard, or none on
//! the device when the host's optimizer takes them), its optimizer state (on the device or the
//! host), and how they are built and initialised from the seed.

use tch::{Device, Kind, TchError, Tensor};
use zerobench_schema::config::{Offload, RunConfig, ZeroStage};
use zerobench_schema::memory::{GradientPath, ParamPath};

use super::error::EngineError;
use super::layout::UnitLayout;
use super::offload::HostState;
use crate::comm::{HostCopy, Pending};
use crate::model::{init_unit, UnitDef};
use crate::runtime::cuda::Gpu;
use crate::runtime::shim;

/// One unit's buffers on this rank.
pub(super) struct Unit {
    pub(super) layout: UnitLayout,
    /// Flat buffer of the full unit in the compute dtype; the parameters are views of it. Where
    /// parameters are sharded its storage points into a gather slot while the unit is gathered,
    /// at nothing otherwise.
    pub(super) base: Tensor,
    /// The parameters: leaf views of `base`, shaped as the model declares them.
    pub(super) params: Vec<Tensor>,
    /// Whether the whole unit stays in `base` or only this rank's shard is kept.
    pub(super) partition: Partition,
    pub(super) grads: UnitGrads,
    /// Where the optimizer state lives.
    pub(super) optim: OptimState,
    /// The updated parameters still on their way to where they are kept: stages 1 and 2's
    /// all-gather (after a copy from the host with offload), stage 3's copy of the shard from the
    /// host.
    pub(super) refreshing: Option<Pending>,
    /// Offload: the last copy of the unit's host parameters to the device, which the next host
    /// update waits for before it overwrites them (the copy runs beside the communication stream,
    /// so the gradient copy the update also waits for no longer orders it).
    pub(super) param_upload: HostCopy,
}

/// How a unit's parameters are kept between uses ([`ParamPath`]).
pub(super) enum Partition {
    /// Stages 0-2, and 3 on one rank with the parameters on the device: the whole unit, always in
    /// `base`.
    Whole,
    /// Stage 3 (on several ranks, or with the parameters on the host): this rank's shard; `base`
    /// holds the whole unit only while it is gathered.
    Sharded { shard: ParamShard, gathered: Option<Gathered> },
}

/// Where stage 3 keeps this rank's shard of a unit's parameters.
pub(super) enum ParamShard {
    Device(Tensor),
    /// With `optimizer+params` offload, beside the optimizer on the host
    /// (`HostState::param_source`).
    Host,
}

/// Stage 3: the gather slot holding a unit, and the gather while it is in flight (with the
/// communicator it went through).
pub(super) struct Gathered {
    pub(super) slot: usize,
    pub(super) in_flight: Option<(Pending, Via)>,
}

/// Which communicator a collective went through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Via {
    World,
    Group,
}

impl Unit {
    /// Stage 3: whether the unit is gathered (or being gathered) into a slot.
    pub(super) fn gathered(&self) -> bool {
        matches!(self.partition, Partition::Sharded { gathered: Some(_), .. })
    }

    /// Stage 3: the gather still in flight, if any, which the caller is to wait for.
    pub(super) fn take_in_flight(&mut self) -> Option<(Pending, Via)> {
        match &mut self.partition {
            Partition::Sharded { gathered: Some(g), .. } => g.in_flight.take(),
            _ => None,
        }
    }

    /// Offload: records a new upload of the parameters, which supersedes the last one (both on
    /// the same stream: the new one finishes after it).
    pub(super) fn uploading(&mut self, read: HostCopy) {
        std::mem::replace(&mut self.param_upload, read).release();
    }

    /// Offload: the last upload of the parameters, for the host update to wait for before it
    /// overwrites them.
    pub(super) fn take_upload(&mut self) -> HostCopy {
        std::mem::replace(&mut self.param_upload, HostCopy::Done)
    }

    /// This rank's parameter shard on the device, where stage 3 keeps one there.
    pub(super) fn device_param_shard(&self) -> Option<&Tensor> {
        match &self.partition {
            Partition::Sharded { shard: ParamShard::Device(s), .. } => Some(s),
            _ => None,
        }
    }
}

/// Where a unit's gradients are kept, by the way they reach it ([`GradientPath`]).
pub(super) enum UnitGrads {
    /// Full buffers (stages 0 and 1; 2 and 3 on one rank without offload): the full gradient
    /// buffer, accumulated over micro-steps, and this rank's reduced part of it (stage 0: all of
    /// it; the others: a view of its slice, on one rank the whole buffer).
    Full { full: Tensor, shard: Tensor },
    /// Staged (stages 2 and 3): this rank's reduced gradients, accumulated over micro-steps.
    Shard(Tensor),
    /// Staged and offloaded: the reduced shard goes straight to the host; none on the device.
    OnHost,
}

impl UnitGrads {
    /// The reduced gradients an optimizer on the device reads (none when they go to the host).
    pub(super) fn device_shard(&self) -> Option<&Tensor> {
        match self {
            UnitGrads::Full { shard, .. } | UnitGrads::Shard(shard) => Some(shard),
            UnitGrads::OnHost => None,
        }
    }
}

/// A unit's optimizer state: on the device, or in host memory (offload).
pub(super) enum OptimState {
    Device {
        /// fp32 master weights of the shard (a view of the parameters themselves in fp32 training).
        master: Tensor,
        master_is_param: bool,
        exp_avg: Tensor,
        exp_avg_sq: Tensor,
    },
    Host(HostState),
}

impl OptimState {
    pub(super) fn host(&self) -> &HostState {
        match self {
            OptimState::Host(h) => h,
            OptimState::Device { .. } => unreachable!("offloaded units keep their optimizer on the host"),
        }
    }
}

/// What building a unit's buffers needs, the same for every unit of a run.
pub(super) struct UnitBuild<'a> {
    pub(super) cfg: &'a RunConfig,
    pub(super) kind: Kind,
    pub(super) device: Device,
    /// Ranks sharing a unit's optimizer state, and this rank's index among them.
    pub(super) owners: usize,
    pub(super) owner: usize,
    /// Where backward's gradients go: full buffers, or staged into shards.
    pub(super) path: GradientPath,
    /// Whether the parameters are kept whole or sharded and gathered.
    pub(super) params: ParamPath,
    pub(super) gpu: Option<&'a Gpu>,
}

impl UnitBuild<'_> {
    /// Unit `index`'s buffers on this rank, initialised from the seed, with its optimizer on the
    /// host when `offloaded`; also the time spent setting up its host state.
    pub(super) fn unit(
        &self,
        def: &UnitDef,
        index: usize,
        layout: UnitLayout,
        offloaded: bool,
    ) -> Result<(Unit, std::time::Duration), EngineError> {
        let UnitBuild { cfg, kind, device, owners, owner, path, params: param_path, .. } = *self;
        let (stage, mixed, f32_on) = (cfg.stage, cfg.precision.has_master_copy(), (Kind::Float, device));
        let mut host_setup = std::time::Duration::ZERO;
        let padded = len64(layout.padded);
        let shard_len = len64(layout.shard_len(owners));
        let shard_start = len64(layout.shard_range(owners, owner).start);
        let numel = len64(layout.numel);

        let full = Tensor::f_zeros([padded], f32_on)?;
        full.f_narrow(0, 0, numel)?.f_copy_(&init_unit(def, index, cfg.seed, device)?)?;
        let shard_f32 = full.f_narrow(0, shard_start, shard_len)?;

        let (base, partition) = if param_path == ParamPath::Sharded {
            let shard = if offloaded && cfg.offload == Offload::OptimizerParams {
                ParamShard::Host
            } else {
                // A copy, not a view: a view would keep the whole unit's buffer alive.
                let shard = Tensor::f_empty([shard_len], (kind, device))?;
                shard.shallow_clone().f_copy_(&shard_f32)?;
                ParamShard::Device(shard)
            };
            (Tensor::f_zeros([padded], (kind, device))?, Partition::Sharded { shard, gathered: None })
        } else {
            (full.f_to_kind(kind)?, Partition::Whole)
        };
        let params = layout
            .params
            .iter()
            .map(|s| {
                let (off, n) = (len64(s.offset), len64(s.numel));
                Ok(base.f_narrow(0, off, n)?.f_view(s.shape.as_slice())?.set_requires_grad(true))
            })
            .collect::<Result<Vec<_>, TchError>>()?;
        let optim = if offloaded {
            let accumulate = cfg.grad_accum > 1 && stage != ZeroStage::Z1;
            let t = std::time::Instant::now();
            let host = HostState::new(&shard_f32, kind, mixed, accumulate, self.gpu)?;
            host_setup = t.elapsed();
            OptimState::Host(host)
        } else {
            // fp32: the parameters are the master weights (stage 3's device shard, or this rank's
            // slice of the whole unit; parameters on the host come with an offloaded optimizer).
            let (master, master_is_param) = match (&partition, mixed) {
                (_, true) => (shard_f32.f_detach_copy()?, false),
                (Partition::Sharded { shard: ParamShard::Device(s), .. }, false) => (s.shallow_clone(), true),
                (_, false) => (base.f_narrow(0, shard_start, shard_len)?, true),
            };
            OptimState::Device {
                master,
                master_is_param,
                exp_avg: Tensor::f_zeros([shard_len], f32_on)?,
                exp_avg_sq: Tensor::f_zeros([shard_len], f32_on)?,
            }
        };
        let grads = match (path, stage) {
            (GradientPath::Buckets, ZeroStage::Z0) => {
                let full = Tensor::f_zeros([padded], (kind, device))?;
                UnitGrads::Full { shard: full.shallow_clone(), full }
            }
            // Stage 1, and stages 2 and 3 on one rank, where the slice is the whole buffer.
            (GradientPath::Buckets, _) => {
                let full = Tensor::f_zeros([padded], (kind, device))?;
                UnitGrads::Full { shard: full.f_narrow(0, shard_start, shard_len)?, full }
            }
            (GradientPath::Staged, _) if offloaded => UnitGrads::OnHost,
            (GradientPath::Staged, _) => UnitGrads::Shard(Tensor::f_zeros([shard_len], (kind, device))?),
        };
        if param_path == ParamPath::Sharded {
            // The parameters exist as views; their memory appears only while gathered.
            shim::storage_release(&base)?;
        }
        let unit =
            Unit { layout, base, params, partition, grads, optim, refreshing: None, param_upload: HostCopy::Done };
        Ok((unit, host_setup))
    }
}

/// A buffer length or offset as libtorch's `i64`. Buffers are allocated before any of these is
/// taken, so a length past `i64::MAX` elements cannot exist.
pub(super) fn len64(n: usize) -> i64 {
    i64::try_from(n).expect("a buffer's length fits in i64")
}

pub(super) fn total_padded(units: &[Unit]) -> usize {
    units.iter().map(|u| u.layout.padded).sum()
}
