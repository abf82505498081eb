//! Foreign logs, so that DeepSpeed runs stand beside zerobench runs in the same tables.
//!
//! Every text file (`.log`, `.txt`, `.out`, `.err`, `.csv`) in a folder without worker logs is
//! scanned line by line; the lines of [`deepspeed`], [`hf_trainer`] and [`nvidia_smi`] formats
//! are recognised and the rest ignored. All recognised files of one folder make one run, whose
//! configuration comes from [`identity`]. A folder in which nothing is recognised is not a run.
//!
//! From the lines to the row (docs/ingest.md has the details):
//! * step time: DeepSpeed's wall-clock breakdown lines, forward + backward + optimizer per line,
//!   after dropping the first `warmup` lines when more than that many are there; else the FLOPs profiler's iter latency; else 1 / the
//!   Trainer's steps per second;
//! * samples/s: DeepSpeed's last `RunningAvgSamplesPerSec`, else the median of the Trainer's
//!   `train_samples_per_second`, else the profiler's samples/second; tokens/s = samples/s ×
//!   sequence length when that is known;
//! * TFLOP/s: the model preset's formula when the model and sequence length are known (T5 at the
//!   target length `run.json` gives, else a quarter of the input, as the worker counts), else the
//!   profiler's `FLOPS per GPU`;
//! * memory: DeepSpeed's peaks (allocated, reserved), nvidia-smi's peak `memory.used`;
//! * energy per token: the sum over GPUs of nvidia-smi's mean `power.draw` over tokens/s;
//! * status: `oom` on a CUDA out-of-memory line, `failed` on a Python error without a Trainer
//!   result, else `ok`.

pub mod deepspeed;
pub mod hf_trainer;
pub mod identity;
pub mod nvidia_smi;

use std::fs::File;
use std::ops::ControlFlow;
use std::path::Path;

use rayon::prelude::*;

use crate::aggregate::Settings;
use crate::discover::ForeignDir;
use crate::lines::{for_each_line, Line, BLOCK, MAX_LINE};
use crate::problem::{Problem, ProblemKind};
use crate::read::ReadStats;
use crate::run::{RunReport, RunRow, Source, Status};
use crate::side::run_json;
use crate::stats::{fsum, median, step_figures, StepTimes};

use deepspeed::DeepSpeed;
use hf_trainer::HfTrainer;
use identity::Hints;
use nvidia_smi::NvidiaSmi;

/// Everything recognised in one folder.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ForeignLogs {
    pub deepspeed: DeepSpeed,
    pub hf: HfTrainer,
    pub smi: NvidiaSmi,
}

impl ForeignLogs {
    /// Feeds one line to every recognizer (a line is one format's at most).
    pub fn line(&mut self, line: &str) {
        let _ = self.deepspeed.line(line) || self.hf.line(line) || self.smi.line(line);
    }

    fn formats(&self) -> String {
        let mut f = Vec::new();
        if self.deepspeed.lines > 0 {
            f.push("deepspeed");
        }
        if self.hf.lines > 0 {
            f.push("hf-trainer");
        }
        if self.smi.lines > 0 {
            f.push("nvidia-smi");
        }
        f.join("+")
    }

    fn recognised(&self) -> bool {
        self.deepspeed.lines + self.hf.lines + self.smi.lines > 0
    }
}

/// Reads every foreign folder; returns its runs, problems and the number of files read.
pub fn read_dirs(dirs: &[ForeignDir], settings: &Settings) -> (Vec<RunReport>, Vec<Problem>, ReadStats) {
    let results: Vec<(Option<RunReport>, Vec<Problem>, ReadStats)> =
        dirs.par_iter().map(|d| read_dir(d, settings)).collect();
    let mut runs = Vec::new();
    let mut problems = Vec::new();
    let mut stats = ReadStats::default();
    for (r, p, s) in results {
        runs.extend(r);
        problems.extend(p);
        stats.add(&s);
    }
    (runs, problems, stats)
}

