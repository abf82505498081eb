//! ZeRO-Offload (Ren et al., "ZeRO-Offload: Democratizing Billion-Scale Model Training", ATC'21):
//! the optimizer of a rank's shards lives in (pinned) host memory and runs on the CPU.
//!
//! Per unit, after its gradients are reduce-scattered, the rank's gradient shard is copied to the
//! host on the communication stream; the CPU then updates the fp32 master weights and Adam
//! moments (the Rust AdamW, over all cores) as soon as that copy has landed — while the GPU goes on
//! with the backward of earlier units — and writes the compute-precision parameters, which the
//! device copies back (and, in stages 1 and 2, all-gathers) just before the next forward uses
//! them (`Engine::refresh_until`): the step does not wait for the updates, see [`HostUpdates`]. With
//! `optimizer+params` (stage 3) the parameters stay on the host too and are copied to the device
//! per use, ahead of it, just before their all-gather.
//!
//! fp16 needs every gradient before any update (an overflow anywhere skips the step), so there the
//! updates start only after backward.
//!
//! With an offload ratio below 1 only the units from `memory::first_host_unit` on are here; the
//! engine updates the others on the device at the same time. With the delayed update the engine
//! waits for a unit's update only at its next harvest (see `Engine::harvest`), so the update of
//! step t overlaps step t + 1's forward and backward.

use std::collections::HashMap;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use tch::{Kind, TchError, Tensor};
use zerobench_schema::config::OptimConfig;

use super::adamw::{step_cpu, AdamW, Shard};
use crate::comm::HostCopy;
use crate::runtime::cuda::Gpu;
use crate::runtime::pinned::{self, host_zeros, PinError, Pinned};

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
    /// The page-lock registrations of the tensors the device copies ([`Self::copied`]; none on
    /// a CPU run, and none in the shallow handles a background update gets: the owner's
    /// registrations outlive them).
    pins: Vec<Pinned>,
}

impl HostState {
    /// The host state of a shard whose initial fp32 values are `shard_f32` (on any device).
    /// With `pin`, the state is page-locked (see `runtime::pinned`): pinned copies run
    /// asynchronously at full PCIe speed, pageable ones are staged and synchronous.
    pub fn new(
        shard_f32: &Tensor,
        kind: Kind,
        mixed: bool,
        accumulate: bool,
        pin: Option<&Gpu>,
    ) -> Result<Self, PinError> {
        let n = i64::try_from(shard_f32.numel()).expect("fits");
        let mut state = Self {
            master: host_zeros(n, Kind::Float)?,
            exp_avg: host_zeros(n, Kind::Float)?,
            exp_avg_sq: host_zeros(n, Kind::Float)?,
            grad: host_zeros(n, kind)?,
            grad_acc: if accumulate { Some(host_zeros(n, Kind::Float)?) } else { None },
            param: if mixed { Some(host_zeros(n, kind)?) } else { None },
            pins: Vec::new(),
        };
        // The moments and gradients start at zero as `host_zeros` gives them. Faulted in and the
        // copied ones locked before they are written, so the initial copy from the device is a DMA.
        if let Some(gpu) = pin {
            state.pins = pinned::pin_copied(gpu, &state.copied(), &state.host_only())?;
        }
        let t = std::time::Instant::now();
        state.master.shallow_clone().f_copy_(shard_f32)?;
        let master_ms = t.elapsed().as_secs_f64() * 1e3;
        if let Some(p) = &state.param {
            p.shallow_clone().f_copy_(&state.master)?;
        }
        tracing::debug!(master_ms, param_ms = t.elapsed().as_secs_f64() * 1e3 - master_ms, "host state filled");
        Ok(state)
    }

    fn tensors(&self) -> Vec<&Tensor> {
        [self.copied(), self.host_only()].concat()
    }

    /// What the device copies to or from: the master weights (filled from the device, and the
    /// parameters copied back in fp32), the landed gradient and the compute-precision parameters.
    pub fn copied(&self) -> Vec<&Tensor> {
        [&self.master, &self.grad].into_iter().chain(&self.param).collect()
    }

