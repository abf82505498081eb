//! Running a run folder again: a finished run is left as it is, a failed one runs again only
//! when asked, with what its earlier attempt left moved aside (never deleted). `local` and
//! `submit` both decide here.

use std::path::{Path, PathBuf};

use crate::error::Error;
use crate::local::{LOCAL_OUTPUT, LOCAL_RECORD};
use crate::plan::Plan;
use crate::render::{check, has_results, move_aside, OnChange, Rendered, ATTEMPTS_DIR, LOG_DIR};
use crate::status::{read_json, status_of, RunState, State, FROM_PIDS};
use crate::submit::{SlurmRecord, SLURM_RECORD};

/// Moves what a run's earlier attempt left (its logs, `local.json`, `local.out`, `slurm.json`,
/// the job's `.out`/`.err` files and an array task's own output from the folder above) into
/// `.attempts/attempt-<unix time>/` in its folder, so that it can run again without a byte of the
/// earlier attempt lost; returns that folder.
pub fn set_aside_attempt(dir: &Path) -> Result<PathBuf, Error> {
    let keep = dir.join(ATTEMPTS_DIR);
    let stage = dir.join(".attempt-in-progress");
    std::fs::create_dir_all(&stage).map_err(|e| Error::io(&stage, e))?;
    // Slurm's word on why the task stopped (`*** ... CANCELLED ... ***`) is in the output folder,
    // under the task's id: it goes with the attempt it explains. Taken first, while the record
    // naming it is still in place.
    let task_output = read_json::<SlurmRecord>(&dir.join(SLURM_RECORD))
        .and_then(|rec| rec.array_task_output())
        .and_then(|name| Some((dir.parent()?.join(&name), name)));
    if let Some((from, name)) = task_output.filter(|(from, _)| from.is_file()) {
        std::fs::rename(&from, stage.join(name)).map_err(|e| Error::io(&from, e))?;
    }
    let mut names: Vec<std::ffi::OsString> = [LOG_DIR, LOCAL_RECORD, LOCAL_OUTPUT, SLURM_RECORD].map(Into::into).into();
    for e in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?.flatten() {
        let n = e.file_name();
        let text = n.to_string_lossy();
        if (text.ends_with(".out") || text.ends_with(".err")) && !names.contains(&n) {
            names.push(n);
        }
    }
    for name in names {
        let from = dir.join(&name);
        if std::fs::symlink_metadata(&from).is_ok() {
            std::fs::rename(&from, stage.join(&name)).map_err(|e| Error::io(&from, e))?;
        }
    }
    move_aside(&stage, &keep, "attempt")
}

/// Renders `plan` into `out` as [`crate::render::render_with`] does; with [`OnChange::MoveAside`] (`--overwrite`)
/// it first refuses, moving nothing, if a folder it would move aside holds a run under way:
/// pending or running in Slurm, or with ranks alive on this host. Moved, such a run went on
/// writing into the new folder (the job's output and logs go to the run folder's path).
pub fn render_over(plan: &Plan, out: &Path, on_change: OnChange) -> Result<Vec<(PathBuf, Rendered)>, Error> {
    let checked = check(plan, out, on_change)?;
    if on_change == OnChange::MoveAside {
        // A folder whose run.json cannot be read says nothing of a job; it is moved as before.
        let moving: Vec<_> = checked.to_replace().filter_map(|(d, r)| r.map(|r| (d, r))).collect();
        if let Some(r) = status_of(&moving).into_iter().find(|r| matches!(r.state, State::Pending | State::Running)) {
            let how = match &r.job_id {
                Some(job) if r.source != FROM_PIDS => {
                    format!("job {job} is {} in Slurm: cancel it (scancel {job}) or let it end", r.state)
                }
                _ => format!("its ranks are {}: stop them or let them end", r.detail),
            };
            return Err(Error::Usage(format!(
                "{}: run {} is under way ({how}); --overwrite would move its folder while it still writes there",
                r.dir.display(),
                r.id
            )));
        }
    }
    checked.write()
}

/// What to do with a run folder before running or submitting it again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rerun {
    /// Run it (its earlier attempt, if any, moved aside).
    Run,
    /// It finished earlier: kept as it is.
    Finished,
    /// Under way: Slurm has it pending or running (its job), or its ranks are alive on this host
    /// (no job: a `local` running it, or killed and leaving them).
    UnderWay { job_id: Option<String> },
    /// It ended failed, out of memory, cancelled or timed out, and was not asked to run again.
    Ended(State),
}

