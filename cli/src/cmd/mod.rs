//! One module per subcommand: its arguments and how it runs.

pub mod schema;
