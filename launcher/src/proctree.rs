//! The processes a run started, found through `/proc`, and stopping them all.
//!
//! A run's script is started in a process group of its own, but `mpirun` may put its ranks in
//! process groups of theirs, so signalling the script's group does not reach them. The tree of
//! processes under the script (by parent pid) does: each member is signalled, SIGTERM first and
//! SIGKILL to those left after a grace period. A pid is signalled the second time only if it still
//! names the process seen the first time (same start time), so a pid reused meanwhile is spared.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// One process: its parent and when it started (clock ticks since boot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Proc {
    ppid: i32,
    start: u64,
}

/// `/proc/<pid>/stat`'s parent and start time. The command name (field 2) may hold spaces and
/// parentheses, so the fields are counted from its closing parenthesis.
fn read(pid: i32) -> Option<Proc> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(0) ppid(1) pgrp(2) session(3) tty(4) tpgid(5) flags(6) minflt(7)
    // cminflt(8) majflt(9) cmajflt(10) utime(11) stime(12) cutime(13) cstime(14) priority(15)
    // nice(16) threads(17) itrealvalue(18) starttime(19).
    Some(Proc { ppid: f.get(1)?.parse().ok()?, start: f.get(19)?.parse().ok()? })
}

fn all() -> BTreeMap<i32, Proc> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return BTreeMap::new() };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| read(pid).map(|p| (pid, p)))
        .collect()
}

/// `root` and every process below it, with their start times.
pub fn tree(root: i32) -> Vec<(i32, u64)> {
    let procs = all();
    let mut out: Vec<(i32, u64)> = procs.get(&root).map(|p| vec![(root, p.start)]).unwrap_or_default();
    let mut i = 0;
    while i < out.len() {
        let parent = out[i].0;
        out.extend(procs.iter().filter(|(_, p)| p.ppid == parent).map(|(pid, p)| (*pid, p.start)));
        i += 1;
    }
    out
}

fn signal(pid: i32, sig: libc::c_int) {
    // kill(2) with 0 or a negative pid signals a whole process group, and -1 every process the
    // user may signal (this shell, its terminal, everything else): only ever one process.
    if pid <= 0 {
        return;
    }
    // SAFETY: kill(2) has no memory-safety preconditions; `pid` is positive (one process).
    unsafe {
        libc::kill(pid, sig);
    }
}

/// Whether `pid` still names the process that started at `start`.
pub fn alive(pid: i32, start: u64) -> bool {
    read(pid).is_some_and(|p| p.start == start)
}

/// Whether `pid` on this host is a live process that started no later than `unix_ts` (seconds
/// since the epoch), with a second's slack for the clocks' rounding: the process that wrote a
/// record at `unix_ts`, not one that took its pid after it ended. A zombie is not alive.
pub fn alive_since(pid: u32, unix_ts: f64) -> bool {
    let Ok(pid) = i32::try_from(pid) else { return false };
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    if stat.rfind(')').is_some_and(|i| stat[i + 1..].trim_start().starts_with(['Z', 'X'])) {
        return false;
    }
    let (Some(p), Some(boot)) = (read(pid), boot_time()) else { return false };
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks <= 0 {
        return false;
    }
    boot + p.start as f64 / ticks as f64 <= unix_ts + 1.0
}

/// This host's name as the worker logs it in `start.host` (gethostname: the kernel's node name),
/// read once: `status` asks for every run folder.
pub fn this_host() -> Option<&'static str> {
    static HOST: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    HOST.get_or_init(|| Some(std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?.trim().to_string())).as_deref()
}

/// When this host booted, seconds since the epoch (`btime` in `/proc/stat`).
fn boot_time() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    stat.lines().find_map(|l| l.strip_prefix("btime "))?.trim().parse().ok()
}

/// Sends SIGTERM to `root` and everything below it, waits until `done` says the root has been
/// reaped or `grace` has passed, then SIGKILLs whatever of that tree (and of what it started
/// meanwhile) is still there.
pub fn stop(root: i32, grace: Duration, mut done: impl FnMut() -> bool) {
    let first = tree(root);
    for (pid, _) in &first {
        signal(*pid, libc::SIGTERM);
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        let left = first.iter().any(|(pid, start)| alive(*pid, *start));
        if done() && !left {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut late = tree(root);
    late.extend(first);
    for (pid, start) in late {
        if alive(pid, start) {
            signal(pid, libc::SIGKILL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt as _;

    /// This process started before now and is alive; a pid that started after a record's time
    /// (a reused pid) is not the record's process; a pid that exists nowhere is not alive.
    #[test]
    fn a_process_is_alive_since_a_time_only_if_it_started_by_then() {
        let me = std::process::id();
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
        assert!(alive_since(me, now));
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        assert!(!alive_since(child.id(), now - 60.0), "a process started a minute after the record");
        assert!(alive_since(child.id(), now + 5.0));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!alive_since(child.id(), now + 5.0), "reaped");
        assert!(!alive_since(u32::MAX, now));
    }

    /// A grandchild in a session of its own that ignores SIGTERM is found and, after the grace
    /// period, killed with its parent.
    #[test]
    fn the_whole_tree_is_stopped_even_in_other_groups() {
        let mut child = std::process::Command::new("bash")
            // The grandchild prints its pid only once it ignores SIGTERM, so the signal cannot
            // arrive before the trap is set.
            .args(["-c", "setsid bash -c \"trap '' TERM; echo \\$\\$; exec sleep 60\" & wait"])
            .stdout(std::process::Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
        let grandchild: i32 = line.trim().parse().unwrap();
        let start = read(grandchild).unwrap().start;
        let root = i32::try_from(child.id()).unwrap();
        assert!(tree(root).iter().any(|(p, _)| *p == grandchild), "{:?}", tree(root));
        let t = Instant::now();
        stop(root, Duration::from_secs(1), || child.try_wait().ok().flatten().is_some());
        assert!(t.elapsed() >= Duration::from_secs(1), "SIGKILL before the grace period");
        let _ = child.wait();
        let t = Instant::now();
        while alive(grandchild, start) && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            !alive(grandchild, start)
                || std::fs::read_to_string(format!("/proc/{grandchild}/stat")).unwrap().contains(") Z"),
            "the grandchild survived"
        );
    }
}
