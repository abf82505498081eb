//! DeepSpeed's console lines:
//! * `see_memory_usage`: `MA 0.77 GB  Max_MA 1.25 GB  CA 1.51 GB  Max_CA 2 GB` (allocated, peak
//!   allocated, reserved ("cached"), peak reserved, in GiB: DeepSpeed divides by 1024³);
//! * the wall-clock breakdown (`wall_clock_breakdown`), of two kinds: one line per micro-step,
//!   `time (ms) | fwd_microstep: 5.54 | bwd_microstep: 22.35 | bwd_inner_microstep: 7.10 |
//!   bwd_allreduce_microstep: 15.16 | step_microstep: 0.06` (older versions: `forward_microstep`,
//!   `backward_microstep`, ...), and, at each gradient accumulation boundary, one line per
//!   optimizer step of the global timers, `time (ms) | fwd: .. | bwd: .. | bwd_inner: .. |
//!   bwd_allreduce: .. | step: ..` (older versions: `forward`, `backward`, `backward_allreduce`,
//!   `step`), which sum the micro-steps since the last boundary ([`DeepSpeed::optimizer_steps`]);
//! * the throughput timer: `RunningAvgSamplesPerSec=502.17, CurrSamplesPerSec=519.41,
//!   MemAllocated=0.14GB, MaxMemAllocated=0.23GB` (global samples per second), on one line or, as
//!   quoted in write-ups, spread over several;
//! * the FLOPs profiler's `Profile Summary at step N` block (`world size:`, `batch size per GPU:`,
//!   `fwd latency:`, `iter latency:`, `FLOPS per GPU = 3 * fwd flops per GPU / iter latency:`,
//!   `samples/second:` ...);
//! * the engine's configuration, printed once at start-up (`[config.py:1007:print]
//!   zero_optimization_stage ...... 2`, `train_micro_batch_size_per_gpu  8`, `world_size`,
//!   `gradient_accumulation_steps`, `bfloat16_enabled`/`bfloat16_config`, `fp16_enabled`,
//!   `zero_config ... offload_optimizer=...(device='cpu' ...)`): the run's identity;
//! * the time stamps that start DeepSpeed's lines (`[2024-07-10 14:14:51,806]`): the span of the
//!   run, to attribute a shared nvidia-smi log by time;
//! * failures: `CUDA out of memory` / `OutOfMemoryError` (an OOM), a Python traceback's final
//!   `SomethingError: ...` line (a failure).
//!
//! A line's ANSI colour escapes (`\x1b[32m ... \x1b[0m`, as coloured loggers print) are taken
//! out before it is read ([`strip_ansi`]); figures that measure nothing (`nan`, `inf`, negative)
//! are no figures ([`quantity`]).

use std::sync::LazyLock;

use regex::Regex;

use super::text::{checked, quantity, strip_ansi};

static MEMORY: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\bMA ([0-9.]+) GB\s+Max_MA ([0-9.]+) GB\s+CA ([0-9.]+) GB\s+Max_CA ([0-9.]+) GB").expect("valid regex")
});
static KEY_VALUE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\b(RunningAvgSamplesPerSec|CurrSamplesPerSec|MemAllocated|MaxMemAllocated)=([0-9.eE+-]+)")
        .expect("valid regex")
});
static CONFIG: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\[config\.py:[0-9]+:print\]\s+([a-z0-9_]+)\s+\.*\s*(\S.*?)\s*$").expect("valid regex")
});
static STAMP: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^\s*\[([0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2})(?:,([0-9]+))?\]").expect("valid regex")
});
static CREATING: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"Creating (?:torch\.)?(bfloat16|float16|float32|fp16|bf16|fp32) ZeRO stage ([0-3]) optimizer")
        .expect("valid regex")
});
static OFFLOAD_DEVICE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"offload_(optimizer|param)=[A-Za-z]*\(device='(cpu|nvme)'").expect("valid regex"));
static ERROR_LINE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^\s*([A-Za-z_][A-Za-z0-9_.]*(?:Error|Exception)): (.*)$").expect("valid regex"));

/// One wall-clock breakdown line (or a sum of micro-step lines), in ms.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Breakdown {
    pub forward: f64,
    pub backward: f64,
    pub optimizer: f64,
    pub allreduce: Option<f64>,
}

impl Breakdown {
    /// The sum of consecutive micro-steps: what DeepSpeed's global timers add up to one
    /// optimizer step.
    fn sum(parts: &[Breakdown]) -> Breakdown {
        let allreduce = parts.iter().filter_map(|b| b.allreduce).reduce(|a, b| a + b);
        Breakdown {
            forward: parts.iter().map(|b| b.forward).sum(),
            backward: parts.iter().map(|b| b.backward).sum(),
            optimizer: parts.iter().map(|b| b.optimizer).sum(),
            allreduce,
        }
    }
}

