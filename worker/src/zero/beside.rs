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
//! A tied embedding (GPT-2's `wte`, [`TiedRows`]) is harvested last, at the lookup's segment, but
//! its gradient is final once backward is done with the LM head, the first segment of backward,
//! except for the rows the batch's ids look up. There the graph records one more event, and the
//! update stream marks the rows the last micro-step's ids name and updates the others, while the
//! whole backward is still to run; the marked rows and the unit's other parameters are updated at
//! the unit's harvest. Without it that unit's whole update (gpt2-xl: 82 M parameters, about 0.55
//! ms) ran after the backward's last kernel. It applies only where the head's gradient of the
//! embedding is in its place after the head's segment (one micro-step; at later micro-steps of
//! accumulation it goes through `.grad`, added at the harvest), which the engine checks at the
//! capture. Each element gets the same arithmetic, so the bits are the same.
//!
//! [`Lane::Beside`]: super::adamw_cuda::Lane::Beside

use std::sync::Arc;

use cudarc::driver::DriverError;
use tch::Tensor;
use zerobench_schema::config::{Offload, Precision, RunConfig};
use zerobench_schema::memory::GradientPath;

use crate::runtime::cuda::{Event, Gpu};

pub(crate) use crate::model::TiedRows;

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
    /// The tied embedding's rows updated early, where the model has one that fits.
    rows: Option<EarlyRows>,
}

/// Where a unit's tied embedding lies, and the backward position after which its rows outside the
/// batch are final.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RowsPlan {
    pub unit: usize,
    /// Its elements in the unit's shard (one rank: the whole unit).
    pub offset: usize,
    pub len: usize,
    pub row_len: usize,
    /// The head segment's backward position.
    pub position: usize,
}

impl RowsPlan {
    /// The plan for `tied` in a unit whose parameters lie at `slots` (offset, numel, shape), with
    /// the head's backward at `position`: none unless the parameter is a matrix whose rows the
    /// update's vectors of 4 take whole, from an offset those vectors are aligned at.
    pub fn new(tied: TiedRows, slots: &[(usize, usize, &[i64])], position: usize) -> Option<Self> {
        let &(offset, len, shape) = slots.get(tied.param)?;
        let &[rows, row_len] = shape else { return None };
        let (rows, row_len) = (usize::try_from(rows).ok()?, usize::try_from(row_len).ok()?);
        let fits = rows > 0 && row_len > 0 && row_len % 4 == 0 && offset % 4 == 0 && rows * row_len == len;
        fits.then_some(Self { unit: tied.unit, offset, len, row_len, position })
    }

    pub fn rows(&self) -> usize {
        self.len / self.row_len
    }
}

/// The early update's state: its plan, its event and marks, and what the capture recorded.
struct EarlyRows {
    plan: RowsPlan,
    /// Recorded once the head's backward is done at the last micro-step, by every replay.
    event: Event,
    /// One byte a row, set for the rows the ids look up.
    marks: Tensor,
    /// The last micro-step's input ids, where the graphs read them.
    ids: Option<Tensor>,
    /// Whether the capture recorded the event (the head's gradient was in place).
    recorded: bool,
}

/// This step's updates to launch beside the backward.
pub(super) struct Launch {
    pub gpu: Arc<Gpu>,
    /// Units in backward's order, each with the event to wait for.
    pub units: Vec<(usize, Event)>,
    /// The tied embedding's rows outside the batch, updated first.
    pub rows: Option<RowsLaunch>,
}

/// The early rows of this step: after `event`, mark the rows `ids` look up, update the others.
pub(super) struct RowsLaunch {
    pub plan: RowsPlan,
    pub event: Event,
    pub ids: Tensor,
    pub marks: Tensor,
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
    /// `rows`: the tied embedding's plan and a byte a row on the GPU for its marks.
    pub(super) fn new(
        gpu: Option<&Arc<Gpu>>,
        cfg: &RunConfig,
        (world, path): (usize, GradientPath),
        units: usize,
        fused: bool,
        rows: Option<(RowsPlan, Tensor)>,
    ) -> Result<Self, DriverError> {
        match gpu {
            Some(gpu) if applies(cfg, world, path, fused) => {
                let events = (0..units).map(|_| gpu.event()).collect::<Result<Vec<_>, _>>()?;
                let rows = match rows {
                    Some((plan, marks)) => {
                        Some(EarlyRows { plan, event: gpu.event()?, marks, ids: None, recorded: false })
                    }
                    None => None,
                };
                Ok(Self::On(Marks { gpu: Arc::clone(gpu), events, order: Vec::new(), replayed: false, rows }))
            }
            _ => Ok(Self::Off),
        }
    }

