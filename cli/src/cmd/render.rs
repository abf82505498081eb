//! `zerobench render SPEC --out DIR`: one folder per run with `job.sbatch`, the hostfile its
//! method reads, and `run.json`.

use std::io::Write;
use std::path::PathBuf;

use zerobench_launcher::rerun::render_over;
use zerobench_launcher::{Plan, Spec};

use crate::Outcome;
use zerobench_table::{write_text, Table};

#[derive(clap::Args)]
pub struct Args {
    /// The experiment spec (YAML; see docs/launcher.md).
    spec: PathBuf,
    /// Where the run folders go (created if needed). A folder that already holds this run is left
    /// as it is; one that holds another configuration's results is refused (see --overwrite).
    #[arg(long, short)]
    out: PathBuf,
    #[command(flatten)]
    render: super::RenderFlags,
}

pub fn run(a: Args) -> anyhow::Result<Outcome> {
    let mut plan = Plan::build(Spec::load(&a.spec)?)?;
    let unfit = super::leave_out_unfit(&mut plan, a.render.include_unfit);
    let _lock = crate::lock::lock(&a.out, "render")?;
    let on_change = a.render.on_change();
    let dirs = render_over(&plan, &a.out, on_change)?;
    let mut t = Table::new("render", ["run", "method", "ranks", "folder", "done"]);
    for (r, (d, what)) in plan.runs.iter().zip(&dirs) {
        t.row([
            r.id.clone(),
            plan.spec.launch.method.to_string(),
            r.world_size().to_string(),
            d.display().to_string(),
            what.describe(),
        ]);
    }
    for (id, why) in &unfit {
        t.row([id.clone(), "-".into(), "-".into(), "-".into(), why.clone()]);
    }
    let mut out = crate::stdout::stdout();
    write_text(&mut out, &t)?;
    writeln!(out, "{} runs rendered, {} left out as unfit", dirs.len(), unfit.len())?;
    Ok(Outcome::Complete)
}
