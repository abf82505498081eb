//! `zerobench fit DIR... --out MODEL.json [--validate]`: a cost model from log folders.
//!
//! Reads the folders as `ingest` does and fits, per GPU kind and precision, the cost model
//! (docs/cost-model.md) on zerobench's own finished runs. Which runs are left out, and why, is
//! printed. With `--validate` it also prints the k-fold validation per family, stage and GPU count.
//! Exit code 0 when a model was written from every run the folders hold, 1 when it was written
//! but part of the folders could not be read (each such file is named), 2 when none could be (no
//! runs, too few configurations, an existing file without `--overwrite`).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use zerobench_costmodel::{CostModel, Observation, Query};
use zerobench_ingest::{Options, ProblemKind, RunRow, Source, Status};
use zerobench_schema::config::RunConfig;
use zerobench_schema::models::ModelPreset;

use crate::host_rate::HostRates;
use crate::Outcome;

#[derive(clap::Args)]
pub struct Args {
    /// Folders to read, searched recursively, as `zerobench ingest` reads them.
    #[arg(required = true)]
    dirs: Vec<PathBuf>,
    /// The model file to write (JSON).
    #[arg(long, short)]
    out: PathBuf,
    /// Replace the model file if it exists (without it an existing file is refused).
    #[arg(long)]
    overwrite: bool,
    /// Fit only the runs on this GPU kind (its name or part of it, any case); without it each kind
    /// found gets a fit of its own.
    #[arg(long)]
    gpu: Option<String>,
    /// Print the k-fold validation: errors per family, stage and GPU count, the stage choice, and
    /// every held-out run.
    #[arg(long)]
    validate: bool,
    /// A build (git commit) of the worker that ran runs whose logs name none (workers before the
    /// build stamp): recorded with the builds the logs name in each fit that has such runs, as
    /// what the model's predictions describe (`predict` says so). Repeat it for several.
    #[arg(long = "build", value_name = "COMMIT")]
    builds: Vec<String>,
}

/// The runs of the folders the cost model can be fitted on, each one left out (run id, why), and
/// how many of the folders' problems lost something (a file or line not read).
pub struct Read {
    pub observations: Vec<Observation>,
    pub left_out: Vec<(String, String)>,
    pub unread: usize,
}

/// The problems a fit names on standard error before it says how many more there are.
const PROBLEMS_SHOWN: usize = 10;

/// Reads the folders' runs as the fit takes them, each with its host's AdamW rate where a
/// `cpu_adamw.json` lies beside its logs ([`HostRates`]).
pub fn observations(dirs: &[PathBuf]) -> anyhow::Result<Read> {
    for dir in dirs {
        std::fs::metadata(dir).with_context(|| format!("cannot read {}", dir.display()))?;
    }
    let ingested = zerobench_ingest::ingest(dirs, &Options::default(), &zerobench_ingest::NoProgress);
    // Two runs of one id (sweeps of several hosts) are both kept: a note, not a loss.
    let (notes, lost): (Vec<_>, Vec<_>) =
        ingested.problems.iter().partition(|p| matches!(p.kind, ProblemKind::DuplicateRunId { .. }));
    for p in &notes {
        tracing::info!("{p}");
    }
    for p in lost.iter().take(PROBLEMS_SHOWN) {
        eprintln!("zerobench: {p}");
    }
    if lost.len() > PROBLEMS_SHOWN {
        eprintln!(
            "zerobench: {} more problem(s) reading the folders (`zerobench ingest` lists them)",
            lost.len() - PROBLEMS_SHOWN
        );
    }
    let mut obs = Vec::new();
    let mut skipped = Vec::new();
    let mut hosts = HostRates::new(dirs);
    for r in &ingested.runs {
        match observation(&r.row) {
            Ok(mut o) => {
                o.query.host_adamw_gparams_per_s = hosts.of(Path::new(&r.row.dir))?;
                obs.push(o);
            }
            Err(why) => skipped.push((r.row.run_id.clone(), why)),
        }
    }
    Ok(Read { observations: obs, left_out: skipped, unread: lost.len() })
}

/// One run as the fit takes it, or why it cannot be taken.
pub fn observation(r: &RunRow) -> Result<Observation, String> {
    if r.source != Source::Zerobench {
        // The model prices zerobench's engine; another engine's step is not a measurement of it.
        return Err("a foreign log (the cost model is fitted on zerobench's own runs)".into());
    }
    if r.status != Status::Ok {
        return Err(format!("status {}", r.status.as_str()));
    }
    if r.log_version != Some(2) {
        return Err("log schema version 1: its step_ms leaves out the optimizer's device work".into());
    }
    let (gpu, query) = query(r)?;
    let step_ms = r.step_ms_median.ok_or_else(|| not_recorded("step time"))?;
    if !(step_ms.is_finite() && step_ms > 0.0) {
        return Err(format!("step time {step_ms} ms, not a positive number"));
    }
    Ok(Observation {
        run_id: r.run_id.clone(),
        gpu,
        query,
        step_ms,
        peak_allocated_bytes: r.peak_allocated_bytes.ok_or_else(|| not_recorded("peak allocated memory"))?,
        peak_reserved_bytes: r.peak_reserved_bytes,
        device_memory_bytes: r.device_memory_bytes,
        peak_tflops: r.peak_tflops_per_gpu,
        optimizer_ms: r.optimizer_ms_median,
        gpu_util_pct: r.gpu_util_pct_mean,
        build: r.commit.clone(),
    })
}

