//! The training loop: micro-steps of segment-by-segment forward and backward around the engine's
//! hooks, one optimizer step, one `step` record (and, when asked, a trace and a profile). With
//! `--cuda-graph` the micro-steps' forward and backward passes are captured at the last warm-up
//! step and replayed from then on (`runtime::graph`); the optimizer step stays eager (on one GPU it
//! runs beside the replayed backward, `zero::beside`).
//!
//! A step's time is what a user's training loop pays: from the start of its work to the
//! completion of all of it, the device synchronised at the end (`StepClock::finish`). What the
//! loop does between two steps (reading the finished step's timers and memory, handing its record
//! to the log thread, which reads NVML and writes) is the next record's `overhead_ms`, so the
//! interval between two step records is the later one's `step_ms + overhead_ms`.

use std::sync::Arc;
use std::time::Instant;

use tch::Tensor;
use zerobench_schema::log::{Eval, ModuleProfile, Profile, Record, Step, Summary};
use zerobench_schema::{RunConfig, SCHEMA_VERSION};

use crate::data::Data;
use crate::failure::Failure;
use crate::logfile::{now_ts, BackgroundWriter, RankLog};
use crate::metrics::clock::{SharedClock, StepPhase};
use crate::metrics::gpu_monitor::GpuMonitor;
use crate::metrics::memory::MemoryProbe;
use crate::metrics::timeline::{Resolved, SharedTimeline, SpanInfo, Track};
use crate::model::{Batch, Model, Shape};
use crate::runtime::cuda::Gpu;
use crate::runtime::graph::{Graph, GraphPool};
use crate::runtime::guard::Guard;
use crate::runtime::shim;
use crate::zero::{Engine, Schedule};

/// Steps a `--trace` records (the first ones after warmup), to bound its size.
pub const TRACE_STEPS: u32 = 20;

/// How far a run got.
pub struct Progress {
    pub steps_completed: u32,
    pub summary: Option<Summary>,
    /// Spans of the traced steps, for `--trace`.
    pub trace: Vec<Resolved>,
    /// The GPU, once chosen, for the memory sample of an error record.
    pub cuda_device: Option<usize>,
}

/// What the trainer observes beyond the `step` records.
pub struct Observe {
    pub timeline: SharedTimeline,
    pub trace: bool,
    pub profile_step: Option<u32>,
    /// libtorch's profiler's trace of one step, when asked.
    pub torch_profile: Option<TorchProfile>,
}

/// `--torch-profile`: the step libtorch's profiler records, and where its trace goes.
pub struct TorchProfile {
    pub step: u32,
    pub path: std::path::PathBuf,
}

pub struct Trainer<'a> {
    pub cfg: &'a RunConfig,
    pub model: &'a dyn Model,
    pub engine: &'a mut Engine,
    pub data: &'a Data,
    pub log: &'a RankLog,
    pub guard: &'a Guard,
    pub probe: &'a MemoryProbe,
    pub monitor: Option<Arc<GpuMonitor>>,
    /// The CPU the launching threads move to after the first backward pass (runtime::cpus).
    pub launch_cpu: Option<usize>,
    /// The rank's GPU, when it has one.
    pub gpu: Option<Arc<Gpu>>,
    pub clock: SharedClock,
    pub observe: Observe,
    pub rank: u32,
}

