//! One module per subcommand: its arguments and how it runs.

pub mod ingest;
pub mod schema;