/// What a run asks the model, whatever it measured (`ingest --cost-model` prices runs that
/// failed, and other engines' runs of known identity): its GPU kind and its query, or why the
/// model does not price it.
pub fn query(r: &RunRow) -> Result<(String, Query), String> {
    // Other engine knobs change the step in ways the model does not price; the training text does
    // not change it, and offload's ratio and delayed update are priced.
    let priced = ["data=", "offload_ratio=", "delayed_update_after="];
    if let Some(knob) = r.variant.split(',').find(|p| !p.is_empty() && !priced.iter().any(|k| p.starts_with(k))) {
        return Err(format!("runs with {knob} are not priced by the model"));
    }
    let model = ModelPreset::from_name(&r.model).ok_or_else(|| format!("model {:?} is not a preset", r.model))?;
    let mut config = RunConfig::new(model, r.stage.ok_or_else(|| not_recorded("stage"))?);
    config.offload = r.offload.ok_or_else(|| not_recorded("offload"))?;
    config.precision = r.precision.ok_or_else(|| not_recorded("precision"))?;
    config.micro_batch = r.micro_batch.ok_or_else(|| not_recorded("micro_batch"))?;
    config.grad_accum = r.grad_accum.ok_or_else(|| not_recorded("grad_accum"))?;
    config.seq_len = r.seq_len.ok_or_else(|| not_recorded("seq_len"))?;
    config.offload_ratio = variant_value(&r.variant, "offload_ratio")?;
    config.delayed_update_after = variant_value(&r.variant, "delayed_update_after")?;
    // The run's length is not part of the query; long enough for its delay, whatever it was.
    config.steps = config.steps.max(config.delayed_update_after.map_or(0, |a| a.saturating_add(1)));
    let gpu = r.gpu.clone().ok_or_else(|| not_recorded("GPU name (a CPU run?)"))?;
    let gpus = r.gpus.ok_or_else(|| not_recorded("gpus"))?;
    // A log edited or written by hand can hold what the worker refuses; the model would be
    // fitted on, or price, a run that cannot exist.
    config.validate(Some(gpus)).map_err(|e| format!("a configuration the worker refuses ({e})"))?;
    let query = Query {
        logged_buffer_bytes: r.state_buffer_bytes,
        logged_param_path: r.param_path,
        ..Query::new(config, gpus, r.nodes.unwrap_or(1))
    };
    Ok((gpu, query))
}

/// Why a run is not taken: a field its logs do not record.
fn not_recorded(what: &str) -> String {
    format!("{what} not recorded")
}

/// The value of `key=` in a run's variant (`RunConfig::variant`), if it names one.
fn variant_value<T: std::str::FromStr>(variant: &str, key: &str) -> Result<Option<T>, String> {
    variant
        .split(',')
        .find_map(|p| p.strip_prefix(key)?.strip_prefix('='))
        .map(|v| v.parse::<T>().map_err(|_| format!("{key} {v:?} is not a number")))
        .transpose()
}

