//! Stopping a rank cleanly when something outside it goes wrong: a peer rank dies or hangs, NCCL
//! reports an error, or the job is cancelled. Whatever stops the rank writes its last two records
//! (`error`, then `end`) and exits with the documented code, so no rank trains on past the point
//! where its results mean anything and none hangs until the job's time limit.
//!
//! * **Signals.** SIGTERM, SIGINT and SIGHUP (what `mpirun` sends the surviving ranks when one
//!   dies, and what Slurm sends on `scancel` and at the time limit), SIGQUIT, and SIGUSR1 and
//!   SIGUSR2 (what `sbatch --signal` sends ahead of the time limit, and `mpirun` forwards; their
//!   default action would end the rank with no record) are handled on a thread of their own:
//!   `error` of class `terminated`, `end`, exit code 128 + the signal. The worker keeps no
//!   checkpoint, so there is nothing better to do with a warning than to stop with a record.
//! * **Stalls.** A watchdog thread stops the rank when no step has completed for too long: 300 s
//!   before the first step (start-up, NCCL set-up, the first step's autotuning), afterwards the
//!   larger of `--stall-timeout-s` (default 30 s) and ten times the longest step so far. A dead or
//!   frozen peer leaves the others blocked in a collective; this is how they notice. Class `comm`,
//!   exit code 4.
//! * **NCCL errors.** The watchdog also polls `ncclCommGetAsyncError` every half second.
//!
//! The main thread claims the end of the run before writing its own last records, so exactly one
//! of them writes `end`; a signal that comes while the main thread writes them waits (up to
//! [`MAIN_END_WAIT`]) for its `end` before it exits the process.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2};
use signal_hook::iterator::Signals;
use zerobench_schema::log::{End, ErrorClass, ErrorRecord, RunStatus};
use zerobench_schema::{Record, SCHEMA_VERSION};

use crate::logfile::RankLog;
use crate::metrics::memory::MemoryProbe;

/// Allowance before the first step completes.
const FIRST_STEP: Duration = Duration::from_secs(300);
const RUNNING: u8 = 0;
const MAIN_ENDING: u8 = 1;
const GUARD_STOPPING: u8 = 2;
/// The main thread has written its `end` record.
const MAIN_ENDED: u8 = 3;

/// The signals that stop a rank, with their names.
const STOP_SIGNALS: [(i32, &str); 6] = [
    (SIGTERM, "SIGTERM"),
    (SIGINT, "SIGINT"),
    (SIGHUP, "SIGHUP"),
    (SIGQUIT, "SIGQUIT"),
    (SIGUSR1, "SIGUSR1"),
    (SIGUSR2, "SIGUSR2"),
];

/// How long a signal that comes while the main thread writes its last records waits for them.
pub const MAIN_END_WAIT: Duration = Duration::from_secs(5);

/// How long a signal that comes before the rank's `start` record waits for it (the main thread
/// writes it moments after the guard starts), so that the log still begins with `start`.
const START_WAIT: Duration = Duration::from_secs(2);

/// The stop signals, caught (their default action would end the rank with no record) from
/// before the rank's log is created: one that comes before [`Guard::start`] waits for it, so a
/// rank signalled just after its log opened does not leave an empty log.
pub struct StopSignals(Signals);

impl StopSignals {
    pub fn catch() -> std::io::Result<StopSignals> {
        Ok(StopSignals(Signals::new(STOP_SIGNALS.map(|(sig, _)| sig))?))
    }
}

/// How often the watchdog looks.
const POLL: Duration = Duration::from_millis(500);

/// The NCCL communicators the watchdog polls: the world's and, with hpZ, the group's. Each is
/// registered by the NCCL backend and removed before it is destroyed, under this lock, so the
/// watchdog never polls a freed communicator.
static WATCHED_COMMS: Mutex<Vec<usize>> = Mutex::new(Vec::new());

fn watched() -> std::sync::MutexGuard<'static, Vec<usize>> {
    WATCHED_COMMS.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub fn watch_nccl(comm: usize) {
    watched().push(comm);
}

pub fn unwatch_nccl(comm: usize) {
    watched().retain(|&c| c != comm);
}

