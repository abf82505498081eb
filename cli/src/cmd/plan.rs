//! `zerobench plan SPEC`: the runs a spec expands to, with the GPUs each needs, the ZeRO
//! model-state memory per GPU (flagging runs that cannot fit the declared GPU memory) and what each
//! rank sends per step (and, given a bus bandwidth, how long that takes). Given a cost model
//! (`--cost-model`, or `--gpu` for the shipped one) it adds each run's predicted step time,
//! throughput and peak memory, marks per model the run that fits with the most tokens per
//! second per GPU, and proposes offloaded runs' offload ratio by the model rather than by the
//! launcher's fixed rates.

use std::io::Write;
use std::path::PathBuf;

use zerobench_costmodel::{CostModel, Prediction, Query};
use zerobench_launcher::plan::offload_ratio_at;
use zerobench_launcher::plan::Fit;
use zerobench_launcher::values::human_bytes;
use zerobench_launcher::{Plan, Run, Spec};
use zerobench_schema::config::{Offload, RunConfig};

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
                              (docs/cost-model.md); pred fit: peak reserved within cluster.gpu_memory (else the fitted GPU's memory; \
                              ?: neither known); best (*): per model, the run with the most tokens/s per GPU \
                              of those not known not to fit.";

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
    #[arg(long, value_name = "GPARAMS_PER_S", value_parser = crate::cmd::predict::host_rate, requires = "gpu")]
    host_adamw_rate: Option<f64>,
}

/// One run's prediction, or why there is none.
enum Predicted<'m> {
    Yes {
        prediction: Box<Prediction>,
        /// An offloaded run's Twin-Flow ratio by the cost model ([`model_offload_ratio`]).
        offload_ratio: Option<f64>,
        /// The fit that priced it (its builds are what the prediction describes).
        fit: &'m zerobench_costmodel::Fit,
    },
    No(String),
}

/// `config` on `run`'s GPUs and nodes, on a host of AdamW rate `host_rate`.
fn query(run: &Run, config: RunConfig, host_rate: Option<f64>) -> Query {
    let mut q = Query::new(config, run.world_size(), run.nodes);
    q.host_adamw_gparams_per_s = host_rate;
    q
}

/// `config` as `run` runs it, on a host of `host_rate`, predicted by `fit`; whether it fits is
/// judged against `declared` (cluster.gpu_memory) where the spec gives it, else against the memory
/// of the GPU the model was fitted on.
fn predict_run(
    fit: &zerobench_costmodel::Fit,
    run: &Run,
    config: RunConfig,
    host_rate: Option<f64>,
    declared: Option<u64>,
) -> Prediction {
    let mut p = fit.predict(&query(run, config, host_rate));
    if let Some(m) = declared {
        (p.device_memory_bytes, p.fits) = (Some(m), Some(p.peak_reserved_bytes <= m));
    }
    p
}

/// Twin-Flow's ratio for an offloaded run by the cost model: the launcher's rule (the smallest
/// share of whole units at least the balance whose memory fits; `offload_ratio_at`), with
/// the balance where the model's host update stops hiding behind the GPU's work
/// (`Fit::offload_balance`, solved, not searched: a 10,000-run sweep stays under a second). So
/// the host's rate, the ranks sharing it and the window are the model's, not the launcher's fixed
/// rates.
fn model_offload_ratio(
    fit: &zerobench_costmodel::Fit,
    run: &Run,
    host_rate: Option<f64>,
    declared: Option<u64>,
) -> Option<f64> {
    let balance = fit.offload_balance(&query(run, run.config.clone(), host_rate))?;
    offload_ratio_at(&run.config, run.world_size(), balance, |ratio| {
        let mut c = run.config.clone();
        c.offload_ratio = Some(ratio);
        // Unknown memory cannot refuse a share.
        predict_run(fit, run, c, host_rate, declared).fits != Some(false)
    })
}

