//! Who this process is: rank, world size, local rank, node.
//!
//! The source follows the transport [`super::rendezvous`] chose; the `start` record names it in
//! `rank_source`:
//! * `mpi`, when the MPI world has more than one rank (`mpirun`, `srun --mpi=pmix`): rank and
//!   size from `MPI_COMM_WORLD`; local rank and ranks per node from a shared-memory split
//!   (`MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`); node rank from the order of the node leaders.
//! * `env`, for ranks launched with the environment convention: rank and size from `RANK` and
//!   `WORLD_SIZE`; local rank, ranks per node and node rank from the node names the ranks
//!   exchanged at the rendezvous (ranks of one host in rank order; hosts in the order of their
//!   first rank).
//! * `env:RANK` or `single`: a single process (rank 0 of 1), with or without `RANK=0` set.
//!
//! Launchers that also set `RANK`, `WORLD_SIZE` or `LOCAL_RANK` must agree with what the ranks
//! found (DeepSpeed's launcher_helper checks the same): a mismatch means two launchers are stacked
//! or the ranks are on other hosts than the launcher thinks.

use std::env;

use mpi::topology::{Color, Communicator, SimpleCommunicator};
use zerobench_schema::log::SlurmInfo;

use super::launch_env::{self, EnvLaunch, RendezvousError, Vars, LOCAL_RANK, RANK, WORLD_SIZE};

/// This process's place in the run.
#[derive(Debug, Clone)]
pub struct Identity {
    pub rank: u32,
    pub world_size: u32,
    pub local_rank: u32,
    pub local_size: u32,
    pub node_rank: u32,
    pub nodes: u32,
    pub source: &'static str,
}

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error(transparent)]
    Env(#[from] RendezvousError),
    #[error("inconsistent rank identity: {0}")]
    Inconsistent(String),
}

/// Works out the identity from an initialised MPI world (one process when it has one rank).
pub fn resolve(world: &SimpleCommunicator) -> Result<Identity, IdentityError> {
    let size = u32::try_from(world.size()).expect("positive MPI size");
    if size > 1 {
        return from_mpi(world);
    }
    let rank = env_u32(RANK)?.unwrap_or(0);
    if rank != 0 {
        return Err(IdentityError::Inconsistent(format!("{RANK}={rank} in a world of one process")));
    }
    let source = if env::var_os(RANK).is_some() { "env:RANK" } else { "single" };
    Ok(Identity { rank: 0, world_size: 1, local_rank: 0, local_size: 1, node_rank: 0, nodes: 1, source })
}

/// The identity of a rank launched with the environment convention, from every rank's
/// [`node_name`].
/// `vars` is the environment (its `LOCAL_RANK` must agree).
pub fn from_env(launch: &EnvLaunch, hosts: &[String], vars: Vars<'_>) -> Result<Identity, IdentityError> {
    let rank = launch.rank as usize;
    let mine = &hosts[rank];
    let mut firsts: Vec<&String> = Vec::new();
    for h in hosts {
        if !firsts.contains(&h) {
            firsts.push(h);
        }
    }
    let count = |it: &mut dyn Iterator<Item = &String>| u32::try_from(it.filter(|h| *h == mine).count()).expect("few");
    let id = Identity {
        rank: launch.rank,
        world_size: launch.world_size,
        local_rank: count(&mut hosts[..rank].iter()),
        local_size: count(&mut hosts.iter()),
        node_rank: u32::try_from(firsts.iter().position(|h| *h == mine).expect("this rank's host")).expect("few"),
        nodes: u32::try_from(firsts.len()).expect("few"),
        source: "env",
    };
    if let Some(l) = launch_env::env_u32(vars, LOCAL_RANK)? {
        if l != id.local_rank {
            return Err(IdentityError::Inconsistent(format!(
                "{LOCAL_RANK}={l} but this is rank {} of the {} ranks on host {mine}",
                id.local_rank, id.local_size
            )));
        }
    }
    Ok(id)
}

fn from_mpi(world: &SimpleCommunicator) -> Result<Identity, IdentityError> {
    let rank = u32::try_from(world.rank()).expect("non-negative rank");
    let world_size = u32::try_from(world.size()).expect("positive size");
    let node = world.split_shared(world.rank());
    let local_rank = u32::try_from(node.rank()).expect("non-negative");
    let local_size = u32::try_from(node.size()).expect("positive");
    // Node leaders (local rank 0) form their own communicator; a leader's rank in it is the node's
    // index, ordered like the world ranks of the leaders. Everyone else gets MPI_COMM_NULL.
    let color = if local_rank == 0 { Color::with_value(0) } else { Color::undefined() };
    let leaders = world.split_by_color(color);
    let mut node_info = match &leaders {
        Some(l) => [l.rank(), l.size()],
        None => [0, 0],
    };
    mpi::collective::Root::broadcast_into(&node.process_at_rank(0), &mut node_info[..]);
    let to_u32 = |v: i32| u32::try_from(v).expect("non-negative");
    let id = Identity {
        rank,
        world_size,
        local_rank,
        local_size,
        node_rank: to_u32(node_info[0]),
        nodes: to_u32(node_info[1]),
        source: "mpi",
    };
    cross_check_env(&id)?;
    Ok(id)
}

