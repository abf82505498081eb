//! How the ranks of a run find each other: over MPI, or over TCP from the environment convention
//! of torchrun and DeepSpeed's launchers.
//!
//! [`Rendezvous`] is chosen with `--rendezvous` (or `ZEROBENCH_RENDEZVOUS`):
//! * `mpi`: the MPI world is the run (`mpirun`, `srun --mpi=pmix`), as is a single process.
//! * `env`: [`RANK`], [`WORLD_SIZE`], [`MASTER_ADDR`] and [`MASTER_PORT`] say who this rank is
//!   and where rank 0 (or torchrun's agent, [`AGENT_STORE`]) hosts a c10d `TCPStore`; every rank
//!   connects to it, and the store carries what the ranks exchange before they communicate: host
//!   names (for local ranks), the CPU collectives' ring addresses ([`crate::comm::tcp`]) and
//!   NCCL's unique id.
//! * `auto` (default): `mpi` when an MPI launcher started this process ([`MPI_LAUNCHED`]), else
//!   `env` when [`WORLD_SIZE`] or [`MASTER_ADDR`] is set, else a single process.
//!
//! Ranks that meet through the environment never initialise MPI: under `srun --mpi=none`, Open
//! MPI's `MPI_Init` would look for Slurm's PMI and abort.
//!
//! A rank that never arrives fails the others at the rendezvous timeout: rank 0's store waits that
//! long for every rank to connect, the others that long for each value, and to reach rank 0 (the
//! store's client tries twice, so at most twice that).

use std::env;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::sync::Arc;
use std::time::Duration;

use clap::ValueEnum;

use mpi::environment::Universe;
use mpi::topology::Communicator;

use crate::comm::group::{first_line, HostGroup, RunStore, StoreGroup};
use crate::comm::CommError;
use crate::runtime::identity::{self, Identity, IdentityError};
use crate::runtime::shim::TcpStore;

pub use zerobench_schema::launch::{LOCAL_RANK, MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE};

/// torchrun sets this to `True` when its agent already hosts the store at
/// `MASTER_ADDR:MASTER_PORT`: rank 0 then connects to it like the others instead of listening.
pub const AGENT_STORE: &str = "TORCHELASTIC_USE_AGENT_STORE";

/// How the ranks find each other (`--rendezvous`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum Rendezvous {
    /// MPI if an MPI launcher started this process, the environment if WORLD_SIZE or
    /// MASTER_ADDR is set, a single process otherwise.
    #[default]
    Auto,
    /// The MPI world (or a single process).
    Mpi,
    /// RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; ranks meet at a TCP store on rank 0.
    Env,
}

/// What the environment convention says about this rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvLaunch {
    pub rank: u32,
    pub world_size: u32,
    pub master_addr: String,
    pub master_port: u16,
    /// Whether the launcher hosts the store ([`AGENT_STORE`]); else rank 0 does.
    pub agent_store: bool,
}

/// The transport a rank uses, once chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// The MPI world: `mpirun`/`srun --mpi=pmix` ranks, or one process.
    Mpi,
    /// Ranks meeting at a TCP store.
    Env(EnvLaunch),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RendezvousError {
    #[error("--rendezvous env needs {name} ({why})")]
    Missing { name: &'static str, why: &'static str },
    #[error("environment variable {name}={value:?} is not {what}")]
    BadEnv { name: &'static str, value: String, what: &'static str },
    #[error("{RANK}={rank} is not below {WORLD_SIZE}={world_size}")]
    RankOutOfRange { rank: u32, world_size: u32 },
    #[error("rendezvous at {addr}:{port} failed (rank {rank} of {world_size}, timeout {timeout_s} s): {message}")]
    Store { addr: String, port: u16, rank: u32, world_size: u32, timeout_s: u64, message: String },
    #[error("MPI started this process alone while {WORLD_SIZE}={0}; launch the ranks with mpirun or srun --mpi=pmix, or use --rendezvous env")]
    NotMpi(u32),
}

