//! The engine: owns every model-state buffer, issues the collectives at the right moments, and
//! applies the optimizer. The trainer calls [`Engine::before`] and [`Engine::after`] around each
//! position of the [`Schedule`], [`Engine::end_micro`] after each micro-step's backward, and
//! [`Engine::step`] once per optimizer step.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use tch::{Device, Kind, Tensor};
use zerobench_schema::config::{Offload, Precision, RunConfig, ZeroStage};
use zerobench_schema::memory::{first_host_unit, GradientPath, ModelStateBytes, ParamPath, GATHER_SLOTS_BUFFER};

use super::adamw::{AdamW, Shard};
use super::beside::Beside;
pub use super::error::EngineError;
use super::layout::UnitLayout;
use super::loss_scale::LossScaler;
use super::offload::{HostUpdates, Update};
use super::reduce::{write_grads, Buckets, GradPlace, Reduction, Staging};
use super::unit::{len64, total_padded, Gathered, OptimState, ParamShard, Partition, Unit, UnitBuild, UnitGrads, Via};
use crate::comm::{Collectives, HostCopy, Pending, StepComm};
use crate::metrics::clock::SharedClock;
use crate::model::{Model, WeightGrads};
use crate::runtime::cuda::Gpu;
use crate::runtime::shim;
use zerobench_schema::schedule::{Phase, Schedule};

/// The compute dtype of a precision.
pub fn compute_kind(p: Precision) -> Kind {
    match p {
        Precision::Bf16 => Kind::BFloat16,
        Precision::Fp16 => Kind::Half,
        Precision::Fp32 => Kind::Float,
    }
}

/// Stage 3 with ZeRO++'s hpZ: the communicator of this rank's group and, per unit, this rank's
/// slice of the unit within the group (the secondary partition) and whether it holds this step's
/// parameters yet (the step's first gather of the unit fills it).
struct Hpz {
    group: Box<dyn Collectives>,
    secondary: Vec<Tensor>,
    fresh: Vec<bool>,
}

/// When stages 1 and 2 all-gather a unit whose updated shard came back from the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GatherAt {
    /// Right after the copy (the copies back at a forward's units, and at the end of training).
    Now,
    /// At the next forward's first position (the delayed update's copies back, during backward).
    NextForward,
}

/// What a step did.
#[derive(Debug, Clone, Copy)]
pub struct StepOutcome {
    /// Mean loss over the global batch.
    pub loss: f64,
    /// fp16: gradients overflowed and the update was skipped.
    pub skipped: bool,
    pub loss_scale: Option<f64>,
}

pub struct Engine {
    stage: ZeroStage,
    kind: Kind,
    device: Device,
    comm: Box<dyn Collectives>,
    world: usize,
    rank: usize,
    /// Ranks sharing the optimizer state of a unit (1 in stage 0) and this rank's index among them.
    owners: usize,
    owner: usize,
    units: Vec<Unit>,
    schedule: Schedule,
    optim: AdamW,
    scaler: Option<LossScaler>,
    updates: u64,
    bucket_elems: usize,
    prefetch: usize,
    micro: usize,
    n_micro: usize,
    reduction: Reduction,
    /// Whether parameters are kept whole or sharded and gathered into `slots` before each use.
    params: ParamPath,
    /// Sharded parameters (stage 3): persistent gather slots and which unit holds each.
    slots: Vec<Tensor>,
    slot_owner: Vec<Option<usize>>,
    loss_acc: Option<Tensor>,
    offload: Offload,
    /// Offload: gradient shards copied to the host this micro-step, not yet handed to an update.
    landed: Vec<(usize, HostCopy)>,
    /// Offload: updates start as gradients land (not in fp16, which must see every gradient first).
    pipelined: bool,
    host_updates: HostUpdates,
    /// Offload: units updated on the host whose parameters are not yet copied back, in forward
    /// order; the next forward (or evaluation) waits for each unit's update and copies it back
    /// just before it needs it (`before`), so the host's updates run beside that forward's first
    /// units.
    deferred: VecDeque<usize>,
    /// Delayed update: after how many exact updates the host's updates are delayed.
    delay_after: Option<u64>,
    /// Delayed update: units whose host update of the previous step is still to be copied back;
    /// each is, once this step's backward is done with it (`harvest`).
    delayed: Vec<usize>,
    /// Delayed update, stages 1 and 2 on several ranks: units copied back at their harvest whose
    /// all-gather waits for the next forward (`gather_copied_back`), so that it does not queue
    /// beside backward's reduce-scatters on the communication stream.
    ungathered: Vec<usize>,
    hpz: Option<Hpz>,
    /// Offload: milliseconds spent allocating (and on a GPU page-locking) the host states.
    host_setup_ms: Option<f64>,
    /// Where waits for the host's updates are charged (the optimizer's time), when set.
    clock: Option<SharedClock>,
    /// Whether the model's layers write their weights' gradients where `place_grads` puts them.
    weight_grads: WeightGrads,
    /// The units whose gradients backward's nodes are writing in place (`place_grads`), each with
    /// the element of its buffer where the unit starts: one at a time into a staging buffer; into
    /// their own buffers, every unit from its first backward segment to its last (a tied weight's
    /// from the head's to the embedding's).
    placed: Vec<(usize, usize)>,
    /// Whether the updates run beside the backward (one GPU, replayed steps), and their events.
    beside: Beside,
}

