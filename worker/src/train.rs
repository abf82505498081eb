//! The training loop: micro-steps of segment-by-segment forward and backward around the engine's
//! hooks, one optimizer step, one `step` record.

use std::time::Instant;

use tch::Tensor;
use zerobench_schema::log::{Record, Step, Summary};
use zerobench_schema::{RunConfig, SCHEMA_VERSION};

use crate::data::Data;
use crate::failure::Failure;
use crate::logfile::RankLog;
use crate::metrics::clock::{PhaseTimer, StepPhase};
use crate::metrics::memory::MemoryProbe;
use crate::model::{Batch, Model};
use crate::runtime::shim;
use crate::zero::{Engine, Schedule};

pub fn now_ts() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// How far a run got.
pub struct Progress {
    pub steps_completed: u32,
    pub summary: Option<Summary>,
}

pub struct Trainer<'a> {
    pub cfg: &'a RunConfig,
    pub model: &'a dyn Model,
    pub engine: &'a mut Engine,
    pub data: &'a Data,
    pub log: &'a mut RankLog,
    pub probe: &'a MemoryProbe,
    pub rank: u32,
}

impl Trainer<'_> {
    /// Runs every step; `progress` is kept current so a failure can report how far it got.
    pub fn run(&mut self, progress: &mut Progress) -> Result<(), Failure> {
        let schedule = self.engine.schedule().clone();
        let world = self.engine.world() as u32;
        let tokens = self.cfg.tokens_per_step(world);
        let samples = self.cfg.global_batch(world);
        let mut timer = PhaseTimer::default();
        let mut measured: Vec<f64> = Vec::new();
        let mut last_loss = f64::NAN;

        for step in 0..self.cfg.steps {
            let t0 = Instant::now();
            for micro in 0..self.cfg.grad_accum as usize {
                self.engine.begin_micro(micro);
                let batch = self.data.batch(u64::from(step), micro)?;
                let loss = self.micro_step(&schedule, &batch, &mut timer)?;
                timer.start(StepPhase::Backward);
                self.engine.end_micro(&loss)?;
                timer.stop();
            }
            timer.start(StepPhase::Optimizer);
            let outcome = self.engine.step()?;
            timer.stop();
            let step_ms = t0.elapsed().as_secs_f64() * 1e3;

            let (forward_ms, backward_ms, optimizer_ms) = timer.take();
            let comm = self.engine.take_comm_stats()?;
            let warmup = step < self.cfg.warmup;
            if !warmup {
                measured.push(step_ms);
            }
            last_loss = outcome.loss;
            let rec = Step {
                v: SCHEMA_VERSION,
                ts: now_ts(),
                rank: self.rank,
                step,
                warmup,
                loss: outcome.loss,
                skipped: outcome.skipped,
                loss_scale: outcome.loss_scale,
                tokens,
                samples,
                step_ms,
                forward_ms,
                backward_ms,
                optimizer_ms,
                comm_ms: comm.total_ms(),
                exposed_comm_ms: comm.exposed_ms,
                comm: comm.to_record(world as usize),
                memory: self.probe.sample(),
                power_w: None,
                energy_j: None,
                gpu_util_pct: None,
            };
            self.log.write(&Record::Step(rec)).map_err(|e| Failure::Io(e.to_string()))?;
            progress.steps_completed = step + 1;
            if !outcome.loss.is_finite() && !outcome.skipped {
                return Err(Failure::Internal(format!("loss became {} at step {step}", outcome.loss)));
            }
        }
        progress.summary = summarize(&measured, tokens, last_loss);
        Ok(())
    }

    /// Forward through every segment, then backward in reverse, with the engine's hooks around
    /// each. Returns the micro-batch's mean loss (detached).
    fn micro_step(&mut self, schedule: &Schedule, batch: &Batch, timer: &mut PhaseTimer) -> Result<Tensor, Failure> {
        let n = self.model.segments().len();
        // inputs[s]: the leaves segment s started from; outputs[s]: what it produced.
        let mut inputs: Vec<Vec<Tensor>> = Vec::with_capacity(n);
        let mut outputs: Vec<Vec<Tensor>> = Vec::with_capacity(n);

        timer.start(StepPhase::Forward);
        for s in 0..n {
            self.engine.before(s)?;
            let leaves: Vec<Tensor> = match outputs.last() {
                None => Vec::new(),
                Some(prev) => prev.iter().map(|t| t.detach().set_requires_grad(true)).collect(),
            };
            let unit = self.model.segments()[s].unit;
            let out = self.model.forward(s, self.engine.params(unit), &leaves, batch)?;
            self.engine.after(s)?;
            inputs.push(leaves);
            outputs.push(out);
        }
        timer.stop();

        timer.start(StepPhase::Backward);
        let loss = outputs[n - 1][0].detach();
        for s in (0..n).rev() {
            let i = schedule.backward_index(s);
            self.engine.before(i)?;
            if s == n - 1 {
                let scaled = outputs[s][0].f_mul_scalar(self.engine.loss_multiplier())?;
                scaled.f_backward()?;
            } else {
                let mut outs = Vec::new();
                let mut grads = Vec::new();
                for (o, leaf) in outputs[s].iter().zip(&inputs[s + 1]) {
                    let g = leaf.grad();
                    if g.defined() {
                        outs.push(o);
                        grads.push(g);
                    }
                }
                let grad_refs: Vec<&Tensor> = grads.iter().collect();
                shim::backward(&outs, &grad_refs).map_err(|e| Failure::from_torch_message(&e.0))?;
            }
            self.engine.after(i)?;
            // This segment's activations and the next one's input gradients are spent.
            outputs[s].clear();
            if s + 1 < n {
                inputs[s + 1].clear();
            }
        }
        timer.stop();
        Ok(loss)
    }
}

fn summarize(step_ms: &[f64], tokens_per_step: u64, final_loss: f64) -> Option<Summary> {
    if step_ms.is_empty() {
        return None;
    }
    let mut sorted = step_ms.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    let median = if sorted.len() % 2 == 0 { (sorted[mid - 1] + sorted[mid]) / 2.0 } else { sorted[mid] };
    let total_s: f64 = step_ms.iter().sum::<f64>() / 1e3;
    Some(Summary {
        steps: u32::try_from(step_ms.len()).unwrap_or(u32::MAX),
        step_ms_median: median,
        tokens_per_s: tokens_per_step as f64 * step_ms.len() as f64 / total_s,
        final_loss,
        peak_allocated_bytes: None,
    })
}