impl Trainer<'_> {
    /// Runs every step; `progress` is kept current so a failure can report how far it got.
    pub fn run(&mut self, progress: &mut Progress) -> Result<(), Failure> {
        let schedule = self.engine.schedule().clone();
        let world = self.engine.world() as u32;
        let tokens = self.cfg.tokens_per_step(world);
        let samples = self.cfg.global_batch(world);
        let mut measured: Vec<f64> = Vec::new();
        let mut last_loss = f64::NAN;
        let mut peak_allocated: Option<u64> = None;
        self.engine.set_timeline(self.observe.timeline.clone());
        self.engine.set_clock(&self.clock);
        let mut writer = self.writer()?;
        // When the previous step's work had all completed, and how long the evaluation after it
        // took (not part of the loop's overhead).
        let mut previous_end: Option<Instant> = None;
        let mut eval_ms = 0.0;
        // `--cuda-graph`: the graphs of a step, once captured.
        let mut graphs: Option<StepGraphs> = None;

        for step in 0..self.cfg.steps {
            let traced = self.observe.trace && step >= self.cfg.warmup && step < self.cfg.warmup + TRACE_STEPS;
            let profiled = self.observe.profile_step == Some(step);
            let record = traced || profiled;
            self.timeline().record_step(record.then_some(step));
            // Where the trace of this step goes, when it is the one recorded.
            let torch_profile = self.observe.torch_profile.as_ref().filter(|t| t.step == step).map(|t| t.path.clone());
            if torch_profile.is_some() {
                shim::profiler_start(progress.cuda_device.is_some()).map_err(|e| Failure::Internal(e.0))?;
            }
            let t0 = Instant::now();
            let overhead_ms = previous_end.map_or(0.0, |e| (ms_between(e, t0) - eval_ms).max(0.0));

            // All of the step's data goes to the device now, while the device is idle after the
            // last step's synchronisation, so no copy stalls the host in the middle of the step.
            let copy_start = self.mark()?;
            let batches = (0..self.cfg.grad_accum as usize)
                .map(|micro| self.data.batch(u64::from(step), micro))
                .collect::<Result<Vec<_>, _>>()?;
            self.span(Track::Copy, || "batch to device", copy_start, SpanInfo::default())?;

            // From the last warmup step on, a `--cuda-graph` run replays the micro-steps' forward
            // and backward from graphs captured at that step.
            if self.cfg.cuda_graph && step + 1 == self.cfg.warmup {
                graphs = Some(self.capture(&schedule, &batches)?);
            }
            match &graphs {
                Some(g) => self.replay(g, &batches)?,
                None => {
                    for (micro, batch) in batches.iter().enumerate() {
                        self.engine.begin_micro(micro);
                        self.clock.start(StepPhase::Forward)?;
                        let activations = self.forward(batch)?;
                        self.clock.stop()?;
                        self.clock.start(StepPhase::Backward)?;
                        self.backward(&schedule, activations)?;
                        self.clock.stop()?;
                    }
                }
            }
            if step == 0 {
                self.pin_launch_threads()?;
            }
            self.clock.start(StepPhase::Optimizer)?;
            let opt_start = self.mark()?;
            let outcome = self.engine.step()?;
            // The parameters' all-gathers and copies back belong to this step; offload's host
            // updates run on into the next step's forward, which waits for each at its unit.
            self.engine.finish_step()?;
            self.span(Track::Optimizer, || "optimizer step", opt_start, SpanInfo::default())?;
            self.clock.stop()?;
            let t1 = self.clock.finish()?;
            previous_end = Some(t1);
            let step_ms = ms_between(t0, t1);
            if let Some(path) = &torch_profile {
                shim::profiler_stop(path).map_err(|e| Failure::Io(format!("{}: {}", path.display(), e.0)))?;
            }

            // From here on the loop's own cost: the next step's `overhead_ms`.
            let phases = self.clock.take()?;
            let comm = self.engine.take_comm_stats()?;
            let mut memory = self.probe.sample();
            if let Some(g) = &graphs {
                // A replay allocates nothing: what its tensors took at the capture is its peak.
                memory.peak_allocated_bytes = memory.peak_allocated_bytes.max(g.peak_allocated);
            }
            if let Some(p) = memory.peak_allocated_bytes {
                peak_allocated = Some(peak_allocated.map_or(p, |q: u64| q.max(p)));
            }
            let warmup = step < self.cfg.warmup;
            if !warmup {
                measured.push(step_ms);
            }
            last_loss = outcome.loss;
            let rec = Step {
                v: SCHEMA_VERSION,
                // Stamped here, when the loop hands the record over: the log thread's NVML reads
                // take from microseconds to tens of milliseconds, which would jitter the stamp.
                ts: now_ts(),
                rank: self.rank,
                step,
                warmup,
                loss: zerobench_schema::log::finite_loss(outcome.loss),
                skipped: outcome.skipped,
                loss_scale: outcome.loss_scale,
                tokens,
                samples,
                step_ms,
                forward_ms: phases.forward_ms,
                backward_ms: phases.backward_ms,
                optimizer_ms: phases.optimizer_ms,
                comm_ms: comm.total_ms(),
                exposed_comm_ms: phases.exposed_comm_ms,
                other_ms: (step_ms - phases.sum()).max(0.0),
                overhead_ms,
                comm: comm.to_record(world as usize),
                memory,
                power_w: None,
                energy_j: None,
                gpu_util_pct: None,
            };
            writer.send(Record::Step(rec)).map_err(|e| Failure::Io(e.to_string()))?;
            self.guard.progress(step_ms);

            let spans = self.timeline().resolve().map_err(|e| Failure::Internal(e.to_string()))?;
            if self.observe.profile_step == Some(step) {
                let profile = self.profile(step, &spans);
                writer.send(Record::Profile(profile)).map_err(|e| Failure::Io(e.to_string()))?;
            }
            if traced {
                progress.trace.extend(spans);
            }
            progress.steps_completed = step + 1;
            if !outcome.loss.is_finite() && !outcome.skipped {
                return Err(Failure::Internal(format!("loss became {} at step {step}", outcome.loss)));
            }
            eval_ms = 0.0;
            if let Some(every) = self.cfg.eval_every {
                if (step + 1) % every == 0 || step + 1 == self.cfg.steps {
                    let eval = self.evaluate(step, samples)?;
                    eval_ms = eval.eval_ms;
                    writer.send(Record::Eval(eval)).map_err(|e| Failure::Io(e.to_string()))?;
                }
            }
        }
        // Nothing of the last update left running: the parameters are the trained ones.
        self.engine.settle()?;
        writer.finish().map_err(|e| Failure::Io(e.to_string()))?;
        // The run's step time: per step the slowest rank, then the median (ingest's rule).
        self.engine.max_over_ranks(&mut measured)?;
        progress.summary = summarize(&measured, tokens, last_loss, peak_allocated);
        Ok(())
    }

    /// The mean loss over the held-out global batch after `step`: forward only, through the
    /// engine's hooks (stage 3 gathers and releases as in training), no gradient, no update. Its
    /// timers, collectives and trace are kept out of the next step's record.
    fn evaluate(&mut self, step: u32, samples: u64) -> Result<Eval, Failure> {
        let start = Instant::now();
        self.timeline().record_step(None);
        let mut losses = Vec::with_capacity(self.cfg.grad_accum as usize);
        {
            let _guard = tch::no_grad_guard();
            let n = self.model.segments().len();
            for micro in 0..self.cfg.grad_accum as usize {
                let batch = self.data.held_out_batch(micro)?;
                let mut outputs: Vec<Tensor> = Vec::new();
                for s in 0..n {
                    self.engine.before(s)?;
                    let unit = self.model.segments()[s].unit;
                    outputs = self.model.forward(s, self.engine.params(unit), &outputs, &batch)?;
                    self.engine.after(s)?;
                }
                losses.push(outputs[0].f_to_kind(tch::Kind::Float)?);
                self.engine.end_eval_forward()?;
            }
        }
        let mean = Tensor::f_stack(&losses, 0)?.f_mean(tch::Kind::Float)?;
        let loss = self.engine.mean_over_ranks(&mean)?;
        // Whatever the evaluation left on the clock and the counters is not the next step's.
        self.clock.finish()?;
        self.clock.take()?;
        self.engine.take_comm_stats()?;
        Ok(Eval {
            v: SCHEMA_VERSION,
            ts: now_ts(),
            rank: self.rank,
            step,
            loss: zerobench_schema::log::finite_loss(loss),
            samples,
            eval_ms: ms_between(start, Instant::now()),
        })
    }

    /// Moves this thread and libtorch's autograd thread, which the first backward pass started,
    /// onto the launch CPU (runtime::cpus says why).
    fn pin_launch_threads(&self) -> Result<(), Failure> {
        let Some(cpu) = self.launch_cpu else { return Ok(()) };
        let autograd = crate::runtime::cpus::pin_launch_threads(cpu).map_err(|e| Failure::Internal(e.to_string()))?;
        tracing::debug!(cpu, autograd_threads = autograd, "launching threads pinned");
        Ok(())
    }

    /// The log thread of this run: step records get NVML's readings there.
    fn writer(&self) -> Result<BackgroundWriter, Failure> {
        let monitor = self.monitor.clone();
        self.log
            .background(move |rec| {
                if let Record::Step(s) = rec {
                    if let Some(m) = &monitor {
                        let gpu = m.read();
                        s.memory.nvml_used_bytes = gpu.used_bytes;
                        s.power_w = gpu.power_w;
                        s.energy_j = gpu.energy_j;
                        s.gpu_util_pct = gpu.util_pct;
                    }
                }
            })
            .map_err(|e| Failure::Io(e.to_string()))
    }

    fn timeline(&self) -> std::sync::MutexGuard<'_, crate::metrics::timeline::Timeline> {
        self.observe.timeline.lock().expect("timeline")
    }

    fn mark(&self) -> Result<Option<crate::metrics::timeline::Mark>, Failure> {
        self.timeline().mark().map_err(|e| Failure::Internal(e.to_string()))
    }

    /// Closes a span opened with [`Self::mark`] (a no-op when not recording, so `name` is only
    /// built for recorded steps).
    fn span<S: AsRef<str>>(
        &self,
        track: Track,
        name: impl FnOnce() -> S,
        start: Option<crate::metrics::timeline::Mark>,
        info: SpanInfo,
    ) -> Result<(), Failure> {
        if let (Some(start), Some(end)) = (start, self.mark()?) {
            self.timeline().span(track, name().as_ref(), start, end, info);
        }
        Ok(())
    }

    /// Forward through every segment, with the engine's hooks around each; what backward needs.
    fn forward(&mut self, batch: &Batch) -> Result<Activations, Failure> {
        let n = self.model.segments().len();
        // inputs[s]: the leaves segment s started from; outputs[s]: what it produced.
        let mut inputs: Vec<Vec<Tensor>> = Vec::with_capacity(n);
        let mut outputs: Vec<Vec<Tensor>> = Vec::with_capacity(n);
        for s in 0..n {
            self.engine.before(s)?;
            let start = self.mark()?;
            let leaves: Vec<Tensor> = match outputs.last() {
                None => Vec::new(),
                Some(prev) => prev.iter().map(|t| t.detach().set_requires_grad(true)).collect(),
            };
            let unit = self.model.segments()[s].unit;
            let out = self.model.forward(s, self.engine.params(unit), &leaves, batch)?;
            let name = || format!("fwd {}", self.model.segments()[s].name);
            self.span(Track::Compute, name, start, SpanInfo { segment: Some((s, false)), bytes: None })?;
            self.engine.after(s)?;
            inputs.push(leaves);
            outputs.push(out);
        }
        Ok(Activations { inputs, outputs })
    }

    /// Backward through the segments in reverse, with the engine's hooks around each, then the
    /// engine's end of the micro-step (its loss added to the step's, every reduction complete).
    /// The segments' backward passes all run from inside one backward pass, on the thread that
    /// runs the device's (shim::run_in_backward): two hand-overs per micro-step, not per segment.
    fn backward(&mut self, schedule: &Schedule, activations: Activations) -> Result<(), Failure> {
        let loss = activations.outputs[activations.outputs.len() - 1][0].detach();
        let device = self.probe.cuda_device();
        shim::run_in_backward(device, || self.backward_segments(schedule, activations))
            .map_err(|e| Failure::from_torch_message(&e.0))??;
        self.engine.end_micro(&loss)?;
        Ok(())
    }

    fn backward_segments(&mut self, schedule: &Schedule, activations: Activations) -> Result<(), Failure> {
        let Activations { mut inputs, mut outputs } = activations;
        let n = outputs.len();
        for s in (0..n).rev() {
            let i = schedule.backward_index(s);
            self.engine.before(i)?;
            let start = self.mark()?;
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
            let name = || format!("bwd {}", self.model.segments()[s].name);
            self.span(Track::Compute, name, start, SpanInfo { segment: Some((s, true)), bytes: None })?;
            self.engine.after(i)?;
            // This segment's activations and the next one's input gradients are spent.
            outputs[s].clear();
            if s + 1 < n {
                inputs[s + 1].clear();
            }
        }
        Ok(())
    }

    /// `--cuda-graph`: captures each micro-step's forward and its backward into a graph of their
    /// own (run by [`Self::replay`], not here), reading the step's batches where they are now.
    fn capture(&mut self, schedule: &Schedule, batches: &[Batch]) -> Result<StepGraphs, Failure> {
        let gpu = self.gpu.clone().ok_or(Failure::Config(crate::failure::Refused::CudaGraphWithoutGpu))?;
        // The device idle, every earlier free settled, before the pool takes allocations.
        gpu.synchronize().map_err(|e| Failure::Internal(format!("--cuda-graph: {e}")))?;
        let started = Instant::now();
        let mut pool = GraphPool::new(gpu.clone());
        let mut micro = Vec::with_capacity(batches.len());
        for (m, batch) in batches.iter().enumerate() {
            self.engine.begin_micro(m);
            let (forward, activations) = pool.capture(|| self.forward(batch))?;
            let (backward, ()) = pool.capture(|| self.backward(schedule, activations))?;
            micro.push((forward, backward));
        }
        let loss_sum = self.engine.loss_sum().ok_or_else(|| Failure::Internal("no loss was captured".into()))?;
        let peak_allocated = match self.probe.cuda_device() {
            Some(d) => shim::cuda_stats(d).ok().and_then(|s| u64::try_from(s.peak_allocated).ok()),
            None => None,
        };
        let memsets_as_kernels: usize = micro.iter().map(|(f, b)| f.memsets_as_kernels + b.memsets_as_kernels).sum();
        tracing::info!(
            graphs = 2 * micro.len(),
            memsets_as_kernels,
            ms = ms_between(started, Instant::now()),
            "captured the step"
        );
        Ok(StepGraphs {
            micro,
            batches: batches.iter().map(Batch::shallow_clone).collect(),
            loss_sum,
            peak_allocated,
            pool,
        })
    }

    /// Runs a step's micro-steps from the graphs: `batches` copied where the graphs read, each
    /// forward and backward a launch, timed as the eager phases are.
    fn replay(&mut self, graphs: &StepGraphs, batches: &[Batch]) -> Result<(), Failure> {
        for (m, ((forward, backward), (fixed, batch))) in
            graphs.micro.iter().zip(graphs.batches.iter().zip(batches)).enumerate()
        {
            self.engine.begin_micro(m);
            fixed.copy_from(batch)?;
            self.clock.start(StepPhase::Forward)?;
            graphs.pool.replay(forward)?;
            self.clock.stop()?;
            self.clock.start(StepPhase::Backward)?;
            // Where the updates run beside the backward, it goes first ([`Engine::backward_urgent`]).
            if self.engine.backward_urgent() {
                graphs.pool.replay_urgent(backward)?;
            } else {
                graphs.pool.replay(backward)?;
            }
            self.clock.stop()?;
        }
        self.engine.set_loss_sum(graphs.loss_sum.shallow_clone());
        Ok(())
    }

    /// Per-kind module times of a profiled step, from its compute spans.
    fn profile(&self, step: u32, spans: &[Resolved]) -> Profile {
        let segments = self.model.segments();
        let shape = Shape {
            sequences: u64::from(self.cfg.micro_batch) * u64::from(self.cfg.grad_accum),
            seq_len: u64::from(self.cfg.seq_len),
            target_len: u64::from(self.cfg.target_len_or_default()),
        };
        let mut modules: Vec<ModuleProfile> = Vec::new();
        for (s, seg) in segments.iter().enumerate() {
            let kind = seg.name.split('.').next().unwrap_or(&seg.name).to_string();
            let ms = |backward: bool| -> f64 {
                spans.iter().filter(|r| r.info.segment == Some((s, backward))).map(|r| r.dur_us / 1e3).sum()
            };
            let params: u64 = self.engine.params(seg.unit).iter().map(|p| p.numel() as u64).sum();
            let flops = self.model.forward_flops(s, &shape);
            let (fwd, bwd) = (ms(false), ms(true));
            match modules.iter_mut().find(|m| m.kind == kind) {
                Some(m) => {
                    m.count += 1;
                    m.params += params;
                    m.forward_flops += flops;
                    m.forward_ms += fwd;
                    m.backward_ms += bwd;
                }
                None => modules.push(ModuleProfile {
                    kind,
                    count: 1,
                    params,
                    forward_flops: flops,
                    forward_ms: fwd,
                    backward_ms: bwd,
                    forward_tflops: 0.0,
                    backward_tflops: 0.0,
                }),
            }
        }
        for m in &mut modules {
            let tflops = |f: f64, ms: f64| if ms > 0.0 { f / (ms * 1e-3) / 1e12 } else { 0.0 };
            m.forward_tflops = tflops(m.forward_flops, m.forward_ms);
            m.backward_tflops = tflops(2.0 * m.forward_flops, m.backward_ms);
        }
        Profile { v: SCHEMA_VERSION, ts: now_ts(), rank: self.rank, step, modules }
    }
}

