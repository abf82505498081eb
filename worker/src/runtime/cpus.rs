//! Where a rank's threads run: how many threads it computes with (libtorch's intra-op pool, the
//! CPU AdamW of offload), and the one CPU its launching threads share on a GPU.
//!
//! A launcher either gives each rank cores of its own (`srun --cpus-per-task`, Open MPI's
//! `--map-by ...:PE=N`: the rank's CPU affinity is a subset of the host) or leaves every rank free
//! on the whole host (`--bind-to none`), where the node's ranks share the cores. Dividing a rank's
//! own cores among the node's ranks again would leave most of them idle; using all of the host's
//! cores in every rank would oversubscribe them. A Slurm job confined to its CPUs without
//! per-task binding looks like the first case to every rank (a subset of the host, the same one);
//! inside a step, `SLURM_CPUS_PER_TASK` caps each rank at its share then.
//!
//! **The launching threads** (`--launch-cpu`). A GPU step is launched from two threads: this one
//! (forward, the optimizer) and libtorch's autograd thread for the GPU, which runs every backward
//! pass. The trainer hands its backward to that thread once per micro-step (train.rs runs the
//! segments from there), and each hand-over wakes a thread that is usually asleep on another CPU:
//! slow on a virtual machine. `--launch-cpu auto` puts both threads on one CPU of the rank's share
//! from the first backward pass on. Measured on 1×H100 VMs while the trainer still handed over
//! every segment (docs/worker.md): launch-bound steps took 0.65-1.04× as long as free (median of
//! runs, per configuration), device-bound and offloaded ones 0.98-1.00×; but runs of one
//! configuration spread up to twice as far (largest median over smallest 1.14-1.23 against
//! 1.11-1.13), likely because a thread pinned to a CPU the hypervisor is slow to run cannot move
//! off it. Measurements have to repeat, so the default is `none`. Threads created before the
//! pinning (the log writer, the rayon pool, offload's host thread, NCCL's) keep the rank's whole
//! affinity; libtorch's intra-op pool is started first so that its threads do too (a thread
//! inherits its creator's affinity).

use std::io;
use std::str::FromStr;

use zerobench_schema::ranges::ranges;

/// The prefix of libtorch's autograd threads' names (`pt_autograd_<device>`, one per visible
/// GPU, started by the first backward pass that touches a GPU).
pub const AUTOGRAD_THREAD_PREFIX: &str = "pt_autograd_";

/// `--launch-cpu`: where a GPU rank's launching threads run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaunchCpu {
    /// One CPU of the rank's share: the last of its slice of the CPUs it may run on.
    Auto,
    /// Free on every CPU the rank may run on, as any other thread.
    Free,
    /// This CPU, which must be one the rank may run on.
    Cpu(usize),
}

impl FromStr for LaunchCpu {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "none" => Ok(Self::Free),
            n => n.parse().map(Self::Cpu).map_err(|_| format!("'{n}' is not auto, none or a CPU number")),
        }
    }
}

