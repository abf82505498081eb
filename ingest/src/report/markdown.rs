//! Markdown: GitHub tables, one file per table, ready to paste into a pull request.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::ReportError;
use crate::table::Table;

pub fn write(tables: &[Table], out: &Path) -> Result<Vec<PathBuf>, ReportError> {
    tables
        .iter()
        .map(|t| {
            let path = out.join(format!("{}.md", t.name));
            std::fs::write(&path, render(t)).map_err(|e| ReportError::io(&path, e))?;
            Ok(path)
        })
        .collect()
}

/// The table as Markdown; a table without a header says so instead.
pub fn render(t: &Table) -> String {
    if t.header.is_empty() {
        return format!("_{}: no runs_\n", t.name);
    }
    let mut s = String::new();
    let line = |cells: &[String]| {
        let cells: Vec<String> = cells.iter().map(|c| c.replace('|', "\\|").replace('\n', " ")).collect();
        format!("| {} |\n", cells.join(" | "))
    };
    s.push_str(&line(&t.header));
    let _ = writeln!(s, "|{}", "---|".repeat(t.header.len()));
    for r in &t.rows {
        s.push_str(&line(r));
    }
    s
}
