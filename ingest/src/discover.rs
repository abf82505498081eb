//! Finding the logs: walks the input folders, groups worker rank logs by the folder that holds
//! them, and picks out folders of foreign logs (DeepSpeed, Hugging Face Trainer, nvidia-smi).
//!
//! This module only lists files; it opens none of them. Symbolic links are followed so that a
//! linked run folder is read, and a link that leads back into one of its own ancestors is
//! reported and not followed. Unreadable folders are reported and skipped.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use zerobench_schema::log::rank_from_name;

use crate::problem::{Problem, ProblemKind};
use crate::side::side_dirs;

/// A folder holding `rank<N>.jsonl` files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunDir {
    pub dir: PathBuf,
    pub rank_files: Vec<RankFile>,
}

/// One worker log file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankFile {
    pub path: PathBuf,
    /// The rank in the file name (`rank3.jsonl` → 3).
    pub name_rank: u32,
    pub len: u64,
}

/// A folder without worker logs but with text logs that may be foreign formats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignDir {
    pub dir: PathBuf,
    /// The root whose walk found `dir` (a folder given to `zerobench ingest`): a run's identity is
    /// read from the folder names between it and `dir` only.
    pub root: PathBuf,
    pub files: Vec<PathBuf>,
}

/// What the walk found.
#[derive(Debug, Default)]
pub struct Discovered {
    pub run_dirs: Vec<RunDir>,
    pub foreign_dirs: Vec<ForeignDir>,
    pub problems: Vec<Problem>,
}

/// An output folder that is one of the folders to read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the output folder {} is the folder to read {}: its tables would be read back as logs by the \
     next ingest, and leaving the output folder out would leave those logs out; write the tables \
     beside it, or into a folder inside it (that one is not read)",
    out.display(),
    input.display()
)]
pub struct OutputIsInput {
    pub out: PathBuf,
    pub input: PathBuf,
}

/// Refuses an output folder that is a folder to read (paths compared canonical, so `.`, `a/..`
/// and links name their folder): leaving it out of the walk would leave the input's own logs out,
/// and reading it would read the tables (`.csv` is a foreign log's extension) as a run of their
/// own; so ingest refuses before anything is written. An output folder inside a folder to read is
/// fine (the walk leaves it out: `discover`'s `skip`), and so is one above it (`ingest runs --out
/// .`: this ingest does not read it). An output folder that does not exist yet is none of these.
pub fn check_output(out: &Path, roots: &[PathBuf]) -> Result<(), OutputIsInput> {
    let Ok(out_c) = std::fs::canonicalize(out) else { return Ok(()) };
    for root in roots {
        if std::fs::canonicalize(root).is_ok_and(|r| r == out_c) {
            return Err(OutputIsInput { out: out.to_path_buf(), input: root.clone() });
        }
    }
    Ok(())
}

/// Extensions of files that may hold foreign logs (console captures, Slurm output, CSV).
const FOREIGN_EXTENSIONS: &[&str] = &["log", "txt", "out", "err", "csv"];

