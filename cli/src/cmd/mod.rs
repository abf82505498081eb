//! One module per subcommand: its arguments and how it runs.

pub mod hostfile;
pub mod hostlist;
pub mod ingest;
pub mod local;
pub mod plan;
pub mod render;
pub mod schema;
pub mod status;
pub mod submit;
