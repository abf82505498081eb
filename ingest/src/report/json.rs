//! JSON: one file per table with the typed values (numbers as numbers, empty cells as null),
//! plus `summary.json` with what was read and every problem.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::ReportError;
use crate::problem::Problem;
use crate::read::ReadStats;
use crate::tables::Tables;
use crate::Ingested;

/// The version of ingest's JSON output; bumped when a field is renamed, removed or changes
/// meaning.
pub const OUTPUT_SCHEMA_VERSION: u32 = 1;

#[derive(Serialize)]
struct Envelope<'a, T: Serialize> {
    schema_version: u32,
    table: &'a str,
    rows: &'a T,
}

#[derive(Serialize)]
struct Summary<'a> {
    schema_version: u32,
    /// Every log read without a problem and every output written.
    complete: bool,
    runs: usize,
    read: &'a ReadStats,
    problems: &'a [Problem],
    /// The outputs that could not be written (a plot on a full disk), each with why.
    unwritten: Vec<String>,
}

/// Writes the tables and `summary.json`; `unwritten` are the outputs already known to be missing.
pub fn write(
    ingested: &Ingested,
    tables: &Tables,
    out: &Path,
    unwritten: &[ReportError],
) -> Result<Vec<PathBuf>, ReportError> {
    let mut written = vec![
        one(out, "latency", &tables.latency)?,
        one(out, "mem", &tables.mem)?,
        one(out, "states", &tables.states)?,
        one(out, "scaling", &tables.scaling)?,
        one(out, "comm", &tables.comm)?,
        one(out, "runs", &tables.runs)?,
        one(out, "memory-phases", &tables.memory_phases)?,
    ];
    if !tables.predicted.is_empty() {
        written.push(one(out, "predicted", &tables.predicted)?);
    }
    if !tables.stage_choice.is_empty() {
        written.push(one(out, "stage-choice", &tables.stage_choice)?);
    }
    let summary = Summary {
        schema_version: OUTPUT_SCHEMA_VERSION,
        complete: ingested.complete() && unwritten.is_empty(),
        runs: ingested.runs.len(),
        read: &ingested.stats,
        problems: &ingested.problems,
        unwritten: unwritten.iter().map(ToString::to_string).collect(),
    };
    written.push(save(out, "summary", &summary)?);
    Ok(written)
}

fn one<T: Serialize>(out: &Path, name: &str, rows: &T) -> Result<PathBuf, ReportError> {
    save(out, name, &Envelope { schema_version: OUTPUT_SCHEMA_VERSION, table: name, rows })
}

fn save<T: Serialize>(out: &Path, name: &str, v: &T) -> Result<PathBuf, ReportError> {
    let path = out.join(format!("{name}.json"));
    let mut text =
        serde_json::to_string_pretty(v).map_err(|source| ReportError::Json { path: path.clone(), source })?;
    text.push('\n');
    std::fs::write(&path, text).map_err(|e| ReportError::io(&path, e))?;
    Ok(path)
}
