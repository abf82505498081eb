//! Foreign logs, so that DeepSpeed runs stand beside zerobench runs in the same tables.
//!
//! Every text file (`.log`, `.txt`, `.out`, `.err`, `.csv`) in a folder without worker logs is
//! scanned line by line; the lines of [`deepspeed`], [`hf_trainer`] and [`nvidia_smi`] formats
//! are recognised and the rest ignored. A folder in which nothing is recognised is not a run.
//!
//! Which files make one run (`group`): one run per log file unless proven otherwise, because
//! people keep one log per configuration in one folder (`ds_z2.log`, `ds_z3.log`).
//! * A `run.json` in the folder says the folder is one run: every file is joined.
//! * Files of one name but the extension (`X.out`, `X.err`: Slurm's streams of one job) are one
//!   run's output and are joined first, before any identity is read (`join_stems`).
//! * Otherwise each DeepSpeed or Trainer log's identity is read from its content (DeepSpeed's
//!   printed configuration) and its file name ([`identity`]'s grammar). Files of equal identity
//!   are joined (per-rank logs of one run); files of different identities never are.
//! * Files whose content and name say nothing are joined with each other when no file of the
//!   folder has an identity (the folder is the run, named by the folder); otherwise each is a run
//!   of its own, joined only with files whose names differ from its own in digits alone
//!   (`rank0.log`, `rank1.log`).
//! * An nvidia-smi log belongs to the folder's only run; shared by several runs, its samples are
//!   split by the runs' time spans (DeepSpeed's time stamps), and where a run's span is unknown
//!   or spans overlap it is reported as ambiguous and attributed to none.
//!
//! From the lines to the row (docs/ingest.md has the details):
//! * step time: DeepSpeed's wall-clock breakdown, forward + backward + optimizer per optimizer
//!   step (the global timers' lines, else the micro-step lines summed per `grad_accum`:
//!   [`DeepSpeed::optimizer_steps`]), after dropping the first `warmup` steps when more than that
//!   many are there; else the FLOPs profiler's iter latency; else 1 / the Trainer's steps per
//!   second;
//! * samples/s: DeepSpeed's last `RunningAvgSamplesPerSec`, else the median of the Trainer's
//!   `train_samples_per_second`, else the profiler's samples/second; tokens/s = samples/s ×
//!   sequence length when that is known;
//! * TFLOP/s: the model preset's formula when the model and sequence length are known (T5 at the
//!   target length `run.json` gives, else a quarter of the input, as the worker counts), else the
//!   profiler's `FLOPS per GPU`;
//! * memory: DeepSpeed's peaks (allocated, reserved), nvidia-smi's peak `memory.used`;
//! * energy per token: the sum over GPUs of nvidia-smi's mean `power.draw` over tokens/s;
//! * status: `oom` on a CUDA out-of-memory line; else Slurm's verdict in the job's output where it
//!   wrote one (`oom` for an OOM kill, `timeout`, `cancelled`, `failed` for a node failure); else
//!   `failed` on a Python error without a Trainer result, else `ok`.

pub mod deepspeed;
pub mod hf_trainer;
pub mod identity;
pub mod nvidia_smi;
pub mod text;

use std::fs::File;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use zerobench_schema::job::JobState;

use crate::aggregate::Settings;
use crate::discover::ForeignDir;
use crate::lines::{for_each_line, Line, BLOCK, MAX_LINE};
use crate::problem::{Problem, ProblemKind};
use crate::read::ReadStats;
use crate::run::{step_figures, StepTimes};
use crate::run::{MemoryPhaseRow, RunReport, RunRow, Source, Status};
use crate::side::run_json;
use crate::stats::{fsum, median};

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
    /// How Slurm ended the job whose output this is, as slurmstepd (or the kernel's OOM killer)
    /// wrote it into the output: a run that trained well until killed at its time limit did not
    /// end well.
    pub job_end: Option<JobState>,
}

