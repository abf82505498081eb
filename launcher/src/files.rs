//! Writing the files of a run folder without following a symbolic link planted under their names:
//! each is written to a new file created exclusively beside it, then renamed over the name. A
//! rename replaces a link instead of writing through it, so a link in a shared project folder
//! cannot make zerobench overwrite another user's file; and each file appears whole or not at all.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::error::Error;

/// A new file beside `path`, created exclusively (never an existing file or link).
fn fresh(path: &Path) -> Result<(File, PathBuf), Error> {
    let name = path.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    for n in 0..100 {
        let tmp = path.with_file_name(format!(".{name}.{}.{n}.tmp", std::process::id()));
        match OpenOptions::new().write(true).create_new(true).custom_flags(libc::O_NOFOLLOW).mode(0o644).open(&tmp) {
            Ok(f) => return Ok((f, tmp)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(Error::io(&tmp, e)),
        }
    }
    Err(Error::io(path, std::io::Error::new(std::io::ErrorKind::AlreadyExists, "no free temporary name")))
}

/// Writes `bytes` to `path`: to a fresh file, then renamed over `path` (a link there is replaced,
/// its target untouched).
pub fn write(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    let (mut f, tmp) = fresh(path)?;
    let done = f.write_all(bytes).map_err(|e| Error::io(&tmp, e));
    let done = done.and_then(|()| std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e)));
    if done.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    done
}

/// A new, empty file at `path` to write into (a run's output): created fresh and renamed into
/// place before anything is written, so a link at `path` is replaced, not followed.
pub fn create(path: &Path) -> Result<File, Error> {
    let (f, tmp) = fresh(path)?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))?;
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A link planted under a file's name is replaced; its target keeps its bytes.
    #[test]
    fn links_are_replaced_not_written_through() {
        let d = tempfile::tempdir().unwrap();
        let victim = d.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        for (i, name) in ["job.sbatch", "local.out"].iter().enumerate() {
            let p = d.path().join(name);
            std::os::unix::fs::symlink(&victim, &p).unwrap();
            if i == 0 {
                write(&p, b"#!/bin/bash\n").unwrap();
            } else {
                create(&p).unwrap().write_all(b"output").unwrap();
            }
            assert!(std::fs::symlink_metadata(&p).unwrap().file_type().is_file(), "{name}");
            assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious", "{name}");
        }
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 3, "no temporary file left");
    }

    /// A temporary name already taken, by a file or by a link, is passed over (never opened, so a
    /// link's target keeps its bytes); with all of them taken the write fails and says so.
    #[test]
    fn taken_temporary_names_are_passed_over() {
        let d = tempfile::tempdir().unwrap();
        let victim = d.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let p = d.path().join("run.json");
        let tmp = |n: usize| d.path().join(format!(".run.json.{}.{n}.tmp", std::process::id()));
        std::os::unix::fs::symlink(&victim, tmp(0)).unwrap();
        std::fs::write(tmp(1), "someone's").unwrap();
        write(&p, b"{}").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "{}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(std::fs::read_to_string(tmp(1)).unwrap(), "someone's");
        for n in 2..100 {
            std::fs::write(tmp(n), "").unwrap();
        }
        let e = write(&p, b"[]").unwrap_err().to_string();
        assert!(e.contains("no free temporary name"), "{e}");
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "{}", "the file keeps its bytes");
    }

    /// Any other failure to create the temporary file is reported as it is, naming the file,
    /// not retried under other names.
    #[test]
    fn other_failures_are_reported_at_once() {
        let d = tempfile::tempdir().unwrap();
        let e = write(&d.path().join("missing").join("job.sbatch"), b"x").unwrap_err().to_string();
        assert!(e.contains("No such file or directory") && e.contains(".job.sbatch."), "{e}");
        assert!(!e.contains("no free temporary name"), "{e}");
    }
}
