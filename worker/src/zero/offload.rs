//! ZeRO-Offload (Ren et al., "ZeRO-Offload: Democratizing Billion-Scale Model Training", ATC'21):
//! the optimizer of a rank's shards lives in (pinned) host memory and runs on the CPU.
//!
//! Per unit, after its gradients are reduce-scattered, the rank's gradient shard is copied to the
//! host on the communication stream; the CPU then updates the fp32 master weights and Adam
//! moments (the Rust AdamW, over all cores) as soon as that copy has landed — while the GPU goes on
//! with the backward of earlier units — and writes the compute-precision parameters, which the
//! device copies back (and, in stages 1 and 2, all-gathers) before they are used again. With
//! `optimizer+params` (stage 3) the parameters stay on the host too and are copied to the device
//! per use, ahead of it, just before their all-gather.
//!
//! fp16 needs every gradient before any update (an overflow anywhere skips the step), so there the
//! updates start only after backward.

use std::collections::{HashSet, VecDeque};
use std::sync::mpsc::{channel, Receiver, Sender};

use tch::{Kind, TchError, Tensor};
use zerobench_schema::config::OptimConfig;

use super::adamw::{step_cpu, AdamW, Shard};
use crate::comm::HostCopy;
use crate::runtime::cuda::Gpu;
use crate::runtime::pinned::{self, host_empty, PinError, Pinned};

/// One unit's shard in host memory.
pub struct HostState {
    /// fp32 master weights.
    pub master: Tensor,
    pub exp_avg: Tensor,
    pub exp_avg_sq: Tensor,
    /// The reduced gradient shard as it lands from the device (compute precision).
    pub grad: Tensor,
    /// Stages 2 and 3 accumulating over micro-steps: the fp32 sum of the landed shards.
    pub grad_acc: Option<Tensor>,
    /// Mixed precision: the compute-precision parameters the CPU writes and the device copies
    /// back. (In fp32 the master weights are copied back directly.)
    pub param: Option<Tensor>,
    /// The page-lock registrations of the tensors above (none on a CPU run, and none in the
    /// shallow handles a background update gets: the owner's registrations outlive them).
    pins: Vec<Pinned>,
}

impl HostState {
    /// The host state of a shard whose initial fp32 values are `shard_f32` (on any device).
    /// With `pin`, the state is page-locked (see `runtime::pinned`): pinned copies run
    /// asynchronously at full PCIe speed, pageable ones are staged and synchronous.
    pub fn new(shard_f32: &Tensor, kind: Kind, mixed: bool, accumulate: bool, pin: Option<&Gpu>) -> Result<Self, PinError> {
        let n = i64::try_from(shard_f32.numel()).expect("fits");
        let mut state = Self {
            master: host_empty(n, Kind::Float)?,
            exp_avg: host_empty(n, Kind::Float)?,
            exp_avg_sq: host_empty(n, Kind::Float)?,
            grad: host_empty(n, kind)?,
            grad_acc: if accumulate { Some(host_empty(n, Kind::Float)?) } else { None },
            param: if mixed { Some(host_empty(n, kind)?) } else { None },
            pins: Vec::new(),
        };
        if let Some(gpu) = pin {
            // Locked before they are written, so the initial copy from the device is a DMA.
            state.pins = pinned::pin_all(gpu, &state.tensors())?;
        }
        state.master.shallow_clone().f_copy_(shard_f32)?;
        if let Some(p) = &state.param {
            p.shallow_clone().f_copy_(&state.master)?;
        }
        for t in [&state.exp_avg, &state.exp_avg_sq, &state.grad].into_iter().chain(&state.grad_acc) {
            let _ = t.shallow_clone().f_zero_()?;
        }
        Ok(state)
    }

    fn tensors(&self) -> Vec<&Tensor> {
        [&self.master, &self.exp_avg, &self.exp_avg_sq, &self.grad].into_iter().chain(&self.grad_acc).chain(&self.param).collect()
    }

    /// The tensor the device copies updated parameters from.
    pub fn param_source(&self) -> &Tensor {
        self.param.as_ref().unwrap_or(&self.master)
    }

    /// The gradient the update reads: the accumulated sum, or the landed shard.
    pub fn update_grad(&self) -> &Tensor {
        self.grad_acc.as_ref().unwrap_or(&self.grad)
    }

    pub fn bytes(&self) -> u64 {
        let b = |t: &Tensor| t.numel() as u64 * t.kind().elt_size_in_bytes() as u64;
        b(&self.master)
            + b(&self.exp_avg)
            + b(&self.exp_avg_sq)
            + b(&self.grad)
            + self.grad_acc.as_ref().map_or(0, b)
            + self.param.as_ref().map_or(0, b)
    }

    /// Adds the landed shard into the accumulator (or starts it, at the first micro-step).
    pub fn accumulate(&self, first: bool) -> Result<(), TchError> {
        if let Some(acc) = &self.grad_acc {
            // Both convert the landed dtype in place, with no fp32 temporary of the shard.
            if first {
                acc.shallow_clone().f_copy_(&self.grad)?;
            } else {
                let _ = acc.shallow_clone().f_add_(&self.grad)?;
            }
        }
        Ok(())
    }