/// Walks every root and groups what it finds, leaving out the folders in `skip` (ingest's own
/// output folder). The same file reached twice (overlapping roots, or a link to a folder also
/// listed directly) is read once.
pub fn discover(roots: &[PathBuf], skip: &[PathBuf]) -> Discovered {
    let mut out = Discovered::default();
    let mut ranks: BTreeMap<PathBuf, Vec<RankFile>> = BTreeMap::new();
    let mut foreign: BTreeMap<PathBuf, ForeignDir> = BTreeMap::new();
    let mut seen: BTreeSet<PathBuf> = BTreeSet::new();
    let mut walked: Vec<PathBuf> = Vec::new();
    // Links are followed only within the folders given.
    let inside: Vec<PathBuf> = roots.iter().filter_map(|r| std::fs::canonicalize(r).ok()).collect();
    let skipped: Vec<PathBuf> = skip.iter().filter_map(|d| std::fs::canonicalize(d).ok()).collect();
    let mut outside: Vec<(PathBuf, PathBuf)> = Vec::new();

    for root in roots {
        if let Err(e) = std::fs::metadata(root) {
            out.problems.push(Problem::file(root, ProblemKind::Io { message: e.to_string() }));
            continue;
        }
        // A root inside one walked before holds nothing that walk did not find: every file there
        // was seen (with the earlier root, which names its runs), every problem was met.
        let canonical = std::fs::canonicalize(root).unwrap_or_else(|_| root.clone());
        if walked.iter().any(|w| canonical.starts_with(w)) {
            continue;
        }
        walked.push(canonical);
        let walk = walkdir::WalkDir::new(root).follow_links(true).sort_by_file_name().into_iter().filter_entry(|e| {
            // Hidden folders below a root hold what is not current: the launcher keeps replaced
            // runs and earlier attempts there. Given as a root, one is read.
            if e.depth() > 0 && e.file_type().is_dir() && e.file_name().to_string_lossy().starts_with('.') {
                return false;
            }
            if !skipped.is_empty()
                && e.depth() > 0
                && e.file_type().is_dir()
                && std::fs::canonicalize(e.path()).is_ok_and(|c| skipped.contains(&c))
            {
                return false;
            }
            if !e.path_is_symlink() {
                return true;
            }
            match std::fs::canonicalize(e.path()) {
                Ok(target) if inside.iter().any(|r| target.starts_with(r)) => true,
                Ok(target) => {
                    outside.push((e.path().to_path_buf(), target));
                    false
                }
                // A dangling link: the walk reports it when it reads the entry.
                Err(_) => true,
            }
        });
        for entry in walk {
            let entry = match entry {
                Ok(e) => e,
                Err(e) => {
                    let path = e.path().map(Path::to_path_buf).unwrap_or_else(|| root.clone());
                    let kind = if e.loop_ancestor().is_some() {
                        ProblemKind::SymlinkLoop { message: e.to_string() }
                    } else {
                        ProblemKind::Io { message: io_message(&e) }
                    };
                    out.problems.push(Problem::file(path, kind));
                    continue;
                }
            };
            if !entry.file_type().is_file() {
                continue;
            }
            let path = entry.path().to_path_buf();
            // Canonical paths make the same file reached two ways one file.
            let key = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
            if !seen.insert(key) {
                continue;
            }
            let Some(dir) = path.parent().map(Path::to_path_buf) else { continue };
            let name = entry.file_name().to_string_lossy();
            if let Some(rank) = rank_from_name(&name) {
                let len = entry.metadata().map(|m| m.len()).unwrap_or(0);
                ranks.entry(dir).or_default().push(RankFile { path, name_rank: rank, len });
            } else if let Some(inner) = compressed_log_name(&name) {
                // Read as it is, it would be binary noise; left out in silence, a lost run.
                out.problems.push(Problem::file(path, ProblemKind::Compressed { inner: inner.to_string() }));
            } else if has_foreign_extension(&name) {
                foreign
                    .entry(dir.clone())
                    .or_insert_with(|| ForeignDir { dir, root: root.clone(), files: Vec::new() })
                    .files
                    .push(path);
            }
        }
    }

    for (link, target) in outside {
        out.problems.push(Problem::file(link, ProblemKind::LinkOutside { target: target.display().to_string() }));
    }
    for (dir, mut files) in ranks {
        files.sort_by(|a, b| a.name_rank.cmp(&b.name_rank).then_with(|| a.path.cmp(&b.path)));
        out.run_dirs.push(RunDir { dir, rank_files: files });
    }
    // Text logs next to worker logs, or in the run folder above a `logs/` folder, belong to that
    // run (its job output, console captures: they may quote errors that look like DeepSpeed's)
    // and are read as side files there, never as a separate foreign run.
    let side: BTreeSet<PathBuf> = out.run_dirs.iter().flat_map(|r| side_dirs(&r.dir)).collect();
    // So does a console capture named after a run folder beside it (`runs/X.out` next to
    // `runs/X/`, as scripts that start one run after another keep them, or next to the
    // launcher's `runs/X/` above `runs/X/logs/`): it quotes the run's errors (an OOM's message),
    // which would otherwise make a phantom foreign run of its own.
    let runs: BTreeSet<PathBuf> = out.run_dirs.iter().flat_map(|r| side_dirs(&r.dir)).collect();
    let names_a_run = |file: &Path| match (file.parent(), file.file_stem()) {
        (Some(dir), Some(stem)) => runs.contains(dir.join(stem).as_path()),
        _ => false,
    };
    out.foreign_dirs = foreign
        .into_values()
        .filter(|f| !side.contains(&f.dir))
        .filter_map(|mut f| {
            f.files.retain(|file| !names_a_run(file));
            (!f.files.is_empty()).then_some(f)
        })
        .collect();
    out
}

/// Suffixes of compressed files (gzip, zstd, xz, bzip2, lz4).
const COMPRESSED_EXTENSIONS: &[&str] = &["gz", "zst", "xz", "bz2", "lz4"];

/// The name a compressed log would have decompressed, where that is a log ingest reads.
fn compressed_log_name(name: &str) -> Option<&str> {
    let (inner, ext) = name.rsplit_once('.')?;
    let compressed = COMPRESSED_EXTENSIONS.iter().any(|e| ext.eq_ignore_ascii_case(e));
    (compressed && (rank_from_name(inner).is_some() || has_foreign_extension(inner))).then_some(inner)
}

fn has_foreign_extension(name: &str) -> bool {
    name.rsplit_once('.').is_some_and(|(_, ext)| FOREIGN_EXTENSIONS.iter().any(|e| ext.eq_ignore_ascii_case(e)))
}

fn io_message(e: &walkdir::Error) -> String {
    match e.io_error() {
        Some(io) => io.to_string(),
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An output folder that is a folder to read (however it is spelt) is refused, naming both;
    /// one inside a folder to read, above it, beside it, or not yet made is not.
    #[test]
    fn an_output_folder_that_is_an_input_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let runs = tmp.path().join("runs");
        std::fs::create_dir_all(runs.join("a/tables")).unwrap();
        std::fs::create_dir_all(tmp.path().join("other")).unwrap();
        let inputs = [runs.join("a")];
        let refused = |out: PathBuf| check_output(&out, &inputs).err();
        let same = runs.join("a/../a/.");
        let e = refused(same.clone()).expect("the input itself");
        assert_eq!((e.out.clone(), e.input.clone()), (same.clone(), inputs[0].clone()));
        let message = e.to_string();
        assert!(
            message.contains(&same.display().to_string()) && message.contains(&inputs[0].display().to_string()),
            "{message}"
        );
        for fine in [runs.join("a/tables"), runs.clone(), tmp.path().join("other"), tmp.path().join("new")] {
            assert_eq!(refused(fine.clone()), None, "{}", fine.display());
        }
    }
}