fn read_dir(dir: &ForeignDir, settings: &Settings) -> (Option<RunReport>, Vec<Problem>, ReadStats) {
    let mut problems = Vec::new();
    let mut logs = ForeignLogs::default();
    let mut stats = ReadStats::default();
    for path in &dir.files {
        match scan(path, &mut logs) {
            Ok((lines, bytes)) => stats.add(&ReadStats { files: 1, bytes, lines, bad_lines: 0 }),
            Err(e) => problems.push(Problem::file(path, ProblemKind::Io { message: e.to_string() })),
        }
    }
    logs.deepspeed.finish();
    if !logs.recognised() {
        tracing::debug!(dir = %dir.dir.display(), "no recognised log lines; not a run");
        return (None, problems, stats);
    }
    let json = run_json(&dir.dir, &mut problems).map(|v| identity::from_run_json(&v)).unwrap_or_default();
    let from_logs = Hints {
        world_size: logs.deepspeed.profile.as_ref().and_then(|p| p.world_size),
        micro_batch: logs.deepspeed.profile.as_ref().and_then(|p| p.batch_per_gpu),
        ..Hints::default()
    };
    let hints = json.or(from_logs).or(identity::from_path(&dir.root, &dir.dir));
    (Some(to_report(&dir.dir, &hints, &logs, settings)), problems, stats)
}

/// Scans one file into `logs`; returns its lines and bytes. Over-long lines (progress bars
/// redrawn with `\r`) are skipped.
pub fn scan(path: &Path, logs: &mut ForeignLogs) -> std::io::Result<(u64, u64)> {
    let file = File::open(path)?;
    let bytes = file.metadata()?.len();
    let lines = for_each_line(file, 0, u64::MAX, MAX_LINE, BLOCK, |_, line| {
        if let Line::Full(b) | Line::Unterminated(b) = line {
            logs.line(&String::from_utf8_lossy(b));
        }
        ControlFlow::Continue(())
    })?;
    Ok((lines, bytes))
}

const GIB: f64 = (1u64 << 30) as f64;
const MIB: f64 = (1u64 << 20) as f64;

