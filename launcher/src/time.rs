//! Unix time, as the run folders' records (`slurm.json`, `local.json`) and the folders set aside
//! (`.replaced/`, `.attempts/`) stamp it.

use std::time::{SystemTime, UNIX_EPOCH};

/// Unix seconds, for the run records.
pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}
