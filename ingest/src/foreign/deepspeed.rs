//! DeepSpeed's console lines:
//! * `see_memory_usage`: `MA 0.77 GB  Max_MA 1.25 GB  CA 1.51 GB  Max_CA 2 GB` (allocated, peak
//!   allocated, reserved ("cached"), peak reserved, in GiB: DeepSpeed divides by 1024³);
//! * the wall-clock breakdown, one line per micro-step: `time (ms) | fwd_microstep: 5.54 |
//!   bwd_microstep: 22.35 | bwd_inner_microstep: 7.10 | bwd_allreduce_microstep: 15.16 |
//!   step_microstep: 0.06` (older versions: `forward`, `backward`, `backward_allreduce`, `step`);
//! * the throughput timer: `RunningAvgSamplesPerSec=502.17, CurrSamplesPerSec=519.41,
//!   MemAllocated=0.14GB, MaxMemAllocated=0.23GB` (global samples per second), on one line or, as
//!   quoted in write-ups, spread over several;
//! * the FLOPs profiler's `Profile Summary at step N` block (`world size:`, `batch size per GPU:`,
//!   `fwd latency:`, `iter latency:`, `FLOPS per GPU = 3 * fwd flops per GPU / iter latency:`,
//!   `samples/second:` ...);
//! * failures: `CUDA out of memory` / `OutOfMemoryError` (an OOM), a Python traceback's final
//!   `SomethingError: ...` line (a failure).

use std::sync::LazyLock;

use regex::Regex;

static MEMORY: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\bMA ([0-9.]+) GB\s+Max_MA ([0-9.]+) GB\s+CA ([0-9.]+) GB\s+Max_CA ([0-9.]+) GB").expect("valid regex")
});
static KEY_VALUE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\b(RunningAvgSamplesPerSec|CurrSamplesPerSec|MemAllocated|MaxMemAllocated)=([0-9.eE+-]+)")
        .expect("valid regex")
});
static ERROR_LINE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^\s*([A-Za-z_][A-Za-z0-9_.]*(?:Error|Exception)): (.*)$").expect("valid regex"));

/// One wall-clock breakdown line, in ms.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Breakdown {
    pub forward: f64,
    pub backward: f64,
    pub optimizer: f64,
    pub allreduce: Option<f64>,
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
}

/// What DeepSpeed lines of one run say.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeepSpeed {
    /// Lines recognised.
    pub lines: u64,
    pub allocated_gib: Option<f64>,
    pub reserved_gib: Option<f64>,
    pub steps: Vec<Breakdown>,
    pub running_avg_samples_per_s: Option<f64>,
    pub profile: Option<Profile>,
    in_profile: Option<Profile>,
    pub oom: Option<String>,
    pub error: Option<String>,
}

fn max_into(slot: &mut Option<f64>, v: f64) {
    *slot = Some(slot.map_or(v, |o| o.max(v)));
}

impl DeepSpeed {
    /// Reads one line; returns whether it was a DeepSpeed line.
    pub fn line(&mut self, line: &str) -> bool {
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
            let v = |i: usize| c.get(i).and_then(|m| m.as_str().parse::<f64>().ok());
            if let (Some(ma), Some(max_ma), Some(ca), Some(max_ca)) = (v(1), v(2), v(3), v(4)) {
                max_into(&mut self.allocated_gib, ma.max(max_ma));
                max_into(&mut self.reserved_gib, ca.max(max_ca));
                self.lines += 1;
                return true;
            }
        }
        if let Some((_, rest)) = line.split_once("time (ms) |") {
            if let Some(b) = breakdown(rest) {
                self.steps.push(b);
                self.lines += 1;
                return true;
            }
        }
        let mut found = false;
        for c in KEY_VALUE.captures_iter(line) {
            let Some(v) = c.get(2).and_then(|m| m.as_str().parse::<f64>().ok()) else { continue };
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

    /// Ends reading: a profile block at the very end of a file is complete too.
    pub fn finish(&mut self) {
        if let Some(p) = self.in_profile.take() {
            self.profile = Some(p);
        }
    }
}

fn breakdown(rest: &str) -> Option<Breakdown> {
    let mut b = Breakdown::default();
    let (mut fwd, mut bwd) = (false, false);
    for part in rest.split('|') {
        let Some((k, v)) = part.split_once(':') else { continue };
        let Ok(v) = v.trim().parse::<f64>() else { continue };
        match k.trim() {
            "fwd_microstep" | "forward" | "fwd" => {
                b.forward = v;
                fwd = true;
            }
            "bwd_microstep" | "backward" | "bwd" => {
                b.backward = v;
                bwd = true;
            }
            "step_microstep" | "step" | "optimizer_step" => b.optimizer = v,
            "bwd_allreduce_microstep" | "backward_allreduce" | "bwd_allreduce" => b.allreduce = Some(v),
            _ => {}
        }
    }
    (fwd && bwd).then_some(b)
}

/// `60 ms`, `1.2 s`, `850 us` → ms.
fn ms(v: &str) -> Option<f64> {
    let (num, unit) = split_unit(v)?;
    Some(match unit {
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
    Some(num * mult)
}

fn split_unit(v: &str) -> Option<(f64, &str)> {
    let v = v.trim();
    let (num, unit) = v.split_once(char::is_whitespace).unwrap_or((v, ""));
    Some((num.parse().ok()?, unit.trim()))
}

fn profile_line(p: &mut Profile, line: &str) {
    let Some((key, value)) = line.rsplit_once(':') else { return };
    let key = key.trim().to_ascii_lowercase();
    match key.as_str() {
        "world size" => p.world_size = value.trim().parse().ok(),
        "batch size per gpu" => p.batch_per_gpu = value.trim().parse().ok(),
        "params per gpu" => p.params_per_gpu = scaled(value),
        "fwd latency" => p.fwd_ms = ms(value),
        "bwd latency" => p.bwd_ms = ms(value),
        "step latency" => p.step_ms = ms(value),
        "iter latency" => p.iter_ms = ms(value),
        "samples/second" => p.samples_per_s = value.trim().parse().ok(),
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

    #[test]
    fn units() {
        assert_eq!(ms("287.7 ms"), Some(287.7));
        assert_eq!(ms("1.5 s"), Some(1500.0));
        assert_eq!(scaled("6.38 TFLOPS"), Some(6.38e12));
        assert_eq!(scaled("60.51 M"), Some(60.51e6));
        assert_eq!(ms("fast"), None);
    }
}
