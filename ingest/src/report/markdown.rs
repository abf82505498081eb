//! Markdown: GitHub tables, one file per table, ready to paste into a pull request.

use std::path::{Path, PathBuf};

use super::ReportError;
use zerobench_table::Table;

pub fn write(tables: &[Table], out: &Path) -> Result<Vec<PathBuf>, ReportError> {
    tables
        .iter()
        .map(|t| {
            let path = out.join(format!("{}.md", t.name));
            std::fs::write(&path, zerobench_table::markdown(t)).map_err(|e| ReportError::io(&path, e))?;
            Ok(path)
        })
        .collect()
}
