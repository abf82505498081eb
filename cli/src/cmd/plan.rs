//! `zerobench plan SPEC`: the runs a spec expands to, with the GPUs each needs and the ZeRO
//! model-state memory per GPU, flagging runs that cannot fit the declared GPU memory.

use std::io::Write;
use std::path::PathBuf;

use zerobench_launcher::plan::Fit;
use zerobench_launcher::values::human_bytes;
use zerobench_launcher::{Plan, Spec};

use zerobench_ingest::report::terminal::write_table;
use zerobench_ingest::tables::Table;
use crate::Outcome;

/// What `fit` weighs, under the table.
const FOOTER: &str = "fit: gpu states (ZeRO model states per GPU, after offload) + gpu buffers (gradient buckets, gather \
                      slots)\nagainst cluster.gpu_memory; activations and the CUDA context come on top, so yes is \
                      necessary, not sufficient.";

#[derive(clap::Args)]
pub struct Args {
    /// The experiment spec (YAML; see docs/launcher.md).
    spec: PathBuf,
    /// Print the runs as JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> anyhow::Result<Outcome> {
    let plan = Plan::build(Spec::load(&a.spec)?)?;
    let mut out = std::io::stdout().lock();
    if a.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&plan.runs)?)?;
        return Ok(Outcome::Complete);
    }
    let mut t = Table::new("plan", ["run", "ranks", "gpus", "params", "gpu states", "gpu buffers", "host states", "fit", "notes"]);
    let mut too_big = 0;
    for r in &plan.runs {
        let fit = match r.fit {
            Fit::Unknown => "-".to_string(),
            Fit::Fits { .. } => "yes".to_string(),
            Fit::TooBig { .. } => {
                too_big += 1;
                "NO".to_string()
            }
        };
        t.row([
            r.id.clone(),
            r.world_size().to_string(),
            r.gpus().to_string(),
            format!("{:.1}M", r.model_params as f64 / 1e6),
            human_bytes(r.device_state_bytes),
            human_bytes(r.buffer_bytes),
            if r.host_state_bytes > 0 { human_bytes(r.host_state_bytes) } else { "-".into() },
            fit,
            r.warnings.join("; "),
        ]);
    }
    write_table(&mut out, &t)?;
    let gpus: u64 = plan.runs.iter().map(|r| u64::from(r.gpus())).sum();
    writeln!(
        out,
        "{} runs, method {}, {} GPUs over all runs; {} do not fit {}",
        plan.runs.len(),
        plan.spec.launch.method,
        gpus,
        too_big,
        plan.spec
            .cluster
            .gpu_memory
            .map_or_else(|| "(no cluster.gpu_memory given)".to_string(), |m| format!("{} per GPU", human_bytes(m.0))),
    )?;
    writeln!(out, "{FOOTER}")?;
    Ok(Outcome::Complete)
}
