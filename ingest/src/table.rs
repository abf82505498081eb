//! A rectangular table of text cells: what the CSV, Markdown and terminal sinks write, built by
//! [`crate::tables`] and [`crate::scaling`].

/// A rectangular table of text cells.
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
}
