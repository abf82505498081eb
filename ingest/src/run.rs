//! What ingest reports per run: one flat row (the `runs` table) and its collectives (the `comm`
//! table). Units are in the field names: `_ms`, `_bytes`, `_per_s`, `_frac` (0..1), `_gbps`
//! (1e9 bytes per second), `_j`, `_w`.

use std::fmt;

use serde::Serialize;
use zerobench_schema::memory::ParamPath;
use zerobench_schema::{Offload, Precision, ZeroStage};

/// How a run ended, as the tables show it (in every format: serialised as [`Status::as_str`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(into = "&'static str")]
pub enum Status {
    Ok,
    /// Out of memory: a cell of the tables, not a crash.
    Oom,
    Failed,
    /// Ended without every rank saying so: killed, still running, or rank logs missing. The
    /// default: nothing says yet that the run finished.
    #[default]
    Incomplete,
    /// The scheduler cancelled the job before every rank finished.
    Cancelled,
    /// The job hit its time limit before every rank finished.
    Timeout,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Oom => "oom",
            Status::Failed => "failed",
            Status::Incomplete => "incomplete",
            Status::Cancelled => "cancelled",
            Status::Timeout => "timeout",
        }
    }
}

impl From<Status> for &'static str {
    fn from(s: Status) -> Self {
        s.as_str()
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which program wrote the logs a run was read from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    #[default]
    Zerobench,
    /// DeepSpeed and/or Hugging Face Trainer and/or nvidia-smi logs.
    Foreign,
}

impl std::fmt::Display for Source {
    /// The name the tables give it (its serde name).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Source::Zerobench => "zerobench",
            Source::Foreign => "foreign",
        })
    }
}