/// Which of DeepSpeed's timers a breakdown line prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Timers {
    /// The micro timers (`fwd_microstep`, ...), reset at every micro-step.
    Micro,
    /// The global timers (`fwd`, ...), summed over the micro-steps of an optimizer step and
    /// printed at its gradient accumulation boundary.
    Global,
}

/// The FLOPs profiler's summary.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Profile {
    pub step: Option<u32>,
    pub world_size: Option<u32>,
    pub batch_per_gpu: Option<u32>,
    pub params_per_gpu: Option<f64>,
    pub fwd_ms: Option<f64>,
    pub bwd_ms: Option<f64>,
    pub step_ms: Option<f64>,
    pub iter_ms: Option<f64>,
    pub tflops_per_gpu: Option<f64>,
    pub samples_per_s: Option<f64>,
    /// Forward FLOPs per GPU per iteration, as the profiler counted them.
    pub fwd_flops_per_gpu: Option<f64>,
}

/// What DeepSpeed's printed configuration says about the run. The precision and offload are
/// `None` when the lines that would say are absent, never a default.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Config {
    pub stage: Option<u8>,
    pub micro_batch: Option<u32>,
    pub grad_accum: Option<u32>,
    pub world_size: Option<u32>,
    pub bf16: Option<bool>,
    pub fp16: Option<bool>,
    /// Whether `zero_config` names an offload device for the optimizer / the parameters.
    pub offload_optimizer: Option<bool>,
    pub offload_param: Option<bool>,
}

/// One `see_memory_usage` report: where in the step it was taken (the message DeepSpeed printed
/// with it), and its figures in GiB.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryPhase {
    pub label: String,
    pub ma: f64,
    pub max_ma: f64,
    pub ca: f64,
    pub max_ca: f64,
}

/// `see_memory_usage` reports kept per run; a log that prints one every step keeps its first ones.
pub const MAX_MEMORY_PHASES: usize = 256;

/// What DeepSpeed lines of one run say.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeepSpeed {
    /// Lines recognised.
    pub lines: u64,
    pub allocated_gib: Option<f64>,
    pub reserved_gib: Option<f64>,
    /// The global timers' lines: one per optimizer step.
    pub global_steps: Vec<Breakdown>,
    /// The micro timers' lines, one list per file (an optimizer step's micro-steps are in one
    /// file, so they are grouped within it).
    pub micro_steps: Vec<Vec<Breakdown>>,
    pub running_avg_samples_per_s: Option<f64>,
    pub profile: Option<Profile>,
    in_profile: Option<Profile>,
    pub oom: Option<String>,
    pub error: Option<String>,
    pub config: Config,
    pub memory_phases: Vec<MemoryPhase>,
    /// The message of the last `see_memory_usage` line without figures (its figures follow on
    /// the next line).
    memory_label: Option<String>,
    /// The first and last time stamp of a DeepSpeed line, seconds (UTC assumed; only compared
    /// with other logs' stamps).
    pub first_ts: Option<f64>,
    pub last_ts: Option<f64>,
}

fn max_into(slot: &mut Option<f64>, v: f64) {
    *slot = Some(slot.map_or(v, |o| o.max(v)));
}

impl DeepSpeed {
    /// Reads one line; returns whether it was a DeepSpeed line.
    pub fn line(&mut self, line: &str) -> bool {
        let line = strip_ansi(line);
        let line: &str = &line;
        let known = self.read_line(line);
        if known {
            if let Some(t) = stamp(line) {
                self.first_ts = Some(self.first_ts.map_or(t, |f| f.min(t)));
                self.last_ts = Some(self.last_ts.map_or(t, |l| l.max(t)));
            }
        }
        known
    }

