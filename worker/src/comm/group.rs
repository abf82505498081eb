//! The host side of a group of ranks: the few small exchanges that are not training collectives
//! (the run id, NCCL's unique id, CUDA IPC handles, host names, step times at the end, barriers).
//!
//! Over MPI they are MPI calls on the group's communicator. Ranks launched with the environment
//! convention have no MPI world; they exchange these values through the rendezvous `TCPStore`:
//! each exchange writes under a fresh key (`<group>/<sequence>/<rank>`) and reads the keys it
//! needs, every read bounded by the store's timeout. Every rank of a group makes the same
//! exchanges in the same order, so the sequence numbers agree without being sent.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mpi::topology::{Color, Communicator, SimpleCommunicator};
use mpi::traits::{CommunicatorCollectives, Root};

use super::CommError;
use crate::runtime::shim::{GlooGroup, TcpStore};

/// The ranks of a run, or of a group of it, for host-side exchanges.
pub enum HostGroup {
    Mpi(SimpleCommunicator),
    Store(StoreGroup),
}

/// The rendezvous store of a run, shared by its groups. Rank 0's process hosts it, so rank 0
/// must not exit while another rank may still read from it (the last exchange of a run, the step
/// times' maximum, ends on every rank at about the same time): on drop, every other rank says it
/// is done, and rank 0 waits (at most the rendezvous timeout) until all have, unless it
/// [abandoned](RunStore::abandon) the run.
pub struct RunStore {
    store: TcpStore,
    rank: usize,
    world: usize,
    abandoned: AtomicBool,
}

impl RunStore {
    pub fn new(store: TcpStore, rank: usize, world: usize) -> Self {
        Self { store, rank, world, abandoned: AtomicBool::new(false) }
    }

    /// This rank failed: on drop, rank 0 leaves at once (a rank that died would never say done);
    /// the others' reads then fail, as they would anyway with rank 0 gone.
    pub fn abandon(&self) {
        self.abandoned.store(true, Ordering::Relaxed);
    }

    /// `store.get` with the stack trace of libtorch's exception left out.
    fn get(&self, key: &str, cap: usize) -> Result<Vec<u8>, String> {
        self.store.get(key, cap).map_err(|e| first_line(&e.0))
    }

    fn set(&self, key: &str, value: &[u8]) -> Result<(), String> {
        self.store.set(key, value).map_err(|e| first_line(&e.0))
    }
}

/// The first line of a libtorch exception's message: the rest is its stack trace.
pub(crate) fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or_default().to_string()
}

impl Drop for RunStore {
    fn drop(&mut self) {
        // Errors are moot here: a rank that is gone has nothing left to read.
        if self.rank != 0 {
            let _ = self.set(&format!("done/{}", self.rank), &[]);
        } else if !self.abandoned.load(Ordering::Relaxed) {
            for r in 1..self.world {
                if self.get(&format!("done/{r}"), 0).is_err() {
                    break;
                }
            }
        }
    }
}

/// A group whose exchanges go through the rendezvous store.
pub struct StoreGroup {
    store: Arc<RunStore>,
    /// Distinguishes this group's keys from other groups'.
    name: String,
    rank: usize,
    size: usize,
    seq: u64,
    /// The address of this host the other ranks reach it at, for the CPU collectives.
    advertise: IpAddr,
    /// How long connecting the CPU collectives may wait for the other ranks.
    timeout: Duration,
}

/// Host names are exchanged padded to this many bytes (POSIX's HOST_NAME_MAX is 255).
const HOST_NAME_BYTES: usize = 256;

fn store_err(op: &'static str, e: impl std::fmt::Display) -> CommError {
    CommError::Failed { op, message: e.to_string() }
}

impl StoreGroup {
    /// The group of all `size` ranks of the run, this one being `rank`, reachable at
    /// `advertise`; `timeout` bounds connecting its CPU collectives.
    pub fn world(store: Arc<RunStore>, rank: usize, size: usize, advertise: IpAddr, timeout: Duration) -> Self {
        Self { store, name: "world".into(), rank, size, seq: 0, advertise, timeout }
    }

    /// The group's c10d Gloo process group, meeting under the group's own keys in the run's
    /// store; each of its collectives may wait `op`.
    pub(super) fn gloo(&self, op: Duration) -> Result<GlooGroup, CommError> {
        let prefix = format!("{}/gloo", self.name);
        GlooGroup::open(&self.store.store, &prefix, &self.advertise.to_string(), self.rank, self.size, self.timeout, op)
            .map_err(|e| store_err("gloo setup", first_line(&e.0)))
    }

    fn key(&mut self, who: &str) -> (String, u64) {
        self.seq += 1;
        (format!("{}/{}/{who}", self.name, self.seq), self.seq)
    }
}

impl HostGroup {
    pub fn rank(&self) -> usize {
        match self {
            HostGroup::Mpi(c) => usize::try_from(c.rank()).expect("non-negative rank"),
            HostGroup::Store(g) => g.rank,
        }
    }

