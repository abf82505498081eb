//! Submitting rendered run folders with `sbatch --parsable`, one job per run or one job array per
//! group of runs that ask for the same resources, and recording the job ids in the run folders.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::interrupts::Held;
use crate::quote::{sh, slurm_pattern_literal};
use crate::render::{directives, read_record, RunRecord};
use crate::slurm;
use crate::time::unix_now;

/// The file in a run folder that records its latest submission.
pub const SLURM_RECORD: &str = "slurm.json";

/// The mark a run folder holds while its job is submitted: made before `sbatch` runs, removed
/// once [`SLURM_RECORD`] records the job, and holding the job's id if Slurm took it but the
/// record could not be written (a full disk). Found with no record, it says a job may be in
/// Slurm that nothing records: that run is not sent again until someone has looked.
pub const SUBMITTING: &str = ".submitting";

/// How to submit.
#[derive(Debug, Clone, Default)]
pub struct SubmitOptions {
    /// One job array per group of runs with identical resources, instead of a job per run.
    pub array: bool,
    /// Passed to every job as `--dependency` (e.g. `afterok:1234`).
    pub dependency: Option<String>,
    /// Each job waits for the one before (`afterany`), so the runs go one at a time.
    pub chain: bool,
    /// With `chain`, the job the first of these waits for: the last of the sweep's jobs an
    /// earlier submit sent that Slurm still has pending or running, so that a submit continuing
    /// an interrupted one extends its chain rather than starting a second beside it.
    pub chain_after: Option<String>,
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

impl SlurmRecord {
    /// The name of an array task's own output file in the output folder (the array script's
    /// `#SBATCH --output`, `<script name>-%A_%a.out`, in [`array_script`]), where slurmstepd
    /// writes why the task was stopped; none for a job of its own (its output is in its folder).
    pub fn array_task_output(&self) -> Option<String> {
        self.array_job_id.as_ref()?;
        Some(array_output(self.script.file_stem()?.to_str()?, &self.job_id))
    }
}

/// The output file of an array script named `name` for `task`: Slurm's `%A_%a` in the script's
/// `#SBATCH --output`, a task's `<array job>_<task>` id once it ran.
fn array_output(name: &str, task: &str) -> String {
    format!("{name}-{task}.out")
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
    // The job starts in its script's folder (a run's, or an array's output folder), whatever the cwd.
    if let Some(parent) = script.parent() {
        cmd.current_dir(parent);
    }
    cmd.arg(script);
    // A process group of its own: a Ctrl-C at the terminal goes to zerobench's group, and must
    // not kill sbatch after the controller has taken the job but before its id is read back
    // (a job then runs that no slurm.json records, and the next submit sends it again).
    cmd.process_group(0);
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

/// Marks run folders as being submitted ([`SUBMITTING`]), before their job goes to Slurm: a
/// folder that cannot be marked (a full disk) stops the submission before the job is sent.
fn mark(dirs: &[&Path]) -> Result<(), Error> {
    for dir in dirs {
        zerobench_files::replace(&dir.join(SUBMITTING), b"")?;
    }
    Ok(())
}

/// Takes the marks away from folders whose job `sbatch` refused (it exited with an error): no
/// job was made. Any other failure (no answer in time, an answer that is not a job id) leaves
/// them: Slurm may have the job.
fn unmark_if_refused(e: &Error, dirs: &[&Path]) {
    if matches!(e, Error::Slurm { code, .. } if *code > 0) {
        for dir in dirs {
            let _ = std::fs::remove_file(dir.join(SUBMITTING));
        }
    }
}

/// Records a job Slurm took for `run` in its folder and takes the folder's mark away. Where the
/// record cannot be written the mark keeps the job's id (if it can) and the error names the job.
fn write_record(dir: &Path, run: &str, rec: &SlurmRecord) -> Result<(), Error> {
    let p = dir.join(SLURM_RECORD);
    let marker = dir.join(SUBMITTING);
    let text = serde_json::to_string_pretty(rec).unwrap_or_default() + "\n";
    if let Err(e) = zerobench_files::replace(&p, text.as_bytes()) {
        let _ = zerobench_files::replace(&marker, format!("{}\n", rec.job_id).as_bytes());
        return Err(Error::Unrecorded {
            run: run.to_string(),
            job: rec.job_id.clone(),
            record: e.path,
            cause: e.cause,
            marker,
        });
    }
    match std::fs::remove_file(&marker) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io(&marker, e)),
        _ => Ok(()),
    }
}

