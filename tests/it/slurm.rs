//! Against the real local Slurm (`slurm/local-cluster.sh`, 2 fake nodes with 4 fake GPUs each,
//! partitions `debug` and `gpu`, no accounting database): every example is accepted by
//! `sbatch --test-only`, and submission, job arrays, chaining and status work on real jobs whose
//! ranks are started by `srun --mpi=pmix`. The ranks here are a stand-in that records what Slurm
//! gave it; `e2e_slurm` runs the real worker.

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use crate::support::{job_output, repo, run, slurm_conf, stderr, stdout, write_script, zerobench_cmd};

/// Runs `zerobench ARGS` against the local cluster.
pub fn zb(conf: &Path, args: &[&str]) -> Output {
    run(zerobench_cmd().args(args).env("SLURM_CONF", conf))
}

/// Polls `zerobench status --json` until every run is final; panics after `limit`.
pub fn wait_final(conf: &Path, dir: &Path, limit: Duration) -> Vec<serde_json::Value> {
    let start = Instant::now();
    loop {
        let o = zb(conf, &["status", "--json", dir.to_str().unwrap()]);
        let rows: Vec<serde_json::Value> =
            serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}{}", stdout(&o), stderr(&o)));
        if rows
            .iter()
            .all(|r| ["done", "failed", "cancelled", "timeout"].contains(&r["state"].as_str().unwrap_or_default()))
        {
            return rows;
        }
        assert!(start.elapsed() < limit, "runs not final after {limit:?}: {rows:#?}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn write_stub_worker(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("stand-in worker");
    write_script(
        &p,
        r#"# Records where Slurm put this rank; fails for stage 1; sleeps for stage 2 (to be cancelled).
for a in "$@"; do
  [ "${prev:-}" = --stage ] && stage=$a; [ "${prev:-}" = --log-dir ] && logs=$a; prev=$a
done
echo "rank=$PMIX_RANK procid=$SLURM_PROCID nodeid=$SLURM_NODEID localid=$SLURM_LOCALID node=$SLURMD_NODENAME ntasks=$SLURM_NTASKS cpus=$SLURM_CPUS_PER_TASK job=$SLURM_JOB_ID" > "$logs/rank$PMIX_RANK.env"
[ "$stage" = 1 ] && exit 3
[ "$stage" = 2 ] && sleep 120
exit 0"#,
    );
    p
}

/// Writes the stand-in worker and a spec `s.yaml` running it (`cluster` and `sweep` are the
/// YAML bodies of those sections, indented by two); returns the spec's path.
fn stub_spec(dir: &Path, cluster: &str, sweep: &str) -> std::path::PathBuf {
    let worker = write_stub_worker(dir);
    let spec = dir.join("s.yaml");
    std::fs::write(
        &spec,
        format!("cluster:\n{cluster}launch:\n  worker: {:?}\nsweep:\n{sweep}", worker.to_str().unwrap()),
    )
    .unwrap();
    spec
}

#[test]
fn every_example_passes_sbatch_test_only() {
    let Some(conf) = slurm_conf() else { return };
    let mut names: Vec<_> = std::fs::read_dir(repo("slurm/examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    names.sort();
    assert!(names.len() >= 5);
    for spec in names {
        let (out, scratch) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let spec = on_this_cluster(&spec, scratch.path());
        let o = zb(&conf, &["submit", spec.to_str().unwrap(), "--out", out.path().to_str().unwrap(), "--test-only"]);
        assert!(o.status.success(), "{}: {}{}", spec.display(), stdout(&o), stderr(&o));
        assert!(stdout(&o).contains("accepted by sbatch --test-only"), "{}", stdout(&o));
        let o = zb(&conf, &["submit", out.path().to_str().unwrap(), "--array", "--test-only"]);
        assert!(o.status.success(), "{} as arrays: {}{}", spec.display(), stdout(&o), stderr(&o));
    }
}

/// `spec` as the local cluster can take it. A spec over a hostfile asks Slurm for exactly the
/// hostfile's hosts (`#SBATCH --nodelist`), and the examples name hosts (`worker-0`, `worker-1`)
/// this cluster does not have, so sbatch would refuse them whatever else the job says: such a
/// spec is copied into `dir` with its hostfile, the hosts renamed to this cluster's nodes. Any
/// other spec is used as it is.
fn on_this_cluster(spec: &Path, dir: &Path) -> std::path::PathBuf {
    let text = std::fs::read_to_string(spec).unwrap();
    let Some(line) = text.lines().find(|l| l.trim_start().starts_with("hostfile:")) else { return spec.to_path_buf() };
    let rel = line.split_once(':').unwrap().1.split('#').next().unwrap().trim();
    let hostfile = spec.parent().unwrap().join(rel);
    let rename = |t: &str| t.replace("worker-0", "node01").replace("worker-1", "node02");
    let local_hosts = dir.join("hosts.txt");
    std::fs::write(&local_hosts, rename(&std::fs::read_to_string(&hostfile).unwrap())).unwrap();
    let local_spec = dir.join(spec.file_name().unwrap());
    let text = rename(&text).replace(line, &format!("  hostfile: {:?}", local_hosts.to_str().unwrap()));
    std::fs::write(&local_spec, text).unwrap();
    local_spec
}

/// `submit SPEC --out DIR` submits that spec's runs only, not run folders an earlier render
/// left in DIR.
#[test]
fn submitting_a_spec_leaves_older_run_folders_alone() {
    let Some(conf) = slurm_conf() else { return };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("runs");
    let o = zb(&conf, &["render", repo("slurm/examples/demo.yaml").to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let spec = dir.path().join("one.yaml");
    std::fs::write(&spec, "sweep: {models: tiny, stages: 1, micro_batches: 2}\n").unwrap();
    let o = zb(&conf, &["submit", spec.to_str().unwrap(), "--out", out.to_str().unwrap(), "--test-only"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("1 runs accepted by sbatch --test-only"), "{}", stdout(&o));
}

#[test]
fn sbatch_refusals_are_errors() {
    let Some(conf) = slurm_conf() else { return };
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("s.yaml");
    std::fs::write(&spec, "cluster: {partition: nosuchpartition}\nsweep: {models: tiny, stages: 0}\n").unwrap();
    let o =
        zb(&conf, &["submit", spec.to_str().unwrap(), "--out", dir.path().join("r").to_str().unwrap(), "--test-only"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("invalid partition"), "{}", stderr(&o));
}

/// Two runs on one and on two fake nodes: srun --mpi=pmix starts 2 ranks per node with the
/// CPUs per task of the spec, and the job ids and final states are found.
#[test]
fn submit_runs_ranks_on_one_and_two_nodes() {
    let Some(conf) = slurm_conf() else { return };
    let dir = tempfile::tempdir().unwrap();
    let spec = stub_spec(
        dir.path(),
        "  time: '2'\n  cpus_per_task: 2\n",
        "  models: tiny\n  stages: 0\n  nodes: [1, 2]\n  ranks_per_node: 2\n",
    );
    let out = dir.path().join("runs");
    let o = zb(&conf, &["submit", spec.to_str().unwrap(), "--out", out.to_str().unwrap(), "--chain"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let rows = wait_final(&conf, &out, Duration::from_secs(90));
    assert!(rows.iter().all(|r| r["state"] == "done"), "{rows:#?}");
    // "rank=.. procid=.. nodeid=.. localid=.. node=NAME ..." split into the placement and the node name.
    let env = |run: &str, rank: u32| -> (String, String) {
        let text = std::fs::read_to_string(out.join(run).join(format!("logs/rank{rank}.env"))).unwrap();
        let node = text.split_whitespace().find_map(|kv| kv.strip_prefix("node=")).unwrap_or_default().to_string();
        (text.replace(&format!(" node={node}"), ""), node)
    };
    let one: Vec<_> = (0..2).map(|r| env("tiny_z0_offnone_mb1_1x2", r)).collect();
    assert!(one[1].0.starts_with("rank=1 procid=1 nodeid=0 localid=1 ntasks=2 cpus=2 job="), "{one:?}");
    assert_eq!(one[0].1, one[1].1, "one node: {one:?}");
    let two: Vec<_> = (0..4).map(|r| env("tiny_z0_offnone_mb1_2x2", r)).collect();
    assert!(two[2].0.starts_with("rank=2 procid=2 nodeid=1 localid=0 ntasks=4 cpus=2 job="), "{two:?}");
    assert!(two[3].0.starts_with("rank=3 procid=3 nodeid=1 localid=1 ntasks=4 cpus=2 job="), "{two:?}");
    assert!(two[0].1 == two[1].1 && two[2].1 == two[3].1 && two[1].1 != two[2].1, "two nodes: {two:?}");
    let rec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("tiny_z0_offnone_mb1_2x2/slurm.json")).unwrap())
            .unwrap();
    assert!(rec["job_id"].as_str().unwrap().bytes().all(|b| b.is_ascii_digit()), "{rec}");
    let first: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("tiny_z0_offnone_mb1_1x2/slurm.json")).unwrap())
            .unwrap();
    assert_eq!(rec["dependency"], format!("afterany:{}", first["job_id"].as_str().unwrap()), "--chain");
}

/// A job array of three runs: one succeeds, one fails, one is cancelled while running; status
/// tells them apart without an accounting database.
#[test]
fn arrays_failures_and_cancellation() {
    let Some(conf) = slurm_conf() else { return };
    let dir = tempfile::tempdir().unwrap();
    let spec = stub_spec(dir.path(), "  time: '3'\n", "  models: tiny\n  stages: [0, 1, 2]\n");
    let out = dir.path().join("runs");
    let o = zb(&conf, &["render", spec.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = zb(&conf, &["submit", out.to_str().unwrap(), "--array"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let job = |run: &str| -> String {
        let rec: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join(run).join("slurm.json")).unwrap()).unwrap();
        rec["job_id"].as_str().unwrap().to_string()
    };
    let sleeper = job("tiny_z2_offnone_mb1_1x1");
    assert!(sleeper.ends_with("_2"), "{sleeper}");
    // Cancel the sleeping run once it has started.
    let start = Instant::now();
    while !out.join("tiny_z2_offnone_mb1_1x1/logs/rank0.env").exists() {
        assert!(start.elapsed() < Duration::from_secs(60), "the array task never started");
        std::thread::sleep(Duration::from_millis(200));
    }
    let c = std::process::Command::new("scancel").arg(&sleeper).env("SLURM_CONF", &conf).output().unwrap();
    assert!(c.status.success(), "{}", String::from_utf8_lossy(&c.stderr));
    let rows = wait_final(&conf, &out, Duration::from_secs(90));
    let states: Vec<&str> = rows.iter().map(|r| r["state"].as_str().unwrap()).collect();
    assert_eq!(states, ["done", "failed", "cancelled"], "{rows:#?}");
    assert!(out.join("tiny_z0_offnone_mb1_1x1").read_dir().unwrap().any(|e| e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .starts_with("zerobench-array-0-")));
    let o = zb(&conf, &["status", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "status exits 1 when a run failed");
    assert!(stdout(&o).contains("3 runs: 1 done, 1 failed, 1 cancelled"), "{}", stdout(&o));

    // Submitting the folder again submits nothing: the runs ended, and their records stay.
    let records: Vec<String> = ["tiny_z0_offnone_mb1_1x1", "tiny_z1_offnone_mb1_1x1", "tiny_z2_offnone_mb1_1x1"]
        .iter()
        .map(|r| std::fs::read_to_string(out.join(r).join("slurm.json")).unwrap())
        .collect();
    let again = zb(&conf, &["submit", out.to_str().unwrap()]);
    assert!(again.status.success(), "{}", stderr(&again));
    let text = stdout(&again);
    assert!(text.contains("0 runs submitted, 3 left as they were"), "{text}");
    assert!(text.contains("not submitted: ended failed earlier; --retry-failed"), "{text}");
    assert_eq!(std::fs::read_to_string(out.join("tiny_z0_offnone_mb1_1x1/slurm.json")).unwrap(), records[0]);
    // --retry-failed submits the failed and the cancelled run, their first attempts kept.
    let retry = zb(&conf, &["submit", out.to_str().unwrap(), "--retry-failed"]);
    assert!(retry.status.success(), "{}", stderr(&retry));
    assert!(stdout(&retry).contains("2 runs submitted, 1 left as they were"), "{}", stdout(&retry));
    for (run, old) in [("tiny_z1_offnone_mb1_1x1", &records[1]), ("tiny_z2_offnone_mb1_1x1", &records[2])] {
        let attempts: Vec<_> = out.join(run).join(".attempts").read_dir().unwrap().map(|e| e.unwrap().path()).collect();
        assert_eq!(attempts.len(), 1, "{run}");
        assert_eq!(&std::fs::read_to_string(attempts[0].join("slurm.json")).unwrap(), old);
        assert!(attempts[0].join("logs/rank0.env").is_file(), "{run}");
        // The task's own output (from the output folder, where Slurm wrote it) goes with it.
        let old_job: serde_json::Value = serde_json::from_str(old).unwrap();
        let task_output = format!("zerobench-array-0-{}.out", old_job["job_id"].as_str().unwrap());
        assert!(attempts[0].join(&task_output).is_file() && !out.join(&task_output).exists(), "{run}: {task_output}");
        let new = std::fs::read_to_string(out.join(run).join("slurm.json")).unwrap();
        assert_ne!(&new, old, "{run} was not submitted again");
        let id: serde_json::Value = serde_json::from_str(&new).unwrap();
        let _ =
            std::process::Command::new("scancel").arg(id["job_id"].as_str().unwrap()).env("SLURM_CONF", &conf).output();
    }
}

/// `cluster.allocation`: the runs are job steps of an allocation held elsewhere (here a job that
/// sleeps), driven one after another by `zerobench local`; `submit` refuses such runs.
#[test]
fn runs_as_steps_of_an_existing_allocation() {
    let Some(conf) = slurm_conf() else { return };
    let dir = tempfile::tempdir().unwrap();
    let hold = std::process::Command::new("sbatch")
        .args(["--parsable", "-N2", "--ntasks-per-node=2", "-t", "3", "-o", "/dev/null", "--wrap", "sleep 170"])
        .env("SLURM_CONF", &conf)
        .output()
        .unwrap();
    assert!(hold.status.success(), "{}", String::from_utf8_lossy(&hold.stderr));
    let job = String::from_utf8_lossy(&hold.stdout).trim().to_string();
    let cancel = || std::process::Command::new("scancel").arg(&job).env("SLURM_CONF", &conf).output();
    let start = Instant::now();
    loop {
        let q = std::process::Command::new("squeue")
            .args(["-h", "-o", "%T", "-j", &job])
            .env("SLURM_CONF", &conf)
            .output()
            .unwrap();
        if String::from_utf8_lossy(&q.stdout).trim() == "RUNNING" {
            break;
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = cancel();
            panic!("the holding job {job} never started");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let cluster = format!("  allocation: {job}\n  time: '1'\n");
    let spec = stub_spec(dir.path(), &cluster, "  models: tiny\n  stages: 0\n  nodes: [1, 2]\n  ranks_per_node: 2\n");
    let out = dir.path().join("runs");
    let o = zb(&conf, &["local", spec.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    let refused = zb(&conf, &["submit", out.to_str().unwrap()]);
    let _ = cancel();
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("2 runs: 2 run now, 0 skipped, 0 not done"), "{}", stdout(&o));
    let env = std::fs::read_to_string(out.join("tiny_z0_offnone_mb1_2x2/logs/rank3.env")).unwrap();
    assert!(env.starts_with("rank=3 procid=3 nodeid=1 localid=1") && env.ends_with(&format!(" job={job}\n")), "{env}");
    assert_eq!(refused.status.code(), Some(2));
    assert!(stderr(&refused).contains("is a step of an existing allocation"), "{}", stderr(&refused));
}

/// A run that outlives its time limit ends as `timeout`, from Slurm while it remembers the job,
/// and from the job's output file after it forgets (no accounting database here). Slurm checks
/// limits every 30 s, so this takes 60 to 100 s; it runs beside the other tests.
#[test]
fn a_run_past_its_time_limit_is_a_timeout() {
    let Some(conf) = slurm_conf() else { return };
    let dir = tempfile::tempdir().unwrap();
    let spec = stub_spec(dir.path(), "  time: '1'\n", "  models: tiny\n  stages: 2\n");
    let out = dir.path().join("runs");
    let o = zb(&conf, &["submit", spec.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let rows = wait_final(&conf, &out, Duration::from_secs(150));
    assert_eq!(rows[0]["state"], "timeout", "{rows:#?}");
    // What status falls back to once the controller has forgotten the job.
    let output = job_output(&out.join("tiny_z2_offnone_mb1_1x1"));
    assert!(output.contains("DUE TO TIME LIMIT"), "{output}");
}

/// A signal to `zerobench submit` half-way through a sweep, to it alone (SIGTERM, as a workflow
/// manager sends it) or to its process group (SIGINT, as Ctrl-C at the terminal), stops it
/// between two submissions: every job sbatch created has its `slurm.json`, none was left
/// unrecorded by killing an sbatch in flight, and submitting again sends only the rest. sbatch
/// is slowed here (0.4 s a call) so that the signal comes while one is in flight.
#[test]
fn an_interrupted_submit_records_every_job_and_sends_none_twice() {
    use std::os::unix::process::CommandExt as _;
    let Some(conf) = slurm_conf() else { return };
    let dir = tempfile::tempdir().unwrap();
    let spec = stub_spec(
        dir.path(),
        "  time: '1'\n",
        "  models: tiny\n  stages: [0]\n  micro_batches: [1, 2, 3, 4, 5, 6, 7, 8]\n",
    );
    let real = String::from_utf8(
        std::process::Command::new("bash").args(["-c", "command -v sbatch"]).output().unwrap().stdout,
    )
    .unwrap()
    .trim()
    .to_string();
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let calls = dir.path().join("calls.log");
    write_script(
        &bin.join("sbatch"),
        &format!("sleep 0.4\nid=$({real:?} \"$@\") || exit $?\necho \"$id ${{@: -1}}\" >> {calls:?}\necho \"$id\""),
    );
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    for (round, (signal, group)) in [(libc::SIGTERM, false), (libc::SIGINT, true)].into_iter().enumerate() {
        let out = dir.path().join(format!("runs{round}"));
        let o = zb(&conf, &["render", spec.to_str().unwrap(), "--out", out.to_str().unwrap()]);
        assert!(o.status.success(), "{}", stderr(&o));
        let child = zerobench_cmd()
            .args(["submit", out.to_str().unwrap()])
            .env("SLURM_CONF", &conf)
            .env("PATH", &path)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        let target = if group { -(child.id() as i32) } else { child.id() as i32 };
        // SAFETY: kill(2) on the process (group) this test started; no memory is involved.
        assert_eq!(unsafe { libc::kill(target, signal) }, 0);
        let o = child.wait_with_output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{}{}", stdout(&o), stderr(&o));
        assert!(stderr(&o).contains("interrupted by SIG") && stderr(&o).contains("submit again"), "{}", stderr(&o));
        let scripts = |o: &Path| -> Vec<String> {
            let log = std::fs::read_to_string(&calls).unwrap_or_default();
            let mut s: Vec<String> =
                log.lines().filter_map(|l| l.split_once(' ')).map(|(_, script)| script.to_string()).collect();
            s.retain(|script| script.starts_with(o.to_str().unwrap()));
            s.sort();
            s
        };
        let recorded = std::fs::read_dir(&out)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().join("slurm.json").is_file())
            .count();
        let sent = scripts(&out);
        assert!((1..8).contains(&sent.len()), "{sent:?}");
        assert_eq!(recorded, sent.len(), "jobs sbatch created without a slurm.json: {sent:?}");
        let o =
            run(zerobench_cmd().args(["submit", out.to_str().unwrap()]).env("SLURM_CONF", &conf).env("PATH", &path));
        assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
        let mut all = scripts(&out);
        let n = all.len();
        all.dedup();
        assert_eq!((n, all.len()), (8, 8), "a run submitted twice: {all:?}");
    }
}

/// `submit --chain` continuing a sweep whose first run an earlier submit sent (an interrupted
/// one, or one run submitted first): the rest wait for that job, so there is one chain, not a
/// second beside it. An OR dependency (`?`) cannot be chained (Slurm takes all of `,` or any of
/// `?`, never both) and is refused before anything is submitted.
#[test]
fn a_chain_continued_waits_for_the_jobs_already_sent() {
    let Some(conf) = slurm_conf() else { return };
    let dir = tempfile::tempdir().unwrap();
    // Stage 2 sleeps in the stand-in worker: the first job stays running while the rest queue.
    let spec = stub_spec(dir.path(), "  time: '2'\n", "  models: tiny\n  stages: [2]\n  micro_batches: [1, 2, 3]\n");
    let out = dir.path().join("runs");
    let o = zb(&conf, &["render", spec.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let record = |run: &str| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(out.join(run).join("slurm.json")).unwrap()).unwrap()
    };
    let o = zb(&conf, &["submit", out.join("tiny_z2_offnone_mb1_1x1").to_str().unwrap(), "--chain"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let first = record("tiny_z2_offnone_mb1_1x1")["job_id"].as_str().unwrap().to_string();
    let o = zb(&conf, &["submit", out.to_str().unwrap(), "--chain", "--dependency", "afterany:1?afterany:2"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("is an OR ('?'), which --chain cannot extend"), "{}", stderr(&o));
    let o = zb(&conf, &["submit", out.to_str().unwrap(), "--chain"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let second = record("tiny_z2_offnone_mb2_1x1");
    assert_eq!(second["dependency"].as_str(), Some(format!("afterany:{first}").as_str()), "{second}");
    let second = second["job_id"].as_str().unwrap().to_string();
    let third = record("tiny_z2_offnone_mb3_1x1");
    assert_eq!(third["dependency"].as_str(), Some(format!("afterany:{second}").as_str()), "{third}");
    let jobs = [first, second, third["job_id"].as_str().unwrap().to_string()];
    let c = std::process::Command::new("scancel").args(&jobs).env("SLURM_CONF", &conf).output().unwrap();
    assert!(c.status.success(), "{}", String::from_utf8_lossy(&c.stderr));
}
