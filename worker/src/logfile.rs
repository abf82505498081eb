//! The rank's JSON-lines log: `<log-dir>/rank<N>.jsonl`, one record per line, each written with a
//! single `write` and flushed to the kernel as it happens, so a killed rank leaves every record it
//! got to write.
//!
//! The log is shared with the guard's threads (see `runtime::guard`), which write the last
//! records of a rank that is being stopped; a lock keeps lines whole.
//!
//! The training loop hands its records to a [`BackgroundWriter`], which serialises and writes
//! them on a thread of its own, so the loop's cost per step is a channel send. A record is queued
//! for microseconds; a rank killed outright (SIGKILL) in that window loses it.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use zerobench_schema::Record;

/// The time stamp records carry (`ts`): Unix seconds.
pub fn now_ts() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// A handle on the log; clones write to the same file.
#[derive(Clone)]
pub struct RankLog {
    file: Arc<Mutex<File>>,
    path: Arc<PathBuf>,
    /// Where the room kept beyond the log's end ends ([`ROOM`]); [`NO_ROOM_KEPT`] where the file
    /// system keeps none.
    room_to: Arc<AtomicU64>,
}

/// Room kept allocated beyond the log's end (`fallocate`, the size unchanged), renewed as the log
/// grows into it: a disk that fills (or a file-size limit) stops the run while half of it is left,
/// so its `error` and `end` records still fit (the last step record was cut off, and nothing came
/// after it). A file system that cannot keep room (NFS, some parallel ones) writes as before.
const ROOM: u64 = 16 << 10;

/// [`RankLog::room_to`] of a file system that keeps no room.
const NO_ROOM_KEPT: u64 = u64::MAX;

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("cannot create the log folder {path}: {source}")]
    Dir { path: PathBuf, source: io::Error },
    /// `--log-dir` names a file, or a link to nothing (create_dir_all's "File exists" said neither).
    #[error("--log-dir {path} is {what}, not a folder")]
    NotADir { path: PathBuf, what: &'static str },
    #[error("{path} exists; use a fresh --log-dir (or --overwrite) so earlier results are not lost")]
    Exists { path: PathBuf },
    #[error("{path} is a symbolic link; a log is never written through one (remove it, or use a fresh --log-dir)")]
    Link { path: PathBuf },
    #[error("cannot write the log {path}: {source}")]
    Write { path: PathBuf, source: io::Error },
}

fn line(rec: &Record) -> Vec<u8> {
    let mut l = serde_json::to_vec(rec).expect("records serialise");
    l.push(b'\n');
    l
}

