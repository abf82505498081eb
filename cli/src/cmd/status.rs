//! `zerobench status DIR`: the state of every run of a rendered sweep (pending, running, done,
//! oom, failed, cancelled, timeout), from Slurm where it still knows and from the run folders.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use zerobench_launcher::status::{status, State};

use crate::Outcome;
use zerobench_table::{write_text, Table};

#[derive(clap::Args)]
pub struct Args {
    /// A folder of rendered runs, or one run folder.
    dir: PathBuf,
    /// Print the states as JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> anyhow::Result<Outcome> {
    let dirs = super::submit::run_dirs(&a.dir)?;
    let rows = status(&dirs)?;
    let mut out = crate::stdout::stdout();
    if a.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&rows)?)?;
    } else {
        let mut t = Table::new("status", ["run", "state", "job", "source", "detail"]);
        for r in &rows {
            t.row([
                r.id.clone(),
                r.state.to_string(),
                r.job_id.clone().unwrap_or_else(|| "-".into()),
                r.source.to_string(),
                r.detail.clone(),
            ]);
        }
        write_text(&mut out, &t)?;
        let mut counts: BTreeMap<State, usize> = BTreeMap::new();
        for r in &rows {
            *counts.entry(r.state).or_default() += 1;
        }
        let summary: Vec<String> = counts.iter().map(|(s, n)| format!("{n} {s}")).collect();
        writeln!(out, "{} runs: {}", rows.len(), summary.join(", "))?;
    }
    // Exit 1 when a run did not end well, so scripts can wait on `zerobench status`.
    let bad = rows
        .iter()
        .any(|r| matches!(r.state, State::Oom | State::Failed | State::Cancelled | State::Timeout | State::Unknown));
    Ok(if bad { Outcome::Incomplete } else { Outcome::Complete })
}
