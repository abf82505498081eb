//! Log folders to tables: per-stage latency and memory, scaling, communication.