impl RankLog {
    /// Creates the log of `rank` in `dir`, refusing to replace an earlier run's log unless told.
    pub fn create(dir: &Path, rank: u32, overwrite: bool) -> Result<Self, LogError> {
        fs::create_dir_all(dir).map_err(|source| match fs::symlink_metadata(dir) {
            Ok(m) if m.file_type().is_symlink() && !dir.exists() => {
                LogError::NotADir { path: dir.into(), what: "a symbolic link to nothing" }
            }
            Ok(m) if !dir.is_dir() && !m.is_dir() => LogError::NotADir { path: dir.into(), what: "a file" },
            _ => LogError::Dir { path: dir.into(), source },
        })?;
        let path = dir.join(format!("rank{rank}.jsonl"));
        let mut opts = OpenOptions::new();
        opts.write(true);
        if overwrite {
            // O_NOFOLLOW: a link planted where the log goes fails the open (ELOOP) instead of
            // having its target truncated.
            opts.create(true).truncate(true).custom_flags(libc::O_NOFOLLOW);
        } else {
            // O_EXCL already refuses any existing name, a link included.
            opts.create_new(true);
        }
        let is_link = || fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink());
        let file = opts.open(&path).map_err(|source| match source.kind() {
            _ if is_link() => LogError::Link { path: path.clone() },
            io::ErrorKind::AlreadyExists => LogError::Exists { path: path.clone() },
            _ => LogError::Write { path: path.clone(), source },
        })?;
        let log = Self { file: Arc::new(Mutex::new(file)), path: Arc::new(path), room_to: Arc::new(AtomicU64::new(0)) };
        // Room for the last records from the start: a disk already full stops the rank here, and
        // the empty log it made goes (a later run into the folder would find it in its way).
        let room = {
            let f = log.file.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            log.keep_room(&f, 0)
        };
        if let Err(source) = room {
            let _ = fs::remove_file(log.path.as_path());
            return Err(LogError::Write { path: log.path.to_path_buf(), source });
        }
        Ok(log)
    }

    /// Removes this log's file: the run stopped before writing to it (`crate::agree`).
    pub fn discard(self) -> io::Result<()> {
        fs::remove_file(self.path.as_path())
    }

    /// Removes the logs `rank<N>.jsonl` in `dir` with N ≥ `ranks`: an earlier run's with more
    /// ranks than this one, which `--overwrite` replaces along with the others.
    pub fn remove_beyond(dir: &Path, ranks: usize) -> io::Result<()> {
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let rank =
                name.to_str().and_then(|n| n.strip_prefix("rank")?.strip_suffix(".jsonl")?.parse::<usize>().ok());
            if rank.is_some_and(|r| r >= ranks) {
                fs::remove_file(entry.path())?;
            }
        }
        Ok(())
    }

    /// Appends one record as one line.
    pub fn write(&self, rec: &Record) -> Result<(), LogError> {
        self.append(rec, false)
    }

    /// Appends `rec`, then (`last`) gives back the room beyond the log.
    fn append(&self, rec: &Record, last: bool) -> Result<(), LogError> {
        let l = line(rec);
        let mut f = self.file.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        self.put(&mut f, &l).map_err(|source| LogError::Write { path: self.path.to_path_buf(), source })?;
        if last {
            self.release_room(&f);
        }
        Ok(())
    }

    /// Writes the last records of a rank that is being stopped from another thread: waits at
    /// most `patience` for a write in progress to finish, so the process can still exit when the
    /// main thread is stuck holding the lock. The file stays locked afterwards, so that nothing
    /// queued elsewhere (the background writer's step records) lands after them: the caller ends
    /// the process, and any other writer blocks until it does.
    pub fn write_last(&self, recs: &[Record], patience: Duration) {
        let deadline = Instant::now() + patience;
        let bytes: Vec<u8> = recs.iter().flat_map(line).collect();
        loop {
            let mut f = match self.file.try_lock() {
                Ok(f) => f,
                Err(TryLockError::Poisoned(p)) => p.into_inner(),
                Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                }
                Err(TryLockError::WouldBlock) => {
                    // Another handle in append mode: the line lands after whatever is there.
                    if let Ok(mut f) = OpenOptions::new().append(true).open(self.path.as_path()) {
                        let _ = f.write_all(&bytes);
                    }
                    return;
                }
            };
            if self.put(&mut f, &bytes).is_ok() {
                self.release_room(&f);
            }
            std::mem::forget(f);
            return;
        }
    }

    /// A writer that serialises and writes records on a thread of its own (see
    /// [`BackgroundWriter`]); `complete` fills in what is read off the critical path.
    pub fn background(&self, complete: impl FnMut(&mut Record) + Send + 'static) -> Result<BackgroundWriter, LogError> {
        BackgroundWriter::start(self.clone(), complete)
    }

    /// Writes one whole line, or nothing: a line cut short (a full disk, a file-size limit) is
    /// taken back, so the log stays whole records that ingest reads (it saw a truncated line).
    /// A line written whose room beyond ([`ROOM`]) cannot be renewed is an error too, so that the
    /// run stops while its last records still fit.
    fn put(&self, f: &mut MutexGuard<'_, File>, bytes: &[u8]) -> io::Result<()> {
        let at = f.stream_position()?;
        let written = f.write_all(bytes).and_then(|()| f.flush());
        if written.is_err() {
            let _ = f.set_len(at);
            let _ = f.seek(SeekFrom::Start(at));
            return written;
        }
        self.keep_room(f, at + bytes.len() as u64)
    }

    /// Renews the room beyond the log's `end` once less than half of it is left.
    fn keep_room(&self, f: &File, end: u64) -> io::Result<()> {
        use std::os::fd::AsRawFd as _;
        let to = self.room_to.load(Ordering::Relaxed);
        if to == NO_ROOM_KEPT || end + ROOM / 2 <= to {
            return Ok(());
        }
        let from = to.max(end);
        let (offset, len) = (i64::try_from(from).unwrap_or(i64::MAX), ROOM as i64);
        // SAFETY: fallocate on this file's descriptor; KEEP_SIZE leaves its size as it is.
        if unsafe { libc::fallocate(f.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, offset, len) } == 0 {
            self.room_to.store(from + ROOM, Ordering::Relaxed);
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EOPNOTSUPP | libc::ENOSYS | libc::EINVAL) => {
                self.room_to.store(NO_ROOM_KEPT, Ordering::Relaxed);
                Ok(())
            }
            _ => Err(io::Error::new(e.kind(), format!("no room left for the log's last records ({e})"))),
        }
    }

    /// Writes the run's last record (`end`) and gives back the room kept beyond the log (16 KiB),
    /// which a finished log no longer needs: the file's blocks are its records'.
    pub fn write_end(&self, rec: &Record) -> Result<(), LogError> {
        self.append(rec, true)
    }

    /// Frees the room beyond the log's end and keeps none from then on. Best effort: a truncation
    /// to the size it has (ext4 and XFS free the blocks past it so; ext4 punches no hole past
    /// the size), then a hole punched there (tmpfs, which truncates nothing to the same size).
    fn release_room(&self, f: &File) {
        use std::os::fd::AsRawFd as _;
        let to = self.room_to.swap(NO_ROOM_KEPT, Ordering::Relaxed);
        let Ok(end) = f.metadata().map(|m| m.len()) else { return };
        if to == NO_ROOM_KEPT || to <= end {
            return;
        }
        let _ = f.set_len(end);
        let (offset, len) = (i64::try_from(end).unwrap_or(i64::MAX), i64::try_from(to - end).unwrap_or(0));
        // SAFETY: fallocate on this file's descriptor; a hole past the size, which KEEP_SIZE keeps.
        let _ = unsafe {
            libc::fallocate(f.as_raw_fd(), libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, offset, len)
        };
    }

    /// Whether the log's file has no name left: its folder was removed (or the file) while the run
    /// went on, and every record written went with it.
    pub fn is_removed(&self) -> bool {
        use std::os::unix::fs::MetadataExt as _;
        let f = self.file.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        f.metadata().is_ok_and(|m| m.nlink() == 0)
    }

    /// Where the log is.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Writes records in the order they are sent, on a thread of its own. `complete` runs on that
