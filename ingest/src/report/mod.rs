//! Writing the tables: CSV, Markdown and JSON files, SVG plots, and the terminal summary.

pub mod csv;
pub mod json;
pub mod markdown;
pub mod plot;
pub mod terminal;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::tables::Tables;
use crate::Ingested;

/// A file format for the tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Format {
    Csv,
    Markdown,
    Json,
    /// SVG plots.
    Svg,
}

impl Format {
    pub const ALL: [Format; 4] = [Format::Csv, Format::Markdown, Format::Json, Format::Svg];
}

impl FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "csv" => Ok(Format::Csv),
            "md" | "markdown" => Ok(Format::Markdown),
            "json" => Ok(Format::Json),
            "svg" | "plots" => Ok(Format::Svg),
            other => Err(format!("unknown format '{other}' (expected csv, md, json or svg)")),
        }
    }
}

/// Why output could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("cannot write {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("cannot write {path}: {source}")]
    Csv { path: PathBuf, source: ::csv::Error },
    #[error("cannot write {path}: {source}")]
    Json { path: PathBuf, source: serde_json::Error },
    #[error("cannot draw {path}: {message}")]
    Plot { path: PathBuf, message: String },
    /// Files in the output folder under names this ingest writes that no earlier ingest wrote
    /// there (its [`MANIFEST`] does not list them): someone else's, kept unless replacing them is
    /// asked for ([`Replace::Any`]). Nothing was written.
    #[error(
        "{} already holds {} that no earlier ingest wrote there; nothing was written: pass \
         --overwrite to replace {}, or write elsewhere",
        out.display(),
        names_list(names),
        if names.len() == 1 { "it" } else { "them" }
    )]
    NotWrittenByIngest { out: PathBuf, names: Vec<String> },
}

/// Up to five names, then how many more.
fn names_list(names: &[String]) -> String {
    const SHOWN: usize = 5;
    let mut s = names.iter().take(SHOWN).cloned().collect::<Vec<_>>().join(", ");
    if names.len() > SHOWN {
        s.push_str(&format!(" and {} more", names.len() - SHOWN));
    }
    s
}

/// Which files already in the output folder an ingest may replace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replace {
    /// Only those the last ingest into the folder wrote ([`MANIFEST`]); a file of the same name
    /// as one of this ingest's that it did not write makes the ingest write nothing.
    IngestOwn,
    /// Any file under a name this ingest writes (`zerobench ingest --overwrite`).
    Any,
}

impl ReportError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        ReportError::Io { path: path.to_path_buf(), source }
    }
}

/// The list of the files the last ingest wrote into its output folder, one name a line. The next
/// ingest into that folder removes those it does not write again (the plots of a model no longer
/// read, `predicted.*` of an earlier `--cost-model`), so the folder never holds two ingests'
/// outputs side by side; nothing else in the folder is ever removed.
pub const MANIFEST: &str = ".zerobench-ingest-files";

/// Writes every table in every format asked for into `out`, which is created if needed.
/// Returns the files written and the plots that could not be drawn (the rest is written; the
/// caller reports them and the result as incomplete). The files of the last ingest into `out`
/// that this one does not write are removed ([`MANIFEST`]). A file under one of this ingest's
/// names that the last ingest did not write is replaced only with [`Replace::Any`]; otherwise
/// nothing is written ([`ReportError::NotWrittenByIngest`]).
///
/// The files are written into a private folder created inside `out` (exclusively: a folder or a
/// link already there under that name is an error) and then renamed into place. A rename
/// replaces whatever has the file's name, a symbolic link included, instead of writing through
/// it, so a link planted in `out` cannot make ingest overwrite its target; and each file appears
/// whole or not at all. If any file cannot be written, none is moved and the private folder is
/// removed. The list of files ([`MANIFEST`]) names the last ingest's files and this one's before
/// the first is moved, and this one's alone after the last: an ingest stopped between the two
/// (killed, a full disk) leaves a folder the next ingest still knows as its own.
///
/// The caller holds `out`'s lock (one writer a folder): a private folder of an earlier ingest
/// found there is what one that was killed left, and is removed.
pub fn write_all(
    ingested: &Ingested,
    tables: &Tables,
    out: &Path,
    formats: &[Format],
    replace: Replace,
) -> Result<(Vec<PathBuf>, Vec<ReportError>), ReportError> {
    std::fs::create_dir_all(out).map_err(|e| ReportError::io(out, e))?;
    // What the last ingest here wrote: the files this one may replace, and those it removes.
    let ours = last_written(out);
    remove_stale_staging(out);
    let staging = out.join(format!("{STAGING_PREFIX}{}", std::process::id()));
    std::fs::create_dir(&staging).map_err(|e| ReportError::io(&staging, e))?;
    let mut failed = Vec::new();
    let staged = write_formats(ingested, tables, &staging, formats, &mut failed)
        .and_then(|files| check_replaced(out, &ours, &files, replace).map(|()| files))
        .and_then(|files| {
            // Both ingests' names while the files move.
            let both: BTreeSet<String> = ours.iter().cloned().chain(names(&files)).collect();
            write_manifest(out, &both).map(|()| files)
        });
    let moved = staged.and_then(|files| {
        files
            .into_iter()
            .map(|f| {
                let name = f.file_name().expect("a file the writers named");
                let dest = out.join(name);
                std::fs::rename(&f, &dest).map_err(|e| ReportError::io(&dest, e))?;
                Ok(dest)
            })
            .collect::<Result<Vec<PathBuf>, ReportError>>()
    });
    // Empty when every file was moved; what is left of a failed write goes with it.
    let _ = std::fs::remove_dir_all(&staging);
    let files = moved?;
    replace_manifest(out, &ours, &files)?;
    Ok((files, failed))
}