/// The row of a foreign run.
pub fn to_report(dir: &Path, hints: &Hints, logs: &ForeignLogs, settings: &Settings) -> RunReport {
    let ds = &logs.deepspeed;
    let hf = &logs.hf;
    let status = if ds.oom.is_some() {
        Status::Oom
    } else if ds.error.is_some() && hf.results.is_empty() {
        Status::Failed
    } else {
        Status::Ok
    };
    let run_id = hints.run_id.clone().unwrap_or_else(|| {
        dir.file_name().map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into_owned())
    });
    let mut row = RunRow::new(
        run_id,
        Source::Foreign,
        dir.display().to_string(),
        hints.model.clone().unwrap_or_else(|| "unknown".into()),
        status,
    );
    row.formats = logs.formats();
    row.status_detail = ds.oom.clone().or_else(|| ds.error.clone()).filter(|_| status != Status::Ok);
    row.stage = hints.stage;
    row.offload = hints.offload.unwrap_or_default();
    row.precision = hints.precision;
    row.micro_batch = hints.micro_batch;
    row.grad_accum = hints.grad_accum;
    row.seq_len = hints.seq_len;
    row.gpus = hints.world_size;
    row.nodes = hints.nodes;
    row.ranks_read = hf.results.len() as u32;
    steps(&mut row, logs, settings.warmup.unwrap_or(FOREIGN_WARMUP));
    let world = row.gpus.map(f64::from);

    let samples = ds
        .running_avg_samples_per_s
        .or_else(|| median(&hf.results.iter().filter_map(|r| r.samples_per_s).collect::<Vec<_>>()))
        .or_else(|| ds.profile.as_ref().and_then(|p| p.samples_per_s));
    row.samples_per_s = samples;
    row.samples_per_s_per_gpu = samples.zip(world).map(|(s, w)| s / w);
    row.tokens_per_s = samples.zip(row.seq_len).map(|(s, t)| s * f64::from(t));
    row.tokens_per_s_per_gpu = row.tokens_per_s.zip(world).map(|(s, w)| s / w);
    let preset = hints.model.as_deref().and_then(zerobench_schema::ModelPreset::from_name);
    if let (Some(p), Some(t), Some(tps)) = (preset, row.seq_len, row.tokens_per_s) {
        let fpt = p.spec().train_flops_per_token(t, hints.target_len);
        row.flops_per_token = Some(fpt);
        row.tflops_per_s = Some(tps * fpt / 1e12);
        row.tflops_per_s_per_gpu = row.tflops_per_s.zip(world).map(|(f, w)| f / w);
    } else if let Some(per_gpu) = ds.profile.as_ref().and_then(|p| p.tflops_per_gpu) {
        row.tflops_per_s_per_gpu = Some(per_gpu);
        row.tflops_per_s = world.map(|w| per_gpu * w);
    }
    let smi = &logs.smi;
    row.gpu = smi.gpus.values().find_map(|g| g.name.clone());
    row.peak_tflops_per_gpu = settings.peaks.lookup(row.gpu.as_deref(), row.precision);
    row.mfu = row.tflops_per_s_per_gpu.zip(row.peak_tflops_per_gpu).map(|(a, p)| a / p);
    row.peak_allocated_bytes = ds.allocated_gib.map(|g| (g * GIB) as u64);
    row.peak_reserved_bytes = ds.reserved_gib.map(|g| (g * GIB) as u64);
    row.peak_nvml_used_bytes =
        smi.gpus.values().filter_map(|g| g.max_used_mib).reduce(f64::max).map(|m| (m * MIB) as u64);
    row.device_memory_bytes = smi.gpus.values().filter_map(|g| g.total_mib).reduce(f64::max).map(|m| (m * MIB) as u64);
    let powers: Vec<f64> = smi.gpus.values().filter_map(|g| g.mean_power_w()).collect();
    if !powers.is_empty() {
        let total = fsum(powers.iter().copied());
        row.avg_power_w_per_gpu = Some(total / powers.len() as f64);
        row.energy_j_per_token = row.tokens_per_s.filter(|t| *t > 0.0).map(|t| total / t);
    }
    row.final_loss = hf.results.iter().find_map(|r| r.loss);
    RunReport { row, collectives: Vec::new() }
}

/// Leading steps of a foreign log left out when `--warmup` is not given: the seed studies drop the
/// first two iterations.
const FOREIGN_WARMUP: u32 = 2;

fn steps(row: &mut RunRow, logs: &ForeignLogs, warmup: u32) {
    let ds = &logs.deepspeed;
    // DeepSpeed prints the breakdown every `steps_per_print` steps, so a log may hold only a few
    // lines, all past warmup: the first `warmup` lines are dropped only if some are left.
    let drop = if ds.steps.len() > warmup as usize { warmup as usize } else { 0 };
    let measured: Vec<&deepspeed::Breakdown> = ds.steps.iter().skip(drop).collect();
    if !measured.is_empty() {
        row.warmup_steps = drop as u32;
        row.steps_measured = measured.len() as u32;
        let times: Vec<StepTimes> = measured
            .iter()
            .map(|b| StepTimes {
                step: b.forward + b.backward + b.optimizer,
                forward: b.forward,
                backward: b.backward,
                optimizer: b.optimizer,
                comm: b.allreduce,
                exposed_comm: None,
            })
            .collect();
        step_figures(row, &times);
        return;
    }
    if let Some(p) = &ds.profile {
        if let Some(iter) = p.iter_ms {
            row.steps_measured = 1;
            row.step_ms_median = Some(iter);
            row.step_ms_mean = Some(iter);
            row.forward_ms_median = p.fwd_ms;
            row.backward_ms_median = p.bwd_ms;
            row.optimizer_ms_median = p.step_ms;
            return;
        }
    }
    if let Some(sps) = median(&logs.hf.results.iter().filter_map(|r| r.steps_per_s).collect::<Vec<_>>()) {
        if sps > 0.0 {
            row.step_ms_median = Some(1e3 / sps);
            row.step_ms_mean = row.step_ms_median;
        }
    }
}
