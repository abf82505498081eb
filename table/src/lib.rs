//! A rectangular table of text cells and its two text forms: aligned columns for a terminal
//! ([`write_text`]) and GitHub Markdown ([`markdown`]).
//!
//! The launcher's commands (`plan`, `render`, `submit`, `status`, `local`, `hostfile`) and ingest's
//! tables print through it, so neither depends on the other for it. Hand-written: the two forms
//! are forty lines together, and their exact layout is held by the golden outputs of ingest and
//! the CLI's tests (a table crate's layout would change those outputs with its versions).

use std::fmt::Write as _;
use std::io::{self, Write};

mod rows;
pub use rows::{row_cells, RowError};

/// A rectangular table of text cells, with a name (its file name in ingest's outputs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    pub name: &'static str,
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    /// An empty table with these column names (filled with [`Table::row`]).
    pub fn new<S: Into<String>>(name: &'static str, header: impl IntoIterator<Item = S>) -> Self {
        Table { name, header: header.into_iter().map(Into::into).collect(), rows: Vec::new() }
    }

    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        self.rows.push(cells.into_iter().map(Into::into).collect());
    }

    /// A table of plain struct rows ([`row_cells`]): the field names as header (`sample`'s when
    /// there are no rows), each field a cell as the CSV writer writes it.
    pub fn from_rows<T: serde::Serialize>(name: &'static str, rows: &[T], sample: &T) -> Result<Self, RowError> {
        let (names, _) = row_cells(sample)?;
        let rows = rows.iter().map(|r| row_cells(r).map(|(_, cells)| cells)).collect::<Result<_, _>>()?;
        Ok(Table { name, header: names, rows })
    }
}

/// Writes a table with its columns aligned (numbers, with an optional `%`, to the right), a rule
/// under the header, and no trailing spaces.
pub fn write_text(w: &mut dyn Write, t: &Table) -> io::Result<()> {
    let n = t.header.len();
    let mut width: Vec<usize> = t.header.iter().map(|h| h.chars().count()).collect();
    for r in &t.rows {
        for (i, c) in r.iter().enumerate().take(n) {
            width[i] = width[i].max(c.chars().count());
        }
    }
    let numeric = |c: &str| !c.is_empty() && c.trim_end_matches('%').parse::<f64>().is_ok();
    let line = |w: &mut dyn Write, cells: &[String]| -> io::Result<()> {
        let mut parts = Vec::with_capacity(n);
        for (i, c) in cells.iter().enumerate().take(n) {
            let pad = width[i].saturating_sub(c.chars().count());
            parts.push(if numeric(c) { format!("{}{c}", " ".repeat(pad)) } else { format!("{c}{}", " ".repeat(pad)) });
        }
        writeln!(w, "{}", parts.join("  ").trim_end())
    };
    line(w, &t.header)?;
    writeln!(w, "{}", width.iter().map(|k| "-".repeat(*k)).collect::<Vec<_>>().join("  "))?;
    for r in &t.rows {
        line(w, r)?;
    }
    Ok(())
}

/// The table as GitHub Markdown (`|` escaped, line breaks as spaces); a table without a header
/// says so instead.
pub fn markdown(t: &Table) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Table {
        let mut t = Table::new("runs", ["run", "ms", "share"]);
        t.row(["gpt2_z0", "12.5", "9.1%"]);
        t.row(["a|b", "7", "n/a"]);
        t
    }

    #[test]
    fn text_aligns_numbers_right_and_words_left() {
        let mut out = Vec::new();
        write_text(&mut out, &sample()).unwrap();
        let text = String::from_utf8(out).unwrap();
        // Headers are words: left-aligned over their column.
        assert_eq!(text, "run      ms    share\n-------  ----  -----\ngpt2_z0  12.5   9.1%\na|b         7  n/a\n");
    }

    #[test]
    fn markdown_escapes_pipes_and_says_when_empty() {
        assert_eq!(
            markdown(&sample()),
            "| run | ms | share |\n|---|---|---|\n| gpt2_z0 | 12.5 | 9.1% |\n| a\\|b | 7 | n/a |\n"
        );
        assert_eq!(markdown(&Table::new::<&str>("latency", [])), "_latency: no runs_\n");
    }
}