/// Launchers that also set RANK/WORLD_SIZE must agree with MPI (DeepSpeed's launcher_helper does
/// the same check); a mismatch means two launchers are stacked.
fn cross_check_env(id: &Identity) -> Result<(), IdentityError> {
    if let Some(n) = env_u32(WORLD_SIZE)? {
        if n != id.world_size {
            return Err(IdentityError::Inconsistent(format!("{WORLD_SIZE}={n} but MPI has {} ranks", id.world_size)));
        }
    }
    if let Some(r) = env_u32(RANK)? {
        if r != id.rank {
            return Err(IdentityError::Inconsistent(format!("{RANK}={r} but MPI rank is {}", id.rank)));
        }
    }
    Ok(())
}

fn env_u32(name: &'static str) -> Result<Option<u32>, IdentityError> {
    Ok(launch_env::env_u32(&launch_env::process_env, name)?)
}

/// The local rank as launchers announce it in the environment, readable before MPI starts: the
/// GPU must be chosen before anything initialises CUDA, and an MPI library may do that in
/// `MPI_Init`. First hit wins: `OMPI_COMM_WORLD_LOCAL_RANK`, `MPI_LOCALRANKID` (MPICH),
/// `SLURM_LOCALID` (inside an srun step only), `LOCAL_RANK`.
pub fn local_rank_hint() -> Option<u32> {
    let get = |k: &str| env::var(k).ok().and_then(|v| v.trim().parse().ok());
    get("OMPI_COMM_WORLD_LOCAL_RANK")
        .or_else(|| get("MPI_LOCALRANKID"))
        .or_else(|| env::var_os("SLURM_STEP_ID").and_then(|_| get("SLURM_LOCALID")))
        .or_else(|| get(LOCAL_RANK))
}

/// The Slurm job this rank runs in, if any.
pub fn slurm_info() -> Option<SlurmInfo> {
    let job_id = env::var("SLURM_JOB_ID").ok()?;
    let get = |k: &str| env::var(k).ok().filter(|v| !v.is_empty());
    Some(SlurmInfo {
        job_id,
        step_id: get("SLURM_STEP_ID"),
        node_id: get("SLURM_NODEID").and_then(|v| v.parse().ok()),
        nodelist: get("SLURM_JOB_NODELIST"),
        array_job_id: get("SLURM_ARRAY_JOB_ID"),
        array_task_id: get("SLURM_ARRAY_TASK_ID"),
    })
}

/// The node this rank runs on, as the ranks compare it to find their local ranks: Slurm's name for
/// it inside a Slurm job (`SLURMD_NODENAME`: the test cluster's fake nodes share one host), else
/// the host's name.
pub fn node_name() -> String {
    env::var("SLURMD_NODENAME").ok().filter(|n| !n.is_empty()).unwrap_or_else(hostname)
}

/// This host's name.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(rank: u32, world_size: u32) -> EnvLaunch {
        EnvLaunch { rank, world_size, master_addr: "a".into(), master_port: 29500, agent_store: false }
    }

    #[test]
    fn env_ranks_place_themselves_by_host_name() {
        let hosts: Vec<String> = ["a", "b", "a", "b", "c"].iter().map(|h| h.to_string()).collect();
        let none = |_: &'static str| None;
        let places: Vec<_> = (0..5)
            .map(|r| {
                let id = from_env(&launch(r, 5), &hosts, &none).unwrap();
                (id.local_rank, id.local_size, id.node_rank, id.nodes, id.source)
            })
            .collect();
        assert_eq!(
            places,
            [(0, 2, 0, 3, "env"), (0, 2, 1, 3, "env"), (1, 2, 0, 3, "env"), (1, 2, 1, 3, "env"), (0, 1, 2, 3, "env")]
        );
        // A launcher's LOCAL_RANK must agree with the hosts.
        let said = |k: &'static str| (k == LOCAL_RANK).then(|| "0".to_string());
        let err = from_env(&launch(2, 5), &hosts, &said).unwrap_err().to_string();
        assert!(err.contains("LOCAL_RANK=0 but this is rank 1 of the 2 ranks on host a"), "{err}");
        assert!(from_env(&launch(4, 5), &hosts, &said).is_ok());
    }
}
