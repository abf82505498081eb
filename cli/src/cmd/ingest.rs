//! `zerobench ingest DIR... --out OUT`: log folders to tables.
//!
//! Reads every worker log (and DeepSpeed, Hugging Face Trainer and nvidia-smi log) under the
//! folders, writes the tables in the formats asked for into OUT, prints a summary on stdout and
//! every problem on stderr. Exit code 0 when everything was read, 1 when something could not be
//! (the tables hold the rest), 2 when the tables could not be written.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use zerobench_ingest::predicted::{PredictedRow, StageChoiceRow};
use zerobench_ingest::report::{self, terminal, Format};
use zerobench_ingest::tables::Tables;
use zerobench_ingest::{Options, PeakTable, Progress, Status};

use crate::Outcome;

#[derive(clap::Args)]
pub struct Args {
    /// Folders to read, searched recursively (symbolic links are followed while they stay inside
    /// these folders).
    #[arg(required = true)]
    dirs: Vec<PathBuf>,
    /// Folder to write the tables and plots into (created if needed). A file there under the
    /// name of one of the tables that no earlier ingest wrote is kept: nothing is written (exit 2)
    /// unless `--overwrite` is given.
    #[arg(long, short)]
    out: PathBuf,
    /// Replace files in the output folder under the tables' names that an earlier ingest did not
    /// write there (someone's own `latency.csv`, the tables of an ingest older than the list of
    /// files ingest keeps).
    #[arg(long)]
    overwrite: bool,
    /// Steps with an index below this are warmup and left out of every time figure (memory peaks
    /// keep them) [default: each zerobench run's own `--warmup`, from its start record; 2 for
    /// foreign logs].
    #[arg(long)]
    warmup: Option<u32>,
    /// Formats to write, comma-separated: csv, md, json, svg.
    #[arg(long, value_delimiter = ',', default_value = "csv,md,json,svg")]
    format: Vec<Format>,
    /// Peak TFLOP/s per GPU for MFU: one number for every run, or NAME=TFLOPS pairs matched
    /// against the GPU name (e.g. "H100=989,RTX 4090=165"); may be repeated. Default: the
    /// built-in table of data-sheet peaks (docs/ingest.md).
    #[arg(long, value_name = "TFLOPS|NAME=TFLOPS,...")]
    peak_tflops: Vec<String>,
    /// Threads to read with (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// Progress bar on stderr, drawn only when stderr is a terminal: auto (for inputs of 64 MiB
    /// or more), always (any size), never.
    #[arg(long, value_enum, default_value_t = ProgressMode::Auto)]
    progress: ProgressMode,
    /// Print nothing on stdout (the files are still written).
    #[arg(long, short)]
    quiet: bool,
    /// Add each run's predicted step time and peak memory from this cost model (`zerobench fit`),
    /// with the error: the `predicted` table and `predicted-vs-measured.svg`.
    #[arg(long)]
    cost_model: Option<PathBuf>,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ProgressMode {
    Auto,
    Always,
    Never,
}

/// Inputs smaller than this are read too fast for a progress bar to help.
const LARGE_INPUT: u64 = 64 << 20;

/// An indicatif bar, shown or not depending on the mode, the terminal and the input size.
struct Bar {
    mode: ProgressMode,
    bar: ProgressBar,
}

impl Progress for Bar {
    fn start(&self, total: u64) {
        let show = match self.mode {
            ProgressMode::Always => true,
            ProgressMode::Never => false,
            ProgressMode::Auto => std::io::stderr().is_terminal() && total >= LARGE_INPUT,
        };
        if show {
            self.bar.set_length(total);
            self.bar.set_draw_target(ProgressDrawTarget::stderr());
            self.bar.enable_steady_tick(Duration::from_millis(200));
        }
    }
    fn advance(&self, bytes: u64) {
        self.bar.inc(bytes);
    }
}

pub fn run(args: Args) -> anyhow::Result<Outcome> {
    // A folder that is not there is a mistyped argument, not an empty result: refuse before
    // anything is written.
    for dir in &args.dirs {
        std::fs::metadata(dir).with_context(|| format!("cannot read {}", dir.display()))?;
    }
    if let Some(n) = args.threads {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n.max(1))
            .build_global()
            .context("cannot start the reading threads")?;
    }
    let mut peaks = PeakTable::default();
    for p in &args.peak_tflops {
        peaks.add(p).context("--peak-tflops")?;
    }
    // A model file that cannot be read is refused before the logs are read and `--out` is made.
    let model = args.cost_model.as_ref().map(|p| crate::cmd::predict::load(Some(p))).transpose()?;
    // An output folder that is a folder to read is refused before it is locked: nothing is
    // written.
    zerobench_ingest::discover::check_output(&args.out, &args.dirs)?;
    let _lock = crate::lock::lock(&args.out, "ingest")?;
    let formats: Vec<Format> = if args.format.is_empty() { Format::ALL.to_vec() } else { args.format.clone() };
    // The output folder may sit inside an input folder (`ingest runs --out runs/tables`): its
    // earlier tables are not input.
    let opts = Options { warmup: args.warmup, peaks, skip: vec![args.out.clone()], ..Options::default() };

    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden());
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} reading logs [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .context("progress bar template")?
        .progress_chars("=> "),
    );
    let progress = Bar { mode: args.progress, bar };
    let t0 = Instant::now();
    let ingested = zerobench_ingest::ingest(&args.dirs, &opts, &progress);
    progress.bar.finish_and_clear();
    let read_s = t0.elapsed().as_secs_f64();

    for p in &ingested.problems {
        tracing::warn!("{p}");
    }
    let mut tables = Tables::build(&ingested.runs);
    let mut host_problems = 0;
    let mut model_problems = 0;
    if let Some(model) = &model {
        // A host rate that cannot be read prices its runs as of an unknown host, and is a problem.
        let mut hosts = crate::host_rate::HostRates::new(&args.dirs);
        let mut bad_hosts = std::collections::BTreeSet::new();
        let mut rate = |dir: &str| {
            hosts.of(std::path::Path::new(dir)).unwrap_or_else(|e| {
                bad_hosts.insert(format!("{e:#}"));
                None
            })
        };
        let (predicted, priced): (Vec<PredictedRow>, Vec<Priced>) =
            ingested.runs.iter().map(|r| predicted_row(model, rate(&r.row.dir), &r.row)).unzip();
        // Runs the model has no fit for (another GPU kind or precision) are what a user asking
        // for predictions most likely did not mean: named, and the result is incomplete. Runs the
        // model does not take (a CPU run, a failed configuration) are counted.
        let mut why_not: BTreeMap<(bool, &str), usize> = BTreeMap::new();
        for p in &priced {
            match p {
                Priced::Yes => {}
                Priced::NotTaken(why) => *why_not.entry((false, why)).or_default() += 1,
                Priced::NoFit(why) => *why_not.entry((true, why)).or_default() += 1,
            }
        }
        for ((_, why), n) in &why_not {
            tracing::warn!("{n} of {} run(s) not predicted: {why}", priced.len());
        }
        model_problems = why_not.keys().filter(|(no_fit, _)| *no_fit).count();
        tables.stage_choice = stage_choice_rows(&ingested.runs, &predicted);
        tables.predicted = predicted.into_iter().map(PredictedRow::round).collect();
        for e in &bad_hosts {
            tracing::warn!("{e}; its runs are priced as of an unknown host");
        }
        host_problems = bad_hosts.len();
    }
    let replace = if args.overwrite { report::Replace::Any } else { report::Replace::IngestOwn };
    let (written, failed) = report::write_all(&ingested, &tables, &args.out, &formats, replace)
        .with_context(|| format!("writing the tables into {}", args.out.display()))?;
    // A plot that cannot be drawn is one problem: the other files are written.
    for e in &failed {
        tracing::warn!("{e}");
    }

    if !args.quiet {
        let mut out = crate::stdout::stdout();
        print_tables(&mut out, &ingested.runs.iter().map(|r| r.row.clone()).collect::<Vec<_>>(), &tables)?;
        out.flush()?;
    }
    let s = &ingested.stats;
    let count = |st: Status| ingested.runs.iter().filter(|r| r.row.status == st).count();
    eprintln!(
        "zerobench: read {} files, {} lines, {:.1} MB in {:.2} s ({:.0} MB/s); {} runs ({} ok, {} oom, {} failed, {} incomplete, {} cancelled, {} timeout); {} problems; wrote {} files to {}",
        s.files,
        s.lines,
        s.bytes as f64 / 1e6,
        read_s,
        s.bytes as f64 / 1e6 / read_s.max(1e-9),
        ingested.runs.len(),
        count(Status::Ok),
        count(Status::Oom),
        count(Status::Failed),
        count(Status::Incomplete),
        count(Status::Cancelled),
        count(Status::Timeout),
        ingested.problems.len(),
        written.len(),
        args.out.display()
    );
    Ok(if ingested.complete() && failed.is_empty() && host_problems == 0 && model_problems == 0 {
        Outcome::Complete
    } else {
        Outcome::Incomplete
    })
}