struct Inner {
    log: RankLog,
    rank: u32,
    started: Instant,
    /// Milliseconds since `started` at the last completed step.
    last_progress_ms: AtomicU64,
    longest_step_ms: AtomicU64,
    steps: AtomicU32,
    stall_timeout: Option<Duration>,
    /// RUNNING, MAIN_ENDING (the main thread writes the last records), MAIN_ENDED (it has
    /// written them) or GUARD_STOPPING.
    state: AtomicU8,
    /// The main thread has written the `start` record ([`Guard::start_logged`]).
    start_logged: AtomicBool,
    cuda_device: Mutex<Option<usize>>,
}

/// Keeps the rank's signal thread and watchdog running; dropping it stops neither (they end with
/// the process), but after [`Guard::claim_end`] they write nothing.
#[derive(Clone)]
pub struct Guard(Arc<Inner>);

impl Guard {
    /// Starts the signal thread (for `signals`, caught before) and the watchdog. `stall_timeout`
    /// `None` disables the stall check.
    pub fn start(
        StopSignals(mut signals): StopSignals,
        log: RankLog,
        rank: u32,
        stall_timeout: Option<Duration>,
    ) -> std::io::Result<Guard> {
        let inner = Arc::new(Inner {
            log,
            rank,
            started: Instant::now(),
            last_progress_ms: AtomicU64::new(0),
            longest_step_ms: AtomicU64::new(0),
            steps: AtomicU32::new(0),
            stall_timeout,
            state: AtomicU8::new(RUNNING),
            start_logged: AtomicBool::new(false),
            cuda_device: Mutex::new(None),
        });
        let on_signal = Arc::clone(&inner);
        thread::Builder::new().name("zb-signals".into()).spawn(move || {
            if let Some(sig) = signals.forever().next() {
                let name = STOP_SIGNALS.iter().find(|(s, _)| *s == sig).map_or("a signal", |(_, n)| *n);
                if on_signal.state.load(Ordering::SeqCst) != RUNNING && wait_for_main_end(&on_signal, MAIN_END_WAIT) {
                    // The run is over and its records written; the process is told to go,
                    // perhaps while stuck saying goodbye to a dead peer.
                    // SAFETY: _exit only ends the process.
                    unsafe { libc::_exit(128 + sig) }
                }
                let why = if sig == SIGUSR1 || sig == SIGUSR2 {
                    "a warning of the job's time limit (sbatch --signal) or a user's; the worker keeps no checkpoint, \
                     so it stops here"
                } else {
                    "the job was cancelled or reached its time limit, or the launcher stopped the ranks after another \
                     rank failed"
                };
                wait_for_start(&on_signal, START_WAIT);
                stop(&on_signal, ErrorClass::Terminated, format!("terminated by {name}: {why}"), 128 + sig);
            }
        })?;
        let watched = Arc::clone(&inner);
        thread::Builder::new().name("zb-watchdog".into()).spawn(move || watchdog(&watched))?;
        Ok(Guard(inner))
    }

    /// A step completed after `step_ms`.
    pub fn progress(&self, step_ms: f64) {
        let i = &self.0;
        i.last_progress_ms.store(i.started.elapsed().as_millis() as u64, Ordering::Relaxed);
        i.longest_step_ms.fetch_max(step_ms.ceil() as u64, Ordering::Relaxed);
        i.steps.fetch_add(1, Ordering::Relaxed);
    }

    /// The GPU whose allocator statistics an error record should carry.
    pub fn set_cuda_device(&self, dev: Option<usize>) {
        *self.0.cuda_device.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = dev;
    }

    /// The main thread is about to write the run's last records: returns `false` if the guard is
    /// already stopping the rank (then the main thread writes nothing and waits to be exited).
    pub fn claim_end(&self) -> bool {
        self.0.state.compare_exchange(RUNNING, MAIN_ENDING, Ordering::SeqCst, Ordering::SeqCst).is_ok()
    }

    /// The main thread has written the rank's `start` record.
    pub fn start_logged(&self) {
        self.0.start_logged.store(true, Ordering::SeqCst);
    }

    /// The main thread has written its last records (after [`Guard::claim_end`]).
    pub fn ended(&self) {
        let _ = self.0.state.compare_exchange(MAIN_ENDING, MAIN_ENDED, Ordering::SeqCst, Ordering::SeqCst);
    }
}