/// What a run folder's mark ([`SUBMITTING`]) says: `None` no mark; `Some(None)` a submission
/// that may have reached Slurm; `Some(Some(job))` a job Slurm took whose record is missing.
pub fn mark_of(dir: &Path) -> Option<Option<String>> {
    let marker = dir.join(SUBMITTING);
    std::fs::symlink_metadata(&marker).ok()?;
    let job = std::fs::read_to_string(&marker).unwrap_or_default().trim().to_string();
    Some((!job.is_empty()).then_some(job))
}

/// Refuses folders whose mark ([`SUBMITTING`]) has no record beside it: a job may be in Slurm
/// that nothing records. A mark beside a record (stopped between the two) is taken away.
fn check_marks(records: &[(PathBuf, RunRecord)]) -> Result<(), Error> {
    for (dir, rec) in records {
        let Some(job) = mark_of(dir) else { continue };
        let marker = dir.join(SUBMITTING);
        if dir.join(SLURM_RECORD).is_file() {
            std::fs::remove_file(&marker).map_err(|e| Error::io(&marker, e))?;
            continue;
        }
        return Err(Error::Unsettled { marker, run: rec.run.id.clone(), job });
    }
    Ok(())
}

/// Whether run folders can be submitted with these options at all (the dependency's syntax; no
/// run a step of an existing allocation); returns their records. Run before deciding which of
/// them to submit, so that a sweep Slurm cannot take is refused whatever state its runs are in.
pub fn check(dirs: &[PathBuf], opts: &SubmitOptions) -> Result<Vec<(PathBuf, RunRecord)>, Error> {
    if let Some(d) = &opts.dependency {
        check_dependency(d)?;
        if opts.chain && d.contains('?') {
            // Slurm takes all of a `,` list or any of a `?` list, never both: the chain's
            // `afterany` joined to an OR would let a job start beside the one before.
            return Err(Error::Usage(format!(
                "--dependency '{d}' is an OR ('?'), which --chain cannot extend: Slurm takes all of a ',' \
                 list or any of a '?' list, never both, so a job would start beside the one before it"
            )));
        }
    }
    let records: Vec<(PathBuf, RunRecord)> =
        dirs.iter().map(|d| read_record(d).map(|r| (d.clone(), r))).collect::<Result<_, _>>()?;
    if !opts.test_only {
        check_marks(&records)?;
    }
    if let Some((_, r)) = records.iter().find(|(_, r)| r.cluster.allocation.is_some()) {
        return Err(Error::Usage(format!(
            "run {} is a step of an existing allocation (cluster.allocation), not a job to submit: run the sweep with zerobench local",
            r.run.id
        )));
    }
    Ok(records)
}

/// Stops the submission between two jobs if a signal came ([`crate::interrupts`]): a signal
/// that comes while an `sbatch` is in flight is acted on once its job is recorded, so that every
/// job Slurm took has its `slurm.json` and the next submit sends only what was not sent.
fn stop_if_signalled(held: &Held, submitted: usize, total: usize) -> Result<(), Error> {
    match held.received() {
        None => Ok(()),
        Some(signal) => Err(Error::Interrupted { signal, submitted, total }),
    }
}

/// Submits run folders (sorted by id). `root` holds the array scripts when `opts.array`.
/// SIGINT, SIGTERM and SIGHUP stop it between two submissions, every job sent recorded
/// ([`crate::interrupts`]).
pub fn submit(root: &Path, dirs: &[PathBuf], opts: &SubmitOptions) -> Result<Vec<Submitted>, Error> {
    submit_checked(root, &check(dirs, opts)?, opts)
}

