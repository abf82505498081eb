//! Experiment specs to run folders, sbatch scripts and hostfiles; Slurm submission and tracking;
//! local runs.
//!
//! The flow is `spec` (load and check a YAML spec) → `plan` (expand the sweep into runs) →
//! `render` (run folders) → `submit`/`status` (Slurm) or `local` (mpirun on this host). The
//! hostlist, hostfile and select modules stand alone and back the `hostlist` and `hostfile`
//! commands. Only `slurm`, `submit`, `status` and `local` start processes.

pub mod error;
pub mod hostfile;
pub mod hostlist;
pub mod interrupts;
pub mod local;
pub mod locate;
pub mod plan;
pub mod proctree;
pub mod quote;
pub mod render;
pub mod rerun;
pub mod select;
pub mod slurm;
pub mod spec;
pub mod status;
pub mod submit;
#[cfg(test)]
mod testkit;
pub mod time;
pub mod values;

pub use error::{Error, Result};
pub use plan::{Plan, Run};
pub use spec::{Spec, SpecError};
