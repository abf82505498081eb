//! What a rank says when it dies of a fatal signal.
//!
//! A crash inside native code (libtorch, MPI, NCCL, the shim) would otherwise end a rank in
//! silence. Rust's runtime handles SIGSEGV and SIGBUS itself (to report stack overflows), so Open
//! MPI, which reports a crash only where no handler is installed, stays quiet about them, and the
//! job's output says no more than Slurm's "task 0: Segmentation fault". [`install`] puts a handler
//! in front for SIGSEGV, SIGBUS, SIGILL, SIGFPE and SIGABRT that writes, to stderr:
//!
//! ```text
//! zerobench-worker: rank 0 (pid 4242): fatal SIGSEGV at address 0x0 on thread 'zerobench-worke'
//! zerobench-worker: native frames (addr2line -Cfie <binary> +OFFSET names the worker's own):
//! /work/target/release/zerobench-worker(+0x3c2d1)[0x55d1c0a3c2d1]
//! ...
//! ```
//!
//! and then lets the signal end the process as it would have: the handler that was there before
//! runs (Rust's stack-overflow report among them), and the exit status still names the signal.
//! A signal sent by another process (`kill -SEGV`) says who sent it instead of an address.
//!
//! Hand-written on libc: a signal handler may only do async-signal-safe work, which rules out
//! the crates that capture symbolised backtraces (they allocate and take locks). Here nothing
//! allocates: numbers are formatted into a buffer on the stack and written with write(2), the
//! frames come from glibc's backtrace(3) and backtrace_symbols_fd(3), and backtrace(3) is called
//! once in [`install`] because its first call loads libgcc_s.
//!
//! The unwinder needs more stack than the signal stacks Rust gives its threads (11,952 bytes on
//! the x86-64 build host, the kernel's signal frame among them): unwinding there faulted inside
//! the handler, and the process died as silently as before. So the handler writes frames only where there is room: on
//! a thread's own stack (libtorch's and MPI's threads have no signal stack) or on a signal stack
//! of [`SIGNAL_STACK`] bytes, which [`install`] gives the main thread and
//! [`signal_stack_for_this_thread`] the worker's other long-lived threads. Elsewhere the report
//! is its first line and a note.

use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::OnceLock;

/// The signals that end a process with a report.
const SIGNALS: [(c_int, &str); 5] = [
    (libc::SIGSEGV, "SIGSEGV"),
    (libc::SIGBUS, "SIGBUS"),
    (libc::SIGILL, "SIGILL"),
    (libc::SIGFPE, "SIGFPE"),
    (libc::SIGABRT, "SIGABRT"),
];

/// Frames written at most: deep enough for libtorch's autograd engine under the training loop.
const FRAMES: usize = 64;

/// The signal stack a thread needs for the report's frames; plenty for the unwinder.
pub const SIGNAL_STACK: usize = 256 << 10;

/// The rank, once the ranks have met (-1 before).
static RANK: AtomicI64 = AtomicI64::new(-1);

/// The actions in place before [`install`], in the order of [`SIGNALS`].
static PREVIOUS: OnceLock<[libc::sigaction; SIGNALS.len()]> = OnceLock::new();

