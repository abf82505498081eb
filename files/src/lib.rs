//! Writing a file whole and never through a symbolic link planted under its name.
//!
//! Every file is first written to a new file created exclusively beside it (`O_EXCL` and
//! `O_NOFOLLOW`: never an existing file or link), then put in place: renamed over the name
//! ([`replace`]), or linked to it only if nothing has the name ([`create_new`]). A rename or a
//! link replaces or refuses a link at the name instead of writing through it, so a link in a
//! shared folder cannot make zerobench overwrite another user's file; a reader never sees half a
//! file; and a write that fails (a full disk, a file-size limit) removes what it wrote and leaves
//! the name as it was.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// A file that could not be written: the path and why. The reason is part of the message and
/// not a separate cause, so a chain of causes prints it once.
#[derive(Debug, thiserror::Error)]
#[error("{}: {cause}", path.display())]
pub struct Error {
    pub path: PathBuf,
    pub cause: std::io::Error,
}

impl Error {
    fn at(path: &Path, cause: std::io::Error) -> Self {
        Error { path: path.to_path_buf(), cause }
    }
}

/// The names, in order, that a write of `path` by this process tries for its temporary file,
/// beside `path`: hidden, and named after it and the process.
pub fn temporary_names(path: &Path) -> impl Iterator<Item = PathBuf> + '_ {
    let name = path.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    (0..100).map(move |n| path.with_file_name(format!(".{name}.{}.{n}.tmp", std::process::id())))
}