    /// What only the host's update reads and writes: the moments and the accumulated gradient.
    pub fn host_only(&self) -> Vec<&Tensor> {
        [&self.exp_avg, &self.exp_avg_sq].into_iter().chain(&self.grad_acc).collect()
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
        self.tensors().into_iter().map(|t| pinned::bytes_of(t) as u64).sum()
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
    /// Where the unit is first used in forward: once the step's gradients are all in, the
    /// remaining updates run in this order (the next forward needs them in it).
    pub priority: usize,
    /// The gradient copy to wait for (`HostCopy::Done` once it has been waited for already).
    pub landed: HostCopy,
    /// The last copy of the unit's parameters to the device, which must have read them before
    /// the update overwrites them.
    pub uploaded: HostCopy,
    /// Whether the landed shard must first be added to the accumulator (the last micro-step of
    /// an accumulating step; the earlier ones were added as they landed).
    pub accumulate: bool,
    pub optim: OptimConfig,
    /// AdamW's step number (1-based) and the gradient's scale (1 / loss scale in fp16).
    pub t: u64,
    pub grad_scale: f64,
}

/// AdamW updates of host shards, run in the background by a driver thread, one unit at a time
/// over the whole CPU pool, while the rank's thread goes on launching the GPU's work.
///
/// Order: during backward the updates run in the order the gradients land. Once the step's last
/// gradient is in ([`HostUpdates::seal`]) the rest run in forward order, because the next forward
/// needs the first units first and backward produced their gradients last: the forward then
/// starts as soon as its first unit is updated instead of after every update.
///
/// Results are taken per unit ([`HostUpdates::wait_for`]), in an order the engine chooses and
/// every rank shares (each is followed by a collective), never in finishing order, which depends
/// on each host's threads (a rank refreshing in finishing order issued its all-gathers in another
/// order than its peers: stage 2 with offload diverged on 2 GPUs).
pub struct HostUpdates {
    shared: Arc<Shared>,
    rx: Receiver<(usize, Result<(), String>)>,
    /// Results received while waiting for another unit.
    done: HashMap<usize, Result<(), String>>,
    driver: Option<JoinHandle<()>>,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
}

#[derive(Default)]
struct Queue {
    jobs: Vec<(HostState, Update)>,
    sealed: bool,
    closed: bool,
}

impl Queue {
    /// The job to run next: the earliest spawned, or once sealed the first in forward order.
    fn take_next(&mut self) -> Option<(HostState, Update)> {
        if self.jobs.is_empty() {
            return None;
        }
        let i = if self.sealed { (0..self.jobs.len()).min_by_key(|&i| self.jobs[i].1.priority)? } else { 0 };
        Some(self.jobs.remove(i))
    }
}

impl HostUpdates {
    pub fn new() -> std::io::Result<Self> {
        let (tx, rx) = channel();
        let shared = Arc::new(Shared { queue: Mutex::new(Queue::default()), wake: Condvar::new() });
        let driver = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new().name("host-updates".into()).spawn(move || {
                // A crash in the host's update is reported with its frames.
                let _ = crate::runtime::fatal::signal_stack_for_this_thread();
                drive(&shared, &tx)
            })?
        };
        Ok(Self { shared, rx, done: HashMap::new(), driver: Some(driver) })
    }

    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.shared.queue.lock().expect("host update queue")
    }

    /// Queues an update of `state`; it runs once its gradient has landed.
    pub fn spawn(&mut self, state: &HostState, u: Update) {
        let mut q = self.queue();
        q.sealed = false; // a new step's gradients: landing order again
        q.jobs.push((state.handles(), u));
        drop(q);
        self.shared.wake.notify_one();
    }

    /// Every update of this step is queued: the rest run in forward order.
    pub fn seal(&mut self) {
        self.queue().sealed = true;
    }

    /// Whether unit `unit`'s update has run, without waiting: its result is then kept for
    /// [`Self::wait_for`], which returns at once.
    pub fn is_done(&mut self, unit: usize) -> bool {
        while let Ok((u, r)) = self.rx.try_recv() {
            self.done.insert(u, r);
        }
        self.done.contains_key(&unit)
    }

    /// Waits until unit `unit`'s update has run (it must have been spawned).
    pub fn wait_for(&mut self, unit: usize) -> Result<(), String> {
        loop {
            if let Some(r) = self.done.remove(&unit) {
                return r.map_err(|e| format!("host update of unit {unit}: {e}"));
            }
            let (u, r) = self.rx.recv().map_err(|_| "the host update thread is gone".to_string())?;
            self.done.insert(u, r);
        }
    }
}

impl Drop for HostUpdates {
    /// Drops what has not started and waits for the update running: it writes through its
    /// handles to host memory until it returns.
    fn drop(&mut self) {
        let mut q = self.queue();
        q.closed = true;
        q.jobs.clear();
        drop(q);
        self.shared.wake.notify_one();
        if let Some(d) = self.driver.take() {
            let _ = d.join();
        }
    }
}

fn drive(shared: &Shared, tx: &Sender<(usize, Result<(), String>)>) {
    loop {
        let (h, u) = {
            let mut q = shared.queue.lock().expect("host update queue");
            loop {
                if q.closed {
                    return;
                }
                if let Some(job) = q.take_next() {
                    break job;
                }
                q = shared.wake.wait(q).expect("host update queue");
            }
        };
        let unit = u.unit;
        let result = run(&h, u);
        if tx.send((unit, result)).is_err() {
            return;
        }
    }
}