impl Engine {
    /// Builds every buffer and initialises the model. Nothing is communicated: every rank computes
    /// the same initial values and keeps what it owns.
    /// `group` is the communicator of this rank's hpZ group (`cfg.engine.hpz`), when used.
    pub fn new(
        model: &dyn Model,
        cfg: &RunConfig,
        comm: Box<dyn Collectives>,
        group: Option<Box<dyn Collectives>>,
        device: Device,
        gpu: Option<Arc<Gpu>>,
    ) -> Result<Self, EngineError> {
        let _guard = tch::no_grad_guard();
        let (world, rank) = (comm.world(), comm.rank());
        let stage = cfg.stage;
        let kind = compute_kind(cfg.precision);
        let (owners, owner) = if stage == ZeroStage::Z0 { (1, 0) } else { (world, rank) };

        let layouts: Vec<UnitLayout> = model.units().iter().map(|d| UnitLayout::new(d, world)).collect();
        // Offload: the units from `first_host` on keep their optimizer on the host, the others on
        // the device (all on the host unless `offload_ratio` says less; see `first_host_unit`).
        let first_host = match cfg.offload {
            Offload::None => layouts.len(),
            Offload::Optimizer | Offload::OptimizerParams => {
                let padded: Vec<u64> = layouts.iter().map(|l| l.padded as u64).collect();
                first_host_unit(&padded, cfg.host_share())
            }
        };
        let mut host_setup = std::time::Duration::ZERO;
        let mut units = Vec::with_capacity(layouts.len());
        let path = GradientPath::of(stage, world as u64, cfg.offload);
        let params = ParamPath::of(stage, world as u64, cfg.offload);
        let build = UnitBuild { cfg, kind, device, owners, owner, path, params, gpu: gpu.as_deref() };
        for (i, (def, layout)) in model.units().iter().zip(layouts).enumerate() {
            let (unit, setup) = build.unit(def, i, layout, i >= first_host)?;
            host_setup += setup;
            units.push(unit);
        }

        let hpz = match (group, params) {
            (Some(group), ParamPath::Sharded) => {
                let len = |u: &Unit| len64(u.layout.padded / group.world());
                let secondary =
                    units.iter().map(|u| Tensor::f_zeros([len(u)], (kind, device))).collect::<Result<Vec<_>, _>>()?;
                Some(Hpz { group, fresh: vec![false; secondary.len()], secondary })
            }
            // Validation keeps hpZ to stage 3; kept whole (one rank), nothing is gathered.
            _ => None,
        };
        let host_setup_ms = (first_host < units.len()).then_some(host_setup.as_secs_f64() * 1e3);
        let segment_units: Vec<usize> = model.segments().iter().map(|s| s.unit).collect();
        let schedule = Schedule::new(&segment_units, units.len());
        let largest = units.iter().map(|u| u.layout.padded).max().unwrap_or(0);
        let elem = kind.elt_size_in_bytes();
        let bucket_elems = ((cfg.engine.bucket_mb * 1024.0 * 1024.0) as usize / elem).max(1);
        // Units prefetched beyond the unit computed: no more than the model has.
        let prefetch = zerobench_schema::memory::gather_slots(units.len(), cfg.engine.prefetch) - 1;

        let reduction = match path {
            GradientPath::Buckets => Reduction::Buckets(Buckets::default()),
            GradientPath::Staged => {
                // A bucket closes once it holds at least `bucket_elems`, so it never exceeds that
                // plus one unit.
                let cap = len64(bucket_elems.min(total_padded(&units)) + largest);
                Reduction::Staged(Staging {
                    buffers: [Tensor::f_zeros([cap], (kind, device))?, Tensor::f_zeros([cap], (kind, device))?],
                    current: 0,
                    fill: 0,
                    in_flight: [Vec::new(), Vec::new()],
                    to_accumulate: [Vec::new(), Vec::new()],
                    staged: Vec::new(),
                })
            }
        };
        let optim = AdamW::new(cfg.optim, gpu.clone());
        let beside = Beside::new(gpu.as_ref(), cfg, world, path, units.len(), optim.runs_beside())?;
        let (slots, slot_owner) = if params == ParamPath::Sharded {
            let n = prefetch + 1;
            let slots =
                (0..n).map(|_| Tensor::f_zeros([len64(largest)], (kind, device))).collect::<Result<Vec<_>, _>>()?;
            (slots, vec![None; n])
        } else {
            (Vec::new(), Vec::new())
        };

        Ok(Self {
            stage,
            kind,
            device,
            comm,
            world,
            rank,
            owners,
            owner,
            units,
            schedule,
            optim,
            scaler: (cfg.precision == Precision::Fp16).then(|| LossScaler::new(cfg.engine.loss_scale_power)),
            updates: 0,
            bucket_elems,
            prefetch,
            micro: 0,
            n_micro: cfg.grad_accum as usize,
            reduction,
            params,
            slots,
            slot_owner,
            loss_acc: None,
            offload: cfg.offload,
            landed: Vec::new(),
            pipelined: cfg.precision != Precision::Fp16,
            host_updates: HostUpdates::new()
                .map_err(|e| EngineError::Offload(format!("cannot start the host update thread: {e}")))?,
            deferred: VecDeque::new(),
            delay_after: cfg.delayed_update_after.map(u64::from),
            delayed: Vec::new(),
            ungathered: Vec::new(),
            hpz,
            host_setup_ms,
            clock: None,
            weight_grads: model.weight_grads(),
            placed: Vec::new(),
            beside,
        })
    }

    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    pub fn world(&self) -> usize {
        self.world
    }

    /// Which AdamW implementation updates the shards: the host's for offloaded units whatever
    /// the device, and `HOST+DEVICE` when an offload ratio below 1 leaves some on the device.
    pub fn optimizer_implementation(&self) -> String {
        let on_host = self.units.iter().filter(|u| matches!(u.optim, OptimState::Host(_))).count();
        let (host, device) = (self.optim.implementation(Device::Cpu), self.optim.implementation(self.device));
        match on_host {
            0 => device.to_string(),
            n if n == self.units.len() || host == device => host.to_string(),
            _ => format!("{host}+{device}"),
        }
    }

    /// Offload: milliseconds spent allocating and page-locking the host states (`None` without
    /// offload).
    pub fn host_setup_ms(&self) -> Option<f64> {
        self.host_setup_ms
    }

    /// The parameters of a unit, in the order the model declared them.
    pub fn params(&self, unit: usize) -> &[Tensor] {
        &self.units[unit].params
    }

    /// What backward must multiply the micro-step's mean loss by: the loss scale (fp16) divided by
    /// the number of micro-batches summed into one update (micro-steps × ranks).
    pub fn loss_multiplier(&self) -> f64 {
        let scale = self.scaler.as_ref().map_or(1.0, LossScaler::scale);
        scale / (self.n_micro * self.world) as f64
    }

    /// Model-state bytes this rank holds, counted from the buffers themselves.
    pub fn model_state_bytes(&self) -> ModelStateBytes {
        let bytes = |t: &Tensor| t.numel() as u64 * t.kind().elt_size_in_bytes() as u64;
        let mut m = ModelStateBytes::default();
        for u in &self.units {
            m.params_bytes += match &u.partition {
                Partition::Whole => bytes(&u.base),
                // A sharded unit's base only ever points into gather slots (buffers, not states); a shard
                // on the host is a host state.
                Partition::Sharded { shard: ParamShard::Device(s), .. } => bytes(s),
                Partition::Sharded { shard: ParamShard::Host, .. } => 0,
            };
            m.grads_bytes += match &u.grads {
                UnitGrads::Full { full: g, .. } | UnitGrads::Shard(g) => bytes(g),
                UnitGrads::OnHost => 0,
            };
            if let OptimState::Device { master, master_is_param, exp_avg, exp_avg_sq } = &u.optim {
                m.optimizer_bytes +=
                    bytes(exp_avg) + bytes(exp_avg_sq) + if *master_is_param { 0 } else { bytes(master) };
            }
        }
        m
    }

    /// Offloaded model states in host memory, counted from the buffers themselves.
    pub fn host_state_bytes(&self) -> u64 {
        self.units
            .iter()
            .map(|u| match &u.optim {
                OptimState::Host(h) => h.bytes(),
                OptimState::Device { .. } => 0,
            })
            .sum()
    }

