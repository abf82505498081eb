//! Collective kinds and nccl-tests' bus-bandwidth factors.
//!
//! `algbw = bytes / time`, with `bytes` the size of the full array (the schema's convention), and
//! `busbw = algbw × factor(n)` (nccl-tests, doc/PERFORMANCE.md): all-reduce `2(n−1)/n`;
//! reduce-scatter, all-gather and all-to-all `(n−1)/n`; broadcast and reduce `1`. Bus bandwidth is
//! the figure to hold against the link's peak, whatever the number of ranks.

use std::fmt;

use serde::Serialize;

/// A collective the worker may log, by its name in the `comm` map of a step record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Collective {
    AllReduce,
    ReduceScatter,
    AllGather,
    Broadcast,
    Reduce,
    AllToAll,
}

impl Collective {
    pub const ALL: [Collective; 6] = [
        Collective::AllReduce,
        Collective::ReduceScatter,
        Collective::AllGather,
        Collective::Broadcast,
        Collective::Reduce,
        Collective::AllToAll,
    ];

    pub fn from_name(name: &str) -> Option<Self> {
        Self::from_bytes(name.as_bytes())
    }

    /// [`Self::from_name`] on the raw bytes of a key.
    pub fn from_bytes(name: &[u8]) -> Option<Self> {
        Some(match name {
            b"all_reduce" => Collective::AllReduce,
            b"reduce_scatter" => Collective::ReduceScatter,
            b"all_gather" => Collective::AllGather,
            b"broadcast" => Collective::Broadcast,
            b"reduce" => Collective::Reduce,
            b"all_to_all" => Collective::AllToAll,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::AllGather => "all_gather",
            Collective::Broadcast => "broadcast",
            Collective::Reduce => "reduce",
            Collective::AllToAll => "all_to_all",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }

    /// nccl-tests' factor from algorithm bandwidth to bus bandwidth on `n` ranks.
    pub fn busbw_factor(self, n: u32) -> f64 {
        let n = f64::from(n.max(1));
        match self {
            Collective::AllReduce => 2.0 * (n - 1.0) / n,
            Collective::ReduceScatter | Collective::AllGather | Collective::AllToAll => (n - 1.0) / n,
            Collective::Broadcast | Collective::Reduce => 1.0,
        }
    }
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn factors_match_nccl_tests() {
        assert_eq!(Collective::AllReduce.busbw_factor(8), 1.75);
        assert_eq!(Collective::ReduceScatter.busbw_factor(4), 0.75);
        assert_eq!(Collective::AllGather.busbw_factor(2), 0.5);
        assert_eq!(Collective::Broadcast.busbw_factor(16), 1.0);
        assert_eq!(Collective::AllReduce.busbw_factor(1), 0.0);
        for c in Collective::ALL {
            assert_eq!(Collective::from_name(c.as_str()), Some(c));
        }
    }
}
