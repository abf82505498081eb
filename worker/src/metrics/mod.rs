//! What a step costs: phase timings, memory, and the GPU's own readings.

pub mod clock;
pub mod gpu_monitor;
pub mod memory;
pub mod timeline;
