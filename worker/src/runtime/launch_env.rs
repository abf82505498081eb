//! The environment convention of torchrun and DeepSpeed's launchers, read: which transport a
//! rank uses ([`choose`]) and, for ranks launched through the environment, who this rank is and
//! where the rendezvous is ([`EnvLaunch`]). Only reading the variables lives here, so that the
//! rank identity ([`super::identity`]) and the rendezvous itself ([`super::rendezvous`]) both
//! build on it.

use std::env;

use clap::ValueEnum;

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

/// Variables one of which every MPI launcher sets in its ranks: Open MPI's `mpirun`, PMI-1/2
/// (MPICH's Hydra, `srun --mpi=pmi2`), PMIx (`srun --mpi=pmix`, `prterun`), MPICH's local ranks.
pub const MPI_LAUNCHED: [&str; 4] = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"];

/// PMIx's choice of data store for the keys its processes exchange.
pub const PMIX_GDS: &str = "PMIX_MCA_gds";

/// The setting a process that no MPI launcher started takes before any thread starts, should it
/// start MPI as a singleton: PMIx's store kept in memory (`hash`).
///
/// Open MPI's singleton start spawns a daemon whose default store (`ds12`/`ds21`) is a file of
/// several MiB in shared memory; under a file-size limit below that (`ulimit -f`, about 8 MiB
/// with Debian's Open MPI 4.1) the start fails inside Open MPI, with messages that do not name
/// the limit. One process shares its keys with nobody, so the file buys nothing; in memory, the
/// rank starts and a limit meets its log, which says so. A store the user chose is kept, and
/// ranks an MPI launcher started use the launcher's.
pub fn singleton_store(vars: Vars<'_>) -> Option<(&'static str, &'static str)> {
    (!mpi_launched(vars) && vars(PMIX_GDS).is_none()).then_some((PMIX_GDS, "hash"))
}

/// Whether an MPI launcher started this process (one of [`MPI_LAUNCHED`] is set).
fn mpi_launched(vars: Vars<'_>) -> bool {
    MPI_LAUNCHED.iter().any(|k| vars(k).is_some())
}

/// Chooses the transport for `requested`, before MPI starts (it must not start for env ranks).
pub fn choose(requested: Rendezvous, vars: Vars<'_>) -> Result<Transport, RendezvousError> {
    let world = env_u32(vars, WORLD_SIZE)?;
    match requested {
        Rendezvous::Mpi => Ok(Transport::Mpi),
        Rendezvous::Env => env_launch(vars).map(Transport::Env),
        Rendezvous::Auto if mpi_launched(vars) => Ok(Transport::Mpi),
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
    fn a_process_no_launcher_started_keeps_pmix_keys_in_memory() {
        assert_eq!(singleton_store(&with(&[])), Some((PMIX_GDS, "hash")));
        assert_eq!(singleton_store(&with(FULL)), Some((PMIX_GDS, "hash")));
        for marker in MPI_LAUNCHED {
            assert_eq!(singleton_store(&with(&[(marker, "2")])), None, "{marker}");
        }
        assert_eq!(singleton_store(&with(&[(PMIX_GDS, "ds21")])), None);
    }

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
