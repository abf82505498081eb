//! How the ranks of a run find each other: over MPI, or over TCP from the environment convention
//! of torchrun and DeepSpeed's launchers.
//!
//! [`Rendezvous`] is chosen with `--rendezvous` (or `ZEROBENCH_RENDEZVOUS`):
//! * `mpi`: the MPI world is the run (`mpirun`, `srun --mpi=pmix`), as is a single process.
//! * `env`: [`RANK`], [`WORLD_SIZE`], [`MASTER_ADDR`] and [`MASTER_PORT`] say who this rank is
//!   and where rank 0 (or torchrun's agent, [`AGENT_STORE`]) hosts a c10d `TCPStore`; every rank
//!   connects to it, and the store carries what the ranks exchange before they communicate: host
//!   names (for local ranks), the keys c10d's Gloo process group connects by ([`crate::comm::gloo`]) and
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
//!
//! [`RANK`]: crate::runtime::launch_env::RANK
//! [`MASTER_PORT`]: crate::runtime::launch_env::MASTER_PORT
//! [`AGENT_STORE`]: crate::runtime::launch_env::AGENT_STORE
//! [`MPI_LAUNCHED`]: crate::runtime::launch_env::MPI_LAUNCHED

use std::net::{IpAddr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::sync::Arc;
use std::time::Duration;

use mpi::environment::Universe;
use mpi::topology::Communicator;

use crate::comm::group::{first_line, HostGroup, RunStore, StoreGroup};
use crate::comm::CommError;
use crate::runtime::identity::{self, Identity, IdentityError};
use crate::runtime::launch_env::{
    choose, env_u32, process_env, EnvLaunch, Rendezvous, RendezvousError, Transport, MASTER_ADDR, WORLD_SIZE,
};
use crate::runtime::shim::TcpStore;

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
