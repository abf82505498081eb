//! The contract between zerobench's parts.
//!
//! * [`config`]: one run's configuration (what the worker's flags say and what the launcher renders).
//! * [`fields`]: a struct's field names read from its serde derive, so code that walks a
//!   configuration by name needs no second list of them.
//! * [`models`]: model presets with their exact dimensions and closed-form parameter counts.
//! * [`memory`]: the ZeRO model-state formulas per stage, precision and offload setting.
//! * [`schedule`]: the order in which a micro-step uses the model's units (the worker's engine
//!   follows it; [`traffic`] replays stage 3's gathers over it).
//! * [`traffic`]: the collectives of one optimizer step per rank, per stage (the planner's estimate
//!   and the closed form the worker's logs are held to).
//! * [`splitmix`]: the seeded generator every part draws synthetic numbers from.
//! * [`log`]: the JSON-lines records a worker writes and ingest reads, versioned by [`log::SCHEMA_VERSION`].
//! * [`collective`]: the collective kinds of a step record's `comm` map and their bus-bandwidth factors.
//! * [`launch`]: the environment variables torchrun-style launchers give each rank.
//! * [`job`]: a batch job's state from Slurm's names and slurmstepd's output, for status and ingest.
//! * [`ranges`]: sorted numbers (ranks, CPUs) written as runs, "0-2,5", for messages.
//! * [`stats`]: quantiles (numpy's linear interpolation), as the logs' medians and the tables use them.
//!
//! It needs no libtorch, MPI or CUDA (serde, schemars and thiserror only; clap behind the `cli`
//! feature, for the worker's flags), so the launcher and ingest link it without them.

pub mod collective;
pub mod config;
pub mod fields;
pub mod fnv;
pub mod job;
pub mod launch;
pub mod log;
pub mod memory;
pub mod models;
pub mod ranges;
pub mod schedule;
pub mod splitmix;
pub mod stats;
mod text_enum;
pub mod traffic;

pub use config::{ConfigError, DeviceRequest, Offload, Precision, RunConfig, ZeroStage};
pub use log::{Record, SCHEMA_VERSION};
pub use models::{ModelPreset, ModelSpec};