/// What a micro-step's forward leaves for its backward.
struct Activations {
    /// The leaves each segment started from (the previous one's outputs, detached).
    inputs: Vec<Vec<Tensor>>,
    /// What each segment produced.
    outputs: Vec<Vec<Tensor>>,
}

/// A step captured for `--cuda-graph`: per micro-step a forward and a backward graph, the batches
/// they read, the summed loss they write. The graphs drop before their pool.
struct StepGraphs {
    micro: Vec<(Graph, Graph)>,
    batches: Vec<Batch>,
    loss_sum: Tensor,
    /// The allocator's peak over the capture: what a replay's tensors take.
    peak_allocated: Option<u64>,
    pool: GraphPool,
}

fn ms_between(a: Instant, b: Instant) -> f64 {
    b.saturating_duration_since(a).as_secs_f64() * 1e3
}

fn summarize(
    step_ms: &[f64],
    tokens_per_step: u64,
    final_loss: f64,
    peak_allocated_bytes: Option<u64>,
) -> Option<Summary> {
    let median = zerobench_schema::stats::median(step_ms)?;
    let total_s: f64 = step_ms.iter().sum::<f64>() / 1e3;
    Some(Summary {
        steps: u32::try_from(step_ms.len()).unwrap_or(u32::MAX),
        step_ms_median: median,
        tokens_per_s: tokens_per_step as f64 * step_ms.len() as f64 / total_s,
        final_loss: zerobench_schema::log::finite_loss(final_loss),
        peak_allocated_bytes,
    })
}