/// One run, every field. `None` is an empty cell: not measured, or not applicable.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RunRow {
    pub run_id: String,
    pub source: Source,
    /// For foreign runs, the formats recognised (`deepspeed+hf-trainer+nvidia-smi`).
    pub formats: String,
    pub dir: String,
    pub model: String,
    /// Optimizer and engine settings that differ from the defaults (`RunConfig::variant`); runs of
    /// different variants are different rows in every table.
    pub variant: String,
    pub stage: Option<ZeroStage>,
    /// `None`: not recorded (a foreign log that does not say), never taken for `none`.
    pub offload: Option<Offload>,
    pub precision: Option<Precision>,
    pub micro_batch: Option<u32>,
    pub grad_accum: Option<u32>,
    pub seq_len: Option<u32>,
    pub gpus: Option<u32>,
    pub nodes: Option<u32>,
    pub gpu: Option<String>,
    /// The host's CPU model (rank 0's; zerobench runs whose logs record it).
    pub host_cpu: Option<String>,
    /// Intra-op threads libtorch used on each rank (rank 0's `start.device.threads`; zerobench
    /// runs only): part of a run's identity, since it sets a CPU run's speed (and that of
    /// offload's optimizer step on the host).
    pub threads: Option<u32>,
    pub status: Status,
    pub status_detail: Option<String>,
    /// The schema version of a zerobench run's logs (`None` for foreign runs). Version 1's
    /// backward and forward include their waits for communication; version 2's phases are
    /// disjoint (docs/log-schema.md).
    pub log_version: Option<u32>,
    /// The git commit of the worker that wrote a zerobench run's logs (`start.versions.commit`;
    /// `None` for foreign runs and logs of builds before it was logged). Repeats of one
    /// configuration by different builds measure different software.
    pub commit: Option<String>,
    pub ranks_read: u32,
    pub ranks_missing: String,
    /// Steps after warmup that every rank read reported, and the warmup steps dropped.
    pub steps_measured: u32,
    pub warmup_steps: u32,
    /// Steps that only some ranks reported (left out).
    pub partial_steps: u32,
    pub step_ms_median: Option<f64>,
    pub step_ms_p10: Option<f64>,
    pub step_ms_p90: Option<f64>,
    pub step_ms_mean: Option<f64>,
    pub forward_ms_median: Option<f64>,
    pub backward_ms_median: Option<f64>,
    pub optimizer_ms_median: Option<f64>,
    pub comm_ms_median: Option<f64>,
    pub exposed_comm_ms_median: Option<f64>,
    pub comm_frac: Option<f64>,
    pub exposed_comm_frac: Option<f64>,
    /// Shares of the measured time (Σ phase / Σ step over measured steps) of forward, backward,
    /// the optimizer and the rest; with `exposed_comm_frac` they add up to 1 when the phases are
    /// disjoint ([`RunRow::breakdown`]).
    pub forward_frac: Option<f64>,
    pub backward_frac: Option<f64>,
    pub optimizer_frac: Option<f64>,
    pub tokens_per_s: Option<f64>,
    pub tokens_per_s_per_gpu: Option<f64>,
    pub samples_per_s: Option<f64>,
    pub samples_per_s_per_gpu: Option<f64>,
    pub flops_per_token: Option<f64>,
    pub tflops_per_s: Option<f64>,
    pub tflops_per_s_per_gpu: Option<f64>,
    pub peak_tflops_per_gpu: Option<f64>,
    pub mfu: Option<f64>,
    pub peak_allocated_bytes: Option<u64>,
    pub peak_reserved_bytes: Option<u64>,
    pub peak_nvml_used_bytes: Option<u64>,
    pub peak_rss_bytes: Option<u64>,
    pub device_memory_bytes: Option<u64>,
    /// Model states of the rank that holds the most, from the setup records (exact: the engine's
    /// own buffers): parameters, gradients, optimizer states on the device, and what offload
    /// keeps on the host.
    pub state_params_bytes: Option<u64>,
    pub state_grads_bytes: Option<u64>,
    pub state_optimizer_bytes: Option<u64>,
    pub host_state_bytes: Option<u64>,
    /// The engine's persistent device buffers beyond the model states on the same rank (gradient
    /// staging, stage 3's gather slots, hpZ's secondary partition), from `setup`.
    pub state_buffer_bytes: Option<u64>,
    /// How the engine kept the parameters: `sharded`, each unit gathered into a slot before its
    /// use (stage 3 on several ranks or with its parameters on the host; `setup`'s gather slots),
    /// or `whole`.
    pub param_path: Option<ParamPath>,
    pub energy_j_per_token: Option<f64>,
    pub avg_power_w_per_gpu: Option<f64>,
    /// NVML GPU utilisation over the measured steps of every rank: mean, and the 10th percentile
    /// (the steps where the GPU idled most).
    pub gpu_util_pct_mean: Option<f64>,
    pub gpu_util_pct_p10: Option<f64>,
    pub final_loss: Option<f64>,
    /// The last evaluation loss, and its perplexity exp(eval_loss).
    pub eval_loss: Option<f64>,
    pub perplexity: Option<f64>,
    /// What the foreign tools themselves reported: the Trainer's result dict (the median over
    /// its processes), DeepSpeed's last `RunningAvgSamplesPerSec` and its FLOPs profiler's
    /// summary (parameters and forward FLOPs per GPU, iteration latency, TFLOP/s per GPU).
    pub hf_train_runtime_s: Option<f64>,
    pub hf_train_samples_per_s: Option<f64>,
    pub hf_train_steps_per_s: Option<f64>,
    pub hf_train_loss: Option<f64>,
    pub ds_running_avg_samples_per_s: Option<f64>,
    pub ds_profile_params: Option<f64>,
    pub ds_profile_fwd_flops: Option<f64>,
    pub ds_profile_iter_ms: Option<f64>,
    pub ds_profile_tflops_per_gpu: Option<f64>,
    pub skipped_steps: u64,
    pub straggler_rank: Option<u32>,
    pub straggler_frac: Option<f64>,
}

/// One bar of the step breakdown: the median step split by the run's phase shares. The parts are
/// disjoint, so they add up to the median step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Breakdown {
    pub forward_ms: f64,
    pub backward_ms: f64,
    /// Zero where the logs' phases contain their waits (version 1, foreign logs).
    pub exposed_comm_ms: f64,
    pub optimizer_ms: f64,
    pub other_ms: f64,
}

impl Breakdown {
    pub fn parts(&self) -> [f64; 5] {
        [self.forward_ms, self.backward_ms, self.exposed_comm_ms, self.optimizer_ms, self.other_ms]
    }
}

/// How the tables name the build of a zerobench run's row: not at all where the zerobench runs of
/// a set are of one build, else by the first 7 digits of its commit (`?` for logs that name
/// none), ` @` before it in a label, so that runs of different builds never share a row or a
/// scaling line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuildNames {
    several: bool,
}

