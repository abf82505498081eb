//! `zerobench plan SPEC`: the runs a spec expands to, with the GPUs each needs, the ZeRO
//! model-state memory per GPU (flagging runs that cannot fit the declared GPU memory) and what each
//! rank sends per step (and, given a bus bandwidth, how long that takes). Given a cost model
//! (`--cost-model`, or `--gpu` for the shipped one) it adds each run's predicted step time,
//! throughput and peak memory, and marks per model the run that fits with the most tokens per
//! second per GPU.

use std::io::Write;
use std::path::PathBuf;

use zerobench_costmodel::{CostModel, Prediction, Query};
use zerobench_launcher::plan::Fit;
use zerobench_launcher::values::human_bytes;
use zerobench_launcher::{Plan, Spec};

use crate::Outcome;
use zerobench_table::{write_text, Table};

/// What `fit` weighs, under the table.
const FOOTER: &str =
    "fit: gpu states (ZeRO model states per GPU, after offload) + gpu buffers (gradient buckets, gather \
                      slots)\nagainst cluster.gpu_memory; activations and the CUDA context come on top, so yes is \
                      necessary, not sufficient.\nsent/step: what each rank's collectives send over its links per \
                      optimizer step (ring; offload's copies not counted).";

/// What `comm ms` assumes, under the table.
const TIME_FOOTER: &str =
    "comm ms: sent/step over the bus bandwidth given, as if no collective overlapped computation.";

/// What the predicted columns are, under the table.
const PREDICT_FOOTER: &str = "pred: the cost model's step time, tokens/s per GPU and peak allocated memory \
                              (docs/cost-model.md); pred fit: peak reserved within cluster.gpu_memory (else the fitted GPU's memory); best (*): \
                              per model, the run that fits with the most tokens/s per GPU.";

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
    /// Predict every run with this cost model (from `zerobench fit`); needs --gpu.
    #[arg(long, requires = "gpu")]
    cost_model: Option<PathBuf>,
    /// The GPU kind to predict for (h200, "H100 80GB"): with --cost-model its fit there, alone the
    /// model shipped for it.
    #[arg(long)]
    gpu: Option<String>,
    /// With --gpu: the hosts' AdamW rate, 1e9 parameters per second, as `examples/cpu_adamw`
    /// reports it; offloaded runs' host updates are priced in proportion to the fitted hosts'
    /// (default: at their rate).
    #[arg(long, value_name = "GPARAMS_PER_S", value_parser = crate::cmd::predict::positive_rate, requires = "gpu")]
    host_adamw_rate: Option<f64>,
}

/// One run's prediction, or why there is none.
enum Predicted {
    Yes(Box<Prediction>),
    No(String),
}

/// Predicts every run; marks per model the fitting run with the most tokens/s per GPU.
fn predict_all(plan: &Plan, model: &CostModel, gpu: &str, host_rate: Option<f64>) -> (Vec<Predicted>, Vec<bool>) {
    // Whether a run fits is judged against cluster.gpu_memory when the spec declares it, else
    // against the memory of the GPU the model was fitted on.
    let declared = plan.spec.cluster.gpu_memory.map(|m| m.0);
    let preds: Vec<Predicted> = plan
        .runs
        .iter()
        .map(|r| match model.fit_for(gpu, r.config.precision) {
            Ok(f) => {
                let mut q = Query::new(r.config.clone(), r.world_size(), r.nodes);
                q.host_adamw_gparams_per_s = host_rate;
                let mut p = f.predict(&q);
                if let Some(m) = declared {
                    (p.device_memory_bytes, p.fits) = (Some(m), p.peak_reserved_bytes <= m);
                }
                Predicted::Yes(Box::new(p))
            }
            Err(e) => Predicted::No(e.to_string()),
        })
        .collect();
    let mut best: std::collections::BTreeMap<String, (usize, f64)> = std::collections::BTreeMap::new();
    for (i, (r, p)) in plan.runs.iter().zip(&preds).enumerate() {
        if let Predicted::Yes(p) = p {
            let e = best.entry(r.config.model.to_string()).or_insert((usize::MAX, f64::NEG_INFINITY));
            if p.fits && p.tokens_per_s_per_gpu > e.1 {
                *e = (i, p.tokens_per_s_per_gpu);
            }
        }
    }
    let mut mark = vec![false; plan.runs.len()];
    for (i, _) in best.values() {
        if let Some(m) = mark.get_mut(*i) {
            *m = true;
        }
    }
    (preds, mark)
}

