//! The collectives of one optimizer step, per rank, as zerobench's engine issues them: what a run
//! will move before it runs, for the planner, and the closed form its logs are held to.
//!
//! With Ψ the padded parameter count ([`crate::memory::padded_params`]), p bytes per element of the compute
//! precision, m micro-steps per optimizer step and `bytes` the size of the full array (the
//! schema's convention, as in a step's `comm` map):
//!
//! | stage | all-reduce | reduce-scatter | all-gather |
//! |---|---|---|---|
//! | 0 | pΨ | | |
//! | 1 | | pΨ | pΨ |
//! | 2 | | m·pΨ | pΨ |
//! | 3 | | m·pΨ | m·pG |
//!
//! Stages 0 and 1 accumulate gradients in a full buffer and reduce once per step; stages 2 and 3
//! reduce-scatter every micro-step. Stages 1 and 2 all-gather the updated parameters after the
//! step (on more than one rank). Stage 3 gathers each unit before its forward and again before
//! its backward, the ZeRO paper's G = 2Ψ per micro-step, less the units still in a gather slot
//! when they are used again and plus the re-gathers of a unit used by several segments (a tied
//! embedding): [`stage3_gathered`] plays the engine's slot policy over the model's segments to
//! give G exactly (for GPT-2 124M with the default prefetch, G = 2.26Ψ: the tied embedding is
//! gathered three times). With hpZ the first gather of each unit in a step goes over all ranks
//! (pΨ) and the rest over the rank's group (`all_gather_group`). On one rank without parameter
//! offload stage 3 keeps its parameters whole ([`ParamPath`]) and gathers nothing.
//! Offload changes none of these, only when stages 1-2's refresh gathers complete (after the
//! host's update, in the next step); its host-device copies are not collectives and not counted.
//!
//! [`StepTraffic::wire_bytes`] turns the arrays into what each rank sends over its links in a ring
//! (the array times nccl-tests' bus factor, [`CommKey::bus_factor`]): all-reduce `2(n−1)/n`,
//! reduce-scatter and all-gather `(n−1)/n` of the array. Stages 1 and 2 send what stage 0 sends;
//! stage 3 sends (Ψ + G)/2Ψ times that, the paper's 1.5× when G = 2Ψ. That over the bus bandwidth
//! the collectives reach is the communication time of a step if none of it overlapped computation.

use crate::collective::{CollectiveKind, CommKey};
use crate::config::{RunConfig, ZeroStage};
use crate::memory::{padded_unit, GradientPath, ParamPath};
use crate::schedule::Schedule;

/// The collectives of one optimizer step on one rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepTraffic {
    /// Bytes per collective, named as in a step's `comm` map (the full array's size), in
    /// [`CommKey::index`] order; kinds the step does not use are left out.
    pub bytes: Vec<(CommKey, u64)>,
}

impl StepTraffic {
    /// The bytes of one key, 0 if the step does not use it.
    pub fn get(&self, key: CommKey) -> u64 {
        self.bytes.iter().find(|(k, _)| *k == key).map_or(0, |(_, b)| *b)
    }

    /// What one rank sends (and receives) over its links in a ring for each collective, on `world`
    /// ranks in hpZ groups of `hpz`: bytes × bus factor. A collective on one rank sends nothing.
    pub fn wire(&self, world: u32, hpz: Option<u32>) -> impl Iterator<Item = (CommKey, f64)> + '_ {
        self.bytes.iter().map(move |(k, b)| (*k, *b as f64 * k.bus_factor(world, hpz).unwrap_or(0.0)))
    }

    /// [`Self::wire`] summed, in whole bytes.
    pub fn wire_bytes(&self, world: u32, hpz: Option<u32>) -> u64 {
        self.wire(world, hpz).map(|(_, b)| b.round() as u64).sum()
    }
}

/// The collectives of one optimizer step of `c` on one of `world` ranks.
pub fn step_traffic(c: &RunConfig, world: u32) -> StepTraffic {
    step_traffic_as(c, world, ParamPath::of(c.stage, u64::from(world), c.offload))
}