    /// Persistent buffers beyond the model states, by name.
    pub fn buffer_bytes(&self) -> BTreeMap<String, u64> {
        let bytes = |t: &Tensor| t.numel() as u64 * t.kind().elt_size_in_bytes() as u64;
        let mut b = BTreeMap::new();
        if let Reduction::Staged(s) = &self.reduction {
            b.insert("grad_buckets".into(), s.buffers.iter().map(bytes).sum());
        }
        if !self.slots.is_empty() {
            b.insert(GATHER_SLOTS_BUFFER.into(), self.slots.iter().map(bytes).sum());
        }
        if let Some(h) = &self.hpz {
            b.insert("hpz_secondary".into(), h.secondary.iter().map(bytes).sum());
        }
        let transport = self.comm.transport_bytes() + self.hpz.as_ref().map_or(0, |h| h.group.transport_bytes());
        if transport > 0 {
            b.insert("copy_engine_inboxes".into(), transport);
        }
        b
    }

    /// Ψ after padding.
    pub fn padded_params(&self) -> u64 {
        self.units.iter().map(|u| u.layout.padded as u64).sum()
    }

    /// Draws the engine's collectives on `timeline` while it records.
    pub fn set_timeline(&mut self, timeline: crate::metrics::timeline::SharedTimeline) {
        self.comm.set_timeline(timeline);
    }

    /// Reports every wait for communication (the world's and the hpZ group's) to `clock`, and
    /// charges every wait for the host's updates to `clock`'s optimizer time.
    pub fn set_clock(&mut self, clock: &SharedClock) {
        self.clock = Some(Arc::clone(clock));
        self.comm.set_clock(Arc::clone(clock));
        if let Some(g) = self.hpz.as_mut().map(|h| &mut h.group) {
            g.set_clock(Arc::clone(clock));
        }
    }

    /// The element-wise maximum of `values` over the ranks.
    pub fn max_over_ranks(&mut self, values: &mut [f64]) -> Result<(), EngineError> {
        Ok(self.comm.max_over_ranks(values)?)
    }

    pub fn take_comm_stats(&mut self) -> Result<StepComm, EngineError> {
        let mut stats = self.comm.take_stats()?;
        if let Some(g) = self.hpz.as_mut().map(|h| &mut h.group) {
            let n = g.world();
            stats.merge_group(g.take_stats()?, n);
        }
        Ok(stats)
    }

    /// Starts micro-step `micro` of the current optimizer step.
    pub fn begin_micro(&mut self, micro: usize) {
        self.micro = micro;
    }

    fn last_micro(&self) -> bool {
        self.micro + 1 == self.n_micro
    }

    /// Before the segment at schedule position `i` runs: its unit's parameters must be in place.
    pub fn before(&mut self, i: usize) -> Result<(), EngineError> {
        let u = self.schedule.positions[i].unit;
        // Delayed update: the units the last backward copied back are all-gathered now, ahead of
        // their use, beside this forward's first units.
        self.gather_copied_back()?;
        // Offload: the last step's host update of this unit, if still running, is waited for and
        // its parameters copied back now, at their first use (stage 3 gathers from them below).
        self.refresh_until(u)?;
        if let Some(p) = self.units[u].refreshing.take() {
            self.comm.wait(p)?;
        }
        // And the next units whose updates are already done are copied back now, ahead of their
        // use, so that their copies run beside this unit's computation. Always the front of
        // `deferred`: the copies back (and their all-gathers) keep the order every rank shares,
        // whenever each rank's host finishes.
        while let Some(&v) = self.deferred.front() {
            if !self.host_updates.is_done(v) {
                break;
            }
            self.refresh_until(v)?;
        }
        if self.params == ParamPath::Sharded {
            if !self.units[u].gathered() {
                self.gather(u, Some(u))?;
            }
            if let Some(g) = self.units[u].take_in_flight() {
                self.wait_gather(g)?;
            }
            for v in self.schedule.upcoming_units(i, self.prefetch) {
                if !self.units[v].gathered() && self.slot_owner.iter().any(Option::is_none) {
                    self.refresh_until(v)?;
                    self.gather(v, Some(u))?;
                }
            }
        }
        let pos = self.schedule.positions[i];
        // A unit's own buffer is its place whatever is harvested meanwhile, so backward's nodes
        // write there from the unit's first backward segment on; a staging buffer's place is only
        // known at the unit's last (`harvest` fills the buffer in that order).
        let place_at = match self.reduction {
            Reduction::Buckets(_) => &self.schedule.first_backward,
            Reduction::Staged(_) => &self.schedule.final_backward,
        };
        if pos.phase == Phase::Backward && place_at[u] == i {
            self.place_grads(u)?;
        }
        Ok(())
    }

    /// Before unit `u`'s first backward segment (its own buffer) or its last (a staging buffer):
    /// backward's nodes (`shim::grad_into`) write the gradients of its parameters straight into
    /// the place `harvest` would copy them to: the unit's full buffer, or its region of the current
    /// staging buffer. The matrices' products write there at every micro-step (adding at the later
    /// ones); the vectors' kernels (biases, layer norms) at a micro-step's first write only, their
    /// later micro-steps' gradients being added by `harvest`. Otherwise every gradient would be
    /// copied once per micro-step. The current staging buffer is not read by any collective
    /// (`flush_staged` drains it when it becomes current), and a unit always fits in it (its
    /// capacity is a bucket plus the largest unit), so the place is the one `harvest` finds.
    /// Offloaded units are left to `harvest`: their buffers are copied to the host, and a delayed
    /// update may still read them.
    /// Nothing is placed for models whose layers return their gradients to autograd (T5, Llama,
    /// the MLP): no place would be taken.
    fn place_grads(&mut self, u: usize) -> Result<(), EngineError> {
        let unit = &self.units[u];
        if self.weight_grads == WeightGrads::Returned || matches!(unit.optim, OptimState::Host(_)) {
            return Ok(());
        }
        let (buf, offset, accumulate) = match (&self.reduction, &unit.grads) {
            (Reduction::Buckets(_), UnitGrads::Full { full, .. }) => (full, 0, self.micro > 0),
            (Reduction::Staged(st), _) if st.fill + unit.layout.padded <= st.capacity() => {
                (&st.buffers[st.current], st.fill, false)
            }
            _ => return Ok(()),
        };
        for (p, slot) in unit.params.iter().zip(&unit.layout.params) {
            shim::grad_into(p, buf, offset + slot.offset, accumulate)?;
        }
        self.placed.push((u, offset));
        Ok(())
    }

