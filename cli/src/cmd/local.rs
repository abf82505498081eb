//! `zerobench local SPEC --out DIR`: render the sweep with the local method and run it on this
//! host, one run after the other, with a progress bar; a failed run does not stop the sweep.
//! A spec with `cluster.allocation` keeps its srun method: each run is a job step of that
//! allocation, driven from here.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Duration;

use zerobench_launcher::local::{run_local, LocalOptions};
use zerobench_launcher::spec::Method;
use zerobench_launcher::status::State;
use zerobench_launcher::{render, Plan, Spec};

use crate::Outcome;
use zerobench_ingest::report::terminal::write_table;
use zerobench_ingest::tables::Table;

#[derive(clap::Args)]
pub struct Args {
    /// The experiment spec; its runs must each fit on one node, unless it names an allocation.
    spec: PathBuf,
    /// Where the run folders go.
    #[arg(long, short)]
    out: PathBuf,
    /// Stop a run after this many seconds (default: the spec's cluster.time, else no limit).
    #[arg(long)]
    timeout: Option<u64>,
}

pub fn run(a: Args) -> anyhow::Result<Outcome> {
    let mut spec = Spec::load(&a.spec)?;
    if spec.cluster.allocation.is_some() {
        // The scripts start their ranks as srun steps of the allocation; this host only drives them.
        tracing::info!("{}: running the runs as steps of the existing allocation", a.spec.display());
    } else if spec.launch.method != Method::Local {
        tracing::warn!(
            "{}: launch.method is {}; zerobench local runs it with mpirun on this host",
            a.spec.display(),
            spec.launch.method
        );
        spec.set_method(Method::Local)?;
    }
    let timeout = a
        .timeout
        .map(Duration::from_secs)
        .or_else(|| spec.cluster.time.as_ref().and_then(|t| t.seconds()).map(Duration::from_secs));
    let plan = Plan::build(spec)?;
    let dirs = render::render(&plan, &a.out)?;
    // render gives the folders in the plan's order.
    let runs: Vec<(String, PathBuf)> = plan.runs.iter().map(|r| r.id.clone()).zip(dirs).collect();
    let results = run_local(&runs, &LocalOptions { timeout, progress: std::io::stderr().is_terminal() })?;
    let mut t = Table::new("local", ["run", "state", "seconds", "detail"]);
    let mut failed = 0;
    for r in &results {
        let st = r.record.state();
        if st != State::Done {
            failed += 1;
        }
        let mut detail = r.record.describe();
        if let Some(why) = &r.failure {
            detail.push_str(&format!("; {why}"));
        }
        t.row([r.id.clone(), st.to_string(), format!("{:.1}", r.record.seconds), detail]);
    }
    let mut out = std::io::stdout().lock();
    write_table(&mut out, &t)?;
    writeln!(out, "{} runs, {} failed; logs in each run folder's logs/, output in local.out", results.len(), failed)?;
    Ok(if failed > 0 { Outcome::Incomplete } else { Outcome::Complete })
}
