//! `zerobench plan SPEC`: the runs a spec expands to, with the GPUs each needs, the ZeRO
//! model-state memory per GPU (flagging runs that cannot fit the declared GPU memory) and what each
//! rank sends per step (and, given a bus bandwidth, how long that takes).

use std::io::Write;
use std::path::PathBuf;

use zerobench_launcher::plan::Fit;
use zerobench_launcher::values::human_bytes;
use zerobench_launcher::{Plan, Spec};

use crate::Outcome;
use zerobench_ingest::report::terminal::write_table;
use zerobench_ingest::table::Table;

/// What `fit` weighs, under the table.
const FOOTER: &str =
    "fit: gpu states (ZeRO model states per GPU, after offload) + gpu buffers (gradient buckets, gather \
                      slots)\nagainst cluster.gpu_memory; activations and the CUDA context come on top, so yes is \
                      necessary, not sufficient.\nsent/step: what each rank's collectives send over its links per \
                      optimizer step (ring; offload's copies not counted).";

/// What `comm ms` assumes, under the table.
const TIME_FOOTER: &str =
    "comm ms: sent/step over the bus bandwidth given, as if no collective overlapped computation.";

#[derive(clap::Args)]
pub struct Args {
    /// The experiment spec (YAML; see docs/launcher.md).
    spec: PathBuf,
    /// Print the runs as JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// The bus bandwidth (GB/s, nccl-tests' busbw) collectives reach inside a node: adds each
    /// run's communication time per step, without overlap.
    #[arg(long, value_name = "GBPS", value_parser = positive_gbps)]
    bus_gbps: Option<f64>,
    /// The bus bandwidth across nodes, for runs on more than one node (default: --bus-gbps).
    #[arg(long, value_name = "GBPS", value_parser = positive_gbps, requires = "bus_gbps")]
    inter_node_bus_gbps: Option<f64>,
}

fn positive_gbps(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("expected a bandwidth in GB/s above 0, got {s:?}")),
    }
}

pub fn run(a: Args) -> anyhow::Result<Outcome> {
    let plan = Plan::build(Spec::load(&a.spec)?)?;
    let mut out = std::io::stdout().lock();
    if a.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&plan.runs)?)?;
        return Ok(Outcome::Complete);
    }
    let mut header =
        vec!["run", "ranks", "gpus", "params", "gpu states", "gpu buffers", "host states", "fit", "sent/step"];
    let bandwidth = a.bus_gbps.map(|intra| (intra, a.inter_node_bus_gbps.unwrap_or(intra)));
    if bandwidth.is_some() {
        header.push("comm ms");
    }
    header.push("notes");
    let mut t = Table::new("plan", header);
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
        let mut row = vec![
            r.id.clone(),
            r.world_size().to_string(),
            r.gpus().to_string(),
            format!("{:.1}M", r.model_params as f64 / 1e6),
            human_bytes(r.device_state_bytes),
            human_bytes(r.buffer_bytes),
            if r.host_state_bytes > 0 { human_bytes(r.host_state_bytes) } else { "-".into() },
            fit,
            human_bytes(r.comm.wire_bytes),
        ];
        if let Some((intra, inter)) = bandwidth {
            row.push(format!("{:.3}", r.comm_seconds(intra, inter) * 1e3));
        }
        let proposal = r.proposed_offload_ratio.map(|x| format!("offload_ratio {x} balances host and GPU (estimate)"));
        row.push(proposal.into_iter().chain(r.warnings.iter().cloned()).collect::<Vec<_>>().join("; "));
        t.row(row);
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
    if bandwidth.is_some() {
        writeln!(out, "{TIME_FOOTER}")?;
    }
    Ok(Outcome::Complete)
}