impl BuildNames {
    pub fn of<'a>(rows: impl IntoIterator<Item = &'a RunRow>) -> Self {
        let commits: std::collections::BTreeSet<Option<&str>> =
            rows.into_iter().filter(|r| r.source == Source::Zerobench).map(|r| r.commit.as_deref()).collect();
        Self { several: commits.len() > 1 }
    }

    /// `row`'s build, as the tables name it: empty for foreign runs and where the set has one.
    pub fn name(&self, row: &RunRow) -> String {
        if !self.several || row.source != Source::Zerobench {
            return String::new();
        }
        row.commit.as_deref().map_or_else(|| "?".into(), zerobench_schema::log::short_commit)
    }

    /// What a label gets for `build` (a [`Self::name`]): ` @` and the name, or nothing.
    pub fn suffix(build: &str) -> String {
        if build.is_empty() {
            String::new()
        } else {
            format!(" @{build}")
        }
    }
}

impl RunRow {
    /// An empty row for a run of this identity; the readers fill in what they measured.
    pub fn new(run_id: String, source: Source, dir: String, model: String, status: Status) -> Self {
        RunRow { run_id, source, dir, model, status, ..RunRow::default() }
    }

    /// Model states per rank (the largest rank's), device and host together; saturating at
    /// `u64::MAX`, as the counts are a log's.
    pub fn state_bytes(&self) -> Option<u64> {
        let parts = [
            self.state_params_bytes?,
            self.state_grads_bytes?,
            self.state_optimizer_bytes?,
            self.host_state_bytes.unwrap_or(0),
        ];
        Some(parts.into_iter().fold(0u64, u64::saturating_add))
    }

    /// The median step split into disjoint phases by their shares of the measured time. Medians
    /// of the phases would not add up to the median step (each is another step's), nor would
    /// version 1's phases, whose forward and backward contain the exposed communication: there it
    /// is not drawn apart. Shares that exceed the whole (version 1 timed the optimizer past the
    /// step's end) are scaled to it.
    pub fn breakdown(&self) -> Option<Breakdown> {
        let step = self.step_ms_median?;
        let disjoint = self.log_version.is_some_and(|v| v >= 2);
        let exposed = if disjoint { self.exposed_comm_frac.unwrap_or(0.0) } else { 0.0 };
        let mut shares = [
            self.forward_frac.unwrap_or(0.0),
            self.backward_frac.unwrap_or(0.0),
            exposed,
            self.optimizer_frac.unwrap_or(0.0),
        ];
        let sum: f64 = shares.iter().sum();
        if sum > 1.0 {
            shares.iter_mut().for_each(|s| *s /= sum);
        }
        let other = (1.0 - shares.iter().sum::<f64>()).max(0.0);
        Some(Breakdown {
            forward_ms: shares[0] * step,
            backward_ms: shares[1] * step,
            exposed_comm_ms: shares[2] * step,
            optimizer_ms: shares[3] * step,
            other_ms: other * step,
        })
    }
}

/// One collective kind of one run, over its measured steps.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CollectiveRow {
    pub run_id: String,
    pub model: String,
    pub stage: Option<ZeroStage>,
    pub offload: Offload,
    pub micro_batch: Option<u32>,
    pub gpus: Option<u32>,
    pub nodes: Option<u32>,
    pub kind: String,
    /// Per rank and measured step.
    pub calls_per_step: f64,
    pub bytes_per_step: f64,
    pub ms_per_step: f64,
    /// `ms_per_step` over the mean step time.
    pub step_frac: Option<f64>,
    pub algbw_gbps: Option<f64>,
    pub busbw_factor: Option<f64>,
    pub busbw_gbps: Option<f64>,
}

/// A run as read: its row and its collectives.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunReport {
    pub row: RunRow,
    pub collectives: Vec<CollectiveRow>,
    /// DeepSpeed's `see_memory_usage` reports, in the order printed (foreign runs).
    pub memory_phases: Vec<MemoryPhaseRow>,
}

/// One `see_memory_usage` report of a foreign run: where in the step (DeepSpeed's message) and
/// the device memory then, GiB.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MemoryPhaseRow {
    pub run_id: String,
    /// 0-based position in the run's log.
    pub seq: u32,
    pub phase: String,
    pub allocated_gib: f64,
    pub max_allocated_gib: f64,
    pub reserved_gib: f64,
    pub max_reserved_gib: f64,
}