/// [`submit`] for run folders [`check`] has passed with the same options, with the records it
/// returned: each folder's `run.json` is read once.
pub fn submit_checked(
    root: &Path,
    records: &[(PathBuf, RunRecord)],
    opts: &SubmitOptions,
) -> Result<Vec<Submitted>, Error> {
    let held = Held::hold()?;
    if opts.array {
        return submit_arrays(root, records, opts, &held);
    }
    let mut out = Vec::new();
    let mut previous: Option<String> = opts.chain_after.clone();
    for (dir, rec) in records {
        stop_if_signalled(&held, out.len(), records.len())?;
        let script = dir.join("job.sbatch");
        let deps = dependencies(opts, previous.as_deref());
        if !opts.test_only {
            mark(&[dir])?;
        }
        let job = sbatch(&script, &deps, opts).inspect_err(|e| unmark_if_refused(e, &[dir]))?;
        tracing::info!(run = %rec.run.id, job = %job, "submitted");
        if !opts.test_only {
            write_record(
                dir,
                &rec.run.id,
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

/// The name of the job arrays' scripts in the output folder, before their number.
const ARRAY_PREFIX: &str = "zerobench-array-";

/// One past the highest number of an array script already in `root` (0 where there is none).
fn next_array_index(root: &Path) -> Result<usize, Error> {
    let entries = std::fs::read_dir(root).map_err(|e| Error::io(root, e))?;
    Ok(entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name();
            let k = name.to_str()?.strip_prefix(ARRAY_PREFIX)?.strip_suffix(".sbatch")?.parse::<usize>().ok()?;
            Some(k + 1)
        })
        .max()
        .unwrap_or(0))
}

/// The script of one job array: task `i` runs the `i`-th run folder's `job.sbatch` with bash (its
/// `#SBATCH` lines are comments there), its output going into that run folder.
pub fn array_script(root: &Path, name: &str, group: &[&(PathBuf, RunRecord)]) -> Result<String, Error> {
    let first = &group[0].1;
    let mut s = String::from("#!/bin/bash\n");
    let output = format!(
        "{}/{}",
        slurm_pattern_literal("the output folder", &root.to_string_lossy())?,
        array_output(name, "%A_%a")
    );
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

fn submit_arrays(
    root: &Path,
    records: &[(PathBuf, RunRecord)],
    opts: &SubmitOptions,
    held: &Held,
) -> Result<Vec<Submitted>, Error> {
    let mut groups: BTreeMap<String, Vec<&(PathBuf, RunRecord)>> = BTreeMap::new();
    for r in records {
        groups.entry(resource_key(&r.1)?).or_default().push(r);
    }
    let mut out = Vec::new();
    let mut previous: Option<String> = opts.chain_after.clone();
    // Numbered after the arrays submitted before into this folder, whose scripts the runs'
    // slurm.json name: rewritten, a record would no longer say what its task ran.
    let first = next_array_index(root)?;
    for (k, group) in groups.values().enumerate() {
        stop_if_signalled(held, out.len(), records.len())?;
        let name = format!("{ARRAY_PREFIX}{}", first + k);
        let script = root.join(format!("{name}.sbatch"));
        zerobench_files::replace(&script, array_script(root, &name, group)?.as_bytes())?;
        let deps = dependencies(opts, previous.as_deref());
        let dirs: Vec<&Path> = group.iter().map(|(d, _)| d.as_path()).collect();
        if !opts.test_only {
            mark(&dirs)?;
        }
        let answer = sbatch(&script, &deps, opts);
        if opts.test_only {
            // Asked, not submitted: no script of a job that never was stays behind.
            let _ = std::fs::remove_file(&script);
        }
        let job = answer.inspect_err(|e| unmark_if_refused(e, &dirs))?;
        tracing::info!(array = %name, runs = group.len(), job = %job, "submitted");
        // Every task's record that can be written is, before the first that could not stops it.
        let mut unrecorded = None;
        for (task, (dir, rec)) in group.iter().enumerate() {
            if !opts.test_only {
                let written = write_record(
                    dir,
                    &rec.run.id,
                    &SlurmRecord {
                        job_id: format!("{job}_{task}"),
                        array_job_id: Some(job.clone()),
                        array_task_id: Some(task as u32),
                        dependency: (!deps.is_empty()).then(|| deps.join(",")),
                        submitted_at: unix_now(),
                        script: script.clone(),
                    },
                );
                if let Err(e) = written {
                    unrecorded.get_or_insert(e);
                    continue;
                }
            }
            let shown = if opts.test_only { job.clone() } else { format!("{job}_{task}") };
            out.push(Submitted { id: rec.run.id.clone(), dir: dir.clone(), job: shown });
        }
        if let Some(e) = unrecorded {
            return Err(e);
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
    use crate::testkit::{first_on_path, render_sweep, stub};
    use rusty_fork::rusty_fork_test;

    /// A rendered sweep of four runs in two resource groups (one node, two nodes), and a stub
    /// `sbatch` first on PATH that answers job ids from 101 on (`id;cluster`, as `--parsable`
    /// does on a federation) and records each call's folder and arguments in `calls`. Set PATH
    /// only in a process of its own.
    fn sweep_and_stub(tmp: &Path) -> (Vec<PathBuf>, PathBuf) {
        let bin = tmp.join("bin");
        std::fs::create_dir(&bin).unwrap();
        let (counter, calls) = (tmp.join("counter"), tmp.join("calls"));
        stub(
            &bin,
            "sbatch",
            &format!(
                "n=$(cat {c} 2>/dev/null || echo 100); n=$((n + 1)); echo $n > {c}\necho \"$PWD $*\" >> {calls}\n\
                 if [ \"$1\" = --test-only ]; then echo \"sbatch: Job $n to start at 2030-01-01T00:00:00 using 4 processors\" >&2; \
                 else echo \"$n;cluster\"; fi",
                c = counter.display(),
                calls = calls.display()
            ),
        );
        first_on_path(&bin);
        let yaml = "cluster: {gpus_per_node: 2, gpu_memory: 16GiB}\nsweep:\n  models: tiny\n  stages: [0, 3]\n  nodes: [1, 2]\n";
        (render_sweep(yaml, &tmp.join("out")).1, calls)
    }

    /// Unix seconds by the standard library, not by [`unix_now`], so that a wrong `unix_now` shows.
    fn clock() -> u64 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
    }

    fn record(dir: &Path) -> Option<SlurmRecord> {
        let text = std::fs::read_to_string(dir.join(SLURM_RECORD)).ok()?;
        Some(serde_json::from_str(&text).unwrap())
    }

    rusty_fork_test! {
        /// One job per run, started in its run folder, each after the one before (`--chain`)
        /// and after the given dependency; each run folder records its job. `--test-only`
        /// records nothing, chains nothing and answers what sbatch said.
        #[test]
        fn runs_are_submitted_one_job_each() {
            let tmp = tempfile::tempdir().unwrap();
            let (dirs, calls) = sweep_and_stub(tmp.path());
            let before = clock();
            let opts = SubmitOptions { chain: true, dependency: Some("afterok:7".into()), ..SubmitOptions::default() };
            let jobs: Vec<String> = submit(tmp.path(), &dirs, &opts).unwrap().into_iter().map(|s| s.job).collect();
            assert_eq!(jobs, ["101", "102", "103", "104"]);
            let mut expected = String::new();
            for (i, d) in dirs.iter().enumerate() {
                let dep = if i == 0 { "afterok:7".to_string() } else { format!("afterok:7,afterany:{}", 100 + i) };
                let script = d.join("job.sbatch");
                expected += &format!("{} --parsable --dependency={dep} {}\n", d.display(), script.display());
                let r = record(d).unwrap();
                assert_eq!(
                    (r.job_id.as_str(), r.dependency.as_deref(), r.array_job_id),
                    (jobs[i].as_str(), Some(dep.as_str()), None)
                );
                assert!(r.submitted_at >= before && r.submitted_at <= before + 600, "{}", r.submitted_at);
                assert_eq!(r.script, d.join("job.sbatch"));
                std::fs::remove_file(d.join(SLURM_RECORD)).unwrap();
            }
            assert_eq!(std::fs::read_to_string(&calls).unwrap(), expected);
            let opts = SubmitOptions { chain: true, test_only: true, ..SubmitOptions::default() };
            let answers: Vec<String> = submit(tmp.path(), &dirs, &opts).unwrap().into_iter().map(|s| s.job).collect();
            assert_eq!(answers[1], "Job 106 to start at 2030-01-01T00:00:00 using 4 processors");
            assert!(dirs.iter().all(|d| record(d).is_none()));
            let last = std::fs::read_to_string(&calls).unwrap().lines().last().unwrap().to_string();
            assert_eq!(last, format!("{} --test-only {}", dirs[3].display(), dirs[3].join("job.sbatch").display()));
        }
    }

    rusty_fork_test! {
        /// A job Slurm took whose record cannot be written (a full disk; here every temporary
        /// name of the run's `slurm.json` taken) stops the submission naming the job, and the
        /// run is not sent again (two jobs would write its logs) until its mark is removed; a
        /// job sbatch refused leaves no mark. The same with job arrays.
        #[test]
        fn a_job_whose_record_cannot_be_written_is_named_and_not_sent_again() {
            for array in [false, true] {
                let tmp = tempfile::tempdir().unwrap();
                let (dirs, calls) = sweep_and_stub(tmp.path());
                let taken: Vec<PathBuf> = zerobench_files::temporary_names(&dirs[1].join(SLURM_RECORD)).collect();
                for t in &taken {
                    std::fs::write(t, "").unwrap();
                }
                let opts = SubmitOptions { array, ..SubmitOptions::default() };
                let e = submit(tmp.path(), &dirs, &opts).unwrap_err();
                let job = if array { "102_0" } else { "102" };
                assert!(matches!(&e, Error::Unrecorded { job: j, .. } if j == job), "{e}");
                assert!(e.to_string().contains(&format!("scancel {job}")), "{e}");
                assert_eq!(std::fs::read_to_string(dirs[1].join(SUBMITTING)).unwrap(), format!("{job}\n"));
                let sent = std::fs::read_to_string(&calls).unwrap().lines().count();
                for t in &taken {
                    std::fs::remove_file(t).unwrap();
                }
                // Not sent again, and nothing else either, while the mark is there.
                let e = submit(tmp.path(), &dirs, &opts).unwrap_err().to_string();
                assert!(e.contains(SUBMITTING) && e.contains(&format!("as job {job}")), "{e}");
                assert_eq!(std::fs::read_to_string(&calls).unwrap().lines().count(), sent);
                std::fs::remove_file(dirs[1].join(SUBMITTING)).unwrap();
                let again = submit(tmp.path(), &dirs[1..2], &opts).unwrap();
                assert_eq!(again.len(), 1);
                assert!(record(&dirs[1]).is_some() && !dirs[1].join(SUBMITTING).exists());
                // The array's other task is recorded; one job a run stopped before the next.
                assert_eq!(record(&dirs[3]).is_some(), array);
                assert!(!dirs[3].join(SUBMITTING).exists());
                // A job sbatch refuses leaves no mark.
                std::fs::remove_file(dirs[3].join(SLURM_RECORD)).ok();
                stub(&tmp.path().join("bin"), "sbatch", "echo 'sbatch: error: invalid partition' >&2; exit 1");
                assert!(submit(tmp.path(), &dirs[3..], &opts).is_err());
                assert!(!dirs[3].join(SUBMITTING).exists());
            }
        }
    }

    rusty_fork_test! {
        /// An answer that is not a job id (sbatch without `--parsable`, or nothing) is an error
        /// naming the command, and no run records a job.
        #[test]
        fn an_answer_that_is_not_a_job_id_is_an_error() {
            let tmp = tempfile::tempdir().unwrap();
            let (dirs, _) = sweep_and_stub(tmp.path());
            for answer in ["Submitted batch job 12", ""] {
                stub(&tmp.path().join("bin"), "sbatch", &format!("echo '{answer}'"));
                let e = submit(tmp.path(), &dirs[..1], &SubmitOptions::default()).unwrap_err().to_string();
                assert!(e.contains("sbatch --parsable") && e.contains("unexpected answer"), "{e}");
                assert!(record(&dirs[0]).is_none());
                // sbatch did not refuse: Slurm may have the job (the first answer says it has), so
                // the run stays marked and is not sent again until someone has looked.
                let e = submit(tmp.path(), &dirs[..1], &SubmitOptions::default()).unwrap_err().to_string();
                assert!(e.contains("may have reached Slurm"), "{e}");
                std::fs::remove_file(dirs[0].join(SUBMITTING)).unwrap();
            }
        }
    }

    rusty_fork_test! {
        /// `--array`: one job array per group of runs asking for the same resources (here, by
        /// node count), its script running each run folder's job; each run records its task. A
        /// chain makes the second array wait for the first; the first has no dependency.
        /// A second `--array` submission into the folder (`--retry-failed` of some runs) numbers
        /// its arrays after the first's, whose scripts the first runs' slurm.json name: they stay
        /// as they ran. `--test-only` leaves no script of a job that never was.
        #[test]
        fn later_arrays_keep_the_scripts_of_earlier_ones() {
            let tmp = tempfile::tempdir().unwrap();
            let (dirs, _) = sweep_and_stub(tmp.path());
            let root = tmp.path();
            let opts = SubmitOptions { array: true, ..SubmitOptions::default() };
            submit(root, &dirs, &opts).unwrap();
            let first = std::fs::read_to_string(root.join("zerobench-array-0.sbatch")).unwrap();
            let test = SubmitOptions { array: true, test_only: true, ..SubmitOptions::default() };
            submit(root, &dirs[..1], &test).unwrap();
            assert!(!root.join("zerobench-array-2.sbatch").exists(), "a test left its script");
            submit(root, &dirs[..1], &opts).unwrap();
            assert_eq!(std::fs::read_to_string(root.join("zerobench-array-0.sbatch")).unwrap(), first);
            assert_eq!(record(&dirs[0]).unwrap().script, root.join("zerobench-array-2.sbatch"));
            assert!(root.join("zerobench-array-2.sbatch").is_file());
        }

        #[test]
        fn runs_with_the_same_resources_share_a_job_array() {
            let tmp = tempfile::tempdir().unwrap();
            let (dirs, calls) = sweep_and_stub(tmp.path());
            let before = clock();
            let opts = SubmitOptions { array: true, chain: true, ..SubmitOptions::default() };
            let subs = submit(tmp.path(), &dirs, &opts).unwrap();
            let root = tmp.path();
            let script = |k: usize| root.join(format!("zerobench-array-{k}.sbatch"));
            assert_eq!(
                std::fs::read_to_string(&calls).unwrap(),
                format!(
                    "{r} --parsable {} \n{r} --parsable --dependency=afterany:101 {}\n",
                    script(0).display(),
                    script(1).display(),
                    r = root.display()
                )
                .replace(" \n", "\n")
            );
            // Each group: its runs' nodes agree, and differ from the other group's.
            let nodes = |d: &Path| read_record(d).unwrap().run.nodes;
            let mut by_job: BTreeMap<String, Vec<(u32, usize)>> = BTreeMap::new();
            for s in &subs {
                let r = record(&s.dir).unwrap();
                let (job, task) = s.job.split_once('_').unwrap();
                assert_eq!(r.job_id, s.job);
                assert_eq!((r.array_job_id.as_deref(), r.array_task_id), (Some(job), Some(task.parse().unwrap())));
                assert_eq!(r.dependency.as_deref(), (job == "102").then_some("afterany:101"));
                assert!(r.submitted_at >= before, "{}", r.submitted_at);
                let k = if job == "101" { 0 } else { 1 };
                assert_eq!(r.script, script(k));
                let text = std::fs::read_to_string(script(k)).unwrap();
                let i = dirs.iter().position(|d| *d == s.dir).unwrap();
                let line = format!("  {}  # {}", crate::quote::sh(&s.dir.to_string_lossy()), s.id);
                assert!(text.contains(&line), "{text}");
                by_job.entry(job.to_string()).or_default().push((nodes(&s.dir), i));
            }
            assert_eq!(by_job.len(), 2);
            for (job, runs) in &by_job {
                assert_eq!(runs.len(), 2, "{job}: {runs:?}");
                assert_eq!(runs[0].0, runs[1].0, "{job}: {runs:?}");
                let k = if job == "101" { 0 } else { 1 };
                let text = std::fs::read_to_string(script(k)).unwrap();
                assert!(text.starts_with("#!/bin/bash\n") && text.contains("#SBATCH --array=0-1\n"), "{text}");
                assert!(text.contains(&format!("#SBATCH --nodes={}\n", runs[0].0)), "{text}");
            }
            assert_ne!(by_job["101"][0].0, by_job["102"][0].0);
            // --test-only: the arrays are asked about, not chained, and nothing is recorded.
            for d in &dirs {
                std::fs::remove_file(d.join(SLURM_RECORD)).unwrap();
            }
            let opts = SubmitOptions { array: true, chain: true, test_only: true, ..SubmitOptions::default() };
            let subs = submit(tmp.path(), &dirs, &opts).unwrap();
            assert_eq!(subs[0].job, "Job 103 to start at 2030-01-01T00:00:00 using 4 processors");
            assert!(dirs.iter().all(|d| record(d).is_none()));
            let text = std::fs::read_to_string(&calls).unwrap();
            assert!(text.lines().skip(2).all(|l| l.contains(" --test-only ") && !l.contains("--dependency")), "{text}");
        }
    }

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