impl ForeignLogs {
    /// Feeds one line to every recognizer (a line is one format's at most), and to the reader of
    /// Slurm's verdict.
    pub fn line(&mut self, line: &str) {
        let _ = self.deepspeed.line(line) || self.hf.line(line) || self.smi.line(line);
        if line.contains("***") || line.contains("OUT_OF_MEMORY") || line.contains("oom_kill") {
            self.job_end = JobState::then_output_line(self.job_end, line);
        }
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

    /// Adds another file's lines of the same run.
    pub fn merge(&mut self, o: &ForeignLogs) {
        self.deepspeed.merge(&o.deepspeed);
        self.hf.merge(&o.hf);
        self.smi.merge(&o.smi);
        // Files of one run read in any order: the worse verdict.
        let badness = |s: Option<JobState>| match s {
            Some(JobState::OutOfMemory) => 4,
            Some(JobState::Timeout) => 3,
            Some(JobState::Failed) => 2,
            Some(JobState::Cancelled) => 1,
            _ => 0,
        };
        if badness(o.job_end) > badness(self.job_end) {
            self.job_end = o.job_end;
        }
    }
}

/// Reads every foreign folder; returns its runs, problems and the number of files read.
pub fn read_dirs(dirs: &[ForeignDir], settings: &Settings) -> (Vec<RunReport>, Vec<Problem>, ReadStats) {
    let results: Vec<(Vec<RunReport>, Vec<Problem>, ReadStats)> =
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

fn read_dir(dir: &ForeignDir, settings: &Settings) -> (Vec<RunReport>, Vec<Problem>, ReadStats) {
    let mut problems = Vec::new();
    let mut stats = ReadStats::default();
    let mut files: Vec<(PathBuf, ForeignLogs)> = Vec::new();
    for path in &dir.files {
        let mut logs = ForeignLogs::default();
        match scan(path, &mut logs, &mut problems) {
            Ok((lines, bytes)) => stats.add(&ReadStats { files: 1, bytes, lines, bad_lines: 0 }),
            Err(e) => problems.push(Problem::file(path, ProblemKind::Io { message: e.to_string() })),
        }
        logs.deepspeed.finish();
        if logs.recognised() {
            files.push((path.clone(), logs));
        }
    }
    if files.is_empty() {
        tracing::debug!(dir = %dir.dir.display(), "no recognised log lines; not a run");
        return (Vec::new(), problems, stats);
    }
    let json = run_json(&dir.dir, &mut problems).map(|(path, v)| {
        for key in identity::zero_counts(&v) {
            let message = format!("`{key}` is 0, which counts nothing: taken as unknown");
            problems.push(Problem::file(&path, ProblemKind::SideFile { message }));
        }
        identity::from_run_json(&v)
    });
    let folder = identity::from_path(&dir.root, &dir.dir);
    let groups = group(&dir.dir, files, json.is_some(), &mut problems);
    let single = groups.len() == 1;
    let runs = groups
        .into_iter()
        .map(|g| {
            let from_logs = Hints {
                world_size: g.logs.deepspeed.profile.as_ref().and_then(|p| p.world_size),
                micro_batch: g.logs.deepspeed.profile.as_ref().and_then(|p| p.batch_per_gpu),
                ..Hints::default()
            };
            let mut hints = json.clone().unwrap_or_default().or(g.own).or(from_logs).or(folder.clone());
            if !single {
                // Runs of one folder are told apart by their files' names.
                let base = dir.dir.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
                hints.run_id = Some(format!("{base}/{}", g.name));
            }
            to_report(&dir.dir, &hints, &g.logs, settings)
        })
        .collect();
    (runs, problems, stats)
}

/// The files of one foreign run.
struct Group {
    /// The file name (without extension) the run is known by within its folder.
    name: String,
    /// What the files' content and names say.
    own: Hints,
    logs: ForeignLogs,
}

/// Splits a folder's recognised files into runs (the rules are in the module doc).
fn group(dir: &Path, files: Vec<(PathBuf, ForeignLogs)>, one_run: bool, problems: &mut Vec<Problem>) -> Vec<Group> {
    let stem = |p: &Path| p.file_stem().map_or_else(String::new, |s| s.to_string_lossy().into_owned());
    let (run_logs, smi_logs): (Vec<_>, Vec<_>) =
        join_stems(files, &stem).into_iter().partition(|(_, l)| l.deepspeed.lines + l.hf.lines > 0);
    let mut groups: Vec<Group> = Vec::new();
    let join =
        |groups: &mut Vec<Group>, key: &dyn Fn(&Group) -> bool, name: String, own: Hints, l: &ForeignLogs| match groups
            .iter_mut()
            .find(|g| key(g))
        {
            Some(g) => g.logs.merge(l),
            None => groups.push(Group { name, own, logs: l.clone() }),
        };
    if one_run || run_logs.is_empty() {
        let mut all = ForeignLogs::default();
        for (_, l) in run_logs.iter().chain(&smi_logs) {
            all.merge(l);
        }
        let name = dir.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        // What the joined logs print (stage, offload, precision, ...) is the run's identity below
        // `run.json`: a run.json of a few keys (`{"seq_len": 1024}`) leaves the rest to the logs.
        let own = identity::from_deepspeed(&all.deepspeed.config);
        return vec![Group { name, own, logs: all }];
    }
    let own = |p: &Path, l: &ForeignLogs| identity::from_deepspeed(&l.deepspeed.config).or(identity::from_file_name(p));
    let named = run_logs.iter().any(|(p, l)| own(p, l) != Hints::default());
    for (path, logs) in &run_logs {
        let hints = own(path, logs);
        let name = stem(path);
        // Files that cannot be one run's are never joined, whatever else they share.
        let can_join = |g: &Group| !apart((&g.name, &g.logs), (&name, logs));
        if hints != Hints::default() {
            let h = hints.clone();
            join(&mut groups, &|g: &Group| g.own == h && can_join(g), name.clone(), hints, logs);
        } else if !named {
            join(&mut groups, &can_join, name.clone(), hints, logs);
        } else {
            let key = |g: &Group| g.own == Hints::default() && skeleton(&g.name) == skeleton(&name) && can_join(g);
            join(&mut groups, &key, name.clone(), hints, logs);
        }
    }
    if groups.len() == 1 {
        // The folder holds one run: it is known by the folder's name, as before files were told
        // apart.
        groups[0].name = dir.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    }
    for (path, smi) in &smi_logs {
        attribute_smi(path, &smi.smi, &mut groups, problems);
    }
    groups
}

/// A file name without its digits: names that differ in digits alone (`rank0`, `rank1`) are one
/// run's files as far as names tell.
fn skeleton(name: &str) -> String {
    name.chars().filter(|c| !c.is_ascii_digit()).collect()
}

/// Whether two files (or a file and the files joined so far), each by its name and what it holds,
/// cannot be one run's: both print time stamps and their spans do not meet (a run's ranks log at
/// once; a sweep's logs one after another), or both hold a Trainer result and their names differ
/// in more than digits (the Trainer prints its result once, from the main process of a node:
/// `node0.log` and `node1.log` may each hold one, `bert-base.log` and `bert-large.log` are two
/// runs).
fn apart(a: (&str, &ForeignLogs), b: (&str, &ForeignLogs)) -> bool {
    let span = |l: &ForeignLogs| l.deepspeed.first_ts.zip(l.deepspeed.last_ts);
    let disjoint = matches!((span(a.1), span(b.1)), (Some((a0, a1)), Some((b0, b1))) if a1 < b0 || b1 < a0);
    let two_results = !a.1.hf.results.is_empty() && !b.1.hf.results.is_empty() && skeleton(a.0) != skeleton(b.0);
    disjoint || two_results
}

/// Joins the files of one name but the extension (`X.out` and `X.err`: Slurm's `--output` and
/// `--error` of one job; `X.log`): they are one run's output, split by stream, so they are one
/// file to [`group`] before it reads an identity from any of them. The `.out` of a DeepSpeed run
/// holds its printed configuration and the `.err` its traceback: taken apart, the one would be a
/// run that went well and the other a run of no configuration that ran out of memory. Kept in the
/// order of the files, each under the first one's path (the names agree but for the extension).
fn join_stems(files: Vec<(PathBuf, ForeignLogs)>, stem: &dyn Fn(&Path) -> String) -> Vec<(PathBuf, ForeignLogs)> {
    let mut joined: Vec<(PathBuf, ForeignLogs)> = Vec::new();
    // Stem → its place in `joined`: a folder may hold thousands of logs.
    let mut at: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for (path, logs) in files {
        match at.entry(stem(&path)) {
            std::collections::hash_map::Entry::Occupied(i) => joined[*i.get()].1.merge(&logs),
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(joined.len());
                joined.push((path, logs));
            }
        }
    }
    joined
}

/// Gives an nvidia-smi log's samples to the runs they were taken during: all of them to a
/// folder's only run; else each run those taken within its time span, when the spans of the runs
/// that have one are disjoint. Runs without a span get none, and that is reported.
fn attribute_smi(path: &Path, smi: &NvidiaSmi, groups: &mut [Group], problems: &mut Vec<Problem>) {
    if let [only] = groups {
        only.logs.smi.merge(smi);
        return;
    }
    let spans: Vec<Option<(f64, f64)>> =
        groups.iter().map(|g| g.logs.deepspeed.first_ts.zip(g.logs.deepspeed.last_ts)).collect();
    let mut known: Vec<(f64, f64)> = spans.iter().flatten().copied().collect();
    known.sort_by(|a, b| a.0.total_cmp(&b.0));
    let disjoint = !known.is_empty() && known.windows(2).all(|w| w[0].1 < w[1].0);
    // Per run: its samples, or `None` without a span; nothing at all when the log's samples lack
    // time stamps.
    let parts: Option<Vec<Option<NvidiaSmi>>> = disjoint
        .then(|| {
            spans
                .iter()
                .map(|span| match span {
                    Some((from, to)) => smi.within(*from, *to).map(|p| Some(p).filter(|p| !p.gpus.is_empty())),
                    None => Some(None),
                })
                .collect()
        })
        .flatten();
    let ambiguous = |message: String| Problem::file(path, ProblemKind::Ambiguous { message });
    let Some(parts) = parts else {
        problems.push(ambiguous(format!(
            "nvidia-smi log shared by {} runs whose time spans are unknown or overlap; attributed to none",
            groups.len()
        )));
        return;
    };
    let mut unplaced = Vec::new();
    for ((g, part), span) in groups.iter_mut().zip(parts).zip(&spans) {
        match (part, span) {
            (Some(p), _) => g.logs.smi.merge(&p),
            (None, None) => unplaced.push(g.name.clone()),
            (None, Some(_)) => {}
        }
    }
    if !unplaced.is_empty() {
        problems.push(ambiguous(format!(
            "nvidia-smi samples not attributed to {}: no time stamps say when it ran",
            unplaced.join(", ")
        )));
    }
}

/// Scans one file into `logs`; returns its lines and bytes. A carriage return ends a line as a
/// newline does (progress bars redraw their line with `\r`); a line over the limit is skipped
/// and reported in `problems`.
pub fn scan(path: &Path, logs: &mut ForeignLogs, problems: &mut Vec<Problem>) -> std::io::Result<(u64, u64)> {
    let file = File::open(path)?;
    let bytes = file.metadata()?.len();
    // nvidia-smi's GPU indices are unique within one file (one node) only.
    logs.smi.file = path.to_path_buf();
    let lines = for_each_line(CrEndsLines::new(file), 0, u64::MAX, MAX_LINE, BLOCK, |n, line| {
        match line {
            Line::Full(b) | Line::Unterminated(b) => logs.line(&String::from_utf8_lossy(b)),
            Line::TooLong(len) => problems.push(Problem::at_line(
                path,
                n,
                ProblemKind::LineTooLong { bytes: len, limit: MAX_LINE as u64 },
            )),
        }
        ControlFlow::Continue(())
    })?;
    Ok((lines, bytes))
}

/// A file read with every carriage return that ends no `\r\n` as a newline. Progress bars
/// (tqdm's, a Trainer's) redraw their line with `\r` and no `\n`, so a job's output can hold
/// megabytes between two newlines with the Trainer's result at their end: split on `\n` alone,
/// all of it is one line over the limit, and the run is lost. A `\r\n` stays one line end, so
/// the lines of a file written on Windows are counted, and numbered in problems, as written.
struct CrEndsLines<R> {
    inner: R,
    /// The last read ended with a `\r` made a newline: a `\n` first in the next read is its pair.
    ended_with_cr: bool,
}

impl<R> CrEndsLines<R> {
    fn new(inner: R) -> Self {
        CrEndsLines { inner, ended_with_cr: false }
    }
}

impl<R: std::io::Read> std::io::Read for CrEndsLines<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let mut n = self.inner.read(buf)?;
            if n > 0 && std::mem::take(&mut self.ended_with_cr) && buf[0] == b'\n' {
                buf.copy_within(1..n, 0);
                n -= 1;
                if n == 0 {
                    continue;
                }
            }
            let read = &mut buf[..n];
            let mut at = 0;
            while let Some(i) = memchr::memchr(b'\r', &read[at..]) {
                let cr = at + i;
                match read.get(cr + 1) {
                    Some(b'\n') => {}
                    Some(_) => read[cr] = b'\n',
                    None => {
                        read[cr] = b'\n';
                        self.ended_with_cr = true;
                    }
                }
                at = cr + 1;
            }
            return Ok(n);
        }
    }
}