impl RunRow {
    /// Rounds every figure to the reported precision.
    pub fn round(&mut self) {
        use crate::stats::round_opt as r;
        for x in [
            &mut self.step_ms_median,
            &mut self.step_ms_p10,
            &mut self.step_ms_p90,
            &mut self.step_ms_mean,
            &mut self.forward_ms_median,
            &mut self.backward_ms_median,
            &mut self.optimizer_ms_median,
            &mut self.comm_ms_median,
            &mut self.exposed_comm_ms_median,
            &mut self.comm_frac,
            &mut self.exposed_comm_frac,
            &mut self.forward_frac,
            &mut self.backward_frac,
            &mut self.optimizer_frac,
            &mut self.tokens_per_s,
            &mut self.tokens_per_s_per_gpu,
            &mut self.samples_per_s,
            &mut self.samples_per_s_per_gpu,
            &mut self.flops_per_token,
            &mut self.tflops_per_s,
            &mut self.tflops_per_s_per_gpu,
            &mut self.peak_tflops_per_gpu,
            &mut self.mfu,
            &mut self.energy_j_per_token,
            &mut self.avg_power_w_per_gpu,
            &mut self.gpu_util_pct_mean,
            &mut self.gpu_util_pct_p10,
            &mut self.final_loss,
            &mut self.eval_loss,
            &mut self.perplexity,
            &mut self.hf_train_runtime_s,
            &mut self.hf_train_samples_per_s,
            &mut self.hf_train_steps_per_s,
            &mut self.hf_train_loss,
            &mut self.ds_running_avg_samples_per_s,
            &mut self.ds_profile_params,
            &mut self.ds_profile_fwd_flops,
            &mut self.ds_profile_iter_ms,
            &mut self.ds_profile_tflops_per_gpu,
            &mut self.straggler_frac,
        ] {
            r(x);
        }
    }
}

impl CollectiveRow {
    /// Rounds every figure to the reported precision.
    pub fn round(&mut self) {
        use crate::stats::{round_opt as r, round_sig, SIGNIFICANT};
        // Byte counts stay exact.
        for x in [&mut self.calls_per_step, &mut self.ms_per_step] {
            *x = round_sig(*x, SIGNIFICANT);
        }
        for x in [&mut self.step_frac, &mut self.algbw_gbps, &mut self.busbw_factor, &mut self.busbw_gbps] {
            r(x);
        }
    }
}

impl RunReport {
    /// Rounds every figure to the reported precision.
    pub fn round(mut self) -> Self {
        self.row.round();
        for c in &mut self.collectives {
            c.round();
        }
        self
    }
}

/// One measured step's times in ms, with its communication where the log has it.
#[derive(Debug, Clone, Copy)]
pub struct StepTimes {
    pub step: f64,
    pub forward: f64,
    pub backward: f64,
    pub optimizer: f64,
    pub comm: Option<f64>,
    pub exposed_comm: Option<f64>,
}

