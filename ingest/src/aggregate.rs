//! From what was read about a run to its row: step-time statistics, throughput, FLOPs and MFU,
//! memory peaks, communication shares, bus bandwidth, energy, stragglers and status.
//!
//! Definitions (docs/ingest.md has them with examples):
//! * A step's time is the maximum over ranks (a step ends when its slowest rank does); its
//!   forward, backward, optimizer, communication and exposed-communication times are that rank's,
//!   so the phases of a step add up to its time.
//! * Measured steps are those with index ≥ warmup that every rank read reported; steps only some
//!   ranks reported (a run cut short) are counted as partial and left out.
//! * Median, p10 and p90 are over measured steps (linear interpolation).
//! * Throughput is total tokens (samples) of measured steps over their total time; per GPU is that
//!   over the world size. TFLOP/s = tokens/s × the model's training FLOPs per token.
//! * Communication share = Σ communication time / Σ step time over measured steps; likewise for
//!   exposed communication (time computation waited for it).

use zerobench_schema::collective::CommKey;
use zerobench_schema::log::Start;

use crate::acc::{KindAcc, StepSlot};
use crate::peak::PeakTable;
use crate::plan::{describe_ranges, RunPlan};
use crate::problem::{Problem, ProblemKind};
use crate::read::RunAcc;
use crate::run::{self, CollectiveRow, RunReport, RunRow, Source, Status, StepTimes};
use crate::stats::fsum;
use crate::status::decide;

/// What turns sums into the reported figures.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    pub warmup: Option<u32>,
    pub peaks: PeakTable,
}

/// The problems a run's records show only once all of them are read: a rank log with more
/// measured step records than steps between its first and last ([`ProblemKind::RepeatedSteps`]),
/// and a `--warmup` that leaves the run no measured step ([`ProblemKind::NothingMeasured`]).
/// The figures hold up (a step's slot keeps its slowest record, throughput takes each rank's
/// mean step), but such a log is not what the run wrote once.
pub fn run_problems(plan: &RunPlan, acc: &RunAcc, settings: &Settings) -> Vec<Problem> {
    let mut problems = Vec::new();
    // `--warmup` at or past the run's last step leaves it no measured step: no time figure.
    let steps = plan.start.config.steps;
    if let Some(warmup) = settings.warmup.filter(|w| *w >= steps) {
        problems.push(Problem::file(&plan.dir, ProblemKind::NothingMeasured { warmup, steps }));
    }
    for (rank, a) in &acc.ranks {
        let Some((first, last)) = a.measured_span else { continue };
        let steps = u64::from(last - first) + 1;
        if a.measured > steps {
            let path = plan.files.iter().find(|f| f.rank == *rank).map_or_else(|| plan.dir.clone(), |f| f.path.clone());
            problems.push(Problem::file(path, ProblemKind::RepeatedSteps { records: a.measured, steps, first, last }));
        }
    }
    problems
}

/// Why a run whose every rank ended `ok` is still short of its steps, if it is: a rank whose
/// `end` counts fewer steps than the run was configured for (the worker ends `ok` only after
/// the last), or steps no rank's record was read for (lines lost from every log). Its figures
/// are of fewer steps than it made.
fn short_of_steps(acc: &RunAcc, used: &[(u32, &StepSlot)], steps: u32) -> Option<String> {
    let short = acc.ranks.iter().find_map(|(r, a)| a.end.filter(|e| e.steps_completed < steps).map(|e| (*r, e)));
    if let Some((rank, end)) = short {
        return Some(format!("rank {rank} ended ok after {} of {steps} steps", end.steps_completed));
    }
    let reported = used.iter().filter(|(i, _)| *i < steps).count() as u32;
    (reported < steps).then(|| format!("{} of {steps} steps have no record on any rank", steps - reported))
}