    pub fn size(&self) -> usize {
        match self {
            HostGroup::Mpi(c) => usize::try_from(c.size()).expect("positive size"),
            HostGroup::Store(g) => g.size,
        }
    }

    /// `buf` := `buf` of rank `root`.
    pub fn broadcast_bytes(&mut self, buf: &mut [u8], root: usize) -> Result<(), CommError> {
        const OP: &str = "host broadcast";
        match self {
            HostGroup::Mpi(c) => {
                let root = i32::try_from(root).expect("rank");
                c.process_at_rank(root).broadcast_into(buf);
                Ok(())
            }
            HostGroup::Store(g) => {
                let (key, _) = g.key("root");
                if g.rank == root {
                    g.store.set(&key, buf).map_err(|e| store_err(OP, e))
                } else {
                    let v = g.store.get(&key, buf.len()).map_err(|e| store_err(OP, e))?;
                    if v.len() != buf.len() {
                        return Err(store_err(OP, format!("{} bytes from rank {root}, not {}", v.len(), buf.len())));
                    }
                    buf.copy_from_slice(&v);
                    Ok(())
                }
            }
        }
    }

    /// Every rank's `mine` (all of the same length), in rank order.
    pub fn all_gather_bytes(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>, CommError> {
        const OP: &str = "host all-gather";
        match self {
            HostGroup::Mpi(c) => {
                let mut all = vec![0u8; mine.len() * usize::try_from(c.size()).expect("size")];
                c.all_gather_into(mine, &mut all[..]);
                Ok(all.chunks(mine.len().max(1)).map(<[u8]>::to_vec).take(self.size()).collect())
            }
            HostGroup::Store(g) => {
                let (key, seq) = g.key(&g.rank.to_string());
                g.store.set(&key, mine).map_err(|e| store_err(OP, e))?;
                (0..g.size)
                    .map(|r| {
                        let v =
                            g.store.get(&format!("{}/{seq}/{r}", g.name), mine.len()).map_err(|e| store_err(OP, e))?;
                        if v.len() == mine.len() {
                            Ok(v)
                        } else {
                            Err(store_err(OP, format!("{} bytes from rank {r}, not {}", v.len(), mine.len())))
                        }
                    })
                    .collect()
            }
        }
    }

    /// `values` := their element-wise maximum over the group.
    pub fn max_f64(&mut self, values: &mut [f64]) -> Result<(), CommError> {
        if let HostGroup::Mpi(c) = self {
            super::mpi::host_max(c, values);
            return Ok(());
        }
        let mine: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        for other in self.all_gather_bytes(&mine)? {
            for (v, b) in values.iter_mut().zip(other.chunks_exact(8)) {
                *v = v.max(f64::from_le_bytes(b.try_into().expect("8 bytes")));
            }
        }
        Ok(())
    }

    /// Returns once every rank of the group has called it.
    pub fn barrier(&mut self) -> Result<(), CommError> {
        match self {
            HostGroup::Mpi(c) => {
                c.barrier();
                Ok(())
            }
            HostGroup::Store(_) => self.all_gather_bytes(&[]).map(drop),
        }
    }

    /// Every rank's node name ([`crate::runtime::identity::node_name`]), in rank order.
    pub fn host_names(&mut self) -> Result<Vec<String>, CommError> {
        let mut mine = [0u8; HOST_NAME_BYTES];
        let name = crate::runtime::identity::node_name();
        let n = name.len().min(HOST_NAME_BYTES);
        mine[..n].copy_from_slice(&name.as_bytes()[..n]);
        Ok(self
            .all_gather_bytes(&mine)?
            .iter()
            .map(|b| {
                let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
                String::from_utf8_lossy(&b[..end]).into_owned()
            })
            .collect())
    }

    /// The run's rendezvous store, for groups that met at one.
    pub fn run_store(&self) -> Option<Arc<RunStore>> {
        match self {
            HostGroup::Mpi(_) => None,
            HostGroup::Store(g) => Some(Arc::clone(&g.store)),
        }
    }

    /// The group of `size` consecutive ranks this rank belongs to (hpZ's groups); collective.
    pub fn split_consecutive(&self, size: u32) -> HostGroup {
        let index = self.rank() / size as usize;
        match self {
            HostGroup::Mpi(c) => HostGroup::Mpi(
                c.split_by_color(Color::with_value(i32::try_from(index).expect("few groups")))
                    .expect("every rank has a color"),
            ),
            HostGroup::Store(g) => HostGroup::Store(StoreGroup {
                store: Arc::clone(&g.store),
                name: format!("{}/group{size}.{index}", g.name),
                rank: g.rank % size as usize,
                size: size as usize,
                seq: 0,
                advertise: g.advertise,
                timeout: g.timeout,
            }),
        }
    }
}