/// The environment, or in tests a map standing in for it.
pub type Vars<'a> = &'a dyn Fn(&'static str) -> Option<String>;

/// The process's environment.
pub fn process_env(name: &'static str) -> Option<String> {
    env::var(name).ok()
}

/// Why the ranks could not meet.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error(transparent)]
    Rendezvous(#[from] RendezvousError),
    #[error(transparent)]
    Identity(#[from] IdentityError),
    #[error(transparent)]
    Comm(#[from] CommError),
    #[error("MPI was already initialised")]
    MpiAgain,
}

impl JoinError {
    /// Whether the launch itself is wrong (flags, environment), rather than the ranks failing to
    /// reach each other.
    pub fn is_config(&self) -> bool {
        match self {
            JoinError::Rendezvous(RendezvousError::Store { .. }) | JoinError::Comm(_) | JoinError::MpiAgain => false,
            JoinError::Rendezvous(_) | JoinError::Identity(_) => true,
        }
    }
}

/// The ranks of the run, once this one has met them.
pub struct Ranks {
    pub ident: Identity,
    /// All ranks, for host-side exchanges and to build the collectives on.
    pub host: HostGroup,
    /// MPI, initialised for as long as the run uses it (dropping it finalises MPI); none for
    /// ranks that met through the environment.
    pub mpi: Option<Universe>,
}

/// Meets the other ranks of the run the way `requested` says.
pub fn join(requested: Rendezvous, timeout: Duration) -> Result<Ranks, JoinError> {
    match choose(requested, &process_env)? {
        Transport::Mpi => {
            let universe = mpi::initialize().ok_or(JoinError::MpiAgain)?;
            let world = universe.world();
            if world.size() == 1 {
                if let Some(n) = env_u32(&process_env, WORLD_SIZE)?.filter(|&n| n > 1) {
                    return Err(RendezvousError::NotMpi(n).into());
                }
            }
            Ok(Ranks { ident: identity::resolve(&world)?, host: HostGroup::Mpi(world), mpi: Some(universe) })
        }
        Transport::Env(launch) => {
            let mut host = connect(&launch, timeout)?;
            let hosts = host.host_names()?;
            Ok(Ranks { ident: identity::from_env(&launch, &hosts, &process_env)?, host, mpi: None })
        }
    }
}

/// Meets the other ranks at the store on `launch`'s master (hosting it on rank 0) and returns
/// the group of all ranks. Fails within `timeout` when a rank does not arrive.
fn connect(launch: &EnvLaunch, timeout: Duration) -> Result<HostGroup, RendezvousError> {
    let fail = |message: String| RendezvousError::Store {
        addr: launch.master_addr.clone(),
        port: launch.master_port,
        rank: launch.rank,
        world_size: launch.world_size,
        timeout_s: timeout.as_secs(),
        message,
    };
    let advertise = route_to(&launch.master_addr, launch.master_port).map_err(&fail)?;
    let server = launch.rank == 0 && !launch.agent_store;
    let store = TcpStore::open(&launch.master_addr, launch.master_port, server, launch.world_size, timeout)
        .map_err(|e| fail(first_line(&e.0)))?;
    Ok(HostGroup::Store(StoreGroup::world(
        Arc::new(RunStore::new(store, launch.rank as usize, launch.world_size as usize)),
        launch.rank as usize,
        launch.world_size as usize,
        advertise,
        timeout,
    )))
}

/// The address of this host on the route to `host`: where the other ranks, which reach the
/// master, can reach this one.
///
/// A master whose own name resolves to a loopback address here (Debian's `127.0.1.1` for the
/// host's name) would advertise that to ranks on other hosts; then the address of the default
/// route is used, when there is one. A loopback address or `localhost` given as such stays: the
/// run is on this host.
fn route_to(host: &str, port: u16) -> Result<IpAddr, String> {
    let target = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {MASTER_ADDR}={host}: {e}"))?
        .next()
        .ok_or_else(|| format!("{MASTER_ADDR}={host} has no address"))?;
    let ip = local_ip_towards(target).map_err(|e| format!("no route to {target}: {e}"))?;
    let local_by_choice = host.parse::<IpAddr>().is_ok() || host.eq_ignore_ascii_case("localhost");
    if ip.is_loopback() && !local_by_choice {
        // TEST-NET-1 stands for "anywhere off this host"; nothing is sent to it.
        let elsewhere = SocketAddr::from(([192, 0, 2, 1], port));
        if let Some(default) = local_ip_towards(elsewhere).ok().filter(|a| !a.is_loopback()) {
            return Ok(default);
        }
    }
    Ok(ip)
}

/// The local address a datagram to `target` would leave from. (Connecting a UDP socket sends
/// nothing; it only picks the route.)
fn local_ip_towards(target: SocketAddr) -> std::io::Result<IpAddr> {
    let any: IpAddr = if target.is_ipv4() { [0, 0, 0, 0].into() } else { [0u16; 8].into() };
    let probe = UdpSocket::bind((any, 0))?;
    probe.connect(target)?;
    Ok(probe.local_addr()?.ip())
}

/// Variables one of which every MPI launcher sets in its ranks: Open MPI's `mpirun`, PMI-1/2
/// (MPICH's Hydra, `srun --mpi=pmi2`), PMIx (`srun --mpi=pmix`, `prterun`), MPICH's local ranks.
pub const MPI_LAUNCHED: [&str; 4] = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"];

/// Chooses the transport for `requested`, before MPI starts (it must not start for env ranks).
pub fn choose(requested: Rendezvous, vars: Vars<'_>) -> Result<Transport, RendezvousError> {
    let world = env_u32(vars, WORLD_SIZE)?;
    match requested {
        Rendezvous::Mpi => Ok(Transport::Mpi),
        Rendezvous::Env => env_launch(vars).map(Transport::Env),
        Rendezvous::Auto if MPI_LAUNCHED.iter().any(|k| vars(k).is_some()) => Ok(Transport::Mpi),
        // One rank needs no rendezvous: it is a single process, whatever else is set.
        Rendezvous::Auto if world == Some(1) => Ok(Transport::Mpi),
        Rendezvous::Auto if world.is_some() || vars(MASTER_ADDR).is_some() => env_launch(vars).map(Transport::Env),
        Rendezvous::Auto => Ok(Transport::Mpi),
    }
}

/// Reads the environment convention, naming the first variable that is missing or wrong.
fn env_launch(vars: Vars<'_>) -> Result<EnvLaunch, RendezvousError> {
    let need = |name: &'static str, why: &'static str| {
        vars(name).filter(|v| !v.trim().is_empty()).ok_or(RendezvousError::Missing { name, why })
    };
    let world_size =
        env_u32(vars, WORLD_SIZE)?.ok_or(RendezvousError::Missing { name: WORLD_SIZE, why: "how many ranks" })?;
    if world_size == 0 {
        return Err(RendezvousError::BadEnv { name: WORLD_SIZE, value: "0".into(), what: "a positive number" });
    }
    let rank = env_u32(vars, RANK)?.ok_or(RendezvousError::Missing { name: RANK, why: "this process's rank" })?;
    if rank >= world_size {
        return Err(RendezvousError::RankOutOfRange { rank, world_size });
    }
    let master_addr = need(MASTER_ADDR, "the host of rank 0")?.trim().to_string();
    let port = need(MASTER_PORT, "the TCP port of the rendezvous on rank 0")?;
    let master_port = port.trim().parse::<u16>().ok().filter(|&p| p > 0).ok_or(RendezvousError::BadEnv {
        name: MASTER_PORT,
        value: port,
        what: "a TCP port (1-65535)",
    })?;
    let agent_store = vars(AGENT_STORE).is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
    Ok(EnvLaunch { rank, world_size, master_addr, master_port, agent_store })
}

/// A non-negative integer from the environment, if set.
pub fn env_u32(vars: Vars<'_>, name: &'static str) -> Result<Option<u32>, RendezvousError> {
    match vars(name) {
        Some(v) => v.trim().parse().map(Some).map_err(|_| RendezvousError::BadEnv {
            name,
            value: v,
            what: "a non-negative number",
        }),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(pairs: &[(&'static str, &str)]) -> impl Fn(&'static str) -> Option<String> {
        let map: std::collections::HashMap<&'static str, String> =
            pairs.iter().map(|(k, v)| (*k, (*v).to_string())).collect();
        move |k| map.get(k).cloned()
    }

    const FULL: &[(&str, &str)] = &[(RANK, "1"), (WORLD_SIZE, "3"), (MASTER_ADDR, "node-a"), (MASTER_PORT, "29511")];

    #[test]
    fn auto_prefers_mpi_then_the_environment_then_one_process() {
        let env = with(FULL);
        for marker in MPI_LAUNCHED {
            let mpirun = with(&[FULL, &[(marker, "3")]].concat());
            assert_eq!(choose(Rendezvous::Auto, &mpirun), Ok(Transport::Mpi), "{marker}");
        }
        let want =
            EnvLaunch { rank: 1, world_size: 3, master_addr: "node-a".into(), master_port: 29511, agent_store: false };
        assert_eq!(choose(Rendezvous::Auto, &env), Ok(Transport::Env(want.clone())));
        assert_eq!(choose(Rendezvous::Env, &env), Ok(Transport::Env(want)));
        assert_eq!(choose(Rendezvous::Mpi, &env), Ok(Transport::Mpi));
        assert_eq!(choose(Rendezvous::Auto, &with(&[])), Ok(Transport::Mpi));
        assert_eq!(choose(Rendezvous::Auto, &with(&[(WORLD_SIZE, "1"), (RANK, "0")])), Ok(Transport::Mpi));
        let torchrun = with(&[FULL, &[(AGENT_STORE, "True")]].concat());
        assert!(matches!(choose(Rendezvous::Auto, &torchrun), Ok(Transport::Env(EnvLaunch { agent_store: true, .. }))));
    }

    #[test]
    fn missing_and_bad_variables_are_named() {
        for (drop, name) in
            [(RANK, RANK), (WORLD_SIZE, WORLD_SIZE), (MASTER_ADDR, MASTER_ADDR), (MASTER_PORT, MASTER_PORT)]
        {
            let pairs: Vec<_> = FULL.iter().copied().filter(|(k, _)| *k != drop).collect();
            let err = choose(Rendezvous::Env, &with(&pairs)).unwrap_err();
            assert!(matches!(err, RendezvousError::Missing { name, .. } if name == drop), "{err}");
            assert!(err.to_string().contains(name), "{err}");
        }
        for (k, v, says) in [
            (RANK, "one", "RANK=\"one\""),
            (RANK, "3", "RANK=3 is not below WORLD_SIZE=3"),
            (WORLD_SIZE, "0", "WORLD_SIZE=\"0\""),
            (MASTER_PORT, "70000", "MASTER_PORT=\"70000\""),
            (MASTER_PORT, "0", "MASTER_PORT=\"0\""),
        ] {
            let pairs: Vec<_> = FULL.iter().copied().map(|(a, b)| if a == k { (a, v) } else { (a, b) }).collect();
            let err = choose(Rendezvous::Auto, &with(&pairs)).unwrap_err().to_string();
            assert!(err.contains(says), "{k}={v}: {err}");
        }
    }
}