/// [`step_traffic`] of a run that kept its parameters as `params` says: its log's
/// ([`ParamPath::logged`]), where an earlier build gathered stage 3's parameters on one rank too.
pub fn step_traffic_as(c: &RunConfig, world: u32, params: ParamPath) -> StepTraffic {
    let spec = c.model.spec();
    let p = c.precision.param_bytes();
    let padded: Vec<u64> = spec.units().iter().map(|u| padded_unit(u.params, u64::from(world))).collect();
    let psi = padded.iter().sum::<u64>() * p;
    let m = u64::from(c.grad_accum.max(1));
    let key = |kind, group| CommKey { kind, group };
    let world_key = |kind| key(kind, false);
    // Stages 1 and 2 refresh the parameters after the step only when others hold part of them.
    let refresh = if world > 1 { psi } else { 0 };
    // Staged gradients are reduce-scattered every micro-step, full buffers at the last.
    let reduced = match GradientPath::of(c.stage, u64::from(world), c.offload) {
        GradientPath::Staged => m * psi,
        GradientPath::Buckets => psi,
    };
    let mut bytes = match c.stage {
        ZeroStage::Z0 => vec![(world_key(CollectiveKind::AllReduce), psi)],
        ZeroStage::Z1 => {
            vec![(world_key(CollectiveKind::ReduceScatter), psi), (world_key(CollectiveKind::AllGather), refresh)]
        }
        ZeroStage::Z2 => {
            vec![(world_key(CollectiveKind::ReduceScatter), reduced), (world_key(CollectiveKind::AllGather), refresh)]
        }
        ZeroStage::Z3 => {
            let mut b = vec![(world_key(CollectiveKind::ReduceScatter), reduced)];
            if params == ParamPath::Sharded {
                let schedule = Schedule::new(&spec.segment_units(), padded.len());
                let gathers = m * stage3_gathered(&padded, &schedule, c.engine.prefetch) * p;
                match c.engine.hpz {
                    Some(_) => {
                        b.push((world_key(CollectiveKind::AllGather), psi));
                        b.push((key(CollectiveKind::AllGather, true), gathers - psi));
                    }
                    None => b.push((world_key(CollectiveKind::AllGather), gathers)),
                }
            }
            b
        }
    };
    bytes.retain(|(_, b)| *b > 0);
    bytes.sort_by_key(|(k, _)| k.index());
    StepTraffic { bytes }
}

