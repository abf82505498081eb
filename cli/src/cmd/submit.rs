//! `zerobench submit DIR|SPEC`: sbatch every run folder (rendering a spec first), one job per
//! run or job arrays, and record the job ids in the run folders.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use zerobench_launcher::rerun::{render_over, rerun_decision, Rerun};
use zerobench_launcher::status::status_of;
use zerobench_launcher::submit::{check, submit_checked, SubmitOptions};
use zerobench_launcher::{render, Plan, Spec};

use crate::Outcome;
use zerobench_table::{write_text, Table};

#[derive(clap::Args)]
pub struct Args {
    /// A folder of rendered runs (or one run folder), or a spec to render first.
    target: PathBuf,
    /// Where to render when TARGET is a spec.
    #[arg(long, short)]
    out: Option<PathBuf>,
    /// Submit job arrays (one per group of runs asking for the same resources).
    #[arg(long)]
    array: bool,
    /// Every job waits on this (sbatch --dependency syntax, e.g. afterok:1234).
    #[arg(long)]
    dependency: Option<String>,
    /// Each job waits for the previous one to end (afterany), so runs go one at a time.
    #[arg(long)]
    chain: bool,
    /// Ask Slurm whether the jobs would be accepted and when they would start; submit nothing.
    #[arg(long)]
    test_only: bool,
    #[command(flatten)]
    render: super::RenderFlags,
    #[command(flatten)]
    rerun: super::RerunFlags,
}

/// The run folders a target names: a run folder, or every run folder under a folder.
pub fn run_dirs(target: &Path) -> anyhow::Result<Vec<PathBuf>> {
    if target.join("run.json").is_file() {
        return Ok(vec![target.to_path_buf()]);
    }
    let dirs = render::run_dirs(target)?;
    if dirs.is_empty() {
        bail!("{}: no run folders (folders with a run.json); render a spec first", target.display());
    }
    Ok(dirs)
}

pub fn run(a: Args) -> anyhow::Result<Outcome> {
    let (root, dirs, _lock) = if a.target.is_file() {
        let Some(out) = &a.out else {
            bail!("{} is a spec: say where to render it with --out DIR", a.target.display())
        };
        let mut plan = Plan::build(Spec::load(&a.target)?)?;
        for (id, why) in super::leave_out_unfit(&mut plan, a.render.include_unfit) {
            eprintln!("zerobench: {id}: {why}");
        }
        let lock = crate::lock::lock(out, "submit")?;
        // Only this spec's runs: older run folders in `out` are not submitted again.
        let on_change = a.render.on_change();
        let dirs = render_over(&plan, out, on_change)?.into_iter().map(|(d, _)| d).collect();
        (std::fs::canonicalize(out)?, dirs, lock)
    } else {
        // Neither a spec file nor a folder that exists: a mistyped path, named.
        let root = std::fs::canonicalize(&a.target)
            .with_context(|| format!("{}: neither a spec file nor a folder of run folders", a.target.display()))?;
        let dirs = run_dirs(&root)?;
        let root = if dirs.len() == 1 && dirs[0] == root { root.parent().unwrap_or(&root).to_path_buf() } else { root };
        let lock = crate::lock::lock(&root, "submit")?;
        (root, dirs, lock)
    };
    let mut opts = SubmitOptions {
        array: a.array,
        dependency: a.dependency,
        chain: a.chain,
        test_only: a.test_only,
        ..Default::default()
    };
    // A run folder that ran or was submitted before is not submitted again, unless it failed
    // and --retry-failed says so (a test submits nothing, so it sets nothing aside).
    let mut t = Table::new("submit", ["run", if a.test_only { "sbatch --test-only" } else { "job" }]);
    let records = check(&dirs, &opts)?;
    let priors = status_of(&records);
    let mut to_submit = Vec::with_capacity(dirs.len());
    let mut under_way: Vec<u64> = Vec::new();
    for (record, prior) in records.into_iter().zip(priors) {
        match rerun_decision(&record.0, &prior, a.rerun.retry_failed && !a.test_only)? {
            Rerun::Run => to_submit.push(record),
            why => {
                if let Rerun::UnderWay { job_id: Some(job) } = &why {
                    // An array task `123_4` is part of array job 123, which a chain waits for.
                    under_way.extend(job.split('_').next().and_then(|j| j.parse::<u64>().ok()));
                }
                t.row([prior.id.clone(), format!("not submitted: {why}")]);
            }
        }
    }
    // Slurm numbers jobs in the order it takes them: the latest under way ends the chain so far.
    if a.chain {
        opts.chain_after = under_way.into_iter().max().map(|j| j.to_string());
    }
    let skipped = t.rows.len();
    let done = submit_checked(&root, &to_submit, &opts)?;
    for s in &done {
        t.row([s.id.clone(), s.job.clone()]);
    }
    let mut out = crate::stdout::stdout();
    write_text(&mut out, &t)?;
    if a.test_only {
        writeln!(out, "{} runs accepted by sbatch --test-only; nothing submitted", done.len())?;
    } else {
        writeln!(
            out,
            "{} runs submitted, {skipped} left as they were; job ids are in each run folder's slurm.json",
            done.len()
        )?;
    }
    Ok(Outcome::Complete)
}
