//! What the host is: its CPU model, the CPUs online and its memory, for the `start` record (hosts
//! of one GPU kind differ in offload's host work and in launching small steps), and the fields of
//! /proc/meminfo, which the host-memory check reads too.

use zerobench_schema::log::Machine;

/// This host, as the kernel describes it.
pub fn machine() -> Machine {
    // Unknown never happens on Linux; the CPUs this rank may use are then the best lower bound.
    let cpus = super::cpus::online_cpus()
        .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
        .map_or(1, |n| u32::try_from(n).unwrap_or(u32::MAX));
    Machine { cpu_model: cpu_name(), cpus, memory_bytes: meminfo("MemTotal") }
}

/// A human-readable name of the CPU: /proc/cpuinfo's `model name`, else the architecture.
pub fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// The field `key` (`MemAvailable`, `MemTotal`) of /proc/meminfo, in bytes.
pub fn meminfo(key: &str) -> Option<u64> {
    std::fs::read_to_string("/proc/meminfo").ok().and_then(|t| meminfo_bytes(&t, key))
}

/// The field `key` of a /proc/meminfo text, in bytes.
fn meminfo_bytes(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.strip_prefix(key).is_some_and(|rest| rest.starts_with(':')))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_fields_are_read_in_bytes() {
        let text = "MemTotal:       24000000 kB\nMemFree:        1000 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(meminfo_bytes(text, "MemAvailable"), Some(20_000_000 * 1024));
        assert_eq!(meminfo_bytes(text, "MemTotal"), Some(24_000_000 * 1024));
        assert_eq!(meminfo_bytes("MemTotal: 1 kB\n", "MemAvailable"), None);
        // A key is the whole name before the colon, not a prefix of another.
        assert_eq!(meminfo_bytes("MemAvailableX: 5 kB\n", "MemAvailable"), None);
    }

    #[test]
    fn the_machine_has_at_least_the_cpus_this_process_may_use() {
        let m = machine();
        let usable = std::thread::available_parallelism().expect("CPUs").get();
        assert!(m.cpus as usize >= usable, "{} online, {usable} usable", m.cpus);
        assert!(!m.cpu_model.is_empty());
        assert!(m.memory_bytes.is_some_and(|b| b > 0));
    }
}
