//! Submitting rendered run folders with `sbatch --parsable`, one job per run or one job array per
//! group of runs that ask for the same resources, and recording the job ids in the run folders.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::quote::{sh, slurm_pattern_literal};
use crate::render::{directives, read_record, RunRecord};
use crate::slurm;
use crate::time::unix_now;

/// The file in a run folder that records its latest submission.
pub const SLURM_RECORD: &str = "slurm.json";

/// How to submit.
#[derive(Debug, Clone, Default)]
pub struct SubmitOptions {
    /// One job array per group of runs with identical resources, instead of a job per run.
    pub array: bool,
    /// Passed to every job as `--dependency` (e.g. `afterok:1234`).
    pub dependency: Option<String>,
    /// Each job waits for the one before (`afterany`), so the runs go one at a time.
    pub chain: bool,
    /// `sbatch --test-only`: ask Slurm whether and when each job would start; record nothing.
    pub test_only: bool,
    /// Limit for each sbatch call; [`slurm::COMMAND_TIMEOUT`] when zero.
    pub timeout: Duration,
}

/// What `slurm.json` holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlurmRecord {
    /// The id to query: `123`, or `123_4` for an array task.
    pub job_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array_job_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array_task_id: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dependency: Option<String>,
    /// Unix seconds.
    pub submitted_at: u64,
    /// The script sbatch was given.
    pub script: PathBuf,
}

/// One submitted (or tested) run.
#[derive(Debug, Clone)]
pub struct Submitted {
    pub id: String,
    pub dir: PathBuf,
    /// The job id, or for `--test-only` sbatch's answer.
    pub job: String,
}

/// Checks a `--dependency` value: Slurm's `type:id[:id…]` list joined by `,` or `?`, or
/// `singleton`. It reaches sbatch as one argument (no shell), so this is about clear errors.
pub fn check_dependency(dep: &str) -> Result<(), Error> {
    const TYPES: [&str; 6] = ["after", "afterany", "afterburstbuffer", "aftercorr", "afternotok", "afterok"];
    let bad = |why: &str| Error::Usage(format!("--dependency '{dep}': {why}"));
    if dep.is_empty() {
        return Err(bad("is empty"));
    }
    for part in dep.split([',', '?']) {
        if part == "singleton" {
            continue;
        }
        let mut it = part.split(':');
        let ty = it.next().unwrap_or_default();
        if !TYPES.contains(&ty) {
            return Err(bad(&format!(
                "'{ty}' is not a dependency type (after, afterany, afterok, afternotok, aftercorr, singleton)"
            )));
        }
        let ids: Vec<&str> = it.collect();
        if ids.is_empty() {
            return Err(bad(&format!("'{part}' names no job id")));
        }
        for id in ids {
            // job id, optionally with +time (after) or _task (arrays)
            if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit() || b == b'_' || b == b'+') {
                return Err(bad(&format!("'{id}' is not a job id")));
            }
        }
    }
    Ok(())
}

fn sbatch(script: &Path, deps: &[String], opts: &SubmitOptions) -> Result<String, Error> {
    let mut cmd = Command::new("sbatch");
    cmd.arg(if opts.test_only { "--test-only" } else { "--parsable" });
    if !deps.is_empty() {
        cmd.arg(format!("--dependency={}", deps.join(",")));
    }
    // The job starts in the run folder's parent whatever the caller's cwd is.
    if let Some(parent) = script.parent() {
        cmd.current_dir(parent);
    }
    cmd.arg(script);
    let timeout = if opts.timeout.is_zero() { slurm::COMMAND_TIMEOUT } else { opts.timeout };
    let out = slurm::run_ok(&mut cmd, timeout)?;
    if opts.test_only {
        // sbatch --test-only answers on stderr: "sbatch: Job 12 to start at ... using 2 processors ..."
        return Ok(out.stderr.trim().trim_start_matches("sbatch: ").to_string());
    }
    // --parsable prints "jobid" or "jobid;cluster".
    let id = out.stdout.trim().split(';').next().unwrap_or_default().to_string();
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Error::Command {
            command: slurm::describe(&cmd),
            message: format!("unexpected answer {:?}", out.stdout),
        });
    }
    Ok(id)
}

fn dependencies(opts: &SubmitOptions, previous: Option<&str>) -> Vec<String> {
    let mut deps: Vec<String> = opts.dependency.iter().cloned().collect();
    if let (true, Some(p)) = (opts.chain, previous) {
        deps.push(format!("afterany:{p}"));
    }
    deps
}

fn write_record(dir: &Path, rec: &SlurmRecord) -> Result<(), Error> {
    let p = dir.join(SLURM_RECORD);
    let text = serde_json::to_string_pretty(rec).unwrap_or_default() + "\n";
    crate::files::write(&p, text.as_bytes())
}

/// Whether run folders can be submitted with these options at all (the dependency's syntax; no
/// run a step of an existing allocation); returns their records. Run before deciding which of
/// them to submit, so that a sweep Slurm cannot take is refused whatever state its runs are in.
pub fn check(dirs: &[PathBuf], opts: &SubmitOptions) -> Result<Vec<(PathBuf, RunRecord)>, Error> {
    if let Some(d) = &opts.dependency {
        check_dependency(d)?;
    }
    let records: Vec<(PathBuf, RunRecord)> =
        dirs.iter().map(|d| read_record(d).map(|r| (d.clone(), r))).collect::<Result<_, _>>()?;
    if let Some((_, r)) = records.iter().find(|(_, r)| r.cluster.allocation.is_some()) {
        return Err(Error::Usage(format!(
            "run {} is a step of an existing allocation (cluster.allocation), not a job to submit: run the sweep with zerobench local",
            r.run.id
        )));
    }
    Ok(records)
}