    /// Shallow handles for a background update.
    fn handles(&self) -> HostState {
        HostState {
            master: self.master.shallow_clone(),
            exp_avg: self.exp_avg.shallow_clone(),
            exp_avg_sq: self.exp_avg_sq.shallow_clone(),
            grad: self.grad.shallow_clone(),
            grad_acc: self.grad_acc.as_ref().map(Tensor::shallow_clone),
            param: self.param.as_ref().map(Tensor::shallow_clone),
            pins: Vec::new(),
        }
    }
}

/// What one background update needs.
pub struct Update {
    pub unit: usize,
    /// The gradient copy to wait for (`HostCopy::Done` once it has been waited for already).
    pub landed: HostCopy,
    /// Whether the landed shard must first be added to the accumulator (the last micro-step of
    /// an accumulating step; the earlier ones were added as they landed).
    pub accumulate: bool,
    pub optim: OptimConfig,
    /// AdamW's step number (1-based) and the gradient's scale (1 / loss scale in fp16).
    pub t: u64,
    pub grad_scale: f64,
}

/// AdamW updates of host shards, run on the CPU thread pool as their gradients land.
///
/// Finished updates are handed back in the order they were spawned, not in the order they
/// finish: the engine issues a collective per finished unit (the all-gather of stages 1 and 2),
/// and collectives must be issued in the same order on every rank. The spawn order follows the
/// gradients, which every rank produces in the same order; the finishing order depends on each
/// host's threads.
pub struct HostUpdates {
    tx: Sender<(usize, Result<(), String>)>,
    rx: Receiver<(usize, Result<(), String>)>,
    /// Units spawned and not yet handed back, in spawn order.
    spawned: VecDeque<usize>,
    /// Units whose update finished before those spawned earlier.
    finished: HashSet<usize>,
}

impl Default for HostUpdates {
    fn default() -> Self {
        Self::new()
    }
}

impl HostUpdates {
    pub fn new() -> Self {
        let (tx, rx) = channel();
        Self { tx, rx, spawned: VecDeque::new(), finished: HashSet::new() }
    }

    /// Starts an update of `state` in the background.
    pub fn spawn(&mut self, state: &HostState, u: Update) {
        let h = state.handles();
        let tx = self.tx.clone();
        self.spawned.push_back(u.unit);
        rayon::spawn(move || {
            let run = || -> Result<(), String> {
                u.landed.wait().map_err(|e| e.to_string())?;
                if u.accumulate {
                    h.accumulate(false).map_err(|e| e.to_string())?;
                }
                let shard = Shard {
                    master: &h.master,
                    exp_avg: &h.exp_avg,
                    exp_avg_sq: &h.exp_avg_sq,
                    grad: h.update_grad(),
                    param_out: h.param.as_ref(),
                };
                step_cpu(&AdamW::coeffs_for(&u.optim, u.t, u.grad_scale), &shard);
                Ok(())
            };
            // The receiver lives as long as the engine, which waits for every update it spawned.
            let _ = tx.send((u.unit, run()));
        });
    }

    /// Waits for the earliest-spawned update not yet handed back and returns its unit; `None`
    /// when every spawned update has been handed back.
    pub fn next_in_spawn_order(&mut self) -> Option<Result<usize, String>> {
        let want = self.spawned.pop_front()?;
        while !self.finished.remove(&want) {
            match self.rx.recv() {
                Ok((unit, Ok(()))) => {
                    self.finished.insert(unit);
                }
                // Updates still running hold their own handles to the host memory.
                Ok((unit, Err(e))) => return Some(Err(format!("host update of unit {unit}: {e}"))),
                Err(_) => return Some(Err("the host update threads are gone".into())),
            }
        }
        Some(Ok(want))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(n: i64) -> HostState {
        HostState::new(&Tensor::ones([n], (Kind::Float, tch::Device::Cpu)), Kind::Float, false, false, None).expect("host state")
    }

    fn update(unit: usize) -> Update {
        Update { unit, landed: HostCopy::Done, accumulate: false, optim: OptimConfig::default(), t: 1, grad_scale: 1.0 }
    }

    /// Unit 0's update is thousands of times larger than the others, so it finishes last; the
    /// units must still come back in spawn order (a rank refreshing in finishing order issued its
    /// all-gathers in another order than its peers: stage 2 with offload diverged on 2 GPUs).
    #[test]
    fn finished_updates_come_back_in_spawn_order() {
        let states: Vec<HostState> = (0..8).map(|u| state(if u == 0 { 1 << 24 } else { 1 << 10 })).collect();
        let mut updates = HostUpdates::new();
        for (u, s) in states.iter().enumerate() {
            updates.spawn(s, update(u));
        }
        let order: Vec<usize> = std::iter::from_fn(|| updates.next_in_spawn_order()).map(|r| r.expect("update ran")).collect();
        assert_eq!(order, (0..8).collect::<Vec<_>>());
        // Every update ran: AdamW moved each master weight away from 1.
        for s in &states {
            assert!(s.master.max().double_value(&[]) < 1.0);
        }
        assert!(updates.next_in_spawn_order().is_none());
    }
}
