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
