//! `zerobench hostfile check FILE`: parse a hostfile strictly, apply DeepSpeed-style
//! `--include`/`--exclude`, and print which rank runs where.

use std::io::Write;
use std::path::PathBuf;

use zerobench_launcher::hostfile::{Hostfile, HostfileFormat};
use zerobench_launcher::select::{Filter, Resources};

use crate::Outcome;
use zerobench_table::{write_text, Table};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    action: Action,
}

#[derive(clap::Subcommand)]
enum Action {
    /// Check a hostfile and print the rank → (host, slot) table.
    Check(CheckArgs),
}

#[derive(clap::Args)]
struct CheckArgs {
    file: PathBuf,
    /// deepspeed (`host slots=N`), openmpi (`host slots=N [max_slots=M]`) or mpich (`host[:N]`).
    #[arg(long, default_value = "deepspeed")]
    format: HostfileFormat,
    /// Only these slots, DeepSpeed syntax: `worker-0:0,2@worker-1` (a bare host: all its slots).
    #[arg(short = 'i', long, conflicts_with = "exclude")]
    include: Option<String>,
    /// All slots but these, same syntax.
    #[arg(short = 'e', long)]
    exclude: Option<String>,
}

pub fn run(a: Args) -> anyhow::Result<Outcome> {
    let Action::Check(c) = a.action;
    let hf = Hostfile::read(&c.file, c.format)?;
    let filter = Filter::from_flags(c.include.as_deref(), c.exclude.as_deref())?;
    let res = Resources::select(&hf, filter)?;
    let mut t = Table::new("hostfile", ["rank", "host", "node_rank", "local_rank", "slot"]);
    for r in res.ranks() {
        t.row([r.rank.to_string(), r.host, r.node_rank.to_string(), r.local_rank.to_string(), r.slot.to_string()]);
    }
    let mut out = crate::stdout::stdout();
    write_text(&mut out, &t)?;
    writeln!(out, "{} ranks on {} hosts ({} format)", res.total_slots(), res.hosts.len(), c.format)?;
    Ok(Outcome::Complete)
}