    /// After the segment at position `i` ran: harvest gradients that are complete, release what is
    /// not needed soon.
    pub fn after(&mut self, i: usize) -> Result<(), EngineError> {
        let pos = self.schedule.positions[i];
        if pos.phase == Phase::Backward && self.schedule.final_backward[pos.unit] == i {
            self.harvest(pos.unit)?;
        }
        if self.params == ParamPath::Sharded {
            // Only the gathered units (one per slot) can be released.
            let keep = self.schedule.upcoming_units(i, self.prefetch + 1);
            for s in 0..self.slot_owner.len() {
                if let Some(v) = self.slot_owner[s].filter(|v| !keep.contains(v)) {
                    self.release(v)?;
                }
            }
        }
        Ok(())
    }

    /// Gathers unit `u` into a free slot (evicting a unit other than `protect` if none is free).
    fn gather(&mut self, u: usize, protect: Option<usize>) -> Result<(), EngineError> {
        let slot = match self.slot_owner.iter().position(Option::is_none) {
            Some(s) => s,
            None => {
                // Every slot is taken, and `u` holds none: one holds a unit other than `protect`.
                let (s, victim) = self
                    .slot_owner
                    .iter()
                    .enumerate()
                    .find_map(|(s, o)| o.filter(|&v| Some(v) != protect).map(|v| (s, v)))
                    .expect("a slot holds a unit other than the one computing");
                self.release(victim)?;
                s
            }
        };
        let unit = &self.units[u];
        let n = len64(unit.layout.padded);
        let dst = self.slots[slot].f_narrow(0, 0, n)?;
        let pending = match self.hpz.as_mut().filter(|h| h.fresh[u]) {
            // hpZ, after the step's first gather: from the secondary partition, inside the group.
            Some(h) => (h.group.all_gather(&h.secondary[u], &dst)?, Via::Group),
            None => (self.gather_world(u, slot)?, Via::World),
        };
        let unit = &mut self.units[u];
        let Partition::Sharded { gathered, .. } = &mut unit.partition else {
            unreachable!("only sharded parameters are gathered")
        };
        *gathered = Some(Gathered { slot, in_flight: Some(pending) });
        // SAFETY: the slot tensor lives as long as the engine and holds `padded` elements.
        unsafe { shim::storage_set(&unit.base, dst.data_ptr(), unit.layout.padded * self.kind.elt_size_in_bytes())? };
        self.slot_owner[slot] = Some(u);
        Ok(())
    }

    /// Gathers unit `u` into `slot` from every rank's primary shard (from the host with parameter
    /// offload); with hpZ, keeps this rank's group slice of it as the secondary partition.
    fn gather_world(&mut self, u: usize, slot: usize) -> Result<Pending, EngineError> {
        let unit = &mut self.units[u];
        let n = len64(unit.layout.padded);
        let dst = self.slots[slot].f_narrow(0, 0, n)?;
        let pending = match unit.device_param_shard() {
            Some(shard) => self.comm.all_gather(shard, &dst)?,
            None => {
                // Parameter offload: the shard comes from the host into this rank's slice of the
                // slot, and is all-gathered in place (the all-gather waits for the copy).
                let len = n / self.world as i64;
                let mine = dst.f_narrow(0, self.rank as i64 * len, len)?;
                let (_copied, read) = self.comm.copy_to_device(unit.optim.host().param_source(), &mine)?;
                // Forward and backward both gather the unit: the later upload, on the same stream,
                // supersedes the earlier one.
                unit.uploading(read);
                self.comm.all_gather(&mine, &dst)?
            }
        };
        let Some(h) = self.hpz.as_mut() else {
            return Ok(pending);
        };
        // The copy runs after the all-gather on the same stream; waiting for it covers both.
        let len = n / h.group.world() as i64;
        let mine = dst.f_narrow(0, h.group.rank() as i64 * len, len)?;
        let copied = self.comm.copy_device(&mine, &h.secondary[u])?;
        h.fresh[u] = true;
        Ok(copied)
    }

    fn wait_gather(&mut self, (p, via): (Pending, Via)) -> Result<(), EngineError> {
        match via {
            Via::World => self.comm.wait(p)?,
            Via::Group => match self.hpz.as_mut() {
                Some(h) => h.group.wait(p)?,
                None => unreachable!("only hpZ gathers through a group"),
            },
        }
        Ok(())
    }

    fn release(&mut self, u: usize) -> Result<(), EngineError> {
        let Partition::Sharded { gathered, .. } = &mut self.units[u].partition else { return Ok(()) };
        let Some(g) = gathered.take() else { return Ok(()) };
        if let Some(p) = g.in_flight {
            self.wait_gather(p)?;
        }
        shim::storage_release(&self.units[u].base)?;
        self.slot_owner[g.slot] = None;
        Ok(())
    }

    /// Moves a unit's finished gradients out of the parameters' `.grad` into the engine's buffers
    /// and, when a bucket is full, starts reducing it.
    fn harvest(&mut self, u: usize) -> Result<(), EngineError> {
        // Offload: a new gradient is about to land in the unit's host buffers, which its last
        // update reads; forward has refreshed every unit (each has a forward position).
        debug_assert!(!self.deferred.contains(&u), "unit {u} harvested before its update was copied back");
        // Delayed update: this step's forward and backward used the parameters before the last
        // update, which ran meanwhile. Backward is done with them now, and the new gradient lands
        // where that update reads it: wait for it and copy its parameters back (the next update
        // of the unit waits for that copy to have read them). Stages 1-2 all-gather them at the
        // next forward, in forward order, which every rank shares.
        if let Some(i) = self.delayed.iter().position(|&v| v == u) {
            self.delayed.swap_remove(i);
            self.wait_for_update(u)?;
            self.refresh_from_host(u, GatherAt::NextForward)?;
        }
        let _guard = tch::no_grad_guard();
        // The unit's place, if `place_grads` gave it one, ends here. Checked in every build against
        // where the gradients go below: a wrong place would leave them where nothing reads them.
        let placed = self.placed.iter().position(|&(v, _)| v == u).map(|k| self.placed.swap_remove(k).1);
        let padded = self.units[u].layout.padded;
        let last = self.last_micro();
        // Staged: a unit that does not fit in the current staging buffer flushes it first
        // (`place_grads` placed nothing then).
        if matches!(&self.reduction, Reduction::Staged(st) if st.fill + padded > st.capacity()) {
            self.flush_staged()?;
        }
        let flush = match &mut self.reduction {
            Reduction::Buckets(bk) => {
                let UnitGrads::Full { full, .. } = &self.units[u].grads else {
                    unreachable!("bucketed gradients have full buffers")
                };
                let place = Buckets::own_place(self.stage, self.world);
                let in_place = write_grads(&self.units[u], full, place, self.micro > 0)?;
                assert!(placed.is_some() || in_place == 0, "unit {u}: gradients in place it was not given");
                if last {
                    bk.units.push(u);
                    bk.fill += padded;
                }
                last && bk.fill >= self.bucket_elems
            }
            Reduction::Staged(st) => {
                let offset = st.fill;
                let in_place = write_grads(&self.units[u], &st.buffers[st.current], GradPlace::At(offset), false)?;
                assert!(
                    placed.map_or(in_place == 0, |p| p == offset),
                    "unit {u} placed at {placed:?}, harvested at {offset}"
                );
                st.staged.push((u, offset));
                st.fill = offset + padded;
                st.fill >= self.bucket_elems
            }
        };
        if flush {
            self.flush_reduction()?;
        }
        if last {
            self.beside.harvested(u)?;
        }
        Ok(())
    }