/// A new file beside `path`, created exclusively (never an existing file or link), under the
/// first of its [`temporary_names`] free.
fn fresh(path: &Path) -> Result<(File, PathBuf), Error> {
    for tmp in temporary_names(path) {
        match OpenOptions::new().write(true).create_new(true).custom_flags(libc::O_NOFOLLOW).mode(0o644).open(&tmp) {
            Ok(f) => return Ok((f, tmp)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(Error::at(&tmp, e)),
        }
    }
    Err(Error::at(path, std::io::Error::new(std::io::ErrorKind::AlreadyExists, "no free temporary name")))
}

/// Writes `bytes` to a fresh file beside `path` and hands it to `place`; the fresh file is
/// removed if writing or placing fails.
fn write_then(path: &Path, bytes: &[u8], place: impl FnOnce(&Path) -> Result<(), Error>) -> Result<(), Error> {
    let (mut f, tmp) = fresh(path)?;
    // A full disk or a file-size limit shows here, before the name holds the file; the error
    // names the file written, not its temporary name.
    let done = f.write_all(bytes).map_err(|e| Error::at(path, e));
    let done = done.and_then(|()| place(&tmp));
    if done.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    done
}

/// Writes `bytes` to `path`, replacing whatever has the name (a link is replaced, its target
/// untouched).
pub fn replace(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    write_then(path, bytes, |tmp| std::fs::rename(tmp, path).map_err(|e| Error::at(path, e)))
}

/// Writes `bytes` to `path` only if nothing has that name (a file, a folder, a link, even a
/// dangling one): `AlreadyExists` otherwise, and nothing is changed.
pub fn create_new(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    write_then(path, bytes, |tmp| {
        // A hard link fails where the name is taken, and never follows a link there.
        std::fs::hard_link(tmp, path).map_err(|e| Error::at(path, e))?;
        std::fs::remove_file(tmp).map_err(|e| Error::at(tmp, e))
    })
}

/// A new, empty file at `path` to write into (a run's output): created fresh and renamed into
/// place before anything is written, so a link at `path` is replaced, not followed.
pub fn create(path: &Path) -> Result<File, Error> {
    let (f, tmp) = fresh(path)?;
    std::fs::rename(&tmp, path).map_err(|e| Error::at(path, e))?;
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusty_fork::rusty_fork_test;

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
                replace(&p, b"#!/bin/bash\n").unwrap();
            } else {
                create(&p).unwrap().write_all(b"output").unwrap();
            }
            assert!(std::fs::symlink_metadata(&p).unwrap().file_type().is_file(), "{name}");
            assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious", "{name}");
        }
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 3, "no temporary file left");
    }

    /// A new file is written only where nothing has its name, a dangling link included; what is
    /// there keeps its bytes, and no temporary file stays.
    #[test]
    fn a_new_file_never_takes_a_name_in_use() {
        let d = tempfile::tempdir().unwrap();
        let victim = d.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let model = d.path().join("model.json");
        create_new(&model, b"{}").unwrap();
        assert_eq!(std::fs::read_to_string(&model).unwrap(), "{}");
        let e = create_new(&model, b"[]").unwrap_err();
        assert_eq!((e.path.as_path(), e.cause.kind()), (model.as_path(), std::io::ErrorKind::AlreadyExists));
        assert_eq!(std::fs::read_to_string(&model).unwrap(), "{}");
        for link in ["to-victim", "dangling"] {
            let p = d.path().join(link);
            let target = if link == "dangling" { d.path().join("nothing") } else { victim.clone() };
            std::os::unix::fs::symlink(&target, &p).unwrap();
            assert_eq!(create_new(&p, b"x").unwrap_err().cause.kind(), std::io::ErrorKind::AlreadyExists);
        }
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert!(!d.path().join("nothing").exists());
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 4, "no temporary file left");
    }

    /// A temporary name already taken, by a file or by a link, is passed over (never opened, so a
    /// link's target keeps its bytes); with all of them taken the write fails and says so.
    #[test]
    fn taken_temporary_names_are_passed_over() {
        let d = tempfile::tempdir().unwrap();
        let victim = d.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let p = d.path().join("run.json");
        let names: Vec<PathBuf> = temporary_names(&p).collect();
        assert_eq!(names[0], d.path().join(format!(".run.json.{}.0.tmp", std::process::id())));
        std::os::unix::fs::symlink(&victim, &names[0]).unwrap();
        std::fs::write(&names[1], "someone's").unwrap();
        replace(&p, b"{}").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "{}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(std::fs::read_to_string(&names[1]).unwrap(), "someone's");
        for t in &names[2..] {
            std::fs::write(t, "").unwrap();
        }
        let e = replace(&p, b"[]").unwrap_err().to_string();
        assert!(e.contains("no free temporary name"), "{e}");
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "{}", "the file keeps its bytes");
    }

    /// Any other failure to create the temporary file is reported as it is, naming the file,
    /// not retried under other names.
    #[test]
    fn other_failures_are_reported_at_once() {
        let d = tempfile::tempdir().unwrap();
        let e = replace(&d.path().join("missing").join("job.sbatch"), b"x").unwrap_err().to_string();
        assert!(e.contains("No such file or directory") && e.contains(".job.sbatch."), "{e}");
        assert!(!e.contains("no free temporary name"), "{e}");
    }

    rusty_fork_test! {
        /// A write the file system cannot hold (a file-size limit here, as a full disk) fails
        /// naming the file, leaves what had the name as it was, and removes its temporary file.
        /// In a process of its own: the limit and SIGXFSZ's disposition are the process's.
        #[test]
        fn a_write_that_does_not_fit_changes_nothing() {
            let d = tempfile::tempdir().unwrap();
            let p = d.path().join("model.json");
            std::fs::write(&p, "old").unwrap();
            let big = vec![b'x'; 1 << 20];
            // SAFETY: a signal's disposition and a limit of this process, which runs this test alone.
            unsafe {
                libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                let lim = libc::rlimit { rlim_cur: 4096, rlim_max: libc::RLIM_INFINITY };
                assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &lim), 0);
            }
            let e = replace(&p, &big).unwrap_err();
            assert_eq!((e.path.as_path(), e.cause.raw_os_error()), (p.as_path(), Some(libc::EFBIG)));
            let new = d.path().join("new.json");
            let e = create_new(&new, &big).unwrap_err();
            assert_eq!((e.path.as_path(), e.cause.raw_os_error()), (new.as_path(), Some(libc::EFBIG)));
            assert_eq!(std::fs::read_to_string(&p).unwrap(), "old");
            let names: Vec<_> = std::fs::read_dir(d.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
            assert_eq!(names, ["model.json"], "no temporary file, no new file");
        }
    }
}