/// Submits run folders (sorted by id). `root` holds the array scripts when `opts.array`.
pub fn submit(root: &Path, dirs: &[PathBuf], opts: &SubmitOptions) -> Result<Vec<Submitted>, Error> {
    let records = check(dirs, opts)?;
    if opts.array {
        return submit_arrays(root, &records, opts);
    }
    let mut out = Vec::new();
    let mut previous: Option<String> = None;
    for (dir, rec) in &records {
        let script = dir.join("job.sbatch");
        let deps = dependencies(opts, previous.as_deref());
        let job = sbatch(&script, &deps, opts)?;
        tracing::info!(run = %rec.run.id, job = %job, "submitted");
        if !opts.test_only {
            write_record(
                dir,
                &SlurmRecord {
                    job_id: job.clone(),
                    array_job_id: None,
                    array_task_id: None,
                    dependency: (!deps.is_empty()).then(|| deps.join(",")),
                    submitted_at: unix_now(),
                    script,
                },
            )?;
            previous = Some(job.clone());
        }
        out.push(Submitted { id: rec.run.id.clone(), dir: dir.clone(), job });
    }
    Ok(out)
}

/// The directives that decide what a job gets, without its name and output: runs whose text is
/// equal can share a job array.
fn resource_key(rec: &RunRecord) -> Result<String, Error> {
    let mut s = String::new();
    directives(&mut s, &rec.run, &rec.cluster, "x", "x")?;
    Ok(s.lines()
        .filter(|l| !l.starts_with("#SBATCH --job-name") && !l.starts_with("#SBATCH --output"))
        .collect::<Vec<_>>()
        .join("\n"))
}

/// The script of one job array: task `i` runs the `i`-th run folder's `job.sbatch` with bash (its
/// `#SBATCH` lines are comments there), its output going into that run folder.
pub fn array_script(root: &Path, name: &str, group: &[&(PathBuf, RunRecord)]) -> Result<String, Error> {
    let first = &group[0].1;
    let mut s = String::from("#!/bin/bash\n");
    let output = format!("{}/{name}-%A_%a.out", slurm_pattern_literal("the output folder", &root.to_string_lossy())?);
    directives(&mut s, &first.run, &first.cluster, name, &output)?;
    let _ = writeln!(s, "#SBATCH --array=0-{}", group.len() - 1);
    let _ = writeln!(
        s,
        "#\n# zerobench job array: {} runs asking for the same resources; task i runs runs[i].",
        group.len()
    );
    s.push_str("set -euo pipefail\n\nruns=(\n");
    for (dir, rec) in group {
        let _ = writeln!(s, "  {}  # {}", sh(&dir.to_string_lossy()), rec.run.id);
    }
    s.push_str(")\nrun_dir=${runs[$SLURM_ARRAY_TASK_ID]}\n");
    s.push_str("exec bash \"$run_dir/job.sbatch\" >\"$run_dir/${SLURM_JOB_NAME}-${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}.out\" 2>&1\n");
    Ok(s)
}

fn submit_arrays(root: &Path, records: &[(PathBuf, RunRecord)], opts: &SubmitOptions) -> Result<Vec<Submitted>, Error> {
    let mut groups: BTreeMap<String, Vec<&(PathBuf, RunRecord)>> = BTreeMap::new();
    for r in records {
        groups.entry(resource_key(&r.1)?).or_default().push(r);
    }
    let mut out = Vec::new();
    let mut previous: Option<String> = None;
    for (k, group) in groups.values().enumerate() {
        let name = format!("zerobench-array-{k}");
        let script = root.join(format!("{name}.sbatch"));
        crate::files::write(&script, array_script(root, &name, group)?.as_bytes())?;
        let deps = dependencies(opts, previous.as_deref());
        let job = sbatch(&script, &deps, opts)?;
        tracing::info!(array = %name, runs = group.len(), job = %job, "submitted");
        for (task, (dir, rec)) in group.iter().enumerate() {
            if !opts.test_only {
                write_record(
                    dir,
                    &SlurmRecord {
                        job_id: format!("{job}_{task}"),
                        array_job_id: Some(job.clone()),
                        array_task_id: Some(task as u32),
                        dependency: (!deps.is_empty()).then(|| deps.join(",")),
                        submitted_at: unix_now(),
                        script: script.clone(),
                    },
                )?;
            }
            let shown = if opts.test_only { job.clone() } else { format!("{job}_{task}") };
            out.push(Submitted { id: rec.run.id.clone(), dir: dir.clone(), job: shown });
        }
        if !opts.test_only {
            previous = Some(job);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dependency_values() {
        for ok in ["afterok:12", "afterany:1:2,afterok:3", "singleton", "after:5+10", "afterok:7_3?afternotok:8"] {
            check_dependency(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for bad in ["", "afterok", "afterok:", "whenever:1", "afterok:1;rm", "afterok:$(x)"] {
            assert!(check_dependency(bad).is_err(), "{bad}");
        }
    }
}