impl std::fmt::Display for Rerun {
    /// Why a run is left alone (empty for [`Rerun::Run`]).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rerun::Run => Ok(()),
            Rerun::Finished => f.write_str("finished earlier; kept as it is"),
            Rerun::UnderWay { job_id: Some(job) } => write!(f, "submitted to Slurm (job {job}); left to it"),
            Rerun::UnderWay { job_id: None } => f.write_str("its ranks are running on this host; left to them"),
            Rerun::Ended(st) => write!(f, "ended {st} earlier; --retry-failed runs it again"),
        }
    }
}

/// Decides from the state a run folder's records and logs give; with `retry_failed`, a run that
/// ended badly has its earlier attempt set aside and runs again.
pub fn rerun_decision(dir: &Path, prior: &RunState, retry_failed: bool) -> Result<Rerun, Error> {
    Ok(match prior.state {
        State::Unsubmitted if !has_results(dir) => Rerun::Run,
        State::Done => Rerun::Finished,
        // Ranks alive here, whatever Slurm says of the job (it may have ended and left them).
        State::Pending | State::Running if prior.source == FROM_PIDS => Rerun::UnderWay { job_id: None },
        State::Pending | State::Running => Rerun::UnderWay { job_id: prior.job_id.clone() },
        _ if retry_failed => {
            let kept = set_aside_attempt(dir)?;
            tracing::info!(run = %prior.id, "running again; the earlier attempt is in {}", kept.display());
            Rerun::Run
        }
        st => Rerun::Ended(st),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::status;
    use rusty_fork::rusty_fork_test;

    /// An attempt's logs, records and job output move into `.attempts/attempt-*/`, contents
    /// intact; the rendered files and anything else stay.
    #[test]
    fn an_attempt_is_set_aside_whole_and_nothing_else() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        std::fs::create_dir(dir.join(LOG_DIR)).unwrap();
        std::fs::write(dir.join(LOG_DIR).join("rank0.jsonl"), "{}\n").unwrap();
        let moved = [LOCAL_RECORD, LOCAL_OUTPUT, SLURM_RECORD, "run-123.out", "run-123.err"];
        let kept = ["run.json", "job.sbatch", "notes.txt", "out.txt"];
        for name in moved.iter().chain(&kept) {
            std::fs::write(dir.join(name), name).unwrap();
        }
        let attempt = set_aside_attempt(dir).unwrap();
        assert!(attempt.starts_with(dir.join(ATTEMPTS_DIR)) && attempt.is_dir(), "{}", attempt.display());
        assert_eq!(std::fs::read_to_string(attempt.join(LOG_DIR).join("rank0.jsonl")).unwrap(), "{}\n");
        for name in moved {
            assert_eq!(std::fs::read_to_string(attempt.join(name)).unwrap(), name);
            assert!(!dir.join(name).exists(), "{name} left behind");
        }
        for name in kept {
            assert_eq!(std::fs::read_to_string(dir.join(name)).unwrap(), name, "{name} moved");
        }
        assert!(!dir.join(LOG_DIR).exists() && !dir.join(".attempt-in-progress").exists());
    }

    /// An array task's own output, in the output folder under the task's id, goes with the attempt
    /// it explains; other tasks' outputs stay, and a job of its own takes nothing from above.
    #[test]
    fn an_array_tasks_own_output_goes_with_its_attempt() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let record = |array: Option<&str>, job_id: &str| SlurmRecord {
            job_id: job_id.into(),
            array_job_id: array.map(Into::into),
            array_task_id: array.map(|_| 1),
            dependency: None,
            submitted_at: 0,
            script: root.join("zerobench-array-0.sbatch"),
        };
        let others = ["zerobench-array-0-8_0.out", "zerobench-array-1-8_1.out", "zerobench-array-0-9_1.out"];
        for name in others.iter().chain(&["zerobench-array-0-8_1.out"]) {
            std::fs::write(root.join(name), name).unwrap();
        }
        let dir = root.join("r");
        std::fs::create_dir(&dir).unwrap();
        let write = |rec: &SlurmRecord| std::fs::write(dir.join(SLURM_RECORD), serde_json::to_string(rec).unwrap());
        write(&record(Some("8"), "8_1")).unwrap();
        let attempt = set_aside_attempt(&dir).unwrap();
        assert_eq!(
            std::fs::read_to_string(attempt.join("zerobench-array-0-8_1.out")).unwrap(),
            "zerobench-array-0-8_1.out"
        );
        assert!(!root.join("zerobench-array-0-8_1.out").exists());
        // A job of its own whose id reads like that of another task.
        write(&record(None, "9_1")).unwrap();
        let attempt = set_aside_attempt(&dir).unwrap();
        assert!(attempt.join(SLURM_RECORD).is_file());
        for name in others {
            assert_eq!(std::fs::read_to_string(root.join(name)).unwrap(), name, "{name} moved");
        }
    }

    fn state(dir: &Path, state: State) -> RunState {
        let job_id = Some("42".to_string());
        RunState { id: "r".into(), dir: dir.to_path_buf(), state, job_id, source: "none", detail: String::new() }
    }

    /// Never run: run. Finished or with Slurm: left alone. Ended badly: left alone, unless asked,
    /// and then run with the earlier attempt set aside. A folder that was never submitted but
    /// holds logs ran outside zerobench's records: it counts as ended.
    #[test]
    fn a_run_folder_runs_again_only_when_it_should() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let decide = |st: State, retry: bool| rerun_decision(dir, &state(dir, st), retry).unwrap();
        assert_eq!(decide(State::Unsubmitted, false), Rerun::Run);
        assert_eq!(decide(State::Done, true), Rerun::Finished);
        assert_eq!(decide(State::Pending, true), Rerun::UnderWay { job_id: Some("42".into()) });
        assert_eq!(decide(State::Running, true), Rerun::UnderWay { job_id: Some("42".into()) });
        for st in [State::Failed, State::Oom, State::Cancelled, State::Timeout, State::Unknown] {
            assert_eq!(decide(st, false), Rerun::Ended(st));
        }
        std::fs::write(dir.join(LOCAL_RECORD), "{}").unwrap();
        assert_eq!(decide(State::Unsubmitted, false), Rerun::Ended(State::Unsubmitted));
        assert_eq!(decide(State::Failed, true), Rerun::Run);
        assert!(!dir.join(LOCAL_RECORD).exists(), "the earlier attempt was set aside");
        assert_eq!(std::fs::read_dir(dir.join(ATTEMPTS_DIR)).unwrap().count(), 1);
    }

    /// A process standing in for rank 0 of `plan`'s first run, alive, whose `start` record (on this
    /// host, after the process started) is the only line of the run's log in `dir`.
    fn live_rank(plan: &Plan, dir: &Path) -> std::process::Child {
        use zerobench_schema::log::Record;
        let rank = std::process::Command::new("sleep").arg("60").spawn().unwrap();
        let run = &plan.runs[0];
        let synth = zerobench_ingest::synth::SynthRun::new(&run.id, run.config.clone(), 1, 5.0);
        let Record::Start(mut start) = synth.records(0).remove(0) else { panic!("no start") };
        (start.host, start.pid) = (crate::proctree::this_host().unwrap().to_string(), rank.id());
        start.ts = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
        std::fs::create_dir_all(dir.join(LOG_DIR)).unwrap();
        let line = serde_json::to_string(&Record::Start(start)).unwrap() + "\n";
        std::fs::write(dir.join(LOG_DIR).join("rank0.jsonl"), line).unwrap();
        rank
    }

    /// A run whose rank is alive on this host with no `end` (a `local` running it, or killed and
    /// leaving its ranks behind) is under way: `status` says running (it said `unsubmitted`), it
    /// is not started again even with `--retry-failed` (a second copy ran beside it), and
    /// `--overwrite` refuses to move its folder; once the rank is gone, both go ahead.
    #[test]
    fn a_run_whose_ranks_are_alive_here_is_left_to_them() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out");
        let spec = |steps: u32| format!("worker:\n  steps: {steps}\nsweep:\n  models: tiny\n");
        let (plan, dirs) = crate::testkit::render_sweep(&spec(5), &out);
        let mut rank = live_rank(&plan, &dirs[0]);

        let row = status(&dirs).unwrap().remove(0);
        assert_eq!((row.state, row.source), (State::Running, FROM_PIDS), "{row:?}");
        assert!(row.detail.contains(&format!("rank 0 pid {}", rank.id())), "{}", row.detail);
        assert_eq!(rerun_decision(&dirs[0], &row, true).unwrap(), Rerun::UnderWay { job_id: None });
        assert!(dirs[0].join(LOG_DIR).join("rank0.jsonl").exists(), "the live attempt was set aside");
        let other = Plan::build(crate::spec::Spec::parse(&spec(6), Path::new("s.yaml")).unwrap()).unwrap();
        let e = render_over(&other, &out, OnChange::MoveAside).unwrap_err().to_string();
        assert!(e.contains("is under way (its ranks are alive on this host: rank 0 pid"), "{e}");
        assert!(dirs[0].join(LOG_DIR).exists() && !out.join(".replaced").exists(), "moved");

        rank.kill().unwrap();
        rank.wait().unwrap();
        let row = status(&dirs).unwrap().remove(0);
        assert_ne!(row.state, State::Running, "{row:?}");
        let done = render_over(&other, &out, OnChange::MoveAside).unwrap();
        assert!(matches!(done[0].1, Rendered::Replaced { .. }), "{:?}", done[0].1);
    }

    // In a process of its own: it puts a stub `squeue` first on PATH.
    rusty_fork_test! {
        /// `--overwrite` of a folder whose job Slurm still has pending refuses, naming the job
        /// and `scancel`: moved aside, the job ran later and wrote into the new folder.
        #[test]
        fn overwrite_refuses_a_folder_whose_job_is_pending() {
            let tmp = tempfile::tempdir().unwrap();
            let bin = tmp.path().join("bin");
            std::fs::create_dir(&bin).unwrap();
            crate::testkit::stub(&bin, "squeue", "echo '301|PENDING'");
            crate::testkit::first_on_path(&bin);
            let out = tmp.path().join("out");
            let (_, dirs) = crate::testkit::render_sweep("worker:\n  steps: 5\nsweep:\n  models: tiny\n", &out);
            crate::testkit::submitted(&dirs[0], "301");
            let other =
                Plan::build(crate::spec::Spec::parse("worker:\n  steps: 6\nsweep:\n  models: tiny\n", Path::new("s.yaml")).unwrap())
                    .unwrap();
            let e = render_over(&other, &out, OnChange::MoveAside).unwrap_err().to_string();
            assert!(e.contains("is under way (job 301 is pending in Slurm: cancel it (scancel 301) or let it end)"), "{e}");
            assert!(dirs[0].join(SLURM_RECORD).exists() && !out.join(".replaced").exists());
            // Cancelled in Slurm, its ranks left alive here (out of the job's reach): the ranks are
            // what is under way, and no message sends the user to `scancel` a job that ended.
            crate::testkit::stub(&bin, "squeue", "true");
            crate::testkit::stub(&bin, "sacct", "echo '301|CANCELLED'");
            let plan = Plan::build(crate::spec::Spec::parse("worker:\n  steps: 5\nsweep:\n  models: tiny\n", Path::new("s.yaml")).unwrap()).unwrap();
            let mut rank = live_rank(&plan, &dirs[0]);
            let row = status(&dirs).unwrap().remove(0);
            assert_eq!((row.state, row.source), (State::Running, FROM_PIDS), "{row:?}");
            assert_eq!(rerun_decision(&dirs[0], &row, true).unwrap(), Rerun::UnderWay { job_id: None });
            let e = render_over(&other, &out, OnChange::MoveAside).unwrap_err().to_string();
            assert!(e.contains("(its ranks are alive on this host: rank 0 pid") && !e.contains("scancel"), "{e}");
            rank.kill().unwrap();
            rank.wait().unwrap();
        }
    }

    #[test]
    fn why_a_run_is_left_alone_is_said() {
        assert_eq!(Rerun::Run.to_string(), "");
        assert_eq!(Rerun::Finished.to_string(), "finished earlier; kept as it is");
        assert_eq!(Rerun::UnderWay { job_id: Some("7".into()) }.to_string(), "submitted to Slurm (job 7); left to it");
        assert_eq!(Rerun::UnderWay { job_id: None }.to_string(), "its ranks are running on this host; left to them");
        assert_eq!(
            Rerun::Ended(State::Oom).to_string(),
            format!("ended {} earlier; --retry-failed runs it again", State::Oom)
        );
    }
}
