//! What a step costs: phase timings and memory.

pub mod clock;
pub mod memory;
