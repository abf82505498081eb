//! The keys of a `step` record's `comm` map and their bus-bandwidth factors, named once for the
//! worker that writes them and for ingest that reads them.
//!
//! A key is a [`CollectiveKind`], measured either on the world's communicator (`all_gather`) or
//! on the rank's hpZ group communicator (`all_gather_group`, see `EngineConfig::hpz`).
//!
//! `algbw = bytes / time`, with `bytes` the size of the full array (the schema's convention), and
//! `busbw = algbw × factor(n)` over the `n` ranks of the communicator (nccl-tests,
//! doc/PERFORMANCE.md): all-reduce `2(n−1)/n`; reduce-scatter and all-gather `(n−1)/n`; broadcast
//! `1`. Bus bandwidth is the figure to hold against the link's peak, whatever the number of ranks.
//! The copies (`d2h`, `h2d`, `d2d`) move every byte once over one link: factor 1.

/// What the worker times in a step's communication.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
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
    /// Every kind, in declaration order (`kind as usize` is its index here).
    pub const ALL: [CollectiveKind; 7] = [
        CollectiveKind::AllReduce,
        CollectiveKind::ReduceScatter,
        CollectiveKind::AllGather,
        CollectiveKind::Broadcast,
        CollectiveKind::DeviceToHost,
        CollectiveKind::HostToDevice,
        CollectiveKind::DeviceToDevice,
    ];

    /// The key in a step's `comm` map.
    pub fn name(self) -> &'static str {
        NAMES[self as usize]
    }

    /// A copy between memories of one rank rather than a collective among ranks.
    pub fn is_copy(self) -> bool {
        matches!(self, CollectiveKind::DeviceToHost | CollectiveKind::HostToDevice | CollectiveKind::DeviceToDevice)
    }

    /// nccl-tests' factor from algorithm bandwidth to bus bandwidth on a communicator of `ranks`
    /// ranks; `None` for a collective on one rank, which moves nothing over a link (a copy always
    /// moves its bytes).
    pub fn bus_factor(self, ranks: usize) -> Option<f64> {
        if ranks <= 1 && !self.is_copy() {
            return None;
        }
        let n = ranks as f64;
        Some(match self {
            CollectiveKind::AllReduce => 2.0 * (n - 1.0) / n,
            CollectiveKind::ReduceScatter | CollectiveKind::AllGather => (n - 1.0) / n,
            CollectiveKind::Broadcast
            | CollectiveKind::DeviceToHost
            | CollectiveKind::HostToDevice
            | CollectiveKind::DeviceToDevice => 1.0,
        })
    }
}

/// Indexed by `CollectiveKind as usize`.
const NAMES: [&str; 7] = ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "d2h", "h2d", "d2d"];
/// [`NAMES`] with `_group`: written out so that [`CommKey::name`] returns a `&'static str`.
const GROUP_NAMES: [&str; 7] = [
    "all_reduce_group",
    "reduce_scatter_group",
    "all_gather_group",
    "broadcast_group",
    "d2h_group",
    "h2d_group",
    "d2d_group",
];

/// One key of a step's `comm` map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CommKey {
    pub kind: CollectiveKind,
    /// Timed on the rank's hpZ group communicator, not the world's.
    pub group: bool,
}

impl CommKey {
    /// How many keys there are: every kind, on the world and on the group.
    pub const COUNT: usize = 2 * CollectiveKind::ALL.len();

    /// Every key, in [`Self::index`] order: the world's kinds, then the group's.
    pub const ALL: [CommKey; Self::COUNT] = {
        let n = CollectiveKind::ALL.len();
        let mut all = [CommKey { kind: CollectiveKind::AllReduce, group: false }; Self::COUNT];
        let mut i = 0;
        while i < Self::COUNT {
            all[i] = CommKey { kind: CollectiveKind::ALL[i % n], group: i >= n };
            i += 1;
        }
        all
    };

    /// A distinct index below [`Self::COUNT`], for keeping keys in fixed slots.
    pub fn index(self) -> usize {
        usize::from(self.group) * CollectiveKind::ALL.len() + self.kind as usize
    }

    pub fn name(self) -> &'static str {
        if self.group {
            GROUP_NAMES[self.kind as usize]
        } else {
            NAMES[self.kind as usize]
        }
    }

    /// The key a name stands for; `None` for a name this schema does not define.
    pub fn from_name(name: &[u8]) -> Option<Self> {
        let (base, group) = match name.strip_suffix(b"_group") {
            Some(base) => (base, true),
            None => (name, false),
        };
        let i = NAMES.iter().position(|n| n.as_bytes() == base)?;
        Some(CommKey { kind: CollectiveKind::ALL[i], group })
    }

    /// The bus-bandwidth factor of this key in a run of `world` ranks whose hpZ groups have
    /// `hpz` ranks; `None` for a group key without a group size, or a collective on one rank.
    pub fn bus_factor(self, world: u32, hpz: Option<u32>) -> Option<f64> {
        let ranks = if self.group { hpz? } else { world };
        self.kind.bus_factor(ranks as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn factors_match_nccl_tests() {
        assert_eq!(CollectiveKind::AllReduce.bus_factor(8), Some(1.75));
        assert_eq!(CollectiveKind::ReduceScatter.bus_factor(4), Some(0.75));
        assert_eq!(CollectiveKind::AllGather.bus_factor(2), Some(0.5));
        assert_eq!(CollectiveKind::Broadcast.bus_factor(16), Some(1.0));
        assert_eq!(CollectiveKind::AllReduce.bus_factor(1), None);
        assert_eq!(CollectiveKind::Broadcast.bus_factor(1), None);
        assert_eq!(CollectiveKind::DeviceToHost.bus_factor(1), Some(1.0));
        let group = CommKey { kind: CollectiveKind::AllGather, group: true };
        assert_eq!(group.bus_factor(16, Some(4)), Some(0.75));
        assert_eq!(group.bus_factor(16, None), None);
    }

    #[test]
    fn names_and_indices_are_one_to_one() {
        for (i, k) in CommKey::ALL.iter().enumerate() {
            assert_eq!(k.index(), i);
            assert_eq!(CommKey::from_name(k.name().as_bytes()), Some(*k));
            let base = NAMES[k.kind as usize];
            let want = if k.group { format!("{base}_group") } else { base.to_string() };
            assert_eq!(k.name(), want);
        }
        assert_eq!(CommKey::from_name(b"p2p"), None);
        assert_eq!(CommKey::from_name(b"all_gather_grou"), None);
    }

    /// A kind's name is its key on the world's communicator, as docs/log-schema.md lists them.
    #[test]
    fn kind_names_are_the_world_keys() {
        let names: Vec<&str> = CollectiveKind::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(names, ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "d2h", "h2d", "d2d"]);
        for kind in CollectiveKind::ALL {
            assert_eq!(kind.name(), CommKey { kind, group: false }.name());
        }
    }

    /// Seven kinds, each on the world and on the group: fourteen keys, each once.
    #[test]
    fn every_kind_has_a_world_and_a_group_key() {
        assert_eq!(CommKey::COUNT, 14);
        for kind in CollectiveKind::ALL {
            for group in [false, true] {
                let n = CommKey::ALL.iter().filter(|k| **k == CommKey { kind, group }).count();
                assert_eq!(n, 1, "{kind:?} group={group}");
            }
        }
    }
}