    /// Starts reducing what waits in the bucket (stages 0/1) or the current staging buffer (stages
    /// 2/3); nothing when it is empty.
    fn flush_reduction(&mut self) -> Result<(), EngineError> {
        match &mut self.reduction {
            Reduction::Buckets(bk) if !bk.units.is_empty() => {
                let landed = bk.flush(self.stage, &self.units, self.comm.as_mut())?;
                for (u, copy) in landed {
                    self.landed_grads(u, copy);
                }
                Ok(())
            }
            Reduction::Staged(st) if !st.staged.is_empty() => self.flush_staged(),
            _ => Ok(()),
        }
    }

    /// Staged: reduce-scatters the current staging buffer, hands the offloaded units' copies
    /// to their updates, then makes the other buffer current once its collectives are done.
    fn flush_staged(&mut self) -> Result<(), EngineError> {
        let (world, rank, accumulate) = (self.world, self.rank, self.micro > 0);
        let Reduction::Staged(st) = &mut self.reduction else { return Ok(()) };
        let landed = st.flush(&self.units, self.comm.as_mut(), world, rank, accumulate)?;
        let next = st.current;
        for (u, copy) in landed {
            self.landed_grads(u, copy);
        }
        let Reduction::Staged(st) = &mut self.reduction else { return Ok(()) };
        st.drain(next, &self.units, self.comm.as_mut(), world, rank)
    }

    /// Offload: a unit's gradient shard is on its way to the host. At the last micro-step its
    /// update starts as soon as it lands (pipelined); otherwise it waits for the end of the
    /// micro-step (accumulation) or of backward (fp16's overflow check).
    fn landed_grads(&mut self, u: usize, copy: HostCopy) {
        if self.last_micro() && self.pipelined {
            // With accumulation this is not the first micro-step, so the shard adds to the sum.
            let accumulate = self.units[u].optim.host().grad_acc.is_some();
            let update = Update {
                unit: u,
                priority: self.schedule.first_use[u],
                landed: copy,
                uploaded: self.units[u].take_upload(),
                accumulate,
                optim: self.optim.cfg,
                t: self.updates + 1,
                grad_scale: 1.0,
            };
            self.host_updates.spawn(self.units[u].optim.host(), update);
        } else {
            self.landed.push((u, copy));
        }
    }

    /// Offload: waits for the gradient copies still listed and adds them to the accumulators.
    fn settle_landed(&mut self) -> Result<(), EngineError> {
        let _guard = tch::no_grad_guard();
        for (u, copy) in std::mem::take(&mut self.landed) {
            copy.wait()?;
            self.units[u].optim.host().accumulate(self.micro == 0)?;
        }
        Ok(())
    }

    /// After a micro-step's backward: every reduction of this micro-step issued and complete.
    pub fn end_micro(&mut self, loss: &Tensor) -> Result<(), EngineError> {
        let _guard = tch::no_grad_guard();
        let loss = loss.f_detach()?.f_to_kind(Kind::Float)?;
        self.loss_acc = Some(match self.loss_acc.take() {
            Some(acc) => acc.f_add(&loss)?,
            None => loss,
        });
        self.flush_reduction()?;
        match &mut self.reduction {
            Reduction::Buckets(bk) => {
                for p in std::mem::take(&mut bk.reductions) {
                    self.comm.wait(p)?;
                }
            }
            Reduction::Staged(st) => {
                st.drain(0, &self.units, self.comm.as_mut(), self.world, self.rank)?;
                st.drain(1, &self.units, self.comm.as_mut(), self.world, self.rank)?;
                st.current = 0;
            }
        }
        self.release_gathered()?;
        if self.offload != Offload::None && !self.last_micro() {
            self.settle_landed()?;
        }
        Ok(())
    }

    /// The step's loss summed over its micro-steps so far, on the device (what `end_micro` adds
    /// to). A captured step keeps the tensor its graphs write.
    pub fn loss_sum(&self) -> Option<Tensor> {
        self.loss_acc.as_ref().map(Tensor::shallow_clone)
    }

    /// Replayed graphs wrote the step's summed loss into `sum` (the tensor [`Self::loss_sum`] gave
    /// at their capture): the optimizer step reads it from there.
    pub fn set_loss_sum(&mut self, sum: Tensor) {
        self.loss_acc = Some(sum);
        self.beside.replayed();
    }

    /// Whether a replayed backward goes on the GPU's urgent stream (`Gpu::on_urgent`), beside
    /// which this step's updates then run (`zero/beside.rs`).
    pub fn backward_urgent(&self) -> bool {
        self.beside.backward_urgent()
    }

    /// After an evaluation's forward pass (no backward, so no gradient was harvested): stage 3
    /// releases the units it gathered, and hpZ forgets the secondary partitions it filled, so the
    /// next step gathers exactly as it would have without the evaluation.
    pub fn end_eval_forward(&mut self) -> Result<(), EngineError> {
        self.release_gathered()?;
        self.forget_secondary();
        Ok(())
    }

    /// hpZ: no secondary partition holds the current parameters any more, so each unit's next
    /// gather goes over all ranks and fills it again.
    fn forget_secondary(&mut self) {
        if let Some(h) = &mut self.hpz {
            h.fresh.fill(false);
        }
    }

    /// Sharded parameters: releases every gathered unit (nothing where units are kept whole).
    fn release_gathered(&mut self) -> Result<(), EngineError> {
        for s in 0..self.slot_owner.len() {
            if let Some(u) = self.slot_owner[s] {
                self.release(u)?;
            }
        }
        Ok(())
    }

    /// The mean over ranks of a scalar each rank computed (evaluation's loss), on the host.
    pub fn mean_over_ranks(&mut self, value: &Tensor) -> Result<f64, EngineError> {
        let _guard = tch::no_grad_guard();
        let buf = value.f_detach()?.f_to_kind(Kind::Float)?.f_reshape([1])?;
        self.comm.reduce_control(&buf)?;
        let sum = Vec::<f32>::try_from(&buf.f_to_device(Device::Cpu)?)?;
        Ok(f64::from(sum[0]) / self.world as f64)
    }

