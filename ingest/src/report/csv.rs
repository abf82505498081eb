//! CSV: one file per table, header first. The latency and memory tables keep the profiling studies'
//! stacked-block layout (a block's header row, then one row per model).

use std::path::{Path, PathBuf};

use super::ReportError;
use zerobench_table::Table;

pub fn write(tables: &[Table], out: &Path) -> Result<Vec<PathBuf>, ReportError> {
    tables.iter().map(|t| write_one(t, out)).collect()
}

fn write_one(t: &Table, out: &Path) -> Result<PathBuf, ReportError> {
    let path = out.join(format!("{}.csv", t.name));
    let err = |source| ReportError::Csv { path: path.clone(), source };
    let mut w = ::csv::WriterBuilder::new().flexible(true).from_path(&path).map_err(err)?;
    if !t.header.is_empty() {
        w.write_record(&t.header).map_err(err)?;
    }
    for r in &t.rows {
        w.write_record(r).map_err(err)?;
    }
    w.flush().map_err(|e| ReportError::io(&path, e))?;
    Ok(path)
}