impl<R: std::io::Seek> std::io::Seek for CrEndsLines<R> {
    fn seek(&mut self, pos: std::io::SeekFrom) -> std::io::Result<u64> {
        self.ended_with_cr = false;
        self.inner.seek(pos)
    }
}

const GIB: f64 = (1u64 << 30) as f64;
const MIB: f64 = (1u64 << 20) as f64;

/// The row of a foreign run.
pub fn to_report(dir: &Path, hints: &Hints, logs: &ForeignLogs, settings: &Settings) -> RunReport {
    let ds = &logs.deepspeed;
    let hf = &logs.hf;
    let status = match logs.job_end {
        _ if ds.oom.is_some() => Status::Oom,
        Some(JobState::OutOfMemory) => Status::Oom,
        Some(JobState::Timeout) => Status::Timeout,
        Some(JobState::Cancelled) => Status::Cancelled,
        Some(JobState::Failed) => Status::Failed,
        _ if ds.error.is_some() && hf.results.is_empty() => Status::Failed,
        _ => Status::Ok,
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
    let verdict = logs.job_end.and_then(|j| match j {
        JobState::OutOfMemory => Some("the job was killed for its memory (oom_kill)".to_string()),
        JobState::Timeout => Some("Slurm ended the job at its time limit".to_string()),
        JobState::Cancelled => Some("Slurm cancelled the job".to_string()),
        JobState::Failed => Some("Slurm ended the job: node failure".to_string()),
        _ => None,
    });
    row.status_detail = ds.oom.clone().or(verdict).or_else(|| ds.error.clone()).filter(|_| status != Status::Ok);
    row.stage = hints.stage;
    row.offload = hints.offload;
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
    row.eval_loss = hf.eval_loss;
    row.perplexity = hf.eval_loss.map(f64::exp);
    let hf_median =
        |f: fn(&hf_trainer::TrainResult) -> Option<f64>| median(&hf.results.iter().filter_map(f).collect::<Vec<_>>());
    row.hf_train_runtime_s = hf_median(|r| r.runtime_s);
    row.hf_train_samples_per_s = hf_median(|r| r.samples_per_s);
    row.hf_train_steps_per_s = hf_median(|r| r.steps_per_s);
    row.hf_train_loss = hf_median(|r| r.loss);
    row.ds_running_avg_samples_per_s = ds.running_avg_samples_per_s;
    if let Some(p) = &ds.profile {
        row.ds_profile_params = p.params_per_gpu;
        row.ds_profile_fwd_flops = p.fwd_flops_per_gpu;
        row.ds_profile_iter_ms = p.iter_ms;
        row.ds_profile_tflops_per_gpu = p.tflops_per_gpu;
    }
    let memory_phases = ds
        .memory_phases
        .iter()
        .enumerate()
        .map(|(i, m)| MemoryPhaseRow {
            run_id: row.run_id.clone(),
            seq: i as u32,
            phase: m.label.clone(),
            allocated_gib: m.ma,
            max_allocated_gib: m.max_ma,
            reserved_gib: m.ca,
            max_reserved_gib: m.max_ca,
        })
        .collect();
    RunReport { row, collectives: Vec::new(), memory_phases }
}

/// Leading steps of a foreign log left out when `--warmup` is not given: the profiling studies drop the
/// first two iterations.
const FOREIGN_WARMUP: u32 = 2;

fn steps(row: &mut RunRow, logs: &ForeignLogs, warmup: u32) {
    let ds = &logs.deepspeed;
    // Warmup and medians count optimizer steps, whichever of DeepSpeed's lines they come from;
    // the accumulation is the row's (run.json, then the printed configuration, then names).
    let steps = ds.optimizer_steps(row.grad_accum);
    // DeepSpeed prints the breakdown every `steps_per_print` steps, so a log may hold only a few
    // lines, all past warmup: the first `warmup` steps are dropped only if some are left.
    let drop = if steps.len() > warmup as usize { warmup as usize } else { 0 };
    let measured: Vec<&deepspeed::Breakdown> = steps.iter().skip(drop).collect();
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Cursor, Read, Seek, SeekFrom};

    /// Hands out at most `step` bytes a read, so a `\r\n` falls across two reads.
    struct Dribble(Cursor<Vec<u8>>, usize);

    impl Read for Dribble {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = buf.len().min(self.1);
            self.0.read(&mut buf[..n])
        }
    }

    impl Seek for Dribble {
        fn seek(&mut self, pos: SeekFrom) -> std::io::Result<u64> {
            self.0.seek(pos)
        }
    }

    fn lines(text: &[u8], step: usize) -> Vec<(u64, String)> {
        let mut out = Vec::new();
        let src = CrEndsLines::new(Dribble(Cursor::new(text.to_vec()), step));
        for_each_line(src, 0, u64::MAX, 64, 4, |n, line| {
            if let Line::Full(b) | Line::Unterminated(b) = line {
                out.push((n, String::from_utf8_lossy(b).into_owned()));
            }
            ControlFlow::Continue(())
        })
        .unwrap();
        out
    }

    /// A `\r\n` ends one line, a lone `\r` (a progress bar's redraw) ends one too, however the
    /// reads cut the file: the lines of a Windows file are numbered as an editor numbers them.
    #[test]
    fn carriage_returns_end_lines_once() {
        let want = |v: &[(u64, &str)]| v.iter().map(|(n, s)| (*n, s.to_string())).collect::<Vec<_>>();
        for step in 1..=9 {
            assert_eq!(lines(b"a\r\nbb\r\nc", step), want(&[(1, "a"), (2, "bb"), (3, "c")]), "reads of {step}");
            assert_eq!(lines(b"10%\r50%\r100%\nok\r\n", step), want(&[(1, "10%"), (2, "50%"), (3, "100%"), (4, "ok")]));
            assert_eq!(lines(b"a\r\r\nb\n\r", step), want(&[(1, "a"), (2, ""), (3, "b"), (4, "")]), "reads of {step}");
        }
    }
}