/// Why the launching threads could not be given their CPU.
#[derive(Debug, thiserror::Error)]
pub enum CpuError {
    #[error("--launch-cpu {cpu} is not among the CPUs this rank may run on ({allowed})")]
    NotAllowed { cpu: usize, allowed: String },
    #[error("cannot read this process's CPU affinity")]
    NoAffinity,
    #[error("no thread named {prefix}* in this process to pin: has libtorch renamed its autograd threads?")]
    NoThread { prefix: &'static str },
    #[error("cannot list this process's threads: {0}")]
    Threads(io::Error),
    #[error("cannot pin thread {tid} to CPU {cpu}: {source}")]
    Pin { tid: i32, cpu: usize, source: io::Error },
}

/// The CPU a GPU rank's launching threads are to run on, or None when left free: the rank's
/// slice of the CPUs it may run on, by local rank (ranks free on a host get different CPUs; ranks
/// bound to cores of their own get one of theirs), and of that slice the last CPU (on the H100
/// host whose /proc/stat was read, CPU 0 handled most soft interrupts and CPU 15 none).
pub fn launch_cpu(choice: LaunchCpu, local_rank: u32, local_size: u32) -> Result<Option<usize>, CpuError> {
    let allowed = affinity_of(0).ok_or(CpuError::NoAffinity)?;
    choose(choice, &allowed, local_rank, local_size)
}

fn choose(choice: LaunchCpu, allowed: &[usize], local_rank: u32, local_size: u32) -> Result<Option<usize>, CpuError> {
    match choice {
        LaunchCpu::Free => Ok(None),
        LaunchCpu::Cpu(cpu) if allowed.contains(&cpu) => Ok(Some(cpu)),
        LaunchCpu::Cpu(cpu) => Err(CpuError::NotAllowed { cpu, allowed: ranges(allowed) }),
        LaunchCpu::Auto => {
            let (n, size) = (allowed.len(), local_size.max(1) as usize);
            let end = ((local_rank as usize % size + 1) * n / size).max(1);
            Ok(allowed.get(end - 1).copied())
        }
    }
}

/// Pins the calling thread and libtorch's autograd threads to `cpu`; returns how many autograd
/// threads it found. Call it after a backward pass on the GPU (which starts them).
pub fn pin_launch_threads(cpu: usize) -> Result<usize, CpuError> {
    // The intra-op pool starts with its first parallel region, from this thread: start it now,
    // while this thread may still run anywhere, or its threads would all share `cpu`.
    let _ = tch::Tensor::ones([1 << 17], (tch::Kind::Float, tch::Device::Cpu)).sum(tch::Kind::Float);
    pin_named(AUTOGRAD_THREAD_PREFIX, cpu)
}

/// Pins the calling thread and every thread of this process whose name starts with `prefix`.
fn pin_named(prefix: &'static str, cpu: usize) -> Result<usize, CpuError> {
    let named: Vec<i32> = std::fs::read_dir("/proc/self/task")
        .map_err(CpuError::Threads)?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|tid: &i32| {
            std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")).is_ok_and(|c| c.starts_with(prefix))
        })
        .collect();
    if named.is_empty() {
        return Err(CpuError::NoThread { prefix });
    }
    // SAFETY: gettid has no preconditions.
    let me = unsafe { libc::gettid() };
    for &tid in named.iter().chain([&me]) {
        pin(tid, cpu)?;
    }
    Ok(named.len())
}

fn pin(tid: i32, cpu: usize) -> Result<(), CpuError> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET stays within it for cpu < CPU_SETSIZE,
    // which every CPU this process may run on is.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(CpuError::Pin { tid, cpu, source: io::Error::last_os_error() })
    }
}

/// The CPUs thread `tid` of this process (0: the calling thread) may run on, in increasing order.
fn affinity_of(tid: i32) -> Option<Vec<usize>> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the kernel fills it, and CPU_ISSET reads
    // within it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        (libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0)
            .then(|| (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect())
    }
}