/// The model's stage choice over the groups of the runs it priced that differ only in the stage
/// (`zerobench_costmodel::validate::stage_choices`, the rule `zerobench fit --validate` counts):
/// zerobench's own completed runs, each group's stages by the median of their runs.
fn stage_choice_rows(runs: &[zerobench_ingest::RunReport], predicted: &[PredictedRow]) -> Vec<StageChoiceRow> {
    let mut priced = Vec::new();
    let mut first = std::collections::HashMap::new();
    for (r, p) in runs.iter().zip(predicted) {
        let (Ok(o), Some(step)) = (crate::cmd::fit::observation(&r.row), p.predicted_step_ms) else { continue };
        first.entry(o.stage_choice_key()).or_insert(&r.row);
        priced.push((o, step));
    }
    let refs: Vec<_> = priced.iter().map(|(o, step)| (o, *step)).collect();
    let builds = zerobench_ingest::run::BuildNames::of(runs.iter().map(|r| &r.row));
    let join = |v: Vec<String>| v.join(";");
    let sig = |x: f64| zerobench_ingest::stats::round_sig(x, zerobench_ingest::stats::SIGNIFICANT);
    let round = |x: f64| sig(x).to_string();
    zerobench_costmodel::validate::stage_choices(&refs)
        .into_iter()
        .map(|g| {
            let r = first[&g.key];
            let j = g.judgement();
            StageChoiceRow {
                model: r.model.clone(),
                variant: r.variant.clone(),
                offload: r.offload.map_or("?".to_string(), |o| o.to_string()),
                micro_batch: r.micro_batch,
                seq_len: r.seq_len,
                grad_accum: r.grad_accum,
                gpus: r.gpus,
                nodes: r.nodes,
                build: builds.name(r),
                stages: join(g.stages.iter().map(|s| s.stage.to_string()).collect()),
                runs: join(g.stages.iter().map(|s| s.measured.len().to_string()).collect()),
                step_ms: join(g.stages.iter().map(|s| round(s.median())).collect()),
                predicted_step_ms: join(g.stages.iter().map(|s| round(s.predicted)).collect()),
                chosen_stage: g.chosen,
                fastest_stage: g.fastest,
                right: j.right,
                right_within_tie: j.right_within_tie,
                shown_slower: j.shown_slower,
                decided: g.decided,
                device_bound: g.device_bound,
                regret_pct: sig(j.regret_pct),
            }
        })
        .collect()
}