    /// The optimizer step: agree on the loss (and, in fp16, on whether any gradient overflowed),
    /// update every shard, and bring the full parameters up to date where a stage keeps them.
    pub fn step(&mut self) -> Result<StepOutcome, EngineError> {
        let _guard = tch::no_grad_guard();
        let offload = self.offload != Offload::None;
        let loss_local = self.loss_acc.take().expect("a micro-step ran").f_div_scalar(self.n_micro as f64)?;
        if offload {
            // fp16: every gradient shard on the host before the overflow check.
            self.settle_landed()?;
        }
        // [loss, overflow] is built where the loss is (the GPU, or the CPU), summed over ranks
        // there, and copied to the host once: the one point per step where the host waits for
        // the device.
        let overflow_local = match self.scaler {
            Some(_) => self.overflow_flag(loss_local.device())?,
            None => Tensor::f_zeros([], (Kind::Float, loss_local.device()))?,
        };
        let control = Tensor::f_stack(&[loss_local, overflow_local], 0)?;
        self.comm.reduce_control(&control)?;
        // Without a loss scale and offload nothing the host reads decides the update: it is
        // issued before the read, so the device goes from backward straight into it instead of
        // idling while the host wakes from the read and starts it.
        let update_first = self.scaler.is_none() && !offload;
        if update_first {
            self.update(1.0)?;
        }
        let v = Vec::<f32>::try_from(&control.f_to_device(Device::Cpu)?)?;
        let loss = f64::from(v[0]) / self.world as f64;
        if update_first {
            return Ok(StepOutcome { loss, skipped: false, loss_scale: None });
        }
        let overflow = v[1] > 0.0;

        let scale = self.scaler.as_ref().map(LossScaler::scale);
        let apply = match self.scaler.as_mut() {
            Some(s) => s.update(overflow),
            None => true,
        };
        if apply {
            self.update(scale.map_or(1.0, |s| 1.0 / s))?;
        } else {
            // Skipped: the next step gathers the parameters anew anyway.
            self.forget_secondary();
        }
        Ok(StepOutcome { loss, skipped: !apply, loss_scale: scale })
    }

    /// Updates every shard with its gradient times `grad_scale`: the parameters change.
    fn update(&mut self, grad_scale: f64) -> Result<(), EngineError> {
        self.forget_secondary();
        self.updates += 1;
        // The host's updates first (when not already running), so that they run while the device
        // updates its own units (Twin-Flow, with an offload ratio below 1).
        if self.offload != Offload::None {
            self.step_on_host(grad_scale)?;
        }
        self.step_on_device(grad_scale)
    }

    /// fp16: 1.0 on `device` if any gradient shard of this rank holds an inf or NaN, else 0.0.
    /// The shards are summed where they live (a non-finite element makes the sum non-finite), so
    /// the device ones cost no host round trip each.
    fn overflow_flag(&self, device: Device) -> Result<Tensor, EngineError> {
        // One sum per place (host, device): with an offload ratio below 1 both hold shards, and
        // each place's sum crosses to `device` once.
        let mut sums: [Option<Tensor>; 2] = [None, None];
        for u in &self.units {
            let (g, place) = match (&u.optim, u.grads.device_shard()) {
                (OptimState::Host(h), _) => (h.update_grad(), 0),
                (OptimState::Device { .. }, Some(g)) => (g, 1),
                (OptimState::Device { .. }, None) => unreachable!("device optimizers read a device shard"),
            };
            let s = g.f_sum(Kind::Float)?;
            sums[place] = Some(match sums[place].take() {
                Some(a) => a.f_add(&s)?,
                None => s,
            });
        }
        let mut sum: Option<Tensor> = None;
        for s in sums.into_iter().flatten() {
            let s = s.f_to_device(device)?;
            sum = Some(match sum {
                Some(a) => a.f_add(&s)?,
                None => s,
            });
        }
        let sum = match sum {
            Some(s) => s,
            None => Tensor::f_zeros([], (Kind::Float, device))?,
        };
        Ok(sum.f_isfinite()?.f_logical_not()?.f_to_kind(Kind::Float)?)
    }

    /// Updates every shard whose optimizer is on the device (all without offload, none with all of
    /// it on the host): beside the backward where it replayed so (`zero/beside.rs`), else on the
    /// compute stream. Stages 1 and 2 then gather each unit's updated parameters: a unit's
    /// all-gather is issued as soon as its update is, so it runs on the communication stream
    /// while the next units are updated, rather than after all of them.
    fn step_on_device(&mut self, grad_scale: f64) -> Result<(), EngineError> {
        let done_beside = self.update_beside(grad_scale)?;
        let gather = matches!(self.stage, ZeroStage::Z1 | ZeroStage::Z2) && self.world > 1;
        for (i, &beside) in done_beside.iter().enumerate() {
            if beside {
                continue;
            }
            let u = &self.units[i];
            let OptimState::Device { master, exp_avg, exp_avg_sq, .. } = &u.optim else {
                continue; // updated on the host
            };
            let param_out = self.param_out(i)?;
            let Some(grad) = u.grads.device_shard() else { unreachable!("device optimizers read a device shard") };
            let shard = Shard { master, exp_avg, exp_avg_sq, grad, param_out: param_out.as_ref() };
            self.optim.step(self.updates, grad_scale, &shard)?;
            if gather {
                let r = u.layout.shard_range(self.owners, self.owner);
                let mine = u.base.f_narrow(0, r.start as i64, r.len() as i64)?;
                let pending = self.comm.all_gather(&mine, &u.base)?;
                self.units[i].refreshing = Some(pending);
            }
        }
        Ok(())
    }

    /// Where unit `i`'s update writes its parameters in the compute precision: `None` where the
    /// fp32 master is the parameter itself.
    fn param_out(&self, i: usize) -> Result<Option<Tensor>, EngineError> {
        let u = &self.units[i];
        Ok(match &u.optim {
            OptimState::Device { master_is_param: true, .. } => None,
            _ => match u.device_param_shard() {
                Some(s) => Some(s.shallow_clone()),
                None => {
                    let r = u.layout.shard_range(self.owners, self.owner);
                    Some(u.base.f_narrow(0, r.start as i64, r.len() as i64)?)
                }
            },
        })
    }

    /// Where this step's backward replayed with its units' events: each unit's update on the
    /// update stream after its event, in backward's order, and the compute stream waiting for the
    /// last. Returns which units were updated so.
    fn update_beside(&mut self, grad_scale: f64) -> Result<Vec<bool>, EngineError> {
        let mut done = vec![false; self.units.len()];
        let Some(launch) = self.beside.take_step() else { return Ok(done) };
        for (u, event) in launch.units {
            let unit = &self.units[u];
            let OptimState::Device { master, exp_avg, exp_avg_sq, .. } = &unit.optim else { continue };
            let Some(grad) = unit.grads.device_shard() else { continue };
            let param_out = self.param_out(u)?;
            launch.gpu.wait(&launch.gpu.update, event)?;
            let shard = Shard { master, exp_avg, exp_avg_sq, grad, param_out: param_out.as_ref() };
            self.optim.step_beside(self.updates, grad_scale, &shard)?;
            done[u] = true;
        }
        let last = launch.gpu.mark(&launch.gpu.update)?;
        launch.gpu.wait(&launch.gpu.compute, last)?;
        launch.gpu.recycle(last);
        Ok(done)
    }