/// Installs the report for this process; later calls do nothing. Fails only if sigaction(2) does.
pub fn install() -> std::io::Result<()> {
    if PREVIOUS.get().is_some() {
        return Ok(());
    }
    signal_stack_for_this_thread()?;
    // backtrace(3) loads libgcc_s on its first call, which must not happen in a handler.
    let mut frames = [std::ptr::null_mut::<c_void>(); 1];
    // SAFETY: the buffer holds the one frame asked for.
    unsafe { libc::backtrace(frames.as_mut_ptr(), 1) };
    // SAFETY: a zeroed sigaction is a valid value of the type; each is filled by sigaction(2)
    // before it is read.
    let mut previous: [libc::sigaction; SIGNALS.len()] = unsafe { std::mem::zeroed() };
    for ((sig, _), old) in SIGNALS.iter().zip(previous.iter_mut()) {
        // SAFETY: reading the current action into valid storage.
        if unsafe { libc::sigaction(*sig, std::ptr::null(), old) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    // Stored before any handler can run, so the handler always finds them.
    let _ = PREVIOUS.set(previous);
    for (sig, _) in SIGNALS {
        // SAFETY: as above; the mask is emptied before use.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = on_fatal as *const () as libc::sighandler_t;
        // SA_ONSTACK: a stack overflow leaves no room on the thread's own stack (Rust gives its
        // threads an alternate one). SA_RESETHAND: a fault inside the handler ends the process.
        action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESETHAND;
        // SAFETY: valid pointers to initialised values.
        unsafe { libc::sigemptyset(&mut action.sa_mask) };
        // SAFETY: installs a handler that only does async-signal-safe work.
        if unsafe { libc::sigaction(sig, &action, std::ptr::null_mut()) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Gives the calling thread a signal stack of [`SIGNAL_STACK`] bytes (and a guard page below
/// it), so that a crash on it is reported with its frames. The stack stays mapped for the rest
/// of the process: call this on threads that live as long as the run.
pub fn signal_stack_for_this_thread() -> std::io::Result<()> {
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    // SAFETY: a fresh private anonymous mapping; nothing else refers to it.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            SIGNAL_STACK + page,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the first page of the mapping just made; an overflow of the stack faults there.
    if unsafe { libc::mprotect(base, page, libc::PROT_NONE) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let stack = libc::stack_t {
        // SAFETY: within the mapping, past the guard page.
        ss_sp: unsafe { base.cast::<u8>().add(page) }.cast(),
        ss_flags: 0,
        ss_size: SIGNAL_STACK,
    };
    // SAFETY: a valid, mapped stack of the given size. Rust's runtime unmaps the small stack it
    // made for this thread when the thread ends, whichever stack is then installed.
    if unsafe { libc::sigaltstack(&stack, std::ptr::null_mut()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Whether the handler runs where the unwinder has room: on the thread's own stack, or on a
/// signal stack of at least [`SIGNAL_STACK`] bytes.
fn room_to_unwind() -> bool {
    // SAFETY: a zeroed stack_t is valid storage for sigaltstack(2) to fill.
    let mut current: libc::stack_t = unsafe { std::mem::zeroed() };
    // SAFETY: queries only; sigaltstack(2) is a system call, safe in a handler.
    if unsafe { libc::sigaltstack(std::ptr::null(), &mut current) } != 0 {
        return false;
    }
    current.ss_flags & libc::SS_ONSTACK == 0 || current.ss_size >= SIGNAL_STACK
}

/// The rank this process is, for the report.
pub fn set_rank(rank: u32) {
    RANK.store(i64::from(rank), Ordering::Relaxed);
}

extern "C" fn on_fatal(sig: c_int, info: *mut libc::siginfo_t, _context: *mut c_void) {
    // Installed only for SIGNALS, so the signal is one of them.
    let index = SIGNALS.iter().position(|(s, _)| *s == sig);
    let name = index.map_or("signal", |i| SIGNALS[i].1);
    let mut line = Line::new();
    line.push(b"zerobench-worker: rank ");
    match RANK.load(Ordering::Relaxed) {
        r if r >= 0 => line.number(r as u64, 10),
        _ => line.push(b"?"),
    }
    line.push(b" (pid ");
    // SAFETY: getpid has no preconditions.
    line.number(unsafe { libc::getpid() } as u64, 10);
    line.push(b"): fatal ");
    line.push(name.as_bytes());
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let info = unsafe { &*info };
    let sent = info.si_code <= 0;
    if sent {
        // SI_USER, SI_TKILL, SI_QUEUE: another process, or this one, sent it.
        line.push(b" sent by pid ");
        // SAFETY: si_pid is set for signals sent by a process.
        line.number(unsafe { info.si_pid() } as u64, 10);
    } else if sig != libc::SIGABRT {
        line.push(b" at address 0x");
        // SAFETY: si_addr is set for the faults (SIGSEGV, SIGBUS, SIGILL, SIGFPE).
        line.number(unsafe { info.si_addr() } as u64, 16);
    }
    line.push(b" on thread '");
    let mut thread = [0u8; 16];
    // SAFETY: PR_GET_NAME writes at most 16 bytes, NUL-terminated.
    if unsafe { libc::prctl(libc::PR_GET_NAME, thread.as_mut_ptr()) } == 0 {
        line.push(&thread[..thread.iter().position(|&b| b == 0).unwrap_or(thread.len())]);
    }
    if room_to_unwind() {
        line.push(b"'\nzerobench-worker: native frames (addr2line -Cfie <binary> +OFFSET names the worker's own):\n");
        line.write();
        let mut frames = [std::ptr::null_mut::<c_void>(); FRAMES];
        // SAFETY: the buffer holds FRAMES entries; backtrace_symbols_fd writes to stderr without
        // allocating (glibc's documentation).
        unsafe {
            let n = libc::backtrace(frames.as_mut_ptr(), FRAMES as c_int);
            libc::backtrace_symbols_fd(frames.as_ptr(), n, libc::STDERR_FILENO);
        }
    } else {
        line.push(b"'\nzerobench-worker: no native frames: this thread's signal stack is too small to unwind on\n");
        line.write();
    }

    // Let the signal do what it would have done without this report.
    let previous = PREVIOUS.get().zip(index).map(|(p, i)| &p[i]);
    let faulted = !sent && sig != libc::SIGABRT;
    match previous {
        // A fault: with the previous action back, returning re-runs the faulting instruction,
        // which faults again into that action (Rust's checks for a stack overflow first).
        Some(old) if faulted => {
            // SAFETY: restores the action read in `install`.
            unsafe { libc::sigaction(sig, old, std::ptr::null_mut()) };
        }
        // Sent, or an abort: SA_RESETHAND put the default action back when this handler was
        // entered, so the signal sent again to this thread (blocked until the handler returns)
        // ends the process as it would have. abort(3) would raise it again anyway. Through the
        // raw system calls: after a stack overflow's report, Rust's abort runs this handler again
        // nested on the same signal stack, where the few hundred bytes that glibc's signal(3)
        // and raise(3) put on it (actions, signal sets) overflowed it on a host whose CPU state
        // makes signal frames large, and the process died of SIGSEGV instead of SIGABRT.
        _ => {
            // SAFETY: gettid, getpid and tgkill are system calls, async-signal-safe.
            unsafe {
                let tid = libc::syscall(libc::SYS_gettid);
                libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, sig);
            }
        }
    }
}

/// One report line, built on the stack.
struct Line {
    buf: [u8; 512],
    len: usize,
}

impl Line {
    fn new() -> Self {
        Self { buf: [0; 512], len: 0 }
    }

    /// Appends what fits; the rest is cut off.
    fn push(&mut self, bytes: &[u8]) {
        let n = bytes.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&bytes[..n]);
        self.len += n;
    }

    /// Appends `v` in base `radix` (10 or 16), lower-case.
    fn number(&mut self, mut v: u64, radix: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b"0123456789abcdef"[(v % radix) as usize];
            v /= radix;
            if v == 0 {
                break;
            }
        }
        self.push(&digits[i..]);
    }

    fn write(&self) {
        let mut done = 0;
        while done < self.len {
            // SAFETY: writes initialised bytes of the buffer; write(2) is async-signal-safe.
            let n = unsafe { libc::write(libc::STDERR_FILENO, self.buf[done..].as_ptr().cast(), self.len - done) };
            if n <= 0 {
                return;
            }
            done += n as usize;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;
    use std::process::Command;

    use super::*;

    /// The text of `line` after `f` wrote into it.
    fn text(f: impl FnOnce(&mut Line)) -> String {
        let mut l = Line::new();
        f(&mut l);
        String::from_utf8(l.buf[..l.len].to_vec()).unwrap()
    }

    #[test]
    fn numbers_are_formatted_without_allocating() {
        assert_eq!(text(|l| l.number(0, 10)), "0");
        assert_eq!(text(|l| l.number(u64::MAX, 10)), u64::MAX.to_string());
        assert_eq!(text(|l| l.number(0, 16)), "0");
        assert_eq!(text(|l| l.number(0x7f3a_0000_beef, 16)), "7f3a0000beef");
        assert_eq!(text(|l| l.number(u64::MAX, 16)), "ffffffffffffffff");
        // A line longer than the buffer is cut off, not overrun.
        let long = text(|l| (0..100).for_each(|_| l.push(b"0123456789")));
        assert_eq!(long.len(), 512);
    }

    /// The way the child dies, selected by the parent through this variable.
    const CHILD: &str = "ZEROBENCH_FATAL_TEST_CHILD";

    /// Runs [`child`] in a copy of this test binary that dies the way `how` says; returns its
    /// signal and stderr.
    fn die(how: &str) -> (Option<i32>, String) {
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "runtime::fatal::tests::child", "--ignored", "--nocapture", "--test-threads=1"])
            .env(CHILD, how)
            .output()
            .unwrap();
        (out.status.signal(), String::from_utf8_lossy(&out.stderr).into_owned())
    }

    #[test]
    #[ignore = "the process that dies for the tests below; they run it in a child"]
    fn child() {
        let Ok(how) = std::env::var(CHILD) else { return };
        install().unwrap();
        install().unwrap(); // a second call keeps the first's previous actions
        set_rank(3);
        std::thread::Builder::new()
            .name("zb-crasher".into())
            .spawn(move || match how.as_str() {
                "null" => {
                    signal_stack_for_this_thread().unwrap();
                    // SAFETY: none; the point is the fault.
                    unsafe { std::ptr::read_volatile(std::ptr::null::<u8>()) };
                }
                // On the signal stack Rust made for the thread.
                // SAFETY: none; the point is the fault.
                "null-small-stack" => unsafe {
                    std::ptr::read_volatile(std::ptr::null::<u8>());
                },
                // SAFETY: raise is always safe to call.
                "raise" => unsafe {
                    libc::raise(libc::SIGSEGV);
                },
                "abort" => std::process::abort(),
                "overflow" => {
                    #[allow(unconditional_recursion)]
                    fn deeper(n: u64) -> u64 {
                        let pad = std::hint::black_box([n; 512]);
                        pad[0] + deeper(n + 1)
                    }
                    std::hint::black_box(deeper(0));
                }
                other => panic!("unknown way to die: {other}"),
            })
            .unwrap()
            .join()
            .unwrap();
        unreachable!("the child should have died");
    }

    #[test]
    fn a_fault_is_reported_then_ends_the_process_as_segv() {
        let (signal, err) = die("null");
        assert_eq!(signal, Some(libc::SIGSEGV), "{err}");
        assert!(err.contains("zerobench-worker: rank 3 (pid "), "{err}");
        assert!(err.contains("): fatal SIGSEGV at address 0x0 on thread 'zb-crasher'\n"), "{err}");
        assert!(err.contains("native frames"), "{err}");
        // At least the handler's and the crasher's frames, as glibc writes them.
        let frames = err.lines().filter(|l| l.contains("[0x") && l.ends_with(']')).count();
        assert!(frames >= 2, "{err}");
    }

    #[test]
    fn without_room_to_unwind_the_report_says_so_and_the_fault_still_ends_the_process() {
        let (signal, err) = die("null-small-stack");
        assert_eq!(signal, Some(libc::SIGSEGV), "{err}");
        assert!(err.contains("): fatal SIGSEGV at address 0x0 on thread 'zb-crasher'\n"), "{err}");
        assert!(err.contains("no native frames: this thread's signal stack is too small"), "{err}");
    }

    #[test]
    fn a_sent_signal_names_its_sender() {
        let (signal, err) = die("raise");
        assert_eq!(signal, Some(libc::SIGSEGV), "{err}");
        assert!(err.contains("): fatal SIGSEGV sent by pid "), "{err}");
        assert!(!err.contains("at address"), "{err}");
    }

    #[test]
    fn an_abort_is_reported_and_still_aborts() {
        let (signal, err) = die("abort");
        assert_eq!(signal, Some(libc::SIGABRT), "{err}");
        assert!(err.contains("): fatal SIGABRT"), "{err}");
    }

    #[test]
    fn rusts_stack_overflow_report_still_follows() {
        let (signal, err) = die("overflow");
        assert_eq!(signal, Some(libc::SIGABRT), "{err}");
        let ours = err.find("fatal SIGSEGV at address").unwrap_or_else(|| panic!("{err}"));
        let rusts = err.find("has overflowed its stack").unwrap_or_else(|| panic!("{err}"));
        assert!(ours < rusts, "{err}");
    }
}
