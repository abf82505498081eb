//! `zerobench render SPEC --out DIR`: one folder per run with `job.sbatch`, the hostfile its
//! method reads, and `run.json`.

use std::io::Write;
use std::path::PathBuf;

use zerobench_launcher::{render, Plan, Spec};

use crate::Outcome;
use zerobench_ingest::report::terminal::write_table;
use zerobench_ingest::tables::Table;

#[derive(clap::Args)]
pub struct Args {
    /// The experiment spec (YAML; see docs/launcher.md).
    spec: PathBuf,
    /// Where the run folders go (created if needed; existing run folders are refreshed).
    #[arg(long, short)]
    out: PathBuf,
}

pub fn run(a: Args) -> anyhow::Result<Outcome> {
    let plan = Plan::build(Spec::load(&a.spec)?)?;
    let dirs = render::render(&plan, &a.out)?;
    let mut t = Table::new("render", ["run", "method", "ranks", "folder"]);
    for (r, d) in plan.runs.iter().zip(&dirs) {
        t.row([r.id.clone(), plan.spec.launch.method.to_string(), r.world_size().to_string(), d.display().to_string()]);
    }
    let mut out = std::io::stdout().lock();
    write_table(&mut out, &t)?;
    writeln!(out, "{} runs rendered", dirs.len())?;
    Ok(Outcome::Complete)
}