pub fn run(args: Args) -> anyhow::Result<Outcome> {
    if std::fs::symlink_metadata(&args.out).is_ok() && !args.overwrite {
        bail!("{} exists; --overwrite replaces it", args.out.display());
    }
    let Read { observations: obs, left_out: skipped, unread } = observations(&args.dirs)?;
    // Per reason: how many runs, and the first of them by name (-v lists every one).
    let mut reasons: BTreeMap<&str, (usize, &str)> = BTreeMap::new();
    for (id, why) in &skipped {
        tracing::info!(run = %id, "left out: {why}");
        reasons.entry(why.as_str()).or_insert((0, id.as_str())).0 += 1;
    }
    for (why, (n, first)) in &reasons {
        eprintln!("zerobench: left out {n} run(s) ({first}{}): {why}", if *n > 1 { ", ..." } else { "" });
    }
    let obs = match &args.gpu {
        None => obs,
        Some(want) => {
            let kinds: std::collections::BTreeSet<&str> = obs.iter().map(|o| o.gpu.as_str()).collect();
            let keep: Vec<Observation> =
                obs.iter().filter(|o| o.gpu.to_lowercase().contains(&want.to_lowercase())).cloned().collect();
            let matched: std::collections::BTreeSet<&str> = keep.iter().map(|o| o.gpu.as_str()).collect();
            if keep.is_empty() {
                bail!("--gpu {want:?}: no run on such a GPU; the runs are on {}", join(&kinds));
            }
            if matched.len() > 1 {
                bail!("--gpu {want:?} names several GPU kinds ({}); name one", join(&matched));
            }
            keep
        }
    };
    let zerobench_costmodel::Fitted { mut model, skipped: kinds_left } =
        zerobench_costmodel::fit(&obs).context("fitting the cost model")?;
    // `--build` names the builds of runs whose logs name none: a fit of runs that all name theirs
    // (another GPU kind's, newer logs) did not measure it.
    let unnamed: std::collections::BTreeSet<(&str, _)> =
        obs.iter().filter(|o| o.build.is_none()).map(|o| (o.gpu.as_str(), o.query.config.precision)).collect();
    for f in model.fits.iter_mut().filter(|f| unnamed.contains(&(f.gpu.as_str(), f.precision))) {
        let named = std::mem::take(&mut f.builds).into_iter();
        let given = args.builds.iter().map(|b| zerobench_schema::log::short_commit(b));
        f.builds = named.chain(given).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    }
    for why in &kinds_left {
        eprintln!("zerobench: no fit: {why}");
    }
    let text = serde_json::to_string_pretty(&model)? + "\n";
    crate::cmd::write_new(&args.out, text.as_bytes(), args.overwrite)?;
    let mut out = crate::stdout::stdout();
    report(&mut out, &model, args.validate)?;
    if unread > 0 {
        writeln!(out, "wrote {} from what could be read: {unread} problem(s) above", args.out.display())?;
        return Ok(Outcome::Incomplete);
    }
    writeln!(out, "wrote {}", args.out.display())?;
    Ok(Outcome::Complete)
}

/// What the fit's offloaded runs said of their hosts' AdamW rates ([`HostRates`]), where it has
/// offloaded runs: so a user sees whether the `cpu_adamw.json` files were found.
fn host_rates(f: &zerobench_costmodel::Fit) -> Option<String> {
    let offloaded: Vec<&zerobench_costmodel::Query> = f
        .runs
        .iter()
        .map(|r| &r.query)
        .filter(|q| q.config.offload != zerobench_schema::config::Offload::None)
        .collect();
    if offloaded.is_empty() {
        return None;
    }
    let known = offloaded.iter().filter(|q| q.host_adamw_gparams_per_s.is_some()).count();
    // Ranks sharing a host: the exponent fitted on the offloaded runs of several ranks per host.
    let shared = offloaded.iter().filter(|q| q.ranks_per_host() > 1).count();
    let sharing = match (f.step.get(zerobench_costmodel::OFFLOAD_SHARING), f.range.offload_ranks_per_host) {
        (Some(e), Some(most)) if shared > 0 => format!(
            "; ranks sharing a host slow each other's host updates by ranks^{e:.2} ({most} ranks: {:.2}x one alone), \
             fitted on {shared} offloaded runs of several ranks per host",
            zerobench_costmodel::sharing_factor(f64::from(most), *e)
        ),
        _ => String::new(),
    };
    let rates = match (f.host_adamw_gparams_per_s, f.range.host_adamw_gparams_per_s) {
        (Some(rate), Some([lo, hi])) => format!(
            "offload priced at the hosts' AdamW rate {rate:.2}G parameters/s (geometric mean of {lo:.2}-{hi:.2}G); \
             {known} of {} offloaded runs had a {} beside them",
            offloaded.len(),
            crate::host_rate::FILE
        ),
        _ => format!(
            "offload priced at one rate for every host: none of {} offloaded runs had a {} beside them",
            offloaded.len(),
            crate::host_rate::FILE
        ),
    };
    Some(rates + &sharing)
}

fn join(kinds: &std::collections::BTreeSet<&str>) -> String {
    if kinds.is_empty() {
        "none (no finished zerobench GPU run)".to_string()
    } else {
        kinds.iter().copied().collect::<Vec<_>>().join(", ")
    }
}