/// Waits up to `limit` for the main thread, which has claimed the end, to write it; `false` if the
/// guard is stopping the rank itself (a second signal: the first one's records are being
/// written). Past `limit` it gives up, `true`: the main thread is stuck, and the process goes.
fn wait_for_main_end(i: &Inner, limit: Duration) -> bool {
    let ended = || match i.state.load(Ordering::SeqCst) {
        MAIN_ENDED => Some(true),
        GUARD_STOPPING => Some(false),
        _ => None,
    };
    poll(limit, ended).unwrap_or(true)
}

/// Waits up to `limit` for the main thread to write the `start` record.
fn wait_for_start(i: &Inner, limit: Duration) {
    let _ = poll(limit, || i.start_logged.load(Ordering::SeqCst).then_some(()));
}

/// Asks `ready` every 5 ms until it answers or `limit` has passed (`None`).
fn poll<T>(limit: Duration, ready: impl Fn() -> Option<T>) -> Option<T> {
    let t = Instant::now();
    loop {
        if let Some(v) = ready() {
            return Some(v);
        }
        if t.elapsed() >= limit {
            return None;
        }
        thread::sleep(Duration::from_millis(5));
    }
}

/// The stall limit after `steps` steps whose longest took `longest_ms`.
fn stall_limit(base: Duration, steps: u32, longest_ms: u64) -> Duration {
    if steps == 0 {
        FIRST_STEP.max(base)
    } else {
        base.max(Duration::from_millis(longest_ms.saturating_mul(10)))
    }
}

fn watchdog(i: &Inner) {
    loop {
        thread::sleep(POLL);
        if i.state.load(Ordering::SeqCst) != RUNNING {
            return;
        }
        if let Some(msg) = nccl_async_error() {
            stop(i, ErrorClass::Comm, msg, 4);
        }
        if let Some(base) = i.stall_timeout {
            let since =
                i.started.elapsed().saturating_sub(Duration::from_millis(i.last_progress_ms.load(Ordering::Relaxed)));
            let steps = i.steps.load(Ordering::Relaxed);
            let limit = stall_limit(base, steps, i.longest_step_ms.load(Ordering::Relaxed));
            if since > limit {
                stop(
                    i,
                    ErrorClass::Comm,
                    format!(
                        "no progress for {} s (limit {} s) after {steps} step(s): a peer rank has probably died or hung",
                        since.as_secs(),
                        limit.as_secs()
                    ),
                    4,
                );
            }
        }
    }
}

/// The first error NCCL has recorded on a watched communicator, if any.
fn nccl_async_error() -> Option<String> {
    use cudarc::nccl::sys;
    let comms = watched();
    comms.iter().find_map(|&comm| {
        let mut state = sys::ncclResult_t::ncclSuccess;
        // SAFETY: a communicator is registered only while alive (see `unwatch_nccl`), and the
        // lock is held during the call.
        let rc = unsafe { sys::ncclCommGetAsyncError(comm as sys::ncclComm_t, &mut state) };
        match (rc, state) {
            (sys::ncclResult_t::ncclSuccess, sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress) => {
                None
            }
            (sys::ncclResult_t::ncclSuccess, e) => Some(format!("NCCL reported an asynchronous error: {e:?}")),
            (e, _) => Some(format!("ncclCommGetAsyncError failed: {e:?}")),
        }
    })
}

