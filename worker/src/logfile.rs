//! The rank's JSON-lines log: `<log-dir>/rank<N>.jsonl`, one record per line, each written with a
//! single `write` and flushed to the kernel as it happens, so a killed rank leaves every record it
//! got to write.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use zerobench_schema::Record;

pub struct RankLog {
    file: File,
    path: PathBuf,
    line: Vec<u8>,
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
        Ok(Self { file, path, line: Vec::with_capacity(4096) })
    }

    /// Appends one record as one line.
    pub fn write(&mut self, rec: &Record) -> Result<(), LogError> {
        self.line.clear();
        serde_json::to_writer(&mut self.line, rec).expect("records serialise");
        self.line.push(b'\n');
        self.file
            .write_all(&self.line)
            .and_then(|()| self.file.flush())
            .map_err(|source| LogError::Write { path: self.path.clone(), source })
    }
}
