//! Memory samples: the process's resident set, and on GPUs the caching allocator's statistics.

use zerobench_schema::log::MemorySample;

use crate::runtime::shim;

/// Reads memory figures for one rank.
pub struct MemoryProbe {
    cuda_device: Option<usize>,
}

impl MemoryProbe {
    pub fn new(cuda_device: Option<usize>) -> Self {
        Self { cuda_device }
    }

    /// The CUDA device sampled, if any.
    pub fn cuda_device(&self) -> Option<usize> {
        self.cuda_device
    }

    /// A sample; allocator peaks are reset afterwards so the next sample's peaks cover the interval
    /// in between (one step).
    pub fn sample(&self) -> MemorySample {
        let mut m = MemorySample { rss_bytes: rss_bytes(), ..Default::default() };
        if let Some(dev) = self.cuda_device {
            if let Ok(s) = shim::cuda_stats(dev) {
                let u = |v: i64| u64::try_from(v).ok();
                m.allocated_bytes = u(s.allocated);
                m.peak_allocated_bytes = u(s.peak_allocated);
                m.reserved_bytes = u(s.reserved);
                m.peak_reserved_bytes = u(s.peak_reserved);
                m.alloc_retries = u(s.alloc_retries);
                m.ooms = u(s.ooms);
                let _ = shim::cuda_reset_peak(dev);
            }
        }
        m
    }
}

/// Resident set size from /proc/self/statm (0 where unavailable).
pub fn rss_bytes() -> u64 {
    let Ok(s) = std::fs::read_to_string("/proc/self/statm") else { return 0 };
    let pages: u64 = s.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * u64::try_from(page).unwrap_or(4096)
}
