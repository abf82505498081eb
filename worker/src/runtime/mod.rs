//! The process around the training: who this rank is, which device it computes on, the CUDA
//! streams and events, and the native helpers (C++ shim over libtorch, MPI constants).

pub mod cpus;
pub mod cuda;
pub mod device;
pub mod fatal;
pub mod graph;
pub mod guard;
pub mod host_memory;
pub mod identity;
pub mod kernels;
pub mod launch_env;
pub mod machine;
pub mod pinned;
pub mod rendezvous;
pub mod shim;