    /// Offload: the host updates (already running when pipelined) go on in the background, the
    /// rest in forward order; the step returns without waiting for them, and the next forward
    /// copies each unit back as soon as it needs it (`before`), in forward order, while later
    /// units are still being updated.
    fn step_on_host(&mut self, grad_scale: f64) -> Result<(), EngineError> {
        let on_host = |u: &Unit| matches!(u.optim, OptimState::Host(_));
        if !self.pipelined {
            for u in 0..self.units.len() {
                if !on_host(&self.units[u]) {
                    continue;
                }
                let update = Update {
                    unit: u,
                    priority: self.schedule.first_use[u],
                    landed: HostCopy::Done,
                    uploaded: self.units[u].take_upload(),
                    accumulate: false,
                    optim: self.optim.cfg,
                    t: self.updates,
                    grad_scale,
                };
                self.host_updates.spawn(self.units[u].optim.host(), update);
            }
        }
        let host_units = self.schedule.forward_order.iter().copied().filter(|&u| on_host(&self.units[u]));
        if self.delay_after.is_some_and(|n| self.updates > n) {
            // Delayed: the next step starts from the parameters it has, and waits for each unit's
            // update at its harvest, in backward order: the order the updates were queued in
            // (landing order), so they stay unsealed.
            self.delayed = host_units.collect();
        } else {
            self.host_updates.seal();
            self.deferred = host_units.collect();
        }
        Ok(())
    }

    /// Offload: waits for the host updates of the deferred units up to `u` and copies them back,
    /// in forward order: a fixed order, the same on every rank, because copying back issues
    /// collectives (see `HostUpdates`). Nothing to do when `u` is not deferred.
    fn refresh_until(&mut self, u: usize) -> Result<(), EngineError> {
        if !self.deferred.contains(&u) {
            return Ok(());
        }
        while let Some(v) = self.deferred.pop_front() {
            self.wait_for_update(v)?;
            self.refresh_from_host(v, GatherAt::Now)?;
            if v == u {
                break;
            }
        }
        Ok(())
    }

    /// Offload: blocks until the host's update of unit `u` is done; the time is the optimizer's
    /// on the step clock, when there is one.
    fn wait_for_update(&mut self, u: usize) -> Result<(), EngineError> {
        let updates = &mut self.host_updates;
        let done = match &self.clock {
            Some(c) => c.host_update_wait(|| updates.wait_for(u))?,
            None => updates.wait_for(u),
        };
        done.map_err(EngineError::Offload)
    }

    /// Offload: every host update of the last step done and its parameters copied back and in
    /// place; for whatever reads the parameters outside a forward pass (the end of training).
    pub fn settle(&mut self) -> Result<(), EngineError> {
        if let Some(&last) = self.deferred.back() {
            self.refresh_until(last)?;
        }
        // Delayed update: the last step's host updates, which no backward will harvest.
        for u in std::mem::take(&mut self.delayed) {
            self.wait_for_update(u)?;
            self.refresh_from_host(u, GatherAt::Now)?;
        }
        self.gather_copied_back()?;
        self.finish_step()
    }

    /// Delayed update, stages 1 and 2 on several ranks: all-gathers the units copied back during
    /// the last backward, in forward order (the same on every rank). Each all-gather follows its
    /// copy from the host on the communication stream; `before` waits for it at the unit's use.
    fn gather_copied_back(&mut self) -> Result<(), EngineError> {
        if self.ungathered.is_empty() {
            return Ok(());
        }
        let copied = std::mem::take(&mut self.ungathered);
        let order: Vec<usize> = self.schedule.forward_order.iter().copied().filter(|u| copied.contains(u)).collect();
        for u in order {
            let unit = &mut self.units[u];
            // The all-gather is ordered after the unit's copy from the host (`copy_to_device`),
            // which the step that issued it has waited for (`finish_step`).
            let r = unit.layout.shard_range(self.owners, self.owner);
            let mine = unit.base.f_narrow(0, r.start as i64, r.len() as i64)?;
            unit.refreshing = Some(self.comm.all_gather(&mine, &unit.base)?);
        }
        Ok(())
    }

    /// The end of a step's work on the device: computation made to wait for the parameter
    /// all-gathers and copies back the step issued. The training loop calls it last in every step
    /// and then synchronises the device, so a step's time covers all of its device work (the
    /// definition of `step_ms`). Offload's host updates are not waited for here: the next forward
    /// waits for each unit's at the unit's first use (`before`), so the host's tail of step t
    /// runs beside step t + 1's first units and is that step's time (its optimizer's, for the
    /// part computation waits). Exact either way: no unit computes before its update is back.
    pub fn finish_step(&mut self) -> Result<(), EngineError> {
        for u in 0..self.units.len() {
            if let Some(p) = self.units[u].refreshing.take() {
                self.comm.wait(p)?;
            }
        }
        Ok(())
    }