/// Writes `error` and `end` and exits the process, once.
fn stop(i: &Inner, class: ErrorClass, message: String, exit_code: i32) {
    if i.state.compare_exchange(RUNNING, GUARD_STOPPING, Ordering::SeqCst, Ordering::SeqCst).is_err() {
        return;
    }
    let steps = i.steps.load(Ordering::Relaxed);
    let ts = crate::logfile::now_ts();
    let device = *i.cuda_device.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let error = ErrorRecord {
        v: SCHEMA_VERSION,
        ts,
        rank: i.rank,
        class,
        message: message.clone(),
        step: Some(steps),
        requested_bytes: None,
        memory: Some(MemoryProbe::new(device).sample()),
    };
    let status = RunStatus::Failed;
    let end = End { v: SCHEMA_VERSION, ts, rank: i.rank, status, steps_completed: steps, exit_code, summary: None };
    i.log.write_last(&[Record::Error(error), Record::End(end)], Duration::from_secs(2));
    crate::say!("zerobench-worker: rank {}: {message}", i.rank);
    // No unwinding and no destructors: other threads may be blocked inside MPI or CUDA.
    // SAFETY: _exit only ends the process.
    unsafe { libc::_exit(exit_code) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_answers_at_once_or_gives_up_past_its_limit() {
        assert_eq!(poll(Duration::ZERO, || Some(3)), Some(3), "asked once, even with no time");
        let calls = std::cell::Cell::new(0);
        let count = || {
            calls.set(calls.get() + 1);
            (calls.get() == 3).then_some("third")
        };
        assert_eq!(poll(Duration::from_secs(60), count), Some("third"));
        calls.set(0);
        let never = || {
            calls.set(calls.get() + 1);
            None::<()>
        };
        // Past its limit only, and having asked again meanwhile (a limit of 300 ms leaves room
        // for more than one 5 ms wait however slowly a loaded host schedules the test).
        let (limit, t) = (Duration::from_millis(300), Instant::now());
        assert_eq!(poll(limit, never), None);
        assert!(t.elapsed() >= limit, "gave up after {:?}", t.elapsed());
        assert!(calls.get() >= 2, "asked again before the limit: {}", calls.get());
    }

    #[test]
    fn stall_limit_grows_with_the_longest_step() {
        let base = Duration::from_secs(30);
        assert_eq!(stall_limit(base, 0, 0), FIRST_STEP);
        assert_eq!(stall_limit(base, 5, 100), base);
        assert_eq!(stall_limit(base, 5, 10_000), Duration::from_secs(100));
        assert_eq!(stall_limit(Duration::from_secs(600), 0, 0), Duration::from_secs(600));
    }

    fn inner(dir: &std::path::Path, state: u8) -> Arc<Inner> {
        Arc::new(Inner {
            log: RankLog::create(dir, 0, false).unwrap(),
            rank: 0,
            started: Instant::now(),
            last_progress_ms: AtomicU64::new(0),
            longest_step_ms: AtomicU64::new(0),
            steps: AtomicU32::new(0),
            stall_timeout: None,
            state: AtomicU8::new(state),
            start_logged: AtomicBool::new(true),
            cuda_device: Mutex::new(None),
        })
    }

    /// A signal while the main thread writes its last records waits for them, not longer than
    /// its limit, and leaves the guard's own stop alone.
    #[test]
    fn a_signal_during_the_main_threads_end_waits_for_it() {
        let tmp = tempfile::tempdir().unwrap();
        let i = inner(tmp.path(), RUNNING);
        let main = Guard(Arc::clone(&i));
        assert!(main.claim_end());
        let writer = thread::spawn(move || {
            thread::sleep(Duration::from_millis(200));
            main.ended();
        });
        let t = Instant::now();
        assert!(wait_for_main_end(&i, Duration::from_secs(20)));
        let waited = t.elapsed();
        writer.join().unwrap();
        assert!(waited >= Duration::from_millis(200), "returned before the end was written: {waited:?}");
        assert_eq!(i.state.load(Ordering::SeqCst), MAIN_ENDED);

        // A main thread stuck before its `end`: the wait gives up at its limit.
        let stuck = inner(&tmp.path().join("stuck"), MAIN_ENDING);
        let t = Instant::now();
        assert!(wait_for_main_end(&stuck, Duration::from_millis(100)));
        assert!(t.elapsed() >= Duration::from_millis(100));

        // The guard stopping the rank already: the signal does not exit over its records.
        let stopping = inner(&tmp.path().join("stopping"), GUARD_STOPPING);
        assert!(!wait_for_main_end(&stopping, Duration::from_secs(20)));
        // `ended` only follows a claimed end.
        Guard(Arc::clone(&stopping)).ended();
        assert_eq!(stopping.state.load(Ordering::SeqCst), GUARD_STOPPING);
    }

    /// With hpZ a rank has two communicators: registering the group's must not stop the world's
    /// from being polled, and destroying one must leave the other watched.
    #[test]
    fn every_registered_communicator_stays_watched_until_its_own_removal() {
        watch_nccl(0x1000);
        watch_nccl(0x2000);
        assert!(watched().contains(&0x1000) && watched().contains(&0x2000));
        unwatch_nccl(0x1000);
        assert!(!watched().contains(&0x1000) && watched().contains(&0x2000));
        unwatch_nccl(0x2000);
        assert!(!watched().contains(&0x2000));
    }
}
