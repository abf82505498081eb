//! `zerobench schema`: the JSON Schema of the log records, generated from the types the worker
//! writes with. `docs/log-schema.json` is this output, kept current by a test.

use std::io::Write;

use crate::Outcome;

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_: Args) -> anyhow::Result<Outcome> {
    let schema = schemars::schema_for!(zerobench_schema::Record);
    let text = serde_json::to_string_pretty(&schema)?;
    writeln!(crate::stdout::stdout(), "{text}")?;
    Ok(Outcome::Complete)
}
