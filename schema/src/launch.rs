//! The environment convention of torchrun and DeepSpeed's launchers, shared by the launcher (which
//! sets these variables for each rank) and the worker (which reads them to meet the other ranks).

/// The rank of a process among all ranks of the run.
pub const RANK: &str = "RANK";
/// The number of ranks of the run.
pub const WORLD_SIZE: &str = "WORLD_SIZE";
/// The rank of a process among those of its host.
pub const LOCAL_RANK: &str = "LOCAL_RANK";
/// The host of rank 0, where the rendezvous store listens.
pub const MASTER_ADDR: &str = "MASTER_ADDR";
/// The store's TCP port.
pub const MASTER_PORT: &str = "MASTER_PORT";

/// The worker's flags that make it meet the other ranks through these variables, whatever else
/// the environment holds (an MPI launcher's variables, say).
pub const ENV_RENDEZVOUS_ARGS: [&str; 2] = ["--rendezvous", "env"];