/// thread just before a record is serialised (the training loop's NVML readings are taken there).
/// Dropping it, or [`BackgroundWriter::finish`], writes everything sent before returning.
pub struct BackgroundWriter {
    tx: Option<mpsc::Sender<Record>>,
    thread: Option<JoinHandle<Result<(), LogError>>>,
}

impl BackgroundWriter {
    fn start(log: RankLog, mut complete: impl FnMut(&mut Record) + Send + 'static) -> Result<Self, LogError> {
        let (tx, rx) = mpsc::channel::<Record>();
        let thread = std::thread::Builder::new()
            .name("zerobench-log".into())
            .spawn(move || {
                for mut rec in rx {
                    complete(&mut rec);
                    log.write(&rec)?;
                }
                Ok(())
            })
            .map_err(|source| LogError::Write { path: PathBuf::from("(log thread)"), source })?;
        Ok(Self { tx: Some(tx), thread: Some(thread) })
    }

    /// Queues `rec`; fails with the write error that stopped the thread, if one did.
    pub fn send(&mut self, rec: Record) -> Result<(), LogError> {
        let sent = self.tx.as_ref().is_some_and(|tx| tx.send(rec).is_ok());
        if sent {
            Ok(())
        } else {
            // The thread has stopped: it returns why.
            self.join().and(Err(LogError::Write {
                path: PathBuf::from("(log thread)"),
                source: io::Error::other("the log thread has stopped"),
            }))
        }
    }

    /// Writes everything sent, then returns the first write error, if any.
    pub fn finish(mut self) -> Result<(), LogError> {
        self.join()
    }

    fn join(&mut self) -> Result<(), LogError> {
        self.tx = None;
        match self.thread.take().map(JoinHandle::join) {
            None => Ok(()),
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(LogError::Write {
                path: PathBuf::from("(log thread)"),
                source: io::Error::other("the log thread panicked"),
            }),
        }
    }
}