/// The rank's default thread count.
pub fn default_threads(local_size: u32) -> u32 {
    let usable = std::thread::available_parallelism().map_or(1, |n| n.get()); // affinity and CPU quota
    let per_task = std::env::var("SLURM_CPUS_PER_TASK").ok().and_then(|v| v.trim().parse().ok());
    threads_for(affinity_of(0).map(|cpus| cpus.len()), online_cpus(), usable, local_size, per_task)
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

/// The CPUs online on this host (not only this process's).
pub fn online_cpus() -> Option<usize> {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).ok().filter(|&n| n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn the_launch_cpu_is_the_last_of_the_ranks_share() {
        let host: Vec<usize> = (0..16).collect();
        assert_eq!(choose(LaunchCpu::Auto, &host, 0, 1).unwrap(), Some(15));
        assert_eq!(choose(LaunchCpu::Auto, &host, 0, 2).unwrap(), Some(7));
        assert_eq!(choose(LaunchCpu::Auto, &host, 1, 2).unwrap(), Some(15));
        // Bound to cores of its own by the launcher: one of them, whatever its local rank.
        assert_eq!(choose(LaunchCpu::Auto, &[8, 9, 10, 11], 1, 2).unwrap(), Some(11));
        // Not contiguous, fewer CPUs than ranks: still one the rank may run on.
        assert_eq!(choose(LaunchCpu::Auto, &[2, 3, 8, 9], 0, 2).unwrap(), Some(3));
        assert_eq!(choose(LaunchCpu::Auto, &[2, 3], 0, 4).unwrap(), Some(2));
        assert_eq!(choose(LaunchCpu::Auto, &[2, 3], 3, 4).unwrap(), Some(3));
        assert_eq!(choose(LaunchCpu::Free, &host, 0, 1).unwrap(), None);
        assert_eq!(choose(LaunchCpu::Cpu(4), &host, 0, 1).unwrap(), Some(4));
    }

    #[test]
    fn a_launch_cpu_the_rank_may_not_run_on_is_refused() {
        let e = choose(LaunchCpu::Cpu(5), &[0, 1, 2, 3, 8], 0, 1).unwrap_err();
        assert_eq!(e.to_string(), "--launch-cpu 5 is not among the CPUs this rank may run on (0-3,8)");
    }

    #[test]
    fn launch_cpu_parses_auto_none_and_numbers() {
        assert_eq!("auto".parse::<LaunchCpu>(), Ok(LaunchCpu::Auto));
        assert_eq!("none".parse::<LaunchCpu>(), Ok(LaunchCpu::Free));
        assert_eq!("7".parse::<LaunchCpu>(), Ok(LaunchCpu::Cpu(7)));
        assert!("-1".parse::<LaunchCpu>().is_err());
        assert!("all".parse::<LaunchCpu>().is_err());
    }

    /// The named threads and the caller end up on the one CPU; other threads keep theirs.
    #[test]
    fn pinning_moves_the_named_threads_and_the_caller_only() {
        use std::sync::mpsc::{channel, Sender};
        let cpu = *affinity_of(0).unwrap().last().unwrap();
        // Each thread sends its id, then waits until its sender of `stop` is dropped.
        let spawn = |name: &str| -> (i32, Sender<()>, std::thread::JoinHandle<()>) {
            let (tid_tx, tid_rx) = channel();
            let (stop, wait) = channel::<()>();
            let t = std::thread::Builder::new()
                .name(name.into())
                .spawn(move || {
                    // SAFETY: gettid has no preconditions.
                    tid_tx.send(unsafe { libc::gettid() }).unwrap();
                    let _ = wait.recv();
                })
                .unwrap();
            (tid_rx.recv().unwrap(), stop, t)
        };
        let (named, stop_a, a) = spawn("zbtest_pin_a");
        let (other, stop_b, b) = spawn("zbtest_other");
        let other_before = affinity_of(other).unwrap();
        let pinned = std::thread::spawn(move || {
            let n = pin_named("zbtest_pin", cpu).unwrap();
            // SAFETY: gettid has no preconditions.
            (n, affinity_of(unsafe { libc::gettid() }).unwrap())
        })
        .join()
        .unwrap();
        assert_eq!(pinned, (1, vec![cpu]), "one named thread, and the caller on the CPU");
        assert_eq!(affinity_of(named).unwrap(), vec![cpu]);
        assert_eq!(affinity_of(other).unwrap(), other_before);
        drop((stop_a, stop_b));
        a.join().unwrap();
        b.join().unwrap();
    }

    #[test]
    fn pinning_without_the_named_threads_is_an_error() {
        let e = pin_named("zbtest_nobody", 0).unwrap_err();
        assert!(e.to_string().starts_with("no thread named zbtest_nobody* in this process"), "{e}");
    }
}
