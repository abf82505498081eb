//! Who this process is: rank, world size, local rank, node.
//!
//! Order of sources (the first that applies wins; the `start` record names it in `rank_source`):
//! 1. **MPI**, when the MPI world has more than one rank (`mpirun`, `srun --mpi=pmix`): rank and
//!    size from `MPI_COMM_WORLD`; local rank and ranks per node from a shared-memory split
//!    (`MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`); node rank from the order of the node leaders.
//! 2. **Environment**: `RANK`, `WORLD_SIZE`, `LOCAL_RANK` (and `LOCAL_WORLD_SIZE`, `NODE_RANK`),
//!    as torchrun and DeepSpeed's launcher set them.
//! 3. A single process: rank 0 of 1.
//!
//! MPI is also the transport for CPU collectives and for bootstrapping NCCL, so a world of more
//! than one rank known only from the environment is refused with a message saying how to launch.

use std::env;

use mpi::topology::{Color, Communicator, SimpleCommunicator};
use zerobench_schema::log::SlurmInfo;

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
    #[error("environment variable {name}={value:?} is not a number")]
    BadEnv { name: &'static str, value: String },
    #[error(
        "WORLD_SIZE={0} but this process is not part of an MPI job; launch the ranks with mpirun or \
         srun --mpi=pmix so they can communicate"
    )]
    NoTransport(u32),
    #[error("inconsistent rank identity: {0}")]
    Inconsistent(String),
}

/// Works out the identity from an initialised MPI world.
pub fn resolve(world: &SimpleCommunicator) -> Result<Identity, IdentityError> {
    let size = u32::try_from(world.size()).expect("positive MPI size");
    if size > 1 {
        return from_mpi(world);
    }
    match env_u32("WORLD_SIZE")? {
        Some(n) if n > 1 => Err(IdentityError::NoTransport(n)),
        _ => {
            let rank = env_u32("RANK")?.unwrap_or(0);
            if rank != 0 {
                return Err(IdentityError::Inconsistent(format!("RANK={rank} in a world of one process")));
            }
            let source = if env::var_os("RANK").is_some() { "env:RANK" } else { "single" };
            Ok(Identity { rank: 0, world_size: 1, local_rank: 0, local_size: 1, node_rank: 0, nodes: 1, source })
        }
    }
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
    if let Some(n) = env_u32("WORLD_SIZE")? {
        if n != id.world_size {
            return Err(IdentityError::Inconsistent(format!("WORLD_SIZE={n} but MPI has {} ranks", id.world_size)));
        }
    }
    if let Some(r) = env_u32("RANK")? {
        if r != id.rank {
            return Err(IdentityError::Inconsistent(format!("RANK={r} but MPI rank is {}", id.rank)));
        }
    }
    Ok(())
}

fn env_u32(name: &'static str) -> Result<Option<u32>, IdentityError> {
    match env::var(name) {
        Ok(v) => v.trim().parse().map(Some).map_err(|_| IdentityError::BadEnv { name, value: v }),
        Err(_) => Ok(None),
    }
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