    /// The backward position after which the tied embedding's rows outside the batch are final.
    pub(super) fn rows_position(&self) -> Option<usize> {
        match self {
            Self::On(Marks { rows: Some(r), .. }) => Some(r.plan.position),
            _ => None,
        }
    }

    /// The last micro-step's input ids, where the graphs read them (at the capture).
    pub(super) fn lookups(&mut self, ids: &Tensor) {
        if let Self::On(Marks { rows: Some(r), .. }) = self {
            r.ids = Some(ids.shallow_clone());
        }
    }

    /// Backward is done with the head's segment at the step's last micro-step; `in_place`: the
    /// head's gradient of the embedding is in its place (not in `.grad`, added only at the
    /// harvest). While the graph is captured it records the rows' event here.
    pub(super) fn rows_final(&mut self, in_place: bool) -> Result<(), DriverError> {
        let Self::On(Marks { gpu, rows: Some(r), .. }) = self else { return Ok(()) };
        if !in_place || !gpu.is_capturing(&gpu.compute)? {
            return Ok(());
        }
        gpu.record_in_capture(r.event, &gpu.compute)?;
        r.recorded = true;
        Ok(())
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
        let rows = m.rows.as_ref().filter(|r| r.recorded).and_then(|r| {
            let ids = r.ids.as_ref()?;
            Some(RowsLaunch { plan: r.plan, event: r.event, ids: ids.shallow_clone(), marks: r.marks.shallow_clone() })
        });
        Some(Launch { gpu: Arc::clone(&m.gpu), units: m.order.iter().map(|&u| (u, m.events[u])).collect(), rows })
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

    /// The early rows go where the embedding is a matrix whose rows the update's vectors of four
    /// take whole, from an offset they are aligned at; anything else is updated at the harvest.
    #[test]
    fn a_tied_embeddings_rows_are_planned_only_where_vectors_take_them_whole() {
        let tied = TiedRows { unit: 0, param: 1, head: 5 };
        let (rows, bias) = ([10_i64, 8], [8_i64]);
        let plan = RowsPlan::new(tied, &[(0, 8, &bias), (8, 80, &rows)], 7).expect("fits");
        assert_eq!(plan, RowsPlan { unit: 0, offset: 8, len: 80, row_len: 8, position: 7 });
        assert_eq!(plan.rows(), 10);
        assert_eq!(RowsPlan::new(tied, &[(0, 6, &[6]), (6, 80, &rows)], 7), None, "offset 6");
        assert_eq!(RowsPlan::new(tied, &[(0, 8, &bias), (8, 60, &[10, 6])], 7), None, "rows of 6");
        assert_eq!(RowsPlan::new(tied, &[(0, 8, &bias), (8, 80, &[80])], 7), None, "a vector");
        assert_eq!(RowsPlan::new(tied, &[(0, 8, &bias)], 7), None, "no such parameter");
        assert_eq!(RowsPlan::new(tied, &[(0, 8, &bias), (8, 0, &[0, 8])], 7), None, "no rows");
    }

    /// GPT-2's tied embedding is `wte` of the embedding unit, whose head is the last segment.
    #[test]
    fn gpt2_ties_wte_to_its_last_segment() {
        let model = crate::model::build(&ModelPreset::Gpt2.spec()).unwrap();
        let tied = model.tied_rows().expect("tied");
        assert_eq!(model.units()[tied.unit].params[tied.param].name, "wte");
        assert_eq!(tied.head, model.segments().len() - 1);
        assert_eq!(model.segments()[tied.head].unit, tied.unit);
    }
}
