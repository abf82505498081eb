//! Per-step accounting of collectives: calls, bytes, time, and bus bandwidth per kind.

use std::collections::BTreeMap;

use zerobench_schema::log::CommStats;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CollectiveKind {
    AllReduce,
    ReduceScatter,
    AllGather,
    Broadcast,
    /// Offload: a gradient shard copied to host memory.
    DeviceToHost,
    /// Offload: updated parameters copied back to the device.
    HostToDevice,
    /// hpZ: a gathered unit's group slice kept as the secondary partition.
    DeviceToDevice,
}

impl CollectiveKind {
    pub fn name(self) -> &'static str {
        match self {
            CollectiveKind::AllReduce => "all_reduce",
            CollectiveKind::ReduceScatter => "reduce_scatter",
            CollectiveKind::AllGather => "all_gather",
            CollectiveKind::Broadcast => "broadcast",
            CollectiveKind::DeviceToHost => "d2h",
            CollectiveKind::HostToDevice => "h2d",
            CollectiveKind::DeviceToDevice => "d2d",
        }
    }

    /// nccl-tests' bus-bandwidth factor (doc/PERFORMANCE.md): what each rank must move per byte of
    /// the array, so bus bandwidth is comparable to the link's speed whatever the rank count.
    pub fn bus_factor(self, world: usize) -> f64 {
        let n = world as f64;
        match self {
            CollectiveKind::AllReduce => 2.0 * (n - 1.0) / n,
            CollectiveKind::ReduceScatter | CollectiveKind::AllGather => (n - 1.0) / n,
            CollectiveKind::Broadcast
            | CollectiveKind::DeviceToHost
            | CollectiveKind::HostToDevice
            | CollectiveKind::DeviceToDevice => 1.0,
        }
    }
}

/// One step's collectives.
#[derive(Debug, Clone, Default)]
pub struct StepComm {
    pub by_kind: BTreeMap<CollectiveKind, CommStats>,
    /// Time computation waited for communication.
    pub exposed_ms: f64,
    /// Collectives of a sub-communicator (hpZ's group), already finalised, by record name.
    pub other: BTreeMap<String, CommStats>,
}

impl StepComm {
    pub fn record(&mut self, kind: CollectiveKind, bytes: u64, ms: f64) {
        let s = self.by_kind.entry(kind).or_default();
        s.calls += 1;
        s.bytes += bytes;
        s.ms += ms;
        s.max_bytes = s.max_bytes.max(bytes);
    }

    pub fn total_ms(&self) -> f64 {
        self.by_kind.values().chain(self.other.values()).map(|s| s.ms).sum()
    }

    /// Adds the collectives of a sub-communicator of `world` ranks, each kind recorded as
    /// `<kind>_<suffix>` (its bus bandwidth computed over that communicator's size).
    pub fn merge_group(&mut self, group: StepComm, world: usize, suffix: &str) {
        self.exposed_ms += group.exposed_ms;
        for (name, s) in group.to_record(world) {
            self.other.insert(format!("{name}_{suffix}"), s);
        }
    }

    /// The per-kind map of the `step` record, with bus bandwidth filled in.
    pub fn to_record(&self, world: usize) -> BTreeMap<String, CommStats> {
        let mut out: BTreeMap<String, CommStats> = self.other.clone();
        out.extend(self.by_kind
            .iter()
            .map(|(k, s)| {
                let mut s = *s;
                let copy = matches!(k, CollectiveKind::DeviceToHost | CollectiveKind::HostToDevice | CollectiveKind::DeviceToDevice);
                s.bus_gbps = (s.ms > 0.0 && (world > 1 || copy))
                    .then(|| s.bytes as f64 * k.bus_factor(world) / (s.ms * 1e-3) / 1e9);
                (k.name().to_string(), s)
            }));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_bandwidth_uses_nccl_tests_factors() {
        let mut s = StepComm::default();
        // 1 GB all-reduce in 10 ms on 4 ranks: algbw 100 GB/s, busbw 150 GB/s.
        s.record(CollectiveKind::AllReduce, 1_000_000_000, 10.0);
        let r = s.to_record(4);
        let bw = r["all_reduce"].bus_gbps.unwrap();
        assert!((bw - 150.0).abs() < 1e-9, "{bw}");
        assert_eq!(r["all_reduce"].calls, 1);
        assert_eq!(s.to_record(1)["all_reduce"].bus_gbps, None);
    }
}
