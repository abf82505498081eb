//! `zerobench local SPEC --out DIR`: render the sweep with the local method and run it on this
//! host, one run after the other, with a progress bar; a failed run does not stop the sweep.
//! A spec with `cluster.allocation` keeps its srun method: each run is a job step of that
//! allocation, driven from here.
//!
//! Into an existing `--out`, nothing already there is lost: a run that finished is skipped, one
//! that failed is run again only with `--retry-failed` (its earlier logs kept in the run folder's
//! `.attempts/`), and a folder holding another configuration's results is refused unless
//! `--overwrite` (which moves it to `.replaced/`).

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use zerobench_launcher::local::{run_local, LocalOptions, SweepProgress};
use zerobench_launcher::render::Rendered;
use zerobench_launcher::rerun::{render_over, rerun_decision, Rerun};
use zerobench_launcher::spec::Method;
use zerobench_launcher::status::{status, State};
use zerobench_launcher::{Plan, Spec};

use crate::Outcome;
use zerobench_table::{write_text, Table};

#[derive(clap::Args)]
pub struct Args {
    /// The experiment spec; its runs must each fit on one node, unless it names an allocation.
    spec: PathBuf,
    /// Where the run folders go.
    #[arg(long, short)]
    out: PathBuf,
    /// Stop a run after this many seconds, at least 1; 0 is refused (cluster.time 0 means no
    /// limit) (default: the spec's cluster.time, else no limit).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    timeout: Option<u64>,
    #[command(flatten)]
    render: super::RenderFlags,
    #[command(flatten)]
    rerun: super::RerunFlags,
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
    let mut plan = Plan::build(spec)?;
    let unfit = super::leave_out_unfit(&mut plan, a.render.include_unfit);
    let _lock = crate::lock::lock(&a.out, "local")?;
    let on_change = a.render.on_change();
    let rendered = render_over(&plan, &a.out, on_change)?;
    let dirs: Vec<PathBuf> = rendered.iter().map(|(d, _)| d.clone()).collect();
    let before = status(&dirs)?;
    let mut t = Table::new("local", ["run", "state", "seconds", "detail"]);
    for (id, why) in &unfit {
        t.row([id.clone(), "unfit".into(), "-".into(), why.clone()]);
    }
    let mut runs: Vec<(String, PathBuf)> = Vec::new();
    let (mut skipped, mut failed) = (0, 0);
    // render gives the folders in the plan's order.
    for ((run, (dir, what)), prior) in plan.runs.iter().zip(&rendered).zip(&before) {
        if matches!(what, Rendered::Replaced { .. }) {
            tracing::warn!(run = %run.id, "{}", what.describe());
        }
        match rerun_decision(dir, prior, a.rerun.retry_failed)? {
            Rerun::Run => runs.push((run.id.clone(), dir.clone())),
            why => {
                let why = why.to_string();
                skipped += 1;
                if !matches!(prior.state, State::Done) {
                    failed += 1;
                }
                let detail = if prior.detail.is_empty() { why } else { format!("{why}; {}", prior.detail) };
                t.row([run.id.clone(), format!("{} (skipped)", prior.state), "-".into(), detail]);
            }
        }
    }
    let mut progress = if std::io::stderr().is_terminal() { Progress::bar(runs.len()) } else { Progress::Lines };
    let done = run_local(&runs, &LocalOptions { timeout }, &mut progress)?;
    progress.clear();
    let results = &done.results;
    for r in results {
        let st = zerobench_launcher::status::local_state(&r.record);
        if st != State::Done {
            failed += 1;
        }
        let mut detail = r.record.describe();
        if let Some(why) = &r.failure {
            detail.push_str(&format!("; {why}"));
        }
        t.row([r.id.clone(), st.to_string(), format!("{:.1}", r.record.seconds), detail]);
    }
    let not_started = runs.len() - results.len();
    for (id, _) in &runs[results.len()..] {
        t.row([id.clone(), "not started".into(), "-".into(), "the sweep was interrupted".into()]);
    }
    let mut out = crate::stdout::stdout();
    write_text(&mut out, &t)?;
    writeln!(
        out,
        "{} runs: {} run now, {} skipped, {} not done; logs in each run folder's logs/, output in local.out",
        plan.runs.len(),
        results.len(),
        skipped,
        failed + not_started
    )?;
    if let Some(sig) = &done.interrupted_by {
        writeln!(
            out,
            "interrupted by {sig}: the run going was stopped with its ranks; {not_started} runs not started"
        )?;
    }
    Ok(if failed + not_started > 0 { Outcome::Incomplete } else { Outcome::Complete })
}

/// How the sweep's progress is drawn: a bar on a terminal; otherwise one line per finished run on
/// stderr (n/total, elapsed, an estimate of the time left), so a log of the sweep shows how far it
/// got.
enum Progress {
    Bar(ProgressBar),
    Lines,
}

impl Progress {
    fn bar(total: usize) -> Self {
        let bar = ProgressBar::new(total as u64);
        bar.set_style(
            ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        Progress::Bar(bar)
    }

    fn clear(&self) {
        if let Progress::Bar(bar) = self {
            bar.finish_and_clear();
        }
    }
}

impl SweepProgress for Progress {
    fn started(&mut self, _: usize, _: usize, id: &str) {
        if let Progress::Bar(bar) = self {
            bar.set_message(id.to_string());
        }
    }

    fn finished(&mut self, index: usize, total: usize, id: &str, state: State, elapsed: Duration) {
        match self {
            Progress::Bar(bar) => bar.inc(1),
            Progress::Lines => {
                let done = index + 1;
                let elapsed = elapsed.as_secs_f64();
                let left = elapsed / done as f64 * (total - done) as f64;
                eprintln!("[{done}/{total}] {id}: {state} ({} elapsed, about {} left)", clock(elapsed), clock(left));
            }
        }
    }
}

/// `h:mm:ss`.
fn clock(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}