fn run(h: &HostState, u: Update) -> Result<(), String> {
    u.landed.wait().map_err(|e| e.to_string())?;
    u.uploaded.wait().map_err(|e| e.to_string())?;
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(n: i64) -> HostState {
        HostState::new(&Tensor::ones([n], (Kind::Float, tch::Device::Cpu)), Kind::Float, false, false, None)
            .expect("host state")
    }

    /// The device copies the master weights, the landed gradient and the bf16 parameters; only
    /// the host's update touches the moments and the accumulator: together every tensor of the
    /// state, each once, whatever the precision and accumulation.
    #[test]
    fn what_the_device_copies_and_what_only_the_host_touches_split_the_state() {
        for (kind, mixed, accumulate, copied, host_only) in
            [(Kind::Float, false, false, 2, 2), (Kind::BFloat16, true, true, 3, 3)]
        {
            let s = HostState::new(&Tensor::ones([7], (Kind::Float, tch::Device::Cpu)), kind, mixed, accumulate, None)
                .expect("host state");
            let ptrs = |ts: Vec<&Tensor>| ts.iter().map(|t| t.data_ptr() as usize).collect::<Vec<_>>();
            let (c, h) = (ptrs(s.copied()), ptrs(s.host_only()));
            assert_eq!((c.len(), h.len()), (copied, host_only), "{kind:?}");
            assert!(c.contains(&(s.master.data_ptr() as usize)) && c.contains(&(s.grad.data_ptr() as usize)));
            assert!(h.contains(&(s.exp_avg.data_ptr() as usize)) && h.contains(&(s.exp_avg_sq.data_ptr() as usize)));
            let mut all = [c, h].concat();
            all.sort_unstable();
            all.dedup();
            assert_eq!(all.len(), copied + host_only, "{kind:?}: a tensor on both sides");
        }
    }

    fn update(unit: usize, priority: usize) -> Update {
        Update {
            unit,
            priority,
            landed: HostCopy::Done,
            uploaded: HostCopy::Done,
            accumulate: false,
            optim: OptimConfig::default(),
            t: 1,
            grad_scale: 1.0,
        }
    }

    /// Backward lands units 3, 2, 1, 0 (reverse of forward): they run in landing order until the
    /// step is sealed, then the first in forward order goes first.
    #[test]
    fn queued_updates_run_in_landing_order_then_forward_order() {
        let mut q = Queue::default();
        for u in [3, 2, 1, 0] {
            q.jobs.push((state(4), update(u, u)));
        }
        assert_eq!(q.take_next().map(|(_, u)| u.unit), Some(3));
        q.sealed = true;
        let rest: Vec<usize> = std::iter::from_fn(|| q.take_next().map(|(_, u)| u.unit)).collect();
        assert_eq!(rest, vec![0, 1, 2]);
    }

    /// Results are taken in the order the engine asks for, whatever order they finish in.
    #[test]
    fn every_update_runs_and_is_waited_for_in_any_order() {
        let states: Vec<HostState> = (0..8).map(|u| state(if u == 0 { 1 << 22 } else { 1 << 10 })).collect();
        let mut updates = HostUpdates::new().expect("driver thread");
        for (u, s) in states.iter().enumerate() {
            updates.spawn(s, update(u, u));
        }
        updates.seal();
        for u in (0..8).rev() {
            updates.wait_for(u).expect("update ran");
        }
        // AdamW moved each master weight away from 1.
        for s in &states {
            assert!(s.master.max().double_value(&[]) < 1.0);
        }
    }

    /// `is_done` says no before an update has run and never blocks; once it says yes the result
    /// is kept, and `wait_for` returns it.
    #[test]
    fn is_done_polls_without_taking_the_result() {
        let states: Vec<HostState> = (0..2).map(|_| state(1 << 10)).collect();
        let mut updates = HostUpdates::new().expect("driver thread");
        assert!(!updates.is_done(0), "nothing spawned");
        updates.spawn(&states[0], update(0, 0));
        updates.seal();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !updates.is_done(0) {
            assert!(std::time::Instant::now() < deadline, "the update never ran");
            std::thread::yield_now();
        }
        assert!(updates.is_done(0), "still done: the result is kept");
        assert!(!updates.is_done(1), "unit 1 was never spawned");
        updates.wait_for(0).expect("the kept result");
        assert!(states[0].master.max().double_value(&[]) < 1.0, "it ran");
    }

    /// Dropping with updates still queued returns (they are dropped, the running one finishes).
    #[test]
    fn dropping_with_queued_updates_does_not_hang() {
        let states: Vec<HostState> = (0..4).map(|_| state(1 << 20)).collect();
        let mut updates = HostUpdates::new().expect("driver thread");
        for (u, s) in states.iter().enumerate() {
            updates.spawn(s, update(u, u));
        }
        drop(updates);
    }
}