/// One run against the model's prediction for its configuration on its host (none when the run
/// cannot be priced, with why).
/// Whether a run was priced, and why not.
enum Priced {
    Yes,
    /// The run is not one the model takes (`fit::observation`'s reason).
    NotTaken(String),
    /// The model has no fit for the run's GPU kind and precision.
    NoFit(String),
}

fn predicted_row(
    model: &zerobench_costmodel::CostModel,
    host_adamw_gparams_per_s: Option<f64>,
    r: &zerobench_ingest::RunRow,
) -> (PredictedRow, Priced) {
    let mut row = PredictedRow {
        run_id: r.run_id.clone(),
        model: r.model.clone(),
        stage: r.stage.map(|s| s.index()),
        offload: r.offload.map_or("?".to_string(), |o| o.to_string()),
        micro_batch: r.micro_batch,
        seq_len: r.seq_len,
        gpus: r.gpus,
        step_ms: r.step_ms_median,
        peak_allocated_bytes: r.peak_allocated_bytes,
        ..PredictedRow::default()
    };
    // Priced as a fit would take it; a foreign run of known identity is priced too (its error
    // then compares engines), and a run that never stepped.
    let (gpu, mut query) = match crate::cmd::fit::query(r) {
        Ok(q) => q,
        Err(why) => {
            row.notes = format!("not predicted: {why}");
            return (row, Priced::NotTaken(why));
        }
    };
    query.host_adamw_gparams_per_s = host_adamw_gparams_per_s;
    match model.fit_for(&gpu, query.config.precision) {
        Ok(f) => {
            let p = f.predict(&query);
            let err = |pred: f64, meas: f64| (meas > 0.0).then(|| (pred / meas - 1.0) * 100.0);
            row.predicted_step_ms = Some(p.step_ms);
            row.step_error_pct = r.step_ms_median.and_then(|m| err(p.step_ms, m));
            row.predicted_peak_allocated_bytes = Some(p.peak_allocated_bytes);
            row.memory_error_pct = r.peak_allocated_bytes.and_then(|m| err(p.peak_allocated_bytes as f64, m as f64));
            row.host_adamw_gparams_per_s = p.host_adamw_gparams_per_s;
            row.notes = p.extrapolated.join("; ");
            (row, Priced::Yes)
        }
        Err(e) => {
            row.notes = format!("not predicted: {e}");
            (row, Priced::NoFit(e.to_string()))
        }
    }
}

