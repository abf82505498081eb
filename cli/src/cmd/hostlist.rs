//! `zerobench hostlist expand|compress EXPR`: Slurm hostlist expressions, without Slurm.

use std::io::Write;

use zerobench_launcher::hostlist;

use crate::Outcome;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    action: Action,
}

#[derive(clap::Subcommand)]
enum Action {
    /// Print every host name of an expression, one per line (`node[01-03]` → node01 node02 node03).
    Expand {
        /// A hostlist expression; several are read as one comma-separated list.
        #[arg(required = true)]
        expr: Vec<String>,
    },
    /// Print the shortest expression for a list of hosts, keeping their order and duplicates.
    Compress {
        /// Host names or expressions, comma- or space-separated.
        #[arg(required = true)]
        hosts: Vec<String>,
    },
}

pub fn run(a: Args) -> anyhow::Result<Outcome> {
    let mut out = crate::stdout::stdout();
    match a.action {
        Action::Expand { expr } => {
            for h in hostlist::expand(&expr.join(","))? {
                writeln!(out, "{h}")?;
            }
        }
        Action::Compress { hosts } => {
            let all = hostlist::expand(&hosts.join(","))?;
            writeln!(out, "{}", hostlist::compress(&all)?)?;
        }
    }
    Ok(Outcome::Complete)
}