    /// Copies a unit's updated parameters from the host to where the device keeps them (and, in
    /// stages 1 and 2, all-gathers them, now or at the next forward: `at`); with parameter
    /// offload they are copied at each use.
    fn refresh_from_host(&mut self, u: usize, at: GatherAt) -> Result<(), EngineError> {
        let unit = &mut self.units[u];
        let src = unit.optim.host().param_source();
        match &unit.partition {
            // Stages 1 and 2 (offload needs a stage above 0).
            Partition::Whole => {
                let r = unit.layout.shard_range(self.owners, self.owner);
                let mine = unit.base.f_narrow(0, r.start as i64, r.len() as i64)?;
                let (copied, read) = self.comm.copy_to_device(src, &mine)?;
                unit.uploading(read);
                // The all-gather waits for the copy (it reads what the copy writes).
                unit.refreshing = Some(match (self.world > 1, at) {
                    (true, GatherAt::Now) => self.comm.all_gather(&mine, &unit.base)?,
                    (true, GatherAt::NextForward) => {
                        self.ungathered.push(u);
                        copied
                    }
                    (false, _) => copied,
                });
            }
            Partition::Sharded { shard: ParamShard::Device(shard), .. } => {
                let (copied, read) = self.comm.copy_to_device(src, shard)?;
                unit.uploading(read);
                unit.refreshing = Some(copied);
            }
            Partition::Sharded { shard: ParamShard::Host, .. } => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::solo::SoloCollectives;
    use crate::model::{build, Batch};
    use zerobench_schema::ModelPreset;

    /// `micros` batches of GPT-2 `tiny` on the CPU, in fp32.
    fn batches(cfg: &RunConfig, micros: usize) -> Vec<Batch> {
        let task = crate::data::Task::of(cfg);
        let source = crate::data::Source::open(None, cfg.model.spec().vocab(), &task, false).unwrap();
        let data = crate::data::Data::new(source, task, 1, cfg.micro_batch as usize, 1, micros, 0, Device::Cpu);
        (0..micros).map(|m| data.batch(0, m).unwrap()).collect()
    }

    /// The engine's gradients on one rank after `grad_accum` micro-steps run as the trainer runs
    /// them, each unit's as its buffer holds it (on one rank without offload, every stage's full
    /// buffer). Checks on the way that backward left the blocks' `.grad` alone where their
    /// gradients went straight to their place (every parameter's at a first micro-step).
    fn engine_grads(cfg: &RunConfig, batches: &[Batch]) -> Vec<Tensor> {
        let model = build(&cfg.model.spec()).unwrap();
        let mut e = Engine::new(model.as_ref(), cfg, Box::new(SoloCollectives), None, Device::Cpu, None).unwrap();
        let schedule = e.schedule().clone();
        let n = model.segments().len();
        for (m, batch) in batches.iter().enumerate() {
            e.begin_micro(m);
            let (mut inputs, mut outputs): (Vec<Vec<Tensor>>, Vec<Vec<Tensor>>) = (Vec::new(), Vec::new());
            for s in 0..n {
                e.before(s).unwrap();
                let leaves: Vec<Tensor> = outputs.last().map_or(Vec::new(), |o: &Vec<Tensor>| {
                    o.iter().map(|t| t.detach().set_requires_grad(true)).collect()
                });
                outputs.push(model.forward(s, e.params(model.segments()[s].unit), &leaves, batch).unwrap());
                e.after(s).unwrap();
                inputs.push(leaves);
            }
            let loss = outputs[n - 1][0].detach();
            for s in (0..n).rev() {
                let i = schedule.backward_index(s);
                e.before(i).unwrap();
                if s == n - 1 {
                    outputs[s][0].f_mul_scalar(e.loss_multiplier()).unwrap().backward();
                } else {
                    let grads: Vec<Tensor> = inputs[s + 1].iter().map(Tensor::grad).collect();
                    shim::backward(&outputs[s].iter().collect::<Vec<_>>(), &grads.iter().collect::<Vec<_>>()).unwrap();
                }
                let u = model.segments()[s].unit;
                if u == 0 {
                    // The tied weight's two gradients, the head's and the lookup's, and the position
                    // embedding's go to their places from the head's backward on, where nothing is
                    // there to add to (a later micro-step's go through .grad, which `harvest` adds).
                    for (p, def) in e.params(0).iter().zip(&model.units()[0].params) {
                        let returned = match def.name.as_str() {
                            "wte" => m > 0,
                            "wpe" if s == 0 => m > 0,
                            _ => continue,
                        };
                        assert_eq!(p.grad().defined(), returned, "{}, micro-step {m}, segment {s}", def.name);
                    }
                } else {
                    for (p, def) in e.params(u).iter().zip(&model.units()[u].params) {
                        // A vector's gradient is placed only where nothing is there to add to.
                        let returned = def.shape.len() < 2 && m > 0;
                        assert_eq!(p.grad().defined(), returned, "block {u}, {}, micro-step {m}", def.name);
                    }
                }
                e.after(i).unwrap();
            }
            e.end_micro(&loss).unwrap();
        }
        e.units
            .iter()
            .map(|u| {
                let buf = match &u.grads {
                    UnitGrads::Full { full, .. } => full,
                    UnitGrads::Shard(shard) => shard,
                    UnitGrads::OnHost => unreachable!("nothing is offloaded here"),
                };
                // The padding is never zeroed after the buffer's allocation on one rank
                // (`GradPlace::ZeroPadded`): nothing may have written it.
                let pad = buf.narrow(0, len64(u.layout.numel), len64(u.layout.padded - u.layout.numel));
                assert_eq!(pad.count_nonzero(None::<i64>).int64_value(&[]), 0, "padding written");
                buf.narrow(0, 0, len64(u.layout.numel)).copy()
            })
            .collect()
    }

    /// The same gradients from one autograd pass over the whole model per micro-step, each
    /// scaled as the trainer scales the loss, from the parameters every stage starts from (read
    /// from a stage-0 engine: stage 3's hold no memory between their uses).
    fn autograd_grads(cfg: &RunConfig, batches: &[Batch]) -> Vec<Tensor> {
        let model = build(&cfg.model.spec()).unwrap();
        let cfg = RunConfig { stage: ZeroStage::Z0, ..cfg.clone() };
        let e = Engine::new(model.as_ref(), &cfg, Box::new(SoloCollectives), None, Device::Cpu, None).unwrap();
        let params: Vec<Vec<Tensor>> = (0..model.units().len())
            .map(|u| e.params(u).iter().map(|p| p.detach().copy().set_requires_grad(true)).collect())
            .collect();
        for batch in batches {
            let mut state: Vec<Tensor> = Vec::new();
            for (s, seg) in model.segments().iter().enumerate() {
                state = model.forward(s, &params[seg.unit], &state, batch).unwrap();
            }
            state[0].f_mul_scalar(e.loss_multiplier()).unwrap().backward();
        }
        params.iter().map(|ps| Tensor::cat(&ps.iter().map(|p| p.grad().reshape([-1])).collect::<Vec<_>>(), 0)).collect()
    }

    /// With the blocks' matrices' gradients written in place by backward's nodes, every unit's
    /// gradient buffer holds what plain autograd gives: replaced at the first micro-step, summed
    /// over the later ones, at every stage. On one rank every stage writes into full buffers
    /// (`GradientPath`); the staging buffers of stages 2 and 3 on several ranks are checked by
    /// their losses against stage 0 on one rank (`tests/it/worker.rs`).
    #[test]
    fn gradients_written_in_place_equal_autograd_at_every_stage() {
        for stage in ZeroStage::ALL {
            for grad_accum in [1, 3] {
                let cfg = RunConfig {
                    precision: Precision::Fp32,
                    micro_batch: 2,
                    seq_len: 16,
                    grad_accum,
                    ..RunConfig::new(ModelPreset::Tiny, stage)
                };
                let batches = batches(&cfg, grad_accum as usize);
                let (ours, want) = (engine_grads(&cfg, &batches), autograd_grads(&cfg, &batches));
                for (u, (a, b)) in ours.iter().zip(&want).enumerate() {
                    let err = (a - b).abs().max().double_value(&[]);
                    let scale = b.abs().max().double_value(&[]);
                    assert!(
                        scale > 0.0 && err <= 1e-5 * scale,
                        "{stage}, {grad_accum} micro-steps, unit {u}: off by {err}"
                    );
                }
            }
        }
    }
}
