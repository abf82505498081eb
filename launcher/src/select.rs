//! Which slots of a hostfile a run uses: DeepSpeed's `--include`/`--exclude` syntax with its bugs
//! fixed, and the resulting rank table.
//!
//! Syntax: `NODE_SPEC[@NODE_SPEC…]` with `NODE_SPEC = HOST[:SLOT[,SLOT…]]`, e.g.
//! `worker-0:0,2@worker-1`. Semantics (DeepSpeed's documented intent, not its code):
//!
//! * a bare host means all of its slots (DeepSpeed drops the host instead: its issue #6671);
//! * slot ids are checked against the hostfile's `slots=` (DeepSpeed accepts `worker-0:7` on a
//!   4-slot host);
//! * a host may appear several times, its slots are merged; the result keeps hostfile order and
//!   drops hosts left without slots;
//! * include and exclude are mutually exclusive, and an empty result is an error.

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::hostfile::Hostfile;

/// The slots of one host that a run may use, as slot ids (GPU indices on GPU nodes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostSlots {
    pub host: String,
    pub slots: Vec<u32>,
}

/// Hosts and slots in node-rank order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resources {
    pub hosts: Vec<HostSlots>,
}

/// A filter as the user wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter<'a> {
    None,
    Include(&'a str),
    Exclude(&'a str),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SelectError {
    #[error("--include and --exclude are mutually exclusive")]
    BothIncludeAndExclude,
    #[error("empty node spec in '{0}' (write HOST[:SLOT,...] between '@'s)")]
    EmptySpec(String),
    #[error("slot '{slot}' of host '{host}' is not a number")]
    BadSlot { host: String, slot: String },
    #[error("host '{0}' is not in the hostfile")]
    UnknownHost(String),
    #[error("host '{host}' has slots 0-{last}; there is no slot {slot}")]
    NoSuchSlot { host: String, slot: u32, last: u32 },
    #[error("the filter leaves no slots to run on")]
    NothingLeft,
}

impl<'a> Filter<'a> {
    /// From the two optional flags, refusing both at once.
    pub fn from_flags(include: Option<&'a str>, exclude: Option<&'a str>) -> Result<Self, SelectError> {
        match (include, exclude) {
            (Some(_), Some(_)) => Err(SelectError::BothIncludeAndExclude),
            (Some(i), None) => Ok(Filter::Include(i)),
            (None, Some(e)) => Ok(Filter::Exclude(e)),
            (None, None) => Ok(Filter::None),
        }
    }
}

impl Resources {
    /// Every slot of every host, numbered 0..slots.
    pub fn all(hf: &Hostfile) -> Self {
        Resources {
            hosts: hf.hosts.iter().map(|h| HostSlots { host: h.host.clone(), slots: (0..h.slots).collect() }).collect(),
        }
    }

    /// The hostfile's slots after a filter.
    pub fn select(hf: &Hostfile, filter: Filter<'_>) -> Result<Self, SelectError> {
        let all = Self::all(hf);
        let (spec, include) = match filter {
            Filter::None => return Ok(all),
            Filter::Include(s) => (s, true),
            Filter::Exclude(s) => (s, false),
        };
        let picked = parse_spec(spec, &all)?;
        let hosts: Vec<HostSlots> = all
            .hosts
            .into_iter()
            .zip(picked)
            .map(|(h, p)| {
                let slots = h.slots.into_iter().filter(|s| p.contains(s) == include).collect();
                HostSlots { host: h.host, slots }
            })
            .filter(|h| !h.slots.is_empty())
            .collect();
        if hosts.is_empty() {
            return Err(SelectError::NothingLeft);
        }
        Ok(Resources { hosts })
    }

    pub fn total_slots(&self) -> usize {
        self.hosts.iter().map(|h| h.slots.len()).sum()
    }

    /// The rank table when every host runs one rank per slot, ranks filled host by host.
    pub fn ranks(&self) -> Vec<RankPlacement> {
        let mut out = Vec::with_capacity(self.total_slots());
        for (node_rank, h) in self.hosts.iter().enumerate() {
            for (local_rank, &slot) in h.slots.iter().enumerate() {
                out.push(RankPlacement {
                    rank: out.len() as u32,
                    host: h.host.clone(),
                    node_rank: node_rank as u32,
                    local_rank: local_rank as u32,
                    slot,
                });
            }
        }
        out
    }
}

/// Where one rank runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankPlacement {
    pub rank: u32,
    pub host: String,
    pub node_rank: u32,
    pub local_rank: u32,
    /// The slot id (GPU index) on that host.
    pub slot: u32,
}

impl fmt::Display for RankPlacement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {} {} {}", self.rank, self.host, self.node_rank, self.local_rank, self.slot)
    }
}