/// The report of one zerobench run.
pub fn finish(plan: &RunPlan, acc: &RunAcc, settings: &Settings) -> RunReport {
    let start = &plan.start;
    let cfg = &start.config;
    let world = start.world_size;
    // The steps some rank reported, in order: read once for the status and the figures.
    let used: Vec<(u32, &StepSlot)> = acc.slots.iter().collect();
    let (status, detail) = match decide(&acc.ranks, world, plan.job_state) {
        (Status::Ok, _) => {
            short_of_steps(acc, &used, cfg.steps).map_or((Status::Ok, None), |why| (Status::Incomplete, Some(why)))
        }
        decided => decided,
    };
    let mut row = RunRow::new(
        start.run_id.clone(),
        Source::Zerobench,
        plan.dir.display().to_string(),
        cfg.model.as_str().to_string(),
        status,
    );
    row.formats = "zerobench".into();
    row.variant = cfg.variant();
    row.stage = Some(cfg.stage);
    row.offload = Some(cfg.offload);
    row.precision = Some(cfg.precision);
    row.micro_batch = Some(cfg.micro_batch);
    row.grad_accum = Some(cfg.grad_accum);
    row.seq_len = Some(cfg.seq_len);
    row.gpus = Some(world);
    row.nodes = Some(start.nodes);
    row.gpu = Some(start.device.name.clone());
    row.host_cpu = start.machine.as_ref().map(|m| m.cpu_model.clone());
    row.threads = Some(start.device.threads);
    row.status_detail = detail;
    row.log_version = Some(start.v);
    row.commit = start.versions.commit.clone();
    row.ranks_read = acc.ranks.len() as u32;
    row.ranks_missing = describe_ranges(&plan.missing_ranks);
    row.device_memory_bytes = start.device.total_memory_bytes;

    let warmup = settings.warmup.unwrap_or(start.config.warmup);
    let present = acc.ranks.len() as u32;
    row.warmup_steps = used.iter().filter(|(i, _)| *i < warmup).count() as u32;
    let measured: Vec<&StepSlot> =
        used.iter().filter(|(i, s)| *i >= warmup && s.ranks >= present).map(|(_, s)| *s).collect();
    row.partial_steps = used.iter().filter(|(i, s)| *i >= warmup && s.ranks < present).count() as u32;
    row.steps_measured = measured.len() as u32;
    step_figures(&mut row, &measured);
    throughput(&mut row, &measured, acc, start, settings);
    memory(&mut row, acc);
    energy(&mut row, acc);
    utilisation(&mut row, acc);
    // The latest value of any rank; the lowest rank's among equally late ones.
    let latest = |f: fn(&crate::acc::RankAcc) -> Option<crate::acc::StepLoss>| {
        acc.ranks
            .iter()
            .filter_map(|(r, a)| f(a).map(|(s, l)| (s, std::cmp::Reverse(*r), l)))
            .max_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)))
            .and_then(|(_, _, l)| l)
    };
    // A last loss that was not finite (a diverged run) is none, not the last finite one; a
    // perplexity beyond what a number holds (e^710 and up) neither.
    row.final_loss = latest(|a| a.last_loss).filter(|l| l.is_finite());
    row.eval_loss = latest(|a| a.last_eval).filter(|l| l.is_finite());
    row.perplexity = row.eval_loss.map(f64::exp).filter(|p| p.is_finite());
    row.skipped_steps = acc.ranks.values().map(|a| a.skipped).max().unwrap_or(0);
    if world > 1 && !measured.is_empty() {
        let mut counts = std::collections::BTreeMap::<u32, u32>::new();
        for s in &measured {
            *counts.entry(s.slowest_rank).or_default() += 1;
        }
        // Most often slowest; the lowest rank on ties.
        if let Some((rank, n)) = counts.iter().max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0))) {
            row.straggler_rank = Some(*rank);
            row.straggler_frac = Some(f64::from(*n) / measured.len() as f64);
        }
    }
    let collectives = collectives(&row, acc, start);
    RunReport { row, collectives, memory_phases: Vec::new() }
}

fn step_figures(row: &mut RunRow, measured: &[&StepSlot]) {
    let times: Vec<StepTimes> = measured
        .iter()
        .map(|s| StepTimes {
            step: s.step_ms,
            forward: s.forward_ms,
            backward: s.backward_ms,
            optimizer: s.optimizer_ms,
            comm: Some(s.comm_ms),
            exposed_comm: Some(s.exposed_comm_ms),
        })
        .collect();
    run::step_figures(row, &times);
}

