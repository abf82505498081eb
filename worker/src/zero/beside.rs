//! AdamW beside the backward: on one GPU replaying its steps from CUDA graphs, each unit's update
//! starts as soon as backward is done with the unit, while the rest of the backward runs.
//!
//! There a unit's update needs nothing but the unit's own gradients: no other rank's (one rank),
//! no loss scale's verdict over every gradient (bf16 and fp32 have none), no host (no offload),
//! and they are final once backward harvests the unit at the last micro-step. The backward's graph
//! then records an event at each unit's harvest; the step launches each unit's update on the
//! GPU's update stream after that unit's event, in the order backward finished the units, and the
//! compute stream waits for the last before anything reads the parameters again. The backward
//! replays on the GPU's urgent stream, at the highest priority, so that where both have blocks
//! waiting for a multiprocessor the backward's products go first, and the update (bound by the
//! memory's bandwidth) takes what the products leave: the tails of their waves and the bandwidth
//! they do not use. Measured on a stand-in of gpt2-xl's backward on one H200
//! (`bench/gpu/optimizer_overlap_probe.py`), that hides about 2.5 ms of the update's 11.3; with
//! both streams at the same priority, or with the update's blocks looping over their shard, it
//! hides nothing. The kernel and its arithmetic are the in-order update's ([`Lane::Beside`]
//! changes only its grid), so the bits are the same.
//!
//! [`Lane::Beside`]: super::adamw_cuda::Lane::Beside

use std::sync::Arc;

use cudarc::driver::DriverError;
use zerobench_schema::config::{Offload, Precision, RunConfig};
use zerobench_schema::memory::GradientPath;

use crate::runtime::cuda::{Event, Gpu};

/// Whether updates run beside the backward, and what they wait for.
pub(super) enum Beside {
    /// Every update runs on the compute stream after the backward.
    Off,
    On(Marks),
}

/// The events a backward's graph records at each unit's harvest.
pub(super) struct Marks {
    gpu: Arc<Gpu>,
    /// `events[u]`: recorded once unit `u` is harvested, by every replay of the captured backward.
    /// Never returned to the GPU's pool: a graph that records them may outlive the engine.
    events: Vec<Event>,
    /// The units in the order the capture harvested them (backward's order); empty until then.
    order: Vec<usize>,
    /// Whether this step's backward was replayed, so that its graph recorded the events.
    replayed: bool,
}

/// This step's updates to launch beside the backward.
pub(super) struct Launch {
    pub gpu: Arc<Gpu>,
    /// Units in backward's order, each with the event to wait for.
    pub units: Vec<(usize, Event)>,
}

/// Whether a run's updates can go beside its backward: its steps are replayed (the events live in
/// the backward's graph), on one rank whose gradients land in their units' own buffers (nothing
/// to reduce), without a loss scale (fp16 checks every gradient before any update) or offload
/// (the host updates those units), with the fused kernel to launch on another stream.
fn applies(cfg: &RunConfig, world: usize, path: GradientPath, fused: bool) -> bool {
    let alone = cfg.cuda_graph && world == 1 && path == GradientPath::Buckets;
    alone && cfg.offload == Offload::None && cfg.precision != Precision::Fp16 && fused
}

impl Beside {
    /// On where the run replays its steps on one GPU and its gradients need nothing but backward
    /// (`fused`: the update's kernel is there to launch on another stream).
    pub(super) fn new(
        gpu: Option<&Arc<Gpu>>,
        cfg: &RunConfig,
        world: usize,
        path: GradientPath,
        units: usize,
        fused: bool,
    ) -> Result<Self, DriverError> {
        match gpu {
            Some(gpu) if applies(cfg, world, path, fused) => {
                let events = (0..units).map(|_| gpu.event()).collect::<Result<Vec<_>, _>>()?;
                Ok(Self::On(Marks { gpu: Arc::clone(gpu), events, order: Vec::new(), replayed: false }))
            }
            _ => Ok(Self::Off),
        }
    }

    /// Backward harvested unit `u` at the step's last micro-step: while its graph is captured,
    /// the graph records the unit's event here.
    pub(super) fn harvested(&mut self, u: usize) -> Result<(), DriverError> {
        let Self::On(m) = self else { return Ok(()) };
        if !m.gpu.is_capturing(&m.gpu.compute)? {
            return Ok(());
        }
        // One capture of the step's backward: a unit is harvested once at its last micro-step.
        debug_assert!(!m.order.contains(&u), "unit {u} marked twice");
        m.gpu.record_in_capture(m.events[u], &m.gpu.compute)?;
        m.order.push(u);
        Ok(())
    }

    /// Whether a replayed backward goes on the urgent stream: its graph records the events.
    pub(super) fn backward_urgent(&self) -> bool {
        matches!(self, Self::On(m) if !m.order.is_empty())
    }

    /// This step's backward was replayed from the captured graph.
    pub(super) fn replayed(&mut self) {
        if let Self::On(m) = self {
            m.replayed = true;
        }
    }

    /// The updates to launch beside this step's backward: none unless it was replayed with the
    /// events recorded (an eager step's backward records none, and its updates run in order).
    pub(super) fn take_step(&mut self) -> Option<Launch> {
        let Self::On(m) = self else { return None };
        if !std::mem::take(&mut m.replayed) || m.order.is_empty() {
            return None;
        }
        Some(Launch { gpu: Arc::clone(&m.gpu), units: m.order.iter().map(|&u| (u, m.events[u])).collect() })
    }
}

#[cfg(test)]
mod tests {
    use zerobench_schema::config::ZeroStage;
    use zerobench_schema::ModelPreset;

    use super::*;

    /// Beside exactly where nothing but the unit's own backward decides its update, at every stage
    /// on one rank; each condition alone turns it off.
    #[test]
    fn updates_go_beside_only_where_a_units_gradients_decide_them() {
        for stage in [ZeroStage::Z0, ZeroStage::Z1, ZeroStage::Z2, ZeroStage::Z3] {
            let cfg = RunConfig { cuda_graph: true, ..RunConfig::new(ModelPreset::Gpt2, stage) };
            assert_eq!(cfg.precision, Precision::Bf16);
            let path = GradientPath::of(stage, 1, Offload::None);
            assert!(applies(&cfg, 1, path, true), "stage {stage:?}");
            assert!(!applies(&RunConfig { cuda_graph: false, ..cfg.clone() }, 1, path, true), "eager");
            assert!(!applies(&cfg, 1, path, false), "no fused kernel");
            assert!(!applies(&cfg, 2, GradientPath::of(stage, 2, Offload::None), true), "two ranks");
            assert!(!applies(&RunConfig { precision: Precision::Fp16, ..cfg.clone() }, 1, path, true), "fp16");
            assert!(applies(&RunConfig { precision: Precision::Fp32, ..cfg.clone() }, 1, path, true), "fp32");
            let offload = RunConfig { offload: Offload::Optimizer, ..cfg.clone() };
            let staged = GradientPath::of(stage, 1, Offload::Optimizer);
            assert!(!applies(&offload, 1, staged, true), "offload");
            assert!(!applies(&cfg, 1, GradientPath::Staged, true), "staged gradients");
        }
    }
}