/// Predicts every run; marks per model the fitting run with the most tokens/s per GPU.
fn predict_all<'m>(
    plan: &Plan,
    model: &'m CostModel,
    gpu: &str,
    host_rate: Option<f64>,
) -> (Vec<Predicted<'m>>, Vec<bool>) {
    let declared = plan.spec.cluster.gpu_memory.map(|m| m.0);
    let preds: Vec<Predicted> = plan
        .runs
        .iter()
        .map(|r| match model.fit_for(gpu, r.config.precision) {
            Ok(f) => Predicted::Yes {
                prediction: Box::new(predict_run(f, r, r.config.clone(), host_rate, declared)),
                offload_ratio: (r.config.offload != Offload::None)
                    .then(|| model_offload_ratio(f, r, host_rate, declared))
                    .flatten(),
                fit: f,
            },
            Err(e) => Predicted::No(e.to_string()),
        })
        .collect();
    let mut best: std::collections::BTreeMap<String, (usize, f64)> = std::collections::BTreeMap::new();
    for (i, (r, p)) in plan.runs.iter().zip(&preds).enumerate() {
        if let Predicted::Yes { prediction: p, .. } = p {
            let e = best.entry(r.config.model.to_string()).or_insert((usize::MAX, f64::NEG_INFINITY));
            if p.fits != Some(false) && p.tokens_per_s_per_gpu > e.1 {
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
    crate::cmd::positive(s, "a bandwidth in GB/s")
}

pub fn run(a: Args) -> anyhow::Result<Outcome> {
    let plan = Plan::build(Spec::load(&a.spec)?)?;
    let model = match &a.gpu {
        Some(gpu) => {
            let model = crate::cmd::predict::load(a.cost_model.as_ref())?;
            // Refuse a GPU the model has no fit for in any precision before printing anything.
            if !model.fits.iter().any(|f| f.gpu.to_lowercase().contains(&gpu.to_lowercase())) {
                model.fit_for(gpu, zerobench_schema::config::Precision::Bf16)?;
            }
            Some((model, gpu))
        }
        None => None,
    };
    let predicted = model.as_ref().map(|(model, gpu)| predict_all(&plan, model, gpu, a.host_adamw_rate));
    // The fits the predictions came from, each once.
    let mut fits: Vec<&zerobench_costmodel::Fit> = Vec::new();
    for p in predicted.iter().flat_map(|(preds, _)| preds) {
        if let Predicted::Yes { fit, .. } = p {
            if !fits.iter().any(|f| std::ptr::eq(*f, *fit)) {
                fits.push(fit);
            }
        }
    }
    let mut out = crate::stdout::stdout();
    if a.json {
        let runs: Vec<serde_json::Value> = plan
            .runs
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let mut v = serde_json::to_value(r)?;
                if let (Some((preds, mark)), Some(obj)) = (&predicted, v.as_object_mut()) {
                    let (p, ratio) = match &preds[i] {
                        Predicted::Yes { prediction, offload_ratio, fit } => {
                            (crate::cmd::predict::with_builds(prediction, &fit.builds)?, *offload_ratio)
                        }
                        Predicted::No(why) => (serde_json::json!({ "error": why }), None),
                    };
                    obj.insert("prediction".into(), p);
                    obj.insert("fastest_that_fits".into(), mark[i].into());
                    if let Some(x) = ratio {
                        obj.insert("cost_model_offload_ratio".into(), x.into());
                    }
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
        let steps = if r.config.delayed_update_after.is_some() { "delayed-update" } else { "exact" };
        // With a cost model its ratio, the launcher's estimate beside it.
        let by_model = match predicted.as_ref().map(|(preds, _)| &preds[row_index]) {
            Some(Predicted::Yes { offload_ratio: Some(x), .. }) => Some(*x),
            _ => None,
        };
        let source = match (by_model, r.proposed_offload_ratio) {
            (Some(x), estimate) => {
                Some((x, format!("cost model{}", estimate.map_or(String::new(), |e| format!("; estimate {e}")))))
            }
            (None, Some(e)) => Some((e, "estimate".to_string())),
            (None, None) => None,
        };
        let proposal = source.map(|(x, by)| format!("offload_ratio {x} balances host and GPU in {steps} steps ({by})"));
        let mut notes: Vec<String> = proposal.into_iter().chain(r.warnings.iter().cloned()).collect();
        if let Some((preds, mark)) = &predicted {
            let i = row_index;
            match &preds[i] {
                Predicted::Yes { prediction: p, .. } => {
                    row.push(format!("{:.1}", p.step_ms));
                    row.push(format!("{:.0}", p.tokens_per_s_per_gpu));
                    row.push(human_bytes(p.peak_allocated_bytes));
                    row.push(
                        match p.fits {
                            Some(true) => "yes",
                            Some(false) => "NO",
                            None => "?",
                        }
                        .to_string(),
                    );
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
        for fit in &fits {
            writeln!(out, "{}", crate::cmd::predict::builds_line(fit, zerobench_build_info::COMMIT))?;
        }
    }
    Ok(Outcome::Complete)
}