fn throughput(row: &mut RunRow, measured: &[&StepSlot], acc: &RunAcc, start: &Start, settings: &Settings) {
    // Wall time: from each rank's own step times (steps end with a synchronisation, so a rank's
    // sum over its steps is the elapsed time). Adding up the slowest rank of every step instead
    // would count every rank's hiccups and overstate the time.
    // The tokens are those of the steps every rank reported (`measured`), so the time is of as
    // many steps: a rank's mean step times their number, the longest over the ranks. Where every
    // rank has every measured step, that is the longest sum; where a rank lacks some (a line lost,
    // a rank that ended early) or holds some twice (a log appended to itself), its sum would be
    // the time of more or fewer steps than the tokens count.
    // Every measured step adds its time to its rank's sum, so there is no other source to fall
    // back on: a run whose measured steps took no time has no throughput.
    let steps = measured.len() as f64;
    let secs = acc
        .ranks
        .values()
        .filter(|r| r.measured > 0)
        .map(|r| r.measured_ns as f64 / r.measured as f64 * steps / 1e9)
        .fold(0.0, f64::max);
    if measured.is_empty() || secs <= 0.0 {
        return;
    }
    let world = f64::from(start.world_size.max(1));
    // Wide sums: token counts come from the logs and must not overflow.
    let tokens: u128 = measured.iter().map(|s| u128::from(s.tokens)).sum();
    let samples: u128 = measured.iter().map(|s| u128::from(s.samples)).sum();
    let tps = tokens as f64 / secs;
    let sps = samples as f64 / secs;
    row.tokens_per_s = Some(tps);
    row.tokens_per_s_per_gpu = Some(tps / world);
    row.samples_per_s = Some(sps);
    row.samples_per_s_per_gpu = Some(sps / world);
    let cfg = &start.config;
    let fpt = cfg.train_flops_per_token();
    row.flops_per_token = Some(fpt);
    let tflops = tps * fpt / 1e12;
    row.tflops_per_s = Some(tflops);
    row.tflops_per_s_per_gpu = Some(tflops / world);
    // Only GPUs are in the table; a plain `--peak-tflops N` applies to any device.
    let gpu = (start.device.kind == "cuda").then_some(start.device.name.as_str());
    row.peak_tflops_per_gpu = settings.peaks.lookup(gpu, Some(cfg.precision));
    row.mfu = row.peak_tflops_per_gpu.map(|p| tflops / world / p);
}

fn memory(row: &mut RunRow, acc: &RunAcc) {
    let max = |f: fn(&crate::acc::MemPeaks) -> Option<u64>| acc.ranks.values().filter_map(|a| f(&a.mem)).max();
    row.peak_allocated_bytes = max(|m| m.allocated);
    row.peak_reserved_bytes = max(|m| m.reserved);
    row.peak_nvml_used_bytes = max(|m| m.nvml);
    row.peak_rss_bytes = max(|m| m.rss);
    // The rank holding the most (ranks differ by their share of the padding).
    if let Some(s) = acc.ranks.values().filter_map(|a| a.states).max_by_key(crate::acc::StateBytes::key) {
        row.state_params_bytes = Some(s.device.params_bytes);
        row.state_grads_bytes = Some(s.device.grads_bytes);
        row.state_optimizer_bytes = Some(s.device.optimizer_bytes);
        row.host_state_bytes = Some(s.host_bytes);
        row.state_buffer_bytes = Some(s.buffer_bytes);
        row.param_path = Some(s.param_path);
    }
}