/// Fills in the step-time figures of `row` from its measured steps: median, p10, p90 and mean of
/// the step time, the median and the share of every phase, and the share of communication (Σ communication /
/// Σ step time) where every step has its communication time.
pub fn step_figures(row: &mut RunRow, steps: &[StepTimes]) {
    use crate::stats::{fsum, median, quantile_sorted};
    if steps.is_empty() {
        return;
    }
    let mut t: Vec<f64> = steps.iter().map(|s| s.step).collect();
    let total = fsum(t.iter().copied());
    t.sort_by(f64::total_cmp);
    row.step_ms_median = quantile_sorted(&t, 0.5);
    row.step_ms_p10 = quantile_sorted(&t, 0.1);
    row.step_ms_p90 = quantile_sorted(&t, 0.9);
    row.step_ms_mean = Some(total / t.len() as f64);
    let med = |f: fn(&StepTimes) -> f64| median(&steps.iter().map(f).collect::<Vec<_>>());
    row.forward_ms_median = med(|s| s.forward);
    row.backward_ms_median = med(|s| s.backward);
    row.optimizer_ms_median = med(|s| s.optimizer);
    let phase_share = |f: fn(&StepTimes) -> f64| (total > 0.0).then(|| fsum(steps.iter().map(f)) / total);
    row.forward_frac = phase_share(|s| s.forward);
    row.backward_frac = phase_share(|s| s.backward);
    row.optimizer_frac = phase_share(|s| s.optimizer);
    // A median or share over only the steps that have the time would misstate the run.
    let every = |f: fn(&StepTimes) -> Option<f64>| steps.iter().map(f).collect::<Option<Vec<f64>>>();
    let share = |v: &[f64]| (total > 0.0).then(|| fsum(v.iter().copied()) / total);
    if let Some(comm) = every(|s| s.comm) {
        row.comm_ms_median = median(&comm);
        row.comm_frac = share(&comm);
    }
    if let Some(exposed) = every(|s| s.exposed_comm) {
        row.exposed_comm_ms_median = median(&exposed);
        row.exposed_comm_frac = share(&exposed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source reads the same in a table's text as in its serialised rows.
    #[test]
    fn a_source_is_named_as_serde_names_it() {
        for s in [Source::Zerobench, Source::Foreign] {
            assert_eq!(serde_json::to_value(s).unwrap(), s.to_string());
        }
    }

    /// Shares are sums over the measured steps divided by their total; steps that took no time
    /// have no shares (not NaN), whether or not the log has their communication.
    #[test]
    fn shares_need_time() {
        let steps = |step: [f64; 2], comm: [f64; 2]| -> Vec<StepTimes> {
            (0..2)
                .map(|i| StepTimes {
                    step: step[i],
                    forward: step[i] / 2.0,
                    backward: step[i] / 4.0,
                    optimizer: 0.0,
                    comm: Some(comm[i]),
                    exposed_comm: Some(comm[i] / 2.0),
                })
                .collect()
        };
        let row = |s: &[StepTimes]| {
            let mut r = RunRow::new("r".into(), Source::Zerobench, "d".into(), "gpt2".into(), Status::Ok);
            step_figures(&mut r, s);
            r
        };
        let r = row(&steps([10.0, 30.0], [2.0, 6.0]));
        assert_eq!((r.forward_frac, r.comm_frac, r.exposed_comm_frac), (Some(0.5), Some(0.2), Some(0.1)));
        let r = row(&steps([0.0, 0.0], [0.0, 0.0]));
        assert_eq!((r.forward_frac, r.comm_frac, r.exposed_comm_frac), (None, None, None));
        assert_eq!(r.step_ms_median, Some(0.0));
    }

    /// A bar is the median step split by the phases' shares; shares that add up to more than the
    /// whole (version 1 timed the optimizer past the step's end) are scaled to it.
    #[test]
    fn breakdowns_add_up_to_the_step() {
        let mut r = RunRow::new("r".into(), Source::Zerobench, "d".into(), "gpt2".into(), Status::Ok);
        (r.step_ms_median, r.log_version) = (Some(10.0), Some(2));
        (r.forward_frac, r.backward_frac, r.exposed_comm_frac, r.optimizer_frac) =
            (Some(0.3), Some(0.5), Some(0.1), None);
        assert_eq!(r.breakdown().unwrap().parts().map(|x| (x * 1e9).round() / 1e9), [3.0, 5.0, 1.0, 0.0, 1.0]);
        (r.forward_frac, r.backward_frac, r.optimizer_frac) = (Some(0.6), Some(0.6), Some(0.2));
        let b = r.breakdown().unwrap();
        assert_eq!(
            b.parts().map(|x| (x * 1e9).round() / 1e9),
            [4.0, 4.0, 2.0 / 3.0, 4.0 / 3.0, 0.0].map(|x: f64| (x * 1e9).round() / 1e9)
        );
    }

    /// A rank's model states: the device's three parts and what the host keeps.
    #[test]
    fn state_bytes_add_the_host() {
        let mut r = RunRow::new("r".into(), Source::Zerobench, "d".into(), "gpt2".into(), Status::Ok);
        (r.state_params_bytes, r.state_grads_bytes, r.state_optimizer_bytes) = (Some(1), Some(2), Some(4));
        assert_eq!(r.state_bytes(), Some(7));
        r.host_state_bytes = Some(8);
        assert_eq!(r.state_bytes(), Some(15));
        r.state_grads_bytes = None;
        assert_eq!(r.state_bytes(), None);
    }

    /// Byte counts a hostile log makes as large as they go: the sum stops at `u64::MAX`, not
    /// wrapped round to a small number.
    #[test]
    fn state_bytes_saturate() {
        let mut r = RunRow::new("r".into(), Source::Zerobench, "d".into(), "gpt2".into(), Status::Ok);
        (r.state_params_bytes, r.state_grads_bytes, r.state_optimizer_bytes) = (Some(u64::MAX), Some(2), Some(2));
        assert_eq!(r.state_bytes(), Some(u64::MAX));
        (r.state_params_bytes, r.state_grads_bytes, r.state_optimizer_bytes) = (Some(1), Some(2), Some(4));
        r.host_state_bytes = Some(u64::MAX - 6);
        assert_eq!(r.state_bytes(), Some(u64::MAX));
        r.host_state_bytes = Some(u64::MAX - 8);
        assert_eq!(r.state_bytes(), Some(u64::MAX - 1));
    }
}