/// Elements stage 3 gathers in one micro-step: the engine's slot policy (`worker/src/zero/engine.rs`,
/// `Engine::before` and `Engine::after`) replayed over the schedule's positions. There are
/// `prefetch + 1` slots. Before a segment runs, its unit is gathered unless a slot holds it
/// (evicting the first slot that holds another unit when none is free), then each of the next
/// `prefetch` distinct units that no slot holds is gathered while a slot is free. After it runs,
/// every slot whose unit is not among the next `prefetch + 1` distinct units is released, so
/// nothing stays gathered between micro-steps. `padded[u]` is unit u's padded size.
///
/// This is a second, independent statement of the engine's policy, on purpose: the end-to-end
/// tests hold the worker's logged gathers to it, so a change to either shows.
pub fn stage3_gathered(padded: &[u64], schedule: &Schedule, prefetch: u32) -> u64 {
    // More slots than units change nothing (a unit no slot holds always finds a free one), and a
    // spec may ask for any prefetch.
    let n_slots = (prefetch as usize).saturating_add(1).min(padded.len().max(1));
    let mut slots: Vec<Option<usize>> = vec![None; n_slots];
    let mut gathered = 0;
    let mut gather = |slots: &mut Vec<Option<usize>>, u: usize, protect: usize| {
        let s = match slots.iter().position(Option::is_none) {
            Some(s) => s,
            // `u` is gathered only when no slot holds it, so some slot holds another unit.
            None => slots.iter().position(|o| *o != Some(protect)).expect("a slot holding another unit"),
        };
        slots[s] = Some(u);
        gathered += padded[u];
    };
    for (i, p) in schedule.positions.iter().enumerate() {
        let u = p.unit;
        if !slots.contains(&Some(u)) {
            gather(&mut slots, u, u);
        }
        for v in schedule.upcoming_units(i, prefetch as usize) {
            if !slots.contains(&Some(v)) && slots.contains(&None) {
                gather(&mut slots, v, u);
            }
        }
        let keep = schedule.upcoming_units(i, prefetch as usize + 1);
        for s in slots.iter_mut() {
            if s.is_some_and(|v| !keep.contains(&v)) {
                *s = None;
            }
        }
    }
    gathered
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Precision;
    use crate::memory::padded_params;
    use crate::models::ModelPreset;

    fn config(stage: ZeroStage, grad_accum: u32) -> RunConfig {
        let mut c = RunConfig::new(ModelPreset::Gpt2Xl, stage);
        c.grad_accum = grad_accum;
        c
    }

    #[test]
    fn stages_1_and_2_send_what_stage_0_sends() {
        for world in [2u32, 4, 8, 64] {
            let psi = (padded_params(&ModelPreset::Gpt2Xl.spec(), u64::from(world)) * 2) as f64;
            let n = f64::from(world);
            let ring = 2.0 * (n - 1.0) / n * psi;
            for stage in [ZeroStage::Z0, ZeroStage::Z1, ZeroStage::Z2] {
                let got = step_traffic(&config(stage, 1), world).wire_bytes(world, None) as f64;
                assert!((got - ring).abs() <= 2.0, "stage {stage} on {world}: {got} vs {ring}");
            }
        }
    }

    #[test]
    fn accumulation_multiplies_what_runs_every_micro_step() {
        let rs = CommKey { kind: CollectiveKind::ReduceScatter, group: false };
        let ag = CommKey { kind: CollectiveKind::AllGather, group: false };
        let (z1, z2) = (step_traffic(&config(ZeroStage::Z1, 4), 4), step_traffic(&config(ZeroStage::Z2, 4), 4));
        assert_eq!(z2.get(rs), 4 * z1.get(rs));
        assert_eq!(z2.get(ag), z1.get(ag));
        let (one, four) = (step_traffic(&config(ZeroStage::Z3, 1), 4), step_traffic(&config(ZeroStage::Z3, 4), 4));
        assert_eq!((four.get(rs), four.get(ag)), (4 * one.get(rs), 4 * one.get(ag)));
    }

    /// Three equal units without tied weights, worked by hand: forward 0 1 2, backward 2 1 0.
    #[test]
    fn stage_3_gathers_follow_the_slots() {
        let a = 1000;
        let untied = Schedule::new(&[0, 1, 2], 3);
        // One slot: unit 2 is still held when backward starts; every other use gathers.
        assert_eq!(stage3_gathered(&[a; 3], &untied, 0), 5 * a);
        // Two slots: units 2 and 1 are both still held at the turn.
        assert_eq!(stage3_gathered(&[a; 3], &untied, 1), 4 * a);
        // Enough slots for everything: each unit once, however many are asked for.
        assert_eq!(stage3_gathered(&[a; 3], &untied, 2), 3 * a);
        assert_eq!(stage3_gathered(&[a; 3], &untied, u32::MAX), 3 * a);
        // A unit used again by a later segment (a tied head: forward 0 1 2 0, backward 0 2 1 0)
        // is gathered again once released: 0 1 2 0, held at the turn, then 2 1 0.
        assert_eq!(stage3_gathered(&[a; 3], &Schedule::new(&[0, 1, 2, 0], 3), 0), 7 * a);
    }

    /// GPT-2 124M on the default prefetch: the paper's 2Ψ per micro-step plus one more gather of
    /// the tied embedding (a third of the parameters), less the last block held at the turn.
    #[test]
    fn gpt2_gathers_its_tied_embedding_three_times() {
        let spec = ModelPreset::Gpt2.spec();
        let padded: Vec<u64> = spec.units().iter().map(|u| padded_unit(u.params, 2)).collect();
        let g = stage3_gathered(&padded, &Schedule::new(&spec.segment_units(), padded.len()), 1);
        assert_eq!(g, 3 * padded[0] + 2 * padded[1..].iter().sum::<u64>() - padded[12]);
        let psi = padded_params(&spec, 2) as f64;
        assert!((g as f64 / psi - 2.26).abs() < 0.01, "{}", g as f64 / psi);
    }

    #[test]
    fn one_rank_sends_nothing_and_refreshes_nothing() {
        for stage in ZeroStage::ALL {
            let t = step_traffic(&config(stage, 2), 1);
            assert_eq!(t.wire_bytes(1, None), 0, "stage {stage}");
        }
        let z1 = step_traffic(&config(ZeroStage::Z1, 1), 1);
        assert_eq!(z1.bytes.len(), 1, "{z1:?}");
    }

    /// Stage 3 on one rank gathers nothing unless its parameters live on the host, where each
    /// use copies a unit in (as a gather over one rank).
    #[test]
    fn one_rank_stage_3_gathers_only_offloaded_parameters() {
        let ag = CommKey { kind: CollectiveKind::AllGather, group: false };
        let mut c = config(ZeroStage::Z3, 2);
        assert_eq!(step_traffic(&c, 1).get(ag), 0);
        // As an earlier build ran it, gathering into slots on one rank.
        assert_eq!(step_traffic_as(&c, 1, ParamPath::Sharded).get(ag), 2 * gpt2_xl_gathered(1) * 2);
        c.offload = crate::config::Offload::Optimizer;
        assert_eq!(step_traffic(&c, 1).get(ag), 0);
        // 2 micro-steps of bf16 elements.
        c.offload = crate::config::Offload::OptimizerParams;
        assert_eq!(step_traffic(&c, 1).get(ag), 2 * gpt2_xl_gathered(1) * 2);
        assert_eq!(step_traffic(&config(ZeroStage::Z3, 2), 2).get(ag), 2 * gpt2_xl_gathered(2) * 2);
    }

    /// The elements stage 3 gathers in one micro-step of gpt2-xl on `world` ranks.
    fn gpt2_xl_gathered(world: u64) -> u64 {
        let spec = ModelPreset::Gpt2Xl.spec();
        let padded: Vec<u64> = spec.units().iter().map(|u| padded_unit(u.params, world)).collect();
        stage3_gathered(&padded, &Schedule::new(&spec.segment_units(), padded.len()), 1)
    }

    /// On one rank, stages 2 and 3 reduce their full buffers once per step, as stage 1 does;
    /// staged for the host's optimizer, they reduce every micro-step.
    #[test]
    fn one_rank_reduces_once_per_step_unless_offloaded() {
        let rs = CommKey { kind: CollectiveKind::ReduceScatter, group: false };
        let z1 = step_traffic(&config(ZeroStage::Z1, 4), 1).get(rs);
        for stage in [ZeroStage::Z2, ZeroStage::Z3] {
            let mut c = config(stage, 4);
            assert_eq!(step_traffic(&c, 1).get(rs), z1, "stage {stage}");
            c.offload = crate::config::Offload::Optimizer;
            assert_eq!(step_traffic(&c, 1).get(rs), 4 * z1, "stage {stage}");
        }
    }

    #[test]
    fn hpz_gathers_once_over_all_ranks_then_in_the_group() {
        let mut c = config(ZeroStage::Z3, 2);
        c.precision = Precision::Fp32;
        c.engine.hpz = Some(4);
        let t = step_traffic(&c, 16);
        let spec = ModelPreset::Gpt2Xl.spec();
        let psi = padded_params(&spec, 16) * 4;
        let padded: Vec<u64> = spec.units().iter().map(|u| padded_unit(u.params, 16)).collect();
        let gathers = 2 * stage3_gathered(&padded, &Schedule::new(&spec.segment_units(), padded.len()), 1) * 4;
        let world = CommKey { kind: CollectiveKind::AllGather, group: false };
        let group = CommKey { kind: CollectiveKind::AllGather, group: true };
        assert_eq!((t.get(world), t.get(group)), (psi, gathers - psi));
        // Inside groups of 4, a gather sends 3/4 of the array rather than 15/16.
        let ag_wire = psi as f64 * 15.0 / 16.0 + (gathers - psi) as f64 * 3.0 / 4.0;
        let rs_wire = 2.0 * psi as f64 * 15.0 / 16.0;
        assert!((t.wire_bytes(16, Some(4)) as f64 - ag_wire - rs_wire).abs() <= 2.0);
    }
}
