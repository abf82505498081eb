//! How much host memory this rank's node can still give, and the check that a configuration's
//! host-resident model states fit in it before any is allocated.
//!
//! Without the check, an offloaded optimizer larger than the host (t5-11b with offload needs
//! 181 GB) pins memory until the kernel's OOM killer ends the rank with no record of why, or
//! swaps for minutes. With it, the run ends at once as an `oom` result naming both sizes.

use std::path::Path;

use zerobench_schema::memory::StateSplit;

use crate::failure::Failure;

/// Bytes the node can still give: `MemAvailable`, capped by this process's cgroup (v2) limit
/// less its usage, as Slurm's `--mem` sets it. `None` where neither can be read.
pub fn available_bytes() -> Option<u64> {
    let meminfo = super::machine::meminfo("MemAvailable");
    let cgroup = cgroup_dir().and_then(|d| cgroup_headroom(&d));
    match (meminfo, cgroup) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// This process's cgroup v2 folder (the `0::/path` line of `/proc/self/cgroup`).
fn cgroup_dir() -> Option<std::path::PathBuf> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(Path::new("/sys/fs/cgroup").join(rel.trim_start_matches('/')))
}

/// `memory.max - memory.current` of a cgroup folder; `None` when unlimited or unreadable.
fn cgroup_headroom(dir: &Path) -> Option<u64> {
    let max = std::fs::read_to_string(dir.join("memory.max")).ok()?;
    let max: u64 = max.trim().parse().ok()?; // "max" (unlimited) does not parse
    let current: u64 = std::fs::read_to_string(dir.join("memory.current")).ok()?.trim().parse().ok()?;
    Some(max.saturating_sub(current))
}

/// What one rank keeps in host memory: the offloaded model states, plus, when the device is the
/// CPU, every state and a step's micro-batches (`step_batches` bytes, all held at once; a huge
/// `--grad-accum` grew memory step by step until the allocator failed).
pub fn host_resident(split: &StateSplit, step_batches: u64, on_cpu: bool) -> u64 {
    let on_device = if on_cpu { split.device.total().saturating_add(step_batches) } else { 0 };
    split.host_bytes.saturating_add(on_device)
}

/// Refuses, as an `oom` result, a configuration whose host model states on this node (`per_rank`
/// times the node's ranks) exceed what the node has left. Activations come on top, so passing
/// is necessary, not sufficient.
pub fn check(per_rank: u64, ranks_on_node: u32, available: Option<u64>) -> Result<(), Failure> {
    let Some(available) = available else { return Ok(()) };
    let need = per_rank.saturating_mul(u64::from(ranks_on_node.max(1)));
    if need <= available {
        return Ok(());
    }
    let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
    Err(Failure::Oom {
        message: format!(
            "host memory: the model states kept in host memory (on a CPU with a step's micro-batches) need {:.1} GiB on this node ({:.1} GiB per rank x {} rank(s)), but only {:.1} GiB is \
             available (MemAvailable, or the cgroup's memory.max less its usage)",
            gib(need),
            gib(per_rank),
            ranks_on_node.max(1),
            gib(available)
        ),
        requested_bytes: Some(need),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_headroom_is_max_less_current_and_none_when_unlimited() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("memory.current"), "1000\n").expect("write");
        std::fs::write(dir.path().join("memory.max"), "max\n").expect("write");
        assert_eq!(cgroup_headroom(dir.path()), None);
        std::fs::write(dir.path().join("memory.max"), "5000\n").expect("write");
        assert_eq!(cgroup_headroom(dir.path()), Some(4000));
    }

    #[test]
    fn t5_11b_offload_needs_16_bytes_per_parameter_and_is_refused_on_a_small_host() {
        use zerobench_schema::config::{Offload, Precision, ZeroStage};
        use zerobench_schema::memory::{model_state_split, padded_params};
        use zerobench_schema::ModelPreset;
        let psi = padded_params(&ModelPreset::T5_11b.spec(), 1);
        let split = model_state_split(ZeroStage::Z2, Precision::Bf16, Offload::Optimizer, 1, psi, psi, 1);
        let need = host_resident(&split, 1 << 40, false);
        // fp32 master, moments (12 B) + bf16 gradient and parameter copies (4 B).
        assert_eq!(need, 16 * psi);
        // On a CPU run the device's share (the bf16 parameters) is in host memory too.
        assert_eq!(host_resident(&split, 0, true), 18 * psi);
        assert_eq!(host_resident(&split, 5, true), 18 * psi + 5);
        assert_eq!(host_resident(&split, u64::MAX, true), u64::MAX);
        let err = check(need, 1, Some(128 << 30)).expect_err("does not fit");
        assert_eq!(err.exit_code(), 3);
        assert!(err.to_string().contains("168.5 GiB"), "{err}");
        assert!(check(need, 1, Some(200 << 30)).is_ok());
        assert!(check(need, 2, Some(200 << 30)).is_err(), "two ranks of a node share its memory");
        assert!(check(need, 1, None).is_ok(), "unknown: not refused");
    }
}