/// The names the last ingest into `out` wrote there ([`MANIFEST`]); a name with a path in it or
/// a hidden one is no name of ingest's (the list is a file anyone can edit).
fn last_written(out: &Path) -> BTreeSet<String> {
    std::fs::read_to_string(out.join(MANIFEST))
        .map(|old| {
            old.lines()
                .filter(|name| !name.is_empty() && !name.starts_with('.') && !name.contains('/'))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// Refuses, under [`Replace::IngestOwn`], to replace anything in `out` (a file, a link, a
/// folder) under the name of a file of `staged` that the last ingest did not write there (`ours`).
fn check_replaced(
    out: &Path,
    ours: &BTreeSet<String>,
    staged: &[PathBuf],
    replace: Replace,
) -> Result<(), ReportError> {
    if replace == Replace::Any {
        return Ok(());
    }
    let names: Vec<String> = staged
        .iter()
        .filter_map(|f| f.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .filter(|n| !ours.contains(n) && std::fs::symlink_metadata(out.join(n)).is_ok())
        .collect();
    if names.is_empty() {
        Ok(())
    } else {
        Err(ReportError::NotWrittenByIngest { out: out.to_path_buf(), names })
    }
}

/// Removes the files the last ingest into `out` wrote (`last`, from its [`MANIFEST`]) that
/// `written` does not hold, then records `written` as the folder's files. Only plain files
/// directly in `out` under the names listed are removed: a link or folder under a listed name is
/// left alone.
fn replace_manifest(out: &Path, last: &BTreeSet<String>, written: &[PathBuf]) -> Result<(), ReportError> {
    let names: BTreeSet<String> = names(written).collect();
    for name in last.difference(&names) {
        let stale = out.join(name);
        if std::fs::symlink_metadata(&stale).is_ok_and(|m| m.file_type().is_file()) {
            std::fs::remove_file(&stale).map_err(|e| ReportError::io(&stale, e))?;
            tracing::info!("removed {}: the last ingest's, not written this time", stale.display());
        }
    }
    write_manifest(out, &names)
}

/// The file names of `files`.
fn names(files: &[PathBuf]) -> impl Iterator<Item = String> + '_ {
    files.iter().filter_map(|f| f.file_name()).map(|n| n.to_string_lossy().into_owned())
}

/// Records `names` as the files of `out` that ingest wrote ([`MANIFEST`]).
fn write_manifest(out: &Path, names: &BTreeSet<String>) -> Result<(), ReportError> {
    let text: String = names.iter().map(|n| format!("{n}\n")).collect();
    let list = out.join(MANIFEST);
    zerobench_files::replace(&list, text.as_bytes()).map_err(|e| ReportError::io(&e.path, e.cause))
}

/// The name of an ingest's private folder in its output folder, before its process id.
const STAGING_PREFIX: &str = ".zerobench-ingest-";

/// Removes the private folders that ingests killed while writing left in `out` (only folders, not
/// links, named as [`STAGING_PREFIX`] and a number); the caller holds `out`'s lock, so none is
/// in use.
fn remove_stale_staging(out: &Path) {
    let Ok(entries) = std::fs::read_dir(out) else { return };
    for e in entries.flatten() {
        let name = e.file_name();
        let is_staging = name
            .to_str()
            .and_then(|n| n.strip_prefix(STAGING_PREFIX))
            .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()));
        if is_staging && e.file_type().is_ok_and(|t| t.is_dir()) {
            match std::fs::remove_dir_all(e.path()) {
                Ok(()) => tracing::info!("removed {}: an earlier ingest's, stopped while writing", e.path().display()),
                Err(err) => tracing::warn!("cannot remove {}: {err}", e.path().display()),
            }
        }
    }
}

fn write_formats(
    ingested: &Ingested,
    tables: &Tables,
    dir: &Path,
    formats: &[Format],
    failed: &mut Vec<ReportError>,
) -> Result<Vec<PathBuf>, ReportError> {
    let mut written = Vec::new();
    let text = tables.text_tables();
    // Plots first: `summary.json` names those that could not be drawn.
    if formats.contains(&Format::Svg) {
        let (plots, bad) = plot::write(tables, dir);
        written.extend(plots);
        failed.extend(bad);
    }
    for f in formats {
        match f {
            Format::Csv => written.extend(csv::write(&text, dir)?),
            Format::Markdown => written.extend(markdown::write(&text, dir)?),
            Format::Json => written.extend(json::write(ingested, tables, dir, failed)?),
            Format::Svg => {}
        }
    }
    Ok(written)
}
