//! The ZeRO engine, written in the project: flat padded buffers per unit, stages 0-3, AdamW on
//! flat shards, fp16 loss scaling.
//!
//! | stage | parameters (compute dtype) | gradients | fp32 master, Adam m, v |
//! |---|---|---|---|
//! | 0 | full, every rank | full, all-reduced | full, every rank |
//! | 1 | full, all-gathered after the step | full buffer, reduce-scattered once per step | own shard |
//! | 2 | full, all-gathered after the step | own shard; reduce-scattered from a bucket per micro-step as backward produces them | own shard |
//! | 3 | own shard; gathered per use into persistent slots, released after | own shard, as stage 2 | own shard |
//!
//! On one rank without offload, stages 2 and 3 keep their gradients as stage 1 does: one rank's
//! shard is the whole unit, so backward writes into it and nothing is staged or copied
//! (`zerobench_schema::memory::GradientPath`).
//!
//! With offload ([`offload`]) the optimizer state (and in stage 3 optionally the parameter shard)
//! lives in pinned host memory and the CPU updates it: for every unit, or with an offload ratio
//! below 1 for the last units only (`memory::first_host_unit`), the device updating the others at
//! the same time. With the delayed update a step's host updates overlap the next step.
//!
//! On one GPU replaying its steps from CUDA graphs, each unit's update runs beside the rest of the
//! backward as soon as backward is done with the unit (`beside.rs`).
//!
//! Every unit is padded to a multiple of world size × [`SHARD_ALIGN_ELEMS`] elements and every
//! rank owns the same contiguous slice of every unit, so the per-rank model states equal the ZeRO
//! formulas for the padded parameter count exactly (`zerobench_schema::memory`).
//!
//! [`SHARD_ALIGN_ELEMS`]: zerobench_schema::memory::SHARD_ALIGN_ELEMS

pub mod adamw;
pub mod adamw_cuda;
mod beside;
pub mod engine;
mod error;
pub mod layout;
pub mod loss_scale;
pub mod offload;
mod reduce;
mod unit;

pub use engine::{Engine, EngineError, StepOutcome};
pub use zerobench_schema::schedule::{Phase, Position, Schedule};