    fn read_line(&mut self, line: &str) -> bool {
        if let Some(p) = self.in_profile.as_mut() {
            if line.trim_start().starts_with("---") && !line.contains("DeepSpeed Flops Profiler") {
                self.profile = self.in_profile.take();
            } else {
                profile_line(p, line);
                self.lines += 1;
                return true;
            }
        }
        if let Some(rest) = line.split_once("Profile Summary at step").map(|(_, r)| r) {
            self.in_profile =
                Some(Profile { step: rest.trim().trim_end_matches(':').parse().ok(), ..Profile::default() });
            self.lines += 1;
            return true;
        }
        if let Some(c) = MEMORY.captures(line) {
            let v = |i: usize| c.get(i).and_then(|m| quantity(m.as_str()));
            if let (Some(ma), Some(max_ma), Some(ca), Some(max_ca)) = (v(1), v(2), v(3), v(4)) {
                max_into(&mut self.allocated_gib, ma.max(max_ma));
                max_into(&mut self.reserved_gib, ca.max(max_ca));
                // The message is on this line before the figures, or alone on the line before.
                let before = line[..c.get(0).map_or(0, |m| m.start())].rsplit(']').next().unwrap_or("").trim();
                let label = if before.is_empty() { self.memory_label.take() } else { Some(before.to_string()) };
                if self.memory_phases.len() < MAX_MEMORY_PHASES {
                    let label = label.unwrap_or_default().chars().take(120).collect();
                    self.memory_phases.push(MemoryPhase { label, ma, max_ma, ca, max_ca });
                }
                self.lines += 1;
                return true;
            }
        }
        if let Some((_, message)) = line.split_once(":see_memory_usage]") {
            let message = message.trim();
            if !message.starts_with("CPU Virtual Memory") {
                self.memory_label = Some(message.to_string());
            }
            self.lines += 1;
            return true;
        }
        if let Some(c) = CONFIG.captures(line) {
            config_line(&mut self.config, &c[1], &c[2]);
            self.lines += 1;
            return true;
        }
        // The ZeRO optimizer says what it creates: `Creating torch.bfloat16 ZeRO stage 2
        // optimizer`, then (stages 1-2) `CPU Offload: True`.
        if let Some(c) = CREATING.captures(line) {
            let cfg = &mut self.config;
            cfg.stage = cfg.stage.or(c[2].parse().ok());
            match &c[1] {
                "bfloat16" | "bf16" => cfg.bf16 = cfg.bf16.or(Some(true)),
                "float16" | "fp16" => cfg.fp16 = cfg.fp16.or(Some(true)),
                _ => {
                    cfg.bf16 = cfg.bf16.or(Some(false));
                    cfg.fp16 = cfg.fp16.or(Some(false));
                }
            }
            self.lines += 1;
            return true;
        }
        if let Some((_, flag)) = line.split_once("] CPU Offload: ") {
            if let Some(on) = match flag.trim() {
                "True" => Some(true),
                "False" => Some(false),
                _ => None,
            } {
                self.config.offload_optimizer = self.config.offload_optimizer.or(Some(on));
                self.lines += 1;
                return true;
            }
        }
        if let Some((_, rest)) = line.split_once("time (ms) |") {
            if let Some((b, timers)) = breakdown(rest) {
                match timers {
                    Timers::Global => self.global_steps.push(b),
                    Timers::Micro => match self.micro_steps.last_mut() {
                        Some(file) => file.push(b),
                        None => self.micro_steps.push(vec![b]),
                    },
                }
                self.lines += 1;
                return true;
            }
        }
        let mut found = false;
        for c in KEY_VALUE.captures_iter(line) {
            let Some(v) = c.get(2).and_then(|m| quantity(m.as_str())) else { continue };
            match &c[1] {
                "RunningAvgSamplesPerSec" => self.running_avg_samples_per_s = Some(v),
                "MemAllocated" | "MaxMemAllocated" => max_into(&mut self.allocated_gib, v),
                _ => {}
            }
            found = true;
        }
        if found {
            self.lines += 1;
            return true;
        }
        if line.contains("CUDA out of memory")
            || line.contains("OutOfMemoryError")
            || line.contains("CUDA error: out of memory")
        {
            if self.oom.is_none() {
                self.oom = Some(line.trim().chars().take(300).collect());
            }
            self.lines += 1;
            return true;
        }
        if let Some(c) = ERROR_LINE.captures(line) {
            if self.error.is_none() {
                self.error = Some(format!("{}: {}", &c[1], &c[2]).chars().take(300).collect());
            }
            self.lines += 1;
            return true;
        }
        false
    }

