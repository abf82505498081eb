//! The process around the training: who this rank is, which device it computes on, and the native
//! helpers (C++ shim over libtorch, MPI constants).

pub mod device;
pub mod identity;
pub mod shim;