/// For each host of `all` (in order), the set of slots the spec names.
fn parse_spec(spec: &str, all: &Resources) -> Result<Vec<BTreeSet<u32>>, SelectError> {
    let mut picked = vec![BTreeSet::new(); all.hosts.len()];
    for node in spec.split('@') {
        let (host, slots) = match node.split_once(':') {
            Some((h, s)) => (h, Some(s)),
            None => (node, None),
        };
        if host.is_empty() {
            return Err(SelectError::EmptySpec(spec.to_string()));
        }
        let i =
            all.hosts.iter().position(|h| h.host == host).ok_or_else(|| SelectError::UnknownHost(host.to_string()))?;
        let have = &all.hosts[i].slots;
        match slots {
            None => picked[i].extend(have.iter().copied()),
            Some(list) => {
                for s in list.split(',') {
                    if s.is_empty() {
                        return Err(SelectError::EmptySpec(spec.to_string()));
                    }
                    let slot: u32 = s
                        .bytes()
                        .all(|b| b.is_ascii_digit())
                        .then(|| s.parse().ok())
                        .flatten()
                        .ok_or_else(|| SelectError::BadSlot { host: host.to_string(), slot: s.to_string() })?;
                    if !have.contains(&slot) {
                        let last = have.len().saturating_sub(1) as u32;
                        return Err(SelectError::NoSuchSlot { host: host.to_string(), slot, last });
                    }
                    picked[i].insert(slot);
                }
            }
        }
    }
    Ok(picked)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hostfile::{HostEntry, Hostfile};

    fn hf() -> Hostfile {
        Hostfile {
            hosts: ["worker-0", "worker-1"]
                .into_iter()
                .map(|h| HostEntry { host: h.into(), slots: 4, max_slots: None })
                .collect(),
        }
    }

    fn sel(f: Filter<'_>) -> Result<Vec<(String, Vec<u32>)>, SelectError> {
        Resources::select(&hf(), f).map(|r| r.hosts.into_iter().map(|h| (h.host, h.slots)).collect())
    }

    fn hs(v: &[(&str, &[u32])]) -> Vec<(String, Vec<u32>)> {
        v.iter().map(|(h, s)| (h.to_string(), s.to_vec())).collect()
    }

    /// `zerobench hostfile` reports the slots selected as the ranks the hostfile gives.
    #[test]
    fn total_slots_counts_every_selected_slot() {
        let all = Resources::select(&hf(), Filter::None).unwrap();
        assert_eq!(all.total_slots(), 8);
        assert_eq!(all.total_slots(), all.ranks().len());
        let some = Resources::select(&hf(), Filter::Include("worker-0:0,2@worker-1:3")).unwrap();
        assert_eq!(some.total_slots(), 3);
    }

    /// The table of DeepSpeed bugs in the reference, with the expected (fixed) results.
    #[test]
    fn fixes_deepspeeds_include_bugs() {
        assert_eq!(
            sel(Filter::Include("worker-0:0,2@worker-1")).unwrap(),
            hs(&[("worker-0", &[0, 2]), ("worker-1", &[0, 1, 2, 3])])
        );
        assert_eq!(sel(Filter::Include("worker-1")).unwrap(), hs(&[("worker-1", &[0, 1, 2, 3])]));
        assert_eq!(sel(Filter::Include("worker-0@worker-1")).unwrap().len(), 2);
        assert_eq!(
            sel(Filter::Include("worker-0:0,1@worker-1:0")).unwrap(),
            hs(&[("worker-0", &[0, 1]), ("worker-1", &[0])])
        );
        assert_eq!(
            sel(Filter::Include("worker-0:7")).unwrap_err(),
            SelectError::NoSuchSlot { host: "worker-0".into(), slot: 7, last: 3 }
        );
        assert_eq!(
            sel(Filter::Exclude("worker-0:0@worker-1:0,1")).unwrap(),
            hs(&[("worker-0", &[1, 2, 3]), ("worker-1", &[2, 3])])
        );
        assert_eq!(sel(Filter::Exclude("worker-1")).unwrap(), hs(&[("worker-0", &[0, 1, 2, 3])]));
    }

    #[test]
    fn order_merging_and_errors() {
        // Hostfile order wins over spec order; repeated hosts merge.
        assert_eq!(
            sel(Filter::Include("worker-1:3@worker-0:1@worker-1:0")).unwrap(),
            hs(&[("worker-0", &[1]), ("worker-1", &[0, 3])])
        );
        assert_eq!(sel(Filter::Include("worker-9")).unwrap_err(), SelectError::UnknownHost("worker-9".into()));
        assert_eq!(
            sel(Filter::Include("worker-0:x")).unwrap_err(),
            SelectError::BadSlot { host: "worker-0".into(), slot: "x".into() }
        );
        assert!(matches!(sel(Filter::Include("worker-0@@worker-1")), Err(SelectError::EmptySpec(_))));
        assert!(matches!(sel(Filter::Include("worker-0:")), Err(SelectError::EmptySpec(_))));
        assert!(matches!(sel(Filter::Include("worker-0:1,")), Err(SelectError::EmptySpec(_))));
        assert_eq!(sel(Filter::Exclude("worker-0@worker-1")).unwrap_err(), SelectError::NothingLeft);
        assert_eq!(Filter::from_flags(Some("a"), Some("b")).unwrap_err(), SelectError::BothIncludeAndExclude);
    }

    #[test]
    fn rank_table_fills_host_by_host() {
        let r = Resources::select(&hf(), Filter::Include("worker-0:1,3@worker-1:2")).unwrap();
        let t: Vec<String> = r.ranks().iter().map(ToString::to_string).collect();
        assert_eq!(t, ["0 worker-0 0 0 1", "1 worker-0 0 1 3", "2 worker-1 1 0 2"]);
    }
}