    /// Adds what another file of the same run says (per-rank logs, stdout and stderr): peaks are
    /// the larger, lists are joined, single facts are the first file's.
    pub fn merge(&mut self, o: &DeepSpeed) {
        self.lines += o.lines;
        for (mine, theirs) in [(&mut self.allocated_gib, o.allocated_gib), (&mut self.reserved_gib, o.reserved_gib)] {
            if let Some(v) = theirs {
                max_into(mine, v);
            }
        }
        self.global_steps.extend_from_slice(&o.global_steps);
        self.micro_steps.extend(o.micro_steps.iter().cloned());
        self.running_avg_samples_per_s = self.running_avg_samples_per_s.or(o.running_avg_samples_per_s);
        if self.profile.is_none() {
            self.profile.clone_from(&o.profile);
        }
        if self.oom.is_none() {
            self.oom.clone_from(&o.oom);
        }
        if self.error.is_none() {
            self.error.clone_from(&o.error);
        }
        let c = &mut self.config;
        let d = &o.config;
        c.stage = c.stage.or(d.stage);
        c.micro_batch = c.micro_batch.or(d.micro_batch);
        c.grad_accum = c.grad_accum.or(d.grad_accum);
        c.world_size = c.world_size.or(d.world_size);
        c.bf16 = c.bf16.or(d.bf16);
        c.fp16 = c.fp16.or(d.fp16);
        c.offload_optimizer = c.offload_optimizer.or(d.offload_optimizer);
        c.offload_param = c.offload_param.or(d.offload_param);
        let room = MAX_MEMORY_PHASES.saturating_sub(self.memory_phases.len());
        self.memory_phases.extend(o.memory_phases.iter().take(room).cloned());
        self.first_ts = self.first_ts.into_iter().chain(o.first_ts).reduce(f64::min);
        self.last_ts = self.last_ts.into_iter().chain(o.last_ts).reduce(f64::max);
    }

    /// The run's optimizer steps, in order. With `wall_clock_breakdown` DeepSpeed prints both a
    /// line per micro-step and, at each accumulation boundary, a line of the global timers, which
    /// sum that step's micro-steps: taking both would count every step twice (and, with
    /// accumulation, add micro-steps as steps of a fraction of the step time). So the global
    /// lines are the steps wherever there are any; a log of micro-step lines alone (an excerpt,
    /// a grep) has them summed by `grad_accum` consecutive lines of a file, a trailing partial
    /// group left out (it is no whole step), or each line taken as a step when the accumulation
    /// is unknown.
    pub fn optimizer_steps(&self, grad_accum: Option<u32>) -> Vec<Breakdown> {
        if !self.global_steps.is_empty() {
            return self.global_steps.clone();
        }
        let n = grad_accum.filter(|n| *n > 0).unwrap_or(1) as usize;
        self.micro_steps.iter().flat_map(|file| file.chunks_exact(n).map(Breakdown::sum)).collect()
    }

    /// Ends reading: a profile block at the very end of a file is complete too.
    pub fn finish(&mut self) {
        if let Some(p) = self.in_profile.take() {
            self.profile = Some(p);
        }
    }
}

fn config_line(c: &mut Config, key: &str, value: &str) {
    let flag = |v: &str| match v {
        "True" | "true" => Some(true),
        "False" | "false" => Some(false),
        _ => None,
    };
    match key {
        "zero_optimization_stage" => c.stage = value.parse().ok().filter(|s| *s <= 3),
        // A count of 0 counts nothing (per-GPU figures would divide by it): no value.
        "train_micro_batch_size_per_gpu" => c.micro_batch = value.parse().ok().filter(|n| *n > 0),
        "gradient_accumulation_steps" => c.grad_accum = value.parse().ok().filter(|n| *n > 0),
        "world_size" => c.world_size = value.parse().ok().filter(|n| *n > 0),
        "bfloat16_enabled" | "bf16_enabled" => c.bf16 = flag(value),
        "fp16_enabled" => c.fp16 = flag(value),
        // Newer versions print the precision configs as objects: `enabled=True ...`.
        "bfloat16_config" | "bf16_config" => c.bf16 = Some(value.contains("enabled=True")),
        "fp16_config" => c.fp16 = Some(value.contains("enabled=True")),
        "zero_config" => {
            c.offload_optimizer = Some(false);
            c.offload_param = Some(false);
            for m in OFFLOAD_DEVICE.captures_iter(value) {
                match &m[1] {
                    "optimizer" => c.offload_optimizer = Some(true),
                    _ => c.offload_param = Some(true),
                }
            }
        }
        _ => {}
    }
}

/// The time stamp that starts a DeepSpeed line, seconds.
fn stamp(line: &str) -> Option<f64> {
    let c = STAMP.captures(line)?;
    let frac = c.get(2).map_or(String::new(), |m| format!(".{}", m.as_str()));
    super::nvidia_smi::timestamp(&format!("{}{frac}", &c[1]))
}

