//! One writer per output folder: `local`, `render`, `submit` and `ingest` hold an advisory lock
//! (flock(2)) on `OUT/.zerobench.lock` while they write there, and a second command into the same
//! folder is refused at once, naming the process that holds it, instead of mixing its files with
//! the first's. The lock goes with the process (the kernel drops it at exit, crash or kill), so a
//! stale lock file never blocks anyone.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

/// The lock file's name in an output folder (hidden: ingest and status pass it by).
pub const LOCK_FILE: &str = ".zerobench.lock";

/// A held lock; released when dropped.
pub struct OutLock {
    _file: File,
}

/// Takes the lock of `out` (created if needed) for `command`, or says who holds it.
pub fn lock(out: &Path, command: &str) -> anyhow::Result<OutLock> {
    std::fs::create_dir_all(out).with_context(|| format!("cannot create the output folder {}", out.display()))?;
    let path: PathBuf = out.join(LOCK_FILE);
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        // A symbolic link planted under the lock's name is not followed.
        .custom_flags(libc::O_NOFOLLOW)
        .mode(0o644)
        .open(&path)
        .with_context(|| format!("cannot open the lock {}", path.display()))?;
    // SAFETY: flock(2) on a file descriptor this function owns; no memory is involved.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let mut holder = String::new();
        let _ = file.read_to_string(&mut holder);
        let holder = holder.trim();
        let who = if holder.is_empty() { String::new() } else { format!(" ({holder})") };
        bail!("{} is in use by another zerobench command{who}; wait for it to end, or write elsewhere", out.display());
    }
    // Who holds it, for the message of the next one (the lock, not this text, is what counts).
    let _ = file.set_len(0);
    let _ = file.seek(SeekFrom::Start(0));
    let _ = write!(file, "zerobench {command}, pid {}", std::process::id());
    Ok(OutLock { _file: file })
}
