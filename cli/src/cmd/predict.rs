//! `zerobench predict --gpu KIND --model M --stage S --micro-batch B --seq-len T --gpus N ...`:
//! the predicted step time, throughput and memory of a configuration, from a fitted cost model
//! (`--cost-model MODEL.json`) or the model shipped for the GPU kind, and the builds of the engine
//! that model measured.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use zerobench_costmodel::{CostModel, Fit, Prediction, Query};
use zerobench_schema::config::{Offload, Precision, RunConfig, ZeroStage};
use zerobench_schema::models::ModelPreset;

use crate::Outcome;

#[derive(clap::Args)]
pub struct Args {
    /// The GPU kind, as its name or part of it (h200, "H100 80GB").
    #[arg(long)]
    gpu: String,
    #[arg(long)]
    model: ModelPreset,
    /// ZeRO stage: 0, 1, 2 or 3.
    #[arg(long)]
    stage: ZeroStage,
    #[arg(long)]
    micro_batch: u32,
    /// Tokens per sequence (the model's default when not given).
    #[arg(long)]
    seq_len: Option<u32>,
    /// GPUs in all.
    #[arg(long, default_value_t = 1)]
    gpus: u32,
    #[arg(long, default_value_t = 1)]
    nodes: u32,
    #[arg(long, default_value_t = Offload::None)]
    offload: Offload,
    /// With --offload: the share of the optimizer kept on the host (the rest is updated on the GPU).
    #[arg(long)]
    offload_ratio: Option<f64>,
    /// With --offload: price the steady state of the delayed update (the host's update of step t
    /// beside step t + 1), as the worker's --delayed-update runs once its exact steps are over.
    #[arg(long)]
    delayed_update: bool,
    #[arg(long, default_value_t = 1)]
    grad_accum: u32,
    #[arg(long, default_value_t = Precision::Bf16)]
    precision: Precision,
    /// With --offload: this host's AdamW rate, 1e9 parameters per second, as
    /// `examples/cpu_adamw` reports it (`adamw_params_per_s` / 1e9); the host's update is priced
    /// in proportion to the fitted hosts' (default: at their rate).
    #[arg(long, value_name = "GPARAMS_PER_S", value_parser = host_rate)]
    host_adamw_rate: Option<f64>,
    /// A model file from `zerobench fit` (default: the model shipped for --gpu).
    #[arg(long)]
    cost_model: Option<PathBuf>,
    /// One JSON object on stdout.
    #[arg(long)]
    json: bool,
}

/// The host AdamW rates a query may give, 1e9 parameters per second: one slow core does about
/// 0.1, the measured GPU hosts 4.8-5.7 (`examples/cpu_adamw`); outside this range a rate is a
/// typo (of the unit, mostly), which would price an update at years or at nothing.
const HOST_RATE_RANGE: std::ops::RangeInclusive<f64> = 0.01..=1000.0;

/// A host's AdamW rate within [`HOST_RATE_RANGE`] (1e9 parameters per second).
pub fn host_rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if HOST_RATE_RANGE.contains(&v) => Ok(v),
        _ => Err(format!(
            "expected a host's AdamW rate between {} and {} (1e9 parameters per second), got {s:?}",
            HOST_RATE_RANGE.start(),
            HOST_RATE_RANGE.end()
        )),
    }
}

/// The model file given, or the shipped one.
/// The largest model file read: a fit of many thousand runs is a few MiB.
const MODEL_FILE_LIMIT: u64 = 64 << 20;

pub fn load(path: Option<&PathBuf>) -> anyhow::Result<CostModel> {
    match path {
        Some(p) => {
            // The shipped models are about 100 KB; a path to a device or a log by mistake would
            // otherwise be read until memory runs out.
            use std::io::Read;
            let file = std::fs::File::open(p).with_context(|| format!("cannot read {}", p.display()))?;
            let mut text = String::new();
            file.take(MODEL_FILE_LIMIT + 1)
                .read_to_string(&mut text)
                .with_context(|| format!("cannot read {}", p.display()))?;
            if text.len() as u64 > MODEL_FILE_LIMIT {
                anyhow::bail!("{}: more than {} MiB; not a cost model", p.display(), MODEL_FILE_LIMIT >> 20);
            }
            Ok(CostModel::from_json(&p.display().to_string(), &text)?)
        }
        None => Ok(zerobench_costmodel::shipped()?),
    }
}

pub fn run(a: Args) -> anyhow::Result<Outcome> {
    let model = load(a.cost_model.as_ref())?;
    let fit = model.fit_for(&a.gpu, a.precision)?;
    let mut config = RunConfig::new(a.model, a.stage);
    config.micro_batch = a.micro_batch;
    config.seq_len = a.seq_len.unwrap_or_else(|| a.model.spec().default_seq_len());
    config.offload = a.offload;
    config.grad_accum = a.grad_accum;
    config.offload_ratio = a.offload_ratio;
    // Only its steady state is priced, whatever the count of exact steps before it.
    config.delayed_update_after = a.delayed_update.then_some(0);
    config.precision = a.precision;
    if a.nodes == 0 || a.gpus % a.nodes != 0 {
        anyhow::bail!("--gpus {} does not split evenly over --nodes {}", a.gpus, a.nodes);
    }
    // The number of ranks is `--gpus` here (the worker's is its launcher's world size).
    config.validate(Some(a.gpus)).map_err(|e| {
        let flag = if e.field == "world-size" { "gpus".to_string() } else { e.field.replace('_', "-") };
        anyhow::anyhow!("--{flag}: {}", e.reason)
    })?;
    if a.host_adamw_rate.is_some() && config.offload == Offload::None {
        anyhow::bail!("--host-adamw-rate: prices the host's update of the optimizer; it needs --offload");
    }
    let mut query = Query::new(config, a.gpus, a.nodes);
    query.host_adamw_gparams_per_s = a.host_adamw_rate;
    let p = fit.predict(&query);
    let mut out = crate::stdout::stdout();
    if a.json {
        writeln!(out, "{}", serde_json::to_string(&with_builds(&p, &fit.builds)?)?)?;
    } else {
        print(&mut out, &p)?;
        writeln!(out, "{}", builds_line(fit, zerobench_build_info::COMMIT))?;
    }
    Ok(Outcome::Complete)
}