/// A breakdown line's times after `time (ms) |`, and which timers they are (the forward timer's
/// name says: DeepSpeed prints the micro timers and the global ones on lines of their own).
fn breakdown(rest: &str) -> Option<(Breakdown, Timers)> {
    let mut b = Breakdown::default();
    let (mut fwd, mut bwd) = (None, false);
    for part in rest.split('|') {
        let Some((k, v)) = part.split_once(':') else { continue };
        let Some(v) = quantity(v) else { continue };
        match k.trim() {
            "fwd_microstep" | "forward_microstep" => {
                b.forward = v;
                fwd = Some(Timers::Micro);
            }
            "fwd" | "forward" => {
                b.forward = v;
                fwd = Some(Timers::Global);
            }
            "bwd_microstep" | "backward_microstep" | "bwd" | "backward" => {
                b.backward = v;
                bwd = true;
            }
            "step_microstep" | "step" | "optimizer_step" => b.optimizer = v,
            "bwd_allreduce_microstep" | "backward_allreduce_microstep" | "bwd_allreduce" | "backward_allreduce" => {
                b.allreduce = Some(v)
            }
            _ => {}
        }
    }
    fwd.filter(|_| bwd).map(|t| (b, t))
}

/// `60 ms`, `1.2 s`, `850 us` → ms.
fn ms(v: &str) -> Option<f64> {
    let (num, unit) = split_unit(v)?;
    checked(match unit {
        "ms" => num,
        "s" => num * 1e3,
        "us" => num / 1e3,
        _ => return None,
    })
}

/// `60.51 M` → 60.51e6, `6.38 TFLOPS` → 6.38e12.
fn scaled(v: &str) -> Option<f64> {
    let (num, unit) = split_unit(v)?;
    let mult = match unit.chars().next() {
        None => 1.0,
        Some('K') => 1e3,
        Some('M') => 1e6,
        Some('G') => 1e9,
        Some('T') => 1e12,
        Some('P') => 1e15,
        Some(_) => 1.0,
    };
    checked(num * mult)
}

fn split_unit(v: &str) -> Option<(f64, &str)> {
    let v = v.trim();
    let (num, unit) = v.split_once(char::is_whitespace).unwrap_or((v, ""));
    Some((quantity(num)?, unit.trim()))
}