fn positive_gbps(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("expected a bandwidth in GB/s above 0, got {s:?}")),
    }
}

pub fn run(a: Args) -> anyhow::Result<Outcome> {
    let plan = Plan::build(Spec::load(&a.spec)?)?;
    let predicted = match &a.gpu {
        Some(gpu) => {
            let model = crate::cmd::predict::load(a.cost_model.as_ref())?;
            // Refuse a GPU the model has no fit for in any precision before printing anything.
            if !model.fits.iter().any(|f| f.gpu.to_lowercase().contains(&gpu.to_lowercase())) {
                model.fit_for(gpu, zerobench_schema::config::Precision::Bf16)?;
            }
            Some(predict_all(&plan, &model, gpu, a.host_adamw_rate))
        }
        None => None,
    };
    let mut out = std::io::stdout().lock();
    if a.json {
        let runs: Vec<serde_json::Value> = plan
            .runs
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let mut v = serde_json::to_value(r)?;
                if let (Some((preds, mark)), Some(obj)) = (&predicted, v.as_object_mut()) {
                    let p = match &preds[i] {
                        Predicted::Yes(p) => serde_json::to_value(p)?,
                        Predicted::No(why) => serde_json::json!({ "error": why }),
                    };
                    obj.insert("prediction".into(), p);
                    obj.insert("fastest_that_fits".into(), mark[i].into());
                }
                Ok(v)
            })
            .collect::<Result<_, serde_json::Error>>()?;
        writeln!(out, "{}", serde_json::to_string_pretty(&runs)?)?;
        return Ok(Outcome::Complete);
    }
    let mut header =
        vec!["run", "ranks", "gpus", "params", "gpu states", "gpu buffers", "host states", "fit", "sent/step"];
    let bandwidth = a.bus_gbps.map(|intra| (intra, a.inter_node_bus_gbps.unwrap_or(intra)));
    if bandwidth.is_some() {
        header.push("comm ms");
    }
    if predicted.is_some() {
        header.extend(["pred step ms", "pred tok/s/gpu", "pred alloc", "pred fit", "best"]);
    }
    header.push("notes");
    let mut t = Table::new("plan", header);
    let mut too_big = 0;
    for (row_index, r) in plan.runs.iter().enumerate() {
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
        let proposal = r.proposed_offload_ratio.map(|x| {
            let steps = if r.config.delayed_update_after.is_some() { "delayed-update" } else { "exact" };
            format!("offload_ratio {x} balances host and GPU in {steps} steps (estimate)")
        });
        let mut notes: Vec<String> = proposal.into_iter().chain(r.warnings.iter().cloned()).collect();
        if let Some((preds, mark)) = &predicted {
            let i = row_index;
            match &preds[i] {
                Predicted::Yes(p) => {
                    row.push(format!("{:.1}", p.step_ms));
                    row.push(format!("{:.0}", p.tokens_per_s_per_gpu));
                    row.push(human_bytes(p.peak_allocated_bytes));
                    row.push(if p.fits { "yes" } else { "NO" }.to_string());
                    row.push(if mark[i] { "*" } else { "" }.to_string());
                    if !p.extrapolated.is_empty() {
                        notes.push(format!("extrapolated: {}", p.extrapolated.join("; ")));
                    }
                }
                Predicted::No(why) => {
                    row.extend(["-", "-", "-", "-", ""].map(String::from));
                    notes.push(why.clone());
                }
            }
        }
        row.push(notes.join("; "));
        t.row(row);
    }
    write_text(&mut out, &t)?;
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
    if predicted.is_some() {
        writeln!(out, "{PREDICT_FOOTER}")?;
    }
    Ok(Outcome::Complete)
}