fn report(out: &mut dyn Write, model: &CostModel, detail: bool) -> anyhow::Result<()> {
    for f in &model.fits {
        let v = &f.validation;
        writeln!(
            out,
            "{} {}: {} runs of {} configurations; {}-fold validation: step time {:.1}% mean absolute error \
             ({:.1}% over {} device-bound runs, {:.1}% over {} launch-bound; {:.1}% per configuration, against \
             the median of its runs{}), peak allocated {:.1}%; \
             fastest stage right in {}/{} groups ({} within {:.0}%; the repeats show the choice slower in {}; \
             choosing by the model costs {:.1}% on average, at most {:.1}%), in {}/{} device-bound groups \
             ({} within), in {}/{} groups whose repeats decide it",
            f.gpu,
            f.precision,
            f.runs.len(),
            v.configurations,
            v.folds,
            v.step_mape_pct,
            v.device_bound.step_mape_pct,
            v.device_bound.runs,
            v.launch_bound.step_mape_pct,
            v.launch_bound.runs,
            v.by_configuration.step_mape_pct,
            repeats(&v.by_configuration),
            v.memory_mape_pct,
            v.stage_choice.all.right,
            v.stage_choice.all.groups,
            v.stage_choice.all.right_within_tie,
            zerobench_costmodel::validate::STAGE_TIE * 100.0,
            v.stage_choice.all.shown_slower,
            v.stage_choice.all.regret_pct_mean,
            v.stage_choice.all.regret_pct_max,
            v.stage_choice.device_bound.right,
            v.stage_choice.device_bound.groups,
            v.stage_choice.device_bound.right_within_tie,
            v.stage_choice.decided.right,
            v.stage_choice.decided.groups
        )?;
        if let Some(line) = host_rates(f) {
            writeln!(out, "{line}")?;
        }
        if !detail {
            continue;
        }
        writeln!(out, "\n| family | stage | offload | GPUs | runs | step time error % | peak allocated error % |")?;
        writeln!(out, "|---|---|---|---|---|---|---|")?;
        for g in &v.groups {
            writeln!(
                out,
                "| {} | {} | {} | {} | {} | {:.1} | {:.1} |",
                g.family, g.stage, g.offload, g.gpus, g.runs, g.step_mape_pct, g.memory_mape_pct
            )?;
        }
        writeln!(out, "\n| held-out run | step ms | predicted | error % | peak GiB | predicted | error % |")?;
        writeln!(out, "|---|---|---|---|---|---|---|")?;
        let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
        for h in &v.held_out {
            writeln!(
                out,
                "| {} | {:.1} | {:.1} | {:+.1} | {:.2} | {:.2} | {:+.1} |",
                h.run_id,
                h.step_ms,
                h.predicted_step_ms,
                (h.predicted_step_ms / h.step_ms - 1.0) * 100.0,
                gib(h.peak_allocated_bytes),
                gib(h.predicted_peak_allocated_bytes),
                (h.predicted_peak_allocated_bytes as f64 / h.peak_allocated_bytes as f64 - 1.0) * 100.0
            )?;
        }
        writeln!(out)?;
    }
    Ok(())
}

/// What the repeats of the validated configurations say on their own: how far a run lies from
/// its configuration's median, which no prediction of a configuration goes below per run.
fn repeats(c: &zerobench_costmodel::validate::ConfigurationError) -> String {
    match c.repeated {
        0 => "; each measured once".to_string(),
        n => format!(
            "; the {n} configurations measured more than once lie {:.1}% per run from their medians",
            c.repeat_floor_pct
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerobench_schema::config::{Offload, Precision, ZeroStage};

    /// A finished zerobench run of gpt2-xl, stage 2 with optimizer offload, whose variant is `variant`.
    fn row(variant: &str) -> RunRow {
        RunRow {
            run_id: "r".into(),
            source: Source::Zerobench,
            model: "gpt2-xl".into(),
            variant: variant.into(),
            stage: Some(ZeroStage::Z2),
            offload: Some(Offload::Optimizer),
            precision: Some(Precision::Bf16),
            micro_batch: Some(4),
            grad_accum: Some(1),
            seq_len: Some(1024),
            status: Status::Ok,
            log_version: Some(2),
            gpu: Some("NVIDIA H100 80GB HBM3".into()),
            gpus: Some(1),
            step_ms_median: Some(110.0),
            peak_allocated_bytes: Some(30 << 30),
            ..RunRow::default()
        }
    }

    /// Offload's ratio and delayed update are priced: the fit takes them into the configuration.
    /// Other knobs are not, and numbers that do not parse name the field.
    #[test]
    fn the_ratio_and_the_delayed_update_are_taken_other_knobs_are_refused() {
        let o = observation(&row("data=shipped,offload_ratio=0.24,delayed_update_after=4")).unwrap();
        assert_eq!((o.query.config.offload_ratio, o.query.config.delayed_update_after), (Some(0.24), Some(4)));
        let o = observation(&row("")).unwrap();
        assert_eq!((o.query.config.offload_ratio, o.query.config.delayed_update_after), (None, None));
        assert_eq!(observation(&row("hpz=2")).unwrap_err(), "runs with hpz=2 are not priced by the model");
        assert_eq!(observation(&row("offload_ratio=x")).unwrap_err(), "offload_ratio \"x\" is not a number");
        assert_eq!(
            observation(&row("delayed_update_after=-1")).unwrap_err(),
            "delayed_update_after \"-1\" is not a number"
        );
    }
}
