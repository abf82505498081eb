//! What ingest reports per run: one flat row (the `runs` table) and its collectives (the `comm`
//! table). Units are in the field names: `_ms`, `_bytes`, `_per_s`, `_frac` (0..1), `_gbps`
//! (1e9 bytes per second), `_j`, `_w`.

use std::fmt;

use serde::Serialize;
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
    pub offload: Offload,
    pub precision: Option<Precision>,
    pub micro_batch: Option<u32>,
    pub grad_accum: Option<u32>,
    pub seq_len: Option<u32>,
    pub gpus: Option<u32>,
    pub nodes: Option<u32>,
    pub gpu: Option<String>,
    pub status: Status,
    pub status_detail: Option<String>,
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
    pub energy_j_per_token: Option<f64>,
    pub avg_power_w_per_gpu: Option<f64>,
    pub final_loss: Option<f64>,
    pub skipped_steps: u64,
    pub straggler_rank: Option<u32>,
    pub straggler_frac: Option<f64>,
}

impl RunRow {
    /// An empty row for a run of this identity; the readers fill in what they measured.
    pub fn new(run_id: String, source: Source, dir: String, model: String, status: Status) -> Self {
        RunRow { run_id, source, dir, model, status, ..RunRow::default() }
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
            &mut self.final_loss,
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