impl Drop for BackgroundWriter {
    fn drop(&mut self) {
        let _ = self.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerobench_schema::log::{End, RunStatus};

    fn end(steps: u32) -> Record {
        Record::End(End {
            v: 2,
            ts: 0.0,
            rank: 0,
            status: RunStatus::Ok,
            steps_completed: steps,
            exit_code: 0,
            summary: None,
        })
    }

    #[test]
    fn the_background_writer_keeps_the_order_and_completes_each_record() {
        let dir = tempfile::tempdir().unwrap();
        let log = RankLog::create(dir.path(), 0, false).unwrap();
        let mut w = log
            .background(|r| {
                if let Record::End(e) = r {
                    e.ts = 7.0;
                }
            })
            .unwrap();
        for i in 0..100 {
            w.send(end(i)).unwrap();
        }
        w.finish().unwrap();
        let text = std::fs::read_to_string(dir.path().join("rank0.jsonl")).unwrap();
        let steps: Vec<u32> = text
            .lines()
            .map(|l| match zerobench_schema::log::parse_line(l.as_bytes()).unwrap() {
                Record::End(e) => {
                    assert_eq!(e.ts, 7.0);
                    e.steps_completed
                }
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(steps, (0..100).collect::<Vec<_>>());
    }

    /// Once the last records are written, nothing else is: a record sent to the background
    /// writer afterwards stays queued (its thread blocks on the file, until the process ends).
    #[test]
    fn nothing_lands_after_the_last_records() {
        let dir = tempfile::tempdir().unwrap();
        let log = RankLog::create(dir.path(), 0, false).unwrap();
        let mut w = log.background(|_| {}).unwrap();
        log.write_last(&[end(1)], Duration::from_secs(2));
        w.send(end(2)).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let text = std::fs::read_to_string(dir.path().join("rank0.jsonl")).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(log.file.try_lock().is_err(), "the file stays locked");
        // The writer thread is blocked for good: leave it (and the test process ends it).
        std::mem::forget(w);
    }

    /// The bytes the file system holds for a file.
    fn allocated(path: &Path) -> u64 {
        use std::os::unix::fs::MetadataExt as _;
        std::fs::metadata(path).unwrap().blocks() * 512
    }

    /// A log keeps room beyond its end while the run goes on and gives it back with its last
    /// record, whether the run ends (`write_end`) or is stopped (`write_last`); a record written
    /// after that still lands, without room.
    #[test]
    fn the_room_beyond_the_log_goes_with_its_last_record() {
        for last in ["end", "stopped"] {
            let dir = tempfile::tempdir().unwrap();
            let log = RankLog::create(dir.path(), 0, false).unwrap();
            let path = dir.path().join("rank0.jsonl");
            log.write(&end(1)).unwrap();
            let len = std::fs::metadata(&path).unwrap().len();
            assert_ne!(log.room_to.load(Ordering::Relaxed), NO_ROOM_KEPT, "the test's folder keeps no room");
            assert!(allocated(&path) >= ROOM, "{last}: {} bytes held for {len}", allocated(&path));
            match last {
                "end" => log.write_end(&end(2)).unwrap(),
                _ => log.write_last(&[end(2)], Duration::from_secs(2)),
            }
            assert_eq!(log.room_to.load(Ordering::Relaxed), NO_ROOM_KEPT, "{last}");
            assert!(allocated(&path) < ROOM / 2, "{last}: {} bytes held", allocated(&path));
            let text = std::fs::read_to_string(&path).unwrap();
            assert_eq!(text.lines().count(), 2, "{last}: {text}");
            if last == "end" {
                log.write(&end(3)).unwrap();
                assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 3);
            }
        }
    }

    #[test]
    fn a_write_error_reaches_the_sender() {
        let dir = tempfile::tempdir().unwrap();
        let log = RankLog::create(dir.path(), 0, false).unwrap();
        // A log whose file refuses writes: /dev/full.
        let full =
            RankLog { file: Arc::new(Mutex::new(File::options().write(true).open("/dev/full").unwrap())), ..log };
        let mut w = full.background(|_| {}).unwrap();
        // The first send is queued; the thread fails on it and stops, so a later send or the
        // finish reports the error.
        let _ = w.send(end(0));
        let mut failed = false;
        for i in 1..1000 {
            if w.send(end(i)).is_err() {
                failed = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(failed || w.finish().is_err());
    }
}
