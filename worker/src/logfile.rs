//! The rank's JSON-lines log: `<log-dir>/rank<N>.jsonl`, one record per line, each written with a
//! single `write` and flushed to the kernel as it happens, so a killed rank leaves every record it
//! got to write.
//!
//! The log is shared with the guard's threads (see `runtime::guard`), which write the last
//! records of a rank that is being stopped; a lock keeps lines whole.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use zerobench_schema::Record;

/// A handle on the log; clones write to the same file.
#[derive(Clone)]
pub struct RankLog {
    file: Arc<Mutex<File>>,
    path: Arc<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("cannot create the log folder {path}: {source}")]
    Dir { path: PathBuf, source: io::Error },
    #[error("{path} exists; use a fresh --log-dir (or --overwrite) so earlier results are not lost")]
    Exists { path: PathBuf },
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
        fs::create_dir_all(dir).map_err(|source| LogError::Dir { path: dir.into(), source })?;
        let path = dir.join(format!("rank{rank}.jsonl"));
        let mut opts = OpenOptions::new();
        opts.write(true);
        if overwrite {
            opts.create(true).truncate(true);
        } else {
            opts.create_new(true);
        }
        let file = opts.open(&path).map_err(|source| match source.kind() {
            io::ErrorKind::AlreadyExists => LogError::Exists { path: path.clone() },
            _ => LogError::Write { path: path.clone(), source },
        })?;
        Ok(Self { file: Arc::new(Mutex::new(file)), path: Arc::new(path) })
    }

    /// Appends one record as one line.
    pub fn write(&self, rec: &Record) -> Result<(), LogError> {
        let l = line(rec);
        let mut f = self.file.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        Self::put(&mut f, &l).map_err(|source| LogError::Write { path: self.path.to_path_buf(), source })
    }

    /// Writes the last records of a rank that is being stopped from another thread: waits at
    /// most `patience` for a write in progress to finish, so the process can still exit when the
    /// main thread is stuck holding the lock.
    pub fn write_last(&self, recs: &[Record], patience: Duration) {
        let deadline = Instant::now() + patience;
        let bytes: Vec<u8> = recs.iter().flat_map(line).collect();
        loop {
            match self.file.try_lock() {
                Ok(mut f) => {
                    let _ = Self::put(&mut f, &bytes);
                    return;
                }
                Err(TryLockError::Poisoned(p)) => {
                    let _ = Self::put(&mut p.into_inner(), &bytes);
                    return;
                }
                Err(TryLockError::WouldBlock) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
                Err(TryLockError::WouldBlock) => {
                    // Another handle in append mode: the line lands after whatever is there.
                    if let Ok(mut f) = OpenOptions::new().append(true).open(self.path.as_path()) {
                        let _ = f.write_all(&bytes);
                    }
                    return;
                }
            }
        }
    }

    fn put(f: &mut MutexGuard<'_, File>, bytes: &[u8]) -> io::Result<()> {
        f.write_all(bytes)?;
        f.flush()
    }
}