fn profile_line(p: &mut Profile, line: &str) {
    let Some((key, value)) = line.rsplit_once(':') else { return };
    let key = key.trim().to_ascii_lowercase();
    match key.as_str() {
        "world size" => p.world_size = value.trim().parse().ok().filter(|n| *n > 0),
        "batch size per gpu" => p.batch_per_gpu = value.trim().parse().ok().filter(|n| *n > 0),
        "params per gpu" => p.params_per_gpu = scaled(value),
        "fwd latency" => p.fwd_ms = ms(value),
        "bwd latency" => p.bwd_ms = ms(value),
        "step latency" => p.step_ms = ms(value),
        "iter latency" => p.iter_ms = ms(value),
        "samples/second" => p.samples_per_s = quantity(value),
        "fwd flops per gpu" => p.fwd_flops_per_gpu = scaled(value),
        k if k.starts_with("flops per gpu") => p.tflops_per_gpu = scaled(value).map(|f| f / 1e12),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `see_memory_usage` prints the memory now (MA) and the peak since the last reset (Max_MA):
    /// the run's peak is the larger of both over every line, not the last MA.
    #[test]
    fn peak_memory_takes_max_ma_over_every_line_not_ma() {
        let mut d = DeepSpeed::default();
        for line in [
            "[INFO] before forward MA 1.5 GB         Max_MA 1.5 GB         CA 2.0 GB         Max_CA 2 GB",
            "[INFO] after forward MA 3.25 GB         Max_MA 7.75 GB         CA 8.0 GB         Max_CA 9 GB",
            "[INFO] after step MA 1.5 GB         Max_MA 2.0 GB         CA 8.0 GB         Max_CA 8 GB",
        ] {
            assert!(d.line(line), "{line}");
        }
        assert_eq!((d.allocated_gib, d.reserved_gib), (Some(7.75), Some(9.0)));
    }

    /// Every line the reader recognises is counted once, the configuration's lines included.
    #[test]
    fn recognised_lines_are_counted() {
        let log = include_str!("../../tests/fixtures/foreign/004-mlp-zero2-offload-bf16/deepspeed.log");
        let mut d = DeepSpeed::default();
        let recognised = log.lines().filter(|l| d.line(l)).count() as u64;
        assert!(recognised > 10, "{recognised}");
        assert_eq!(d.lines, recognised);
        assert_eq!(d.config.offload_optimizer, Some(true));
    }

    /// The configuration block's keys, each to its field; a stage above 3 is no stage, a count of 0
    /// no count.
    #[test]
    fn configuration_lines() {
        let mut c = Config::default();
        for (k, v) in [
            ("zero_optimization_stage", "2"),
            ("train_micro_batch_size_per_gpu", "8"),
            ("gradient_accumulation_steps", "4"),
            ("world_size", "16"),
            ("bf16_enabled", "True"),
            ("fp16_enabled", "false"),
        ] {
            config_line(&mut c, k, v);
        }
        assert_eq!(
            (c.stage, c.micro_batch, c.grad_accum, c.world_size, c.bf16, c.fp16),
            (Some(2), Some(8), Some(4), Some(16), Some(true), Some(false))
        );
        config_line(&mut c, "zero_optimization_stage", "4");
        assert_eq!(c.stage, None);
        // A count of 0 counts nothing: per-GPU figures would divide by it.
        for key in ["world_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"] {
            config_line(&mut c, key, "0");
        }
        assert_eq!((c.world_size, c.micro_batch, c.grad_accum), (None, None, None));
        let mut p = Profile::default();
        profile_line(&mut p, "world size:                                                   0");
        profile_line(&mut p, "batch size per GPU:                                           0");
        assert_eq!((p.world_size, p.batch_per_gpu), (None, None));
    }

    #[test]
    fn units() {
        assert_eq!(ms("287.7 ms"), Some(287.7));
        assert_eq!(ms("1.5 s"), Some(1500.0));
        assert_eq!(ms("250 us"), Some(0.25));
        assert_eq!(scaled("6.38 TFLOPS"), Some(6.38e12));
        assert_eq!(scaled("60.51 M"), Some(60.51e6));
        assert_eq!(ms("fast"), None);
    }

    /// A profiler block ends at its closing rule: the lines after it are read as what they are
    /// (a memory report here), not as profile lines; the configuration's lines count as read.
    #[test]
    fn lines_after_a_profile_block_are_read_on_their_own() {
        let mut d = DeepSpeed::default();
        let lines = [
            "-------------------------- DeepSpeed Flops Profiler --------------------------",
            "Profile Summary at step 2:",
            "world size:                                                             3",
            "batch size per GPU:                                                     32",
            "------------------------------------------------------------------------------",
            "[INFO] after step MA 1.5 GB         Max_MA 2.0 GB         CA 8.0 GB         Max_CA 8 GB",
            "[2024-01-01 10:00:00,000] [INFO] [config.py:1000:print]   train_micro_batch_size_per_gpu  8",
            "[2024-01-01 10:00:00,000] [INFO] [config.py:1000:print]   zero_optimization_stage ....... 2",
        ];
        let recognised = lines.iter().filter(|l| d.line(l)).count() as u64;
        assert_eq!(recognised, 6, "the opening rule and the closing one are not the reader's");
        assert_eq!(d.lines, recognised);
        let profile = d.profile.as_ref().expect("a finished profile");
        assert_eq!((profile.step, profile.world_size, profile.batch_per_gpu), (Some(2), Some(3), Some(32)));
        assert_eq!(d.allocated_gib, Some(2.0));
        assert_eq!((d.config.micro_batch, d.config.stage), (Some(8), Some(2)));
    }

    /// A wall-clock breakdown needs both a forward and a backward time; either alone is no step.
    #[test]
    fn breakdowns_need_forward_and_backward() {
        assert_eq!(
            breakdown(" fwd_microstep: 10.5 | bwd_microstep: 20.0 | step_microstep: 3.0").map(|(_, t)| t),
            Some(Timers::Micro)
        );
        assert_eq!(breakdown(" fwd: 10.5 | bwd: 20.0 | step: 3.0").map(|(_, t)| t), Some(Timers::Global));
        assert_eq!(breakdown(" forward: 10.5 | backward: 20.0 | step: 3.0").map(|(_, t)| t), Some(Timers::Global));
        assert!(breakdown(" fwd_microstep: 10.5 | step_microstep: 3.0").is_none());
        assert!(breakdown(" bwd_microstep: 20.0 | step_microstep: 3.0").is_none());
    }

    /// The global timers' lines are the optimizer steps, whatever micro-step lines surround them;
    /// without them, micro-step lines are summed per accumulation within each file, a partial
    /// group at a file's end left out; with the accumulation unknown, each is a step.
    #[test]
    fn optimizer_steps_from_either_kind_of_line() {
        let micro = |fwd: f64| format!("time (ms) | fwd_microstep: {fwd} | bwd_microstep: 2 | step_microstep: 1");
        let mut d = DeepSpeed::default();
        for line in [micro(1.0), micro(2.0), micro(3.0)] {
            assert!(d.line(&line));
        }
        let forward = |d: &DeepSpeed, accum| d.optimizer_steps(accum).iter().map(|b| b.forward).collect::<Vec<_>>();
        assert_eq!(forward(&d, Some(2)), [3.0]);
        assert_eq!(forward(&d, None), [1.0, 2.0, 3.0]);
        assert_eq!(forward(&d, Some(0)), [1.0, 2.0, 3.0]);
        // A second file's micro-steps do not complete the first file's partial group.
        let mut other = DeepSpeed::default();
        assert!(other.line(&micro(4.0)) && other.line(&micro(5.0)));
        d.merge(&other);
        assert_eq!(forward(&d, Some(2)), [3.0, 9.0]);
        assert_eq!(
            d.optimizer_steps(Some(2))[0],
            Breakdown { forward: 3.0, backward: 4.0, optimizer: 2.0, allreduce: None }
        );
        assert!(d.line("time (ms) | fwd: 7 | bwd: 8 | bwd_allreduce: 3 | step: 9"));
        assert_eq!(
            d.optimizer_steps(Some(2)),
            [Breakdown { forward: 7.0, backward: 8.0, optimizer: 9.0, allreduce: Some(3.0) }]
        );
    }

    /// Precision from the optimizer's creation line and from the newer precision-config objects.
    #[test]
    fn precision_from_every_form_deepspeed_prints() {
        let creating = |line: &str| {
            let mut d = DeepSpeed::default();
            assert!(d.line(line), "{line}");
            (d.config.stage, d.config.bf16, d.config.fp16)
        };
        assert_eq!(creating("[INFO] Creating torch.float16 ZeRO stage 1 optimizer"), (Some(1), None, Some(true)));
        assert_eq!(creating("[INFO] Creating torch.bfloat16 ZeRO stage 2 optimizer"), (Some(2), Some(true), None));
        assert_eq!(creating("[INFO] Creating fp32 ZeRO stage 3 optimizer"), (Some(3), Some(false), Some(false)));
        let mut c = Config::default();
        config_line(&mut c, "bf16_config", "enabled=True immediate_grad_update=False");
        config_line(&mut c, "fp16_config", "enabled=False auto_cast=False");
        assert_eq!((c.bf16, c.fp16), (Some(true), Some(false)));
    }

    /// The profiler's throughput line.
    #[test]
    fn profile_samples_per_second() {
        let mut p = Profile::default();
        profile_line(&mut p, "samples/second:                                                         196.88  ");
        assert_eq!(p.samples_per_s, Some(196.88));
    }

    /// The FLOP rate comes from its own line only: other keys the profiler prints, before or after
    /// it, leave it alone.
    #[test]
    fn flops_rate_from_its_own_line() {
        let mut p = Profile::default();
        for line in [
            "fwd flops of model = fwd flops per GPU * mp_size:                       382.64 G",
            "FLOPS per GPU = 3 * fwd flops per GPU / iter latency:                   2.35 TFLOPS",
            "fwd+bwd FLOPS per GPU = 3 * fwd flops per GPU / (fwd+bwd latency):      3.3 TFLOPS",
        ] {
            profile_line(&mut p, line);
        }
        assert_eq!(p.tflops_per_gpu, Some(2.35));
    }

    /// Each of the ways PyTorch reports running out of device memory is an OOM on its own.
    #[test]
    fn every_out_of_memory_phrase() {
        for line in [
            "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB",
            "torch.OutOfMemoryError: Tried to allocate 2.00 GiB",
            "RuntimeError: CUDA error: out of memory",
        ] {
            let mut d = DeepSpeed::default();
            assert!(d.line(line), "{line}");
            assert_eq!(d.oom.as_deref(), Some(line), "{line}");
        }
    }

    /// A profile block that ends the file, without its closing rule, is complete once reading
    /// ends.
    #[test]
    fn a_profile_at_the_end_of_a_file() {
        let mut d = DeepSpeed::default();
        for line in ["Profile Summary at step 5:", "world size:                             2"] {
            assert!(d.line(line));
        }
        assert_eq!(d.profile, None);
        d.finish();
        assert_eq!(d.profile.as_ref().map(|p| (p.step, p.world_size)), Some((Some(5), Some(2))));
    }

    /// Memory reports past the first MAX_MEMORY_PHASES still count for the peak but are not kept.
    #[test]
    fn memory_phases_are_bounded() {
        let mut d = DeepSpeed::default();
        for i in 0..MAX_MEMORY_PHASES + 5 {
            let line = format!(
                "[INFO] step {i} MA 1.0 GB         Max_MA {}.0 GB         CA 2.0 GB         Max_CA 2 GB",
                i + 1
            );
            assert!(d.line(&line));
        }
        assert_eq!(d.memory_phases.len(), MAX_MEMORY_PHASES);
        assert_eq!(d.allocated_gib, Some((MAX_MEMORY_PHASES + 5) as f64));
    }

    /// Colour escapes around a DeepSpeed line (a coloured logger's) are no part of it: its
    /// figures and its time stamp are read as without them.
    #[test]
    fn ansi_colours_around_lines() {
        let mut d = DeepSpeed::default();
        assert!(d.line(
            "\x1b[32m[2026-11-20 10:00:05,000] [INFO] [logging.py:96:log_dist] [Rank 0] time (ms) | \
             fwd_microstep: 10.00 | bwd_microstep: 20.00 | step_microstep: 70.00\x1b[0m"
        ));
        assert!(d.line(
            "[2026-11-20 10:00:09,000] [INFO] [timer.py:260:stop] \x1b[1;33mRunningAvgSamplesPerSec=120.5\x1b[m"
        ));
        assert_eq!(
            d.optimizer_steps(None),
            [Breakdown { forward: 10.0, backward: 20.0, optimizer: 70.0, allreduce: None }]
        );
        assert_eq!(d.running_avg_samples_per_s, Some(120.5));
        assert_eq!((d.first_ts.map(|t| t % 60.0), d.last_ts.map(|t| t % 60.0)), (Some(5.0), Some(9.0)));
        assert!(matches!(strip_ansi("plain | fwd: 1"), std::borrow::Cow::Borrowed("plain | fwd: 1")));
        assert_eq!(strip_ansi("\x1b[1;31mRuntimeError\x1b[0m: x \x1b[38;5;208mred\x1b[K"), "RuntimeError: x red");
        // A sequence cut short by the line's end; an escape that is no CSI is left.
        assert_eq!(strip_ansi("a\x1b[0"), "a");
        assert_eq!(strip_ansi("a\x1bb"), "a\x1bb");
    }

    /// `nan`, infinite, overflowing and negative figures measure nothing: each is read as if its
    /// field were absent (a breakdown without its forward time is no step).
    #[test]
    fn figures_that_measure_nothing_are_no_figures() {
        let mut d = DeepSpeed::default();
        assert!(!d.line("time (ms) | fwd_microstep: nan | bwd_microstep: 20.00 | step_microstep: 70.00"));
        assert!(!d.line("time (ms) | fwd_microstep: inf | bwd_microstep: 20.00 | step_microstep: 70.00"));
        assert!(d.line("time (ms) | fwd: 1 | bwd: 2 | bwd_allreduce: -3 | step: -4"));
        assert_eq!(
            d.optimizer_steps(None),
            [Breakdown { forward: 1.0, backward: 2.0, optimizer: 0.0, allreduce: None }]
        );
        assert!(!d.line("[INFO] [timer.py:260:stop] RunningAvgSamplesPerSec=-50"));
        assert!(!d.line("[INFO] [timer.py:260:stop] MemAllocated=1e400GB, MaxMemAllocated=nan"));
        assert!(d.line("[INFO] [timer.py:260:stop] RunningAvgSamplesPerSec=NaN, MaxMemAllocated=0.5GB"));
        assert_eq!((d.running_avg_samples_per_s, d.allocated_gib), (None, Some(0.5)));
        assert_eq!((ms("-5 ms"), ms("1e308 s"), ms("nan ms")), (None, None, None));
        assert_eq!((scaled("1e300 P"), scaled("-2.35 TFLOPS"), scaled("inf")), (None, None, None));
        let mut p = Profile::default();
        profile_line(&mut p, "samples/second:                                                         -196.88");
        profile_line(&mut p, "iter latency:                                                           nan ms");
        assert_eq!((p.samples_per_s, p.iter_ms), (None, None));
    }

    /// Offload from the stage-1/2 optimizer's line (either answer) and from the ZeRO config
    /// object (the optimizer's and the parameters' devices each to their own field).
    #[test]
    fn offload_from_every_form_deepspeed_prints() {
        for (answer, on) in [("True", true), ("False", false)] {
            let mut d = DeepSpeed::default();
            assert!(d.line(&format!(
                "[2024-01-01 10:00:00,000] [INFO] [stage_1_and_2.py:150:__init__] CPU Offload: {answer}"
            )));
            assert_eq!(d.config.offload_optimizer, Some(on));
        }
        let mut c = Config::default();
        config_line(
            &mut c,
            "zero_config",
            "stage=2 offload_optimizer=DeepSpeedZeroOffloadOptimizerConfig(device='cpu', pin_memory=True)",
        );
        assert_eq!((c.offload_optimizer, c.offload_param), (Some(true), Some(false)));
        config_line(&mut c, "zero_config", "stage=3 offload_param=DeepSpeedZeroOffloadParamConfig(device='nvme')");
        assert_eq!((c.offload_optimizer, c.offload_param), (Some(false), Some(true)));
    }
}
