//! Per-step accounting of collectives: calls, bytes, time, and bus bandwidth per kind.

use std::collections::BTreeMap;

use zerobench_schema::collective::CommKey;
use zerobench_schema::log::CommStats;

// The kinds, their names in the record and their bus-bandwidth factors are the schema's, which
// ingest reads them with.
pub use zerobench_schema::collective::CollectiveKind;

/// One step's collectives.
#[derive(Debug, Clone, Default)]
pub struct StepComm {
    pub by_kind: BTreeMap<CollectiveKind, CommStats>,
    /// Collectives of the hpZ group's communicator, already finalised (bus bandwidth over the
    /// group's size).
    pub group: BTreeMap<CollectiveKind, CommStats>,
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
        self.by_kind.values().chain(self.group.values()).map(|s| s.ms).sum()
    }

    /// Adds the collectives of the hpZ group's communicator of `world` ranks, recorded as
    /// `<kind>_group`.
    pub fn merge_group(&mut self, group: StepComm, world: usize) {
        self.group.extend(group.finalised(world));
    }

    /// Every kind timed on this communicator of `world` ranks, with bus bandwidth filled in.
    fn finalised(&self, world: usize) -> impl Iterator<Item = (CollectiveKind, CommStats)> + '_ {
        self.by_kind.iter().map(move |(k, s)| {
            let mut s = *s;
            s.bus_gbps = k.bus_factor(world).filter(|_| s.ms > 0.0).map(|f| s.bytes as f64 * f / (s.ms * 1e-3) / 1e9);
            (*k, s)
        })
    }

    /// The per-kind map of the `step` record, with bus bandwidth filled in.
    pub fn to_record(&self, world: usize) -> BTreeMap<String, CommStats> {
        let own = self.finalised(world).map(|(kind, s)| (CommKey { kind, group: false }, s));
        let group = self.group.iter().map(|(kind, s)| (CommKey { kind: *kind, group: true }, *s));
        own.chain(group).map(|(key, s)| (key.name().to_string(), s)).collect()
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

    #[test]
    fn copies_and_group_collectives_are_named_and_rated_as_the_schema_says() {
        let mut group = StepComm::default();
        // 3 GB gathered in 10 ms within a group of 4: busbw 300 × 3/4 = 225 GB/s.
        group.record(CollectiveKind::AllGather, 3_000_000_000, 10.0);
        let mut s = StepComm::default();
        s.record(CollectiveKind::DeviceToHost, 1_000_000_000, 50.0);
        s.merge_group(group, 4);
        let r = s.to_record(1);
        assert_eq!(r.keys().collect::<Vec<_>>(), ["all_gather_group", "d2h"]);
        assert!((r["all_gather_group"].bus_gbps.unwrap() - 225.0).abs() < 1e-9);
        // A copy has its bandwidth on one rank too.
        assert!((r["d2h"].bus_gbps.unwrap() - 20.0).abs() < 1e-9);
        assert_eq!(s.total_ms(), 60.0);
    }
}
