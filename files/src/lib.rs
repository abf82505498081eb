//! Writing a file whole and never through a symbolic link planted under its name.
//!
//! Every file is first written to a new file created exclusively beside it (`O_EXCL` and
//! `O_NOFOLLOW`: never an existing file or link), then put in place: renamed over the name
//! ([`replace`]), or linked to it only if nothing has the name ([`create_new`]; on a file system
//! without hard links, renamed to it by a rename that refuses to replace). A rename or a
//! link replaces or refuses a link at the name instead of writing through it, so a link in a
//! shared folder cannot make zerobench overwrite another user's file; a reader never sees half a
//! file; and a write that fails (a full disk, a file-size limit) removes what it wrote and leaves
//! the name as it was.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
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
    write_then(path, bytes, |tmp| place_new(tmp, path, |from, to| std::fs::hard_link(from, to), rename_no_replace))
}

/// Puts the written file `tmp` at `path` only if nothing has that name, with `link` (a hard
/// link: it fails where the name is taken, and never follows a link there). A file system that
/// has no hard links (vfat, exFAT, many FUSE mounts) fails it with EPERM or EOPNOTSUPP; there
/// `rename` (one that refuses to replace: [`rename_no_replace`]) does the same.
fn place_new(
    tmp: &Path,
    path: &Path,
    link: impl FnOnce(&Path, &Path) -> io::Result<()>,
    rename: impl FnOnce(&Path, &Path) -> io::Result<()>,
) -> Result<(), Error> {
    match link(tmp, path) {
        Ok(()) => std::fs::remove_file(tmp).map_err(|e| Error::at(tmp, e)),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EPERM | libc::EOPNOTSUPP)) => {
            rename(tmp, path).map_err(|r| match r.raw_os_error() {
                // The rename's flag unsupported too: say what both steps found.
                Some(libc::EINVAL) => Error::at(
                    path,
                    io::Error::new(
                        io::ErrorKind::Unsupported,
                        format!(
                            "this file system has no hard links ({e}) nor renames that refuse to replace ({r}), \
                             which a new file needs here so that nothing under its name is overwritten"
                        ),
                    ),
                ),
                _ => Error::at(path, r),
            })
        }
        Err(e) => Err(Error::at(path, e)),
    }
}

/// Renames `from` to `to` only if nothing has the name `to` (`AlreadyExists` otherwise, a link
/// there included): `renameat2`'s `RENAME_NOREPLACE`, EINVAL where the file system lacks it.
fn rename_no_replace(from: &Path, to: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt as _;
    let c = |p: &Path| {
        CString::new(p.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in the path"))
    };
    let (from, to) = (c(from)?, c(to)?);
    // SAFETY: two NUL-terminated paths that outlive the call, relative to the working folder.
    let rc =
        unsafe { libc::renameat2(libc::AT_FDCWD, from.as_ptr(), libc::AT_FDCWD, to.as_ptr(), libc::RENAME_NOREPLACE) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
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

    /// Where the file system has no hard links (the link fails with EPERM or EOPNOTSUPP), a new
    /// file is renamed into place by a rename that refuses to replace: it never takes a name in
    /// use (a file, a dangling link), and no temporary file stays. Another failure of the link is
    /// reported as it is.
    #[test]
    fn without_hard_links_a_new_file_is_renamed_into_place_never_over_a_name() {
        let d = tempfile::tempdir().unwrap();
        let fails_with =
            |code: i32| move |_: &Path, _: &Path| -> io::Result<()> { Err(io::Error::from_raw_os_error(code)) };
        for code in [libc::EPERM, libc::EOPNOTSUPP] {
            let p = d.path().join(format!("model-{code}.json"));
            write_then(&p, b"{}", |tmp| place_new(tmp, &p, fails_with(code), rename_no_replace)).unwrap();
            assert_eq!(std::fs::read_to_string(&p).unwrap(), "{}");
            let e = write_then(&p, b"[]", |tmp| place_new(tmp, &p, fails_with(code), rename_no_replace)).unwrap_err();
            assert_eq!((e.path.as_path(), e.cause.kind()), (p.as_path(), io::ErrorKind::AlreadyExists));
            assert_eq!(std::fs::read_to_string(&p).unwrap(), "{}");
        }
        let dangling = d.path().join("dangling");
        std::os::unix::fs::symlink(d.path().join("nothing"), &dangling).unwrap();
        let e =
            write_then(&dangling, b"x", |tmp| place_new(tmp, &dangling, fails_with(libc::EPERM), rename_no_replace))
                .unwrap_err();
        assert_eq!(e.cause.kind(), io::ErrorKind::AlreadyExists);
        assert!(!d.path().join("nothing").exists(), "the link was not followed");
        let other = d.path().join("other.json");
        let e = write_then(&other, b"x", |tmp| place_new(tmp, &other, fails_with(libc::EACCES), rename_no_replace))
            .unwrap_err();
        assert_eq!((e.path.as_path(), e.cause.raw_os_error()), (other.as_path(), Some(libc::EACCES)));
        assert!(!other.exists(), "no rename after another failure");
        // Neither hard links nor the rename's flag (EINVAL): an error that says both, nothing placed.
        let e =
            write_then(&other, b"x", |tmp| place_new(tmp, &other, fails_with(libc::EPERM), fails_with(libc::EINVAL)))
                .unwrap_err();
        assert_eq!((e.path.as_path(), e.cause.kind()), (other.as_path(), io::ErrorKind::Unsupported));
        assert!(
            e.to_string().contains("no hard links (Operation not permitted") && e.to_string().contains("nor renames"),
            "{e}"
        );
        assert!(!other.exists());
        let mut names: Vec<String> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        let mut want = vec!["dangling".to_string()];
        want.extend([libc::EPERM, libc::EOPNOTSUPP].map(|c| format!("model-{c}.json")));
        want.sort();
        assert_eq!(names, want, "no temporary file left");
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
