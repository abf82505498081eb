//! How many threads a rank computes with (libtorch's intra-op pool, the CPU AdamW of offload).
//!
//! A launcher either gives each rank cores of its own (`srun --cpus-per-task`, Open MPI's
//! `--map-by ...:PE=N`: the rank's CPU affinity is a subset of the host) or leaves every rank free
//! on the whole host (`--bind-to none`), where the node's ranks share the cores. Dividing a rank's
//! own cores among the node's ranks again would leave most of them idle; using all of the host's
//! cores in every rank would oversubscribe them. A Slurm job confined to its CPUs without
//! per-task binding looks like the first case to every rank (a subset of the host, the same one);
//! inside a step, `SLURM_CPUS_PER_TASK` caps each rank at its share then.

/// The rank's default thread count.
pub fn default_threads(local_size: u32) -> u32 {
    let usable = std::thread::available_parallelism().map_or(1, |n| n.get()); // affinity and CPU quota
    let per_task = std::env::var("SLURM_CPUS_PER_TASK").ok().and_then(|v| v.trim().parse().ok());
    threads_for(affinity_count(), online_cpus(), usable, local_size, per_task)
}

/// `affinity`: CPUs this process may run on; `online`: the host's; `usable`: what the standard
/// library found (affinity, lowered by a cgroup CPU quota); `per_task`: Slurm's CPUs per task.
fn threads_for(
    affinity: Option<usize>,
    online: Option<usize>,
    usable: usize,
    local_size: u32,
    per_task: Option<usize>,
) -> u32 {
    let own_cores = matches!((affinity, online), (Some(a), Some(o)) if a < o);
    let n = if own_cores { usable } else { usable / local_size.max(1) as usize };
    let n = per_task.map_or(n, |c| n.min(c));
    u32::try_from(n.max(1)).unwrap_or(u32::MAX)
}

fn affinity_count() -> Option<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the kernel fills it for this process.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        (libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0)
            .then(|| usize::try_from(libc::CPU_COUNT(&set)).unwrap_or(0))
    }
}

fn online_cpus() -> Option<usize> {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).ok().filter(|&n| n > 0)
}

#[cfg(test)]
mod tests {
    use super::threads_for;

    #[test]
    fn ranks_free_on_the_host_share_its_cores() {
        assert_eq!(threads_for(Some(32), Some(32), 32, 2, None), 16);
        assert_eq!(threads_for(Some(2), Some(2), 2, 4, None), 1);
    }

    #[test]
    fn a_rank_bound_to_cores_of_its_own_uses_all_of_them() {
        // srun --cpus-per-task=8 with 4 ranks on a 32-core node.
        assert_eq!(threads_for(Some(8), Some(32), 8, 4, Some(8)), 8);
        // Open MPI's default for 2 ranks binds each to one core: one thread, not zero.
        assert_eq!(threads_for(Some(1), Some(32), 1, 2, None), 1);
    }

    /// A job confined to 16 CPUs of a 64-core node, 4 tasks of 4 CPUs, srun binding none.
    #[test]
    fn a_slurm_job_cpuset_shared_by_its_tasks_is_capped_at_cpus_per_task() {
        assert_eq!(threads_for(Some(16), Some(64), 16, 4, Some(4)), 4);
    }

    #[test]
    fn a_cpu_quota_without_binding_is_shared() {
        // A container limited to 4 CPUs of a free 32-core host.
        assert_eq!(threads_for(Some(32), Some(32), 4, 2, None), 2);
    }
}