fn print_tables(out: &mut dyn Write, runs: &[zerobench_ingest::RunRow], tables: &Tables) -> anyhow::Result<()> {
    zerobench_table::write_text(out, &terminal::summary_table(runs))?;
    for (title, t) in [
        ("Median step time (ms)", tables.latency.to_table()),
        ("Peak memory per GPU (GiB; allocated unless marked nvml or rss)", tables.mem.to_table()),
        ("Model states per rank (MiB; parameters, gradients and optimizer states)", tables.states.to_table()),
    ] {
        if t.header.is_empty() {
            continue;
        }
        writeln!(out, "\n{title}")?;
        zerobench_table::write_text(out, &t)?;
    }
    let scaling = tables.text_tables().into_iter().find(|t| t.name == "scaling");
    if let Some(t) = scaling.filter(|t| !t.rows.is_empty()) {
        // Threads per rank where rows differ in them (lines split by threads would look repeated).
        let column = |name: &str| t.header.iter().position(|h| h == name);
        let threads_vary = column("threads")
            .is_some_and(|i| t.rows.iter().map(|r| &r[i]).collect::<std::collections::BTreeSet<_>>().len() > 1);
        let keep = [
            "model",
            "variant",
            "stage",
            "offload",
            "micro_batch",
            "gpus",
            "nodes",
            if threads_vary { "threads" } else { "" },
            "samples_per_s",
            "speedup",
            "efficiency",
        ];
        let idx: Vec<usize> = keep.iter().filter_map(|k| column(k)).collect();
        let pick = |r: &Vec<String>| idx.iter().map(|i| r[*i].clone()).collect::<Vec<_>>();
        let small = zerobench_table::Table {
            name: "scaling",
            header: pick(&t.header),
            rows: t.rows.iter().map(pick).collect(),
        };
        writeln!(out, "\nScaling (weak: micro-batch per GPU fixed; baseline = fewest GPUs)")?;
        zerobench_table::write_text(out, &small)?;
    }
    Ok(())
}