/// Energy per token: each rank's energy counter difference between its first and last measured
/// step, over the global tokens of the steps in between (first excluded, last included), summed
/// over ranks. Only when every rank has a counter that advanced: one that stood still or went
/// back over steps that took time (a GPU that does not count energy, a reset) is no reading.
fn energy(row: &mut RunRow, acc: &RunAcc) {
    if acc.ranks.is_empty() {
        return;
    }
    let mut per_token = 0.0;
    let mut power = 0.0;
    for a in acc.ranks.values() {
        let (Some((s0, e0)), Some((s1, e1))) = (a.energy_first, a.energy_last) else { return };
        // A counter beyond what a number holds (or a difference that overflows) is no reading.
        if s1 <= s0 || e1 <= e0 || !(e1 - e0).is_finite() {
            return;
        }
        let read: Vec<&StepSlot> = acc.slots.range(s0 + 1..=s1).map(|(_, s)| s).collect();
        let tokens: u128 = read.iter().map(|s| u128::from(s.tokens)).sum();
        let secs = fsum(read.iter().map(|s| s.step_ms)) / 1e3;
        if tokens == 0 || secs <= 0.0 {
            return;
        }
        // The counter ran through every step of the window, the records of some of which may be
        // lost (a line that could not be read): those are taken at the mean of the others, or
        // the energy of the whole window would be put on part of its time and tokens.
        let whole = f64::from(s1 - s0) / read.len() as f64;
        per_token += (e1 - e0) / (tokens as f64 * whole);
        power += (e1 - e0) / (secs * whole);
    }
    row.energy_j_per_token = Some(per_token);
    row.avg_power_w_per_gpu = Some(power / acc.ranks.len() as f64);
}

/// NVML utilisation over every rank's measured steps: the mean, and the 10th percentile (the
/// lowest value at or above which 90% of the steps lie).
fn utilisation(row: &mut RunRow, acc: &RunAcc) {
    let mut hist = [0u64; 101];
    for a in acc.ranks.values() {
        if let Some(h) = &a.util {
            for (m, t) in hist.iter_mut().zip(h.iter()) {
                *m += t;
            }
        }
    }
    let n: u64 = hist.iter().sum();
    if n == 0 {
        return;
    }
    let sum: u64 = hist.iter().enumerate().map(|(pct, c)| pct as u64 * c).sum();
    row.gpu_util_pct_mean = Some(sum as f64 / n as f64);
    let mut seen = 0;
    row.gpu_util_pct_p10 = hist.iter().enumerate().find_map(|(pct, c)| {
        seen += c;
        (seen * 10 >= n).then_some(pct as f64)
    });
}

fn collectives(row: &RunRow, acc: &RunAcc, start: &Start) -> Vec<CollectiveRow> {
    let rank_steps: u64 = acc.ranks.values().map(|a| a.measured).sum();
    if rank_steps == 0 {
        return Vec::new();
    }
    // Name, bus-bandwidth factor (the schema's kinds only) and sums over ranks.
    let mut kinds: Vec<(String, Option<f64>, KindAcc)> = Vec::new();
    for k in CommKey::ALL {
        let mut sum = KindAcc::default();
        for a in acc.ranks.values() {
            sum.merge(&a.comm.known[k.index()]);
        }
        if sum.steps > 0 {
            kinds.push((k.name().to_string(), k.bus_factor(start.world_size, start.config.engine.hpz), sum));
        }
    }
    let mut others = std::collections::BTreeMap::<String, KindAcc>::new();
    for a in acc.ranks.values() {
        for (name, k) in &a.comm.other {
            others.entry(name.clone()).or_default().merge(k);
        }
    }
    kinds.extend(others.into_iter().map(|(n, k)| (n, None, k)));
    let n = rank_steps as f64;
    kinds
        .into_iter()
        .map(|(name, factor, k)| {
            let algbw = (k.ns > 0).then(|| k.bytes as f64 / k.ns as f64);
            let ms = k.ns as f64 / 1e6 / n;
            CollectiveRow {
                run_id: row.run_id.clone(),
                model: row.model.clone(),
                stage: row.stage,
                offload: start.config.offload,
                micro_batch: row.micro_batch,
                gpus: row.gpus,
                nodes: row.nodes,
                kind: name,
                calls_per_step: k.calls as f64 / n,
                bytes_per_step: k.bytes as f64 / n,
                ms_per_step: ms,
                step_frac: row.step_ms_mean.filter(|m| *m > 0.0).map(|m| ms / m),
                algbw_gbps: algbw,
                busbw_factor: factor,
                busbw_gbps: algbw.zip(factor).map(|(a, f)| a * f),
            }
        })
        .collect()
}

/// Whether a status keeps a run out of the throughput figures of the scaling table.
pub fn usable_for_scaling(s: Status) -> bool {
    s == Status::Ok
}