/// A prediction as JSON, with its fit's builds (`Fit::builds`) as `fitted_builds` beside its
/// fields.
pub fn with_builds(p: &Prediction, builds: &[String]) -> serde_json::Result<serde_json::Value> {
    let mut v = serde_json::to_value(p)?;
    if let Some(o) = v.as_object_mut() {
        o.insert("fitted_builds".into(), builds.into());
    }
    Ok(v)
}

/// Which engine a fit's predictions describe: the builds its runs measured, and whether `this`
/// build (zerobench's own commit, where known) is one of them. A later build's engine may be
/// faster or slower than the one measured (docs/cost-model.md says by how much for the shipped
/// models).
pub fn builds_line(fit: &Fit, this: Option<&str>) -> String {
    let builds = &fit.builds;
    let head = format!("model: {} {}", fit.gpu, fit.precision);
    if builds.is_empty() {
        return format!("{head}, fitted on runs whose logs name no build");
    }
    let plural = if builds.len() > 1 { "s" } else { "" };
    let mut s = format!("{head}, fitted on runs of build{plural} {}", builds.join(", "));
    if let Some(this) = this.map(zerobench_schema::log::short_commit) {
        if !builds.contains(&this) {
            s.push_str(&format!(
                "; this zerobench is {this}, an engine the model has not measured (docs/cost-model.md)"
            ));
        }
    }
    s
}

fn print(out: &mut dyn Write, p: &Prediction) -> anyhow::Result<()> {
    let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
    let of = match p.step_ms_interval_of {
        zerobench_costmodel::IntervalOf::LaunchBound => "held-out launch-bound runs",
        zerobench_costmodel::IntervalOf::DeviceBound => "held-out device-bound runs",
        zerobench_costmodel::IntervalOf::All => "held-out runs",
    };
    writeln!(
        out,
        "step {:.1} ms (90% of {of}: {:.1}-{:.1}), {:.0} tokens/s per GPU{}",
        p.step_ms,
        p.step_ms_interval[0],
        p.step_ms_interval[1],
        p.tokens_per_s_per_gpu,
        p.mfu.map(|m| format!(", MFU {:.1}%", m * 100.0)).unwrap_or_default()
    )?;
    writeln!(
        out,
        "  compute {:.1} ms ({} bound), optimizer {:.1} ms, offload {:.1} ms, communication {:.1} ms",
        p.compute_ms,
        match p.bound {
            zerobench_costmodel::Bound::Launch => "launch",
            zerobench_costmodel::Bound::Device => "device",
        },
        p.optimizer_ms,
        p.offload_ms,
        p.comm_ms
    )?;
    writeln!(
        out,
        "peak allocated {:.2} GiB ({:.2}-{:.2}), reserved {:.2} GiB{}: {}",
        gib(p.peak_allocated_bytes),
        gib(p.peak_allocated_interval[0]),
        gib(p.peak_allocated_interval[1]),
        gib(p.peak_reserved_bytes),
        p.device_memory_bytes.map(|m| format!(" of {:.1} GiB", gib(m))).unwrap_or_default(),
        match p.fits {
            Some(true) => "fits",
            Some(false) => "does not fit",
            None => "fits unknown (the model records no device memory for this GPU)",
        }
    )?;
    if let Some(r) = p.host_adamw_gparams_per_s {
        writeln!(out, "  the host's update priced at AdamW {r:.2}G parameters/s")?;
    }
    for e in &p.extrapolated {
        writeln!(out, "extrapolated: {e}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The line names the fit's builds and says when zerobench's own build is none of them; a
    /// fit whose runs name no build says so.
    #[test]
    fn the_builds_line_names_the_fits_builds_and_this_one_outside_them() {
        let model = zerobench_costmodel::shipped().unwrap();
        let mut fit = model.fits.into_iter().next().unwrap();
        let gpu = fit.gpu.clone();
        fit.builds = vec!["0e1fab4".into(), "41cf013".into()];
        let line = |this| builds_line(&fit, this);
        let head = format!("model: {gpu} bf16, fitted on runs of builds 0e1fab4, 41cf013");
        assert_eq!(line(None), head);
        assert_eq!(line(Some("41cf0130000000000000")), head);
        assert_eq!(
            line(Some("797bb0e1234")),
            format!("{head}; this zerobench is 797bb0e, an engine the model has not measured (docs/cost-model.md)")
        );
        fit.builds.truncate(1);
        assert!(builds_line(&fit, None).ends_with("fitted on runs of build 0e1fab4"), "{}", builds_line(&fit, None));
        fit.builds.clear();
        assert_eq!(
            builds_line(&fit, Some("797bb0e")),
            format!("model: {gpu} bf16, fitted on runs whose logs name no build")
        );
    }
}
