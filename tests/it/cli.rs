//! The `zerobench` commands as a user runs them: what they print, the errors they give for bad
//! input (file, line, column and key), and their exit codes (0 ok, 1 incomplete, 2 error).

use std::path::{Path, PathBuf};

use crate::support::{repo, run, stderr, stdout, worker, write_script, zerobench, zerobench_cmd};

fn ok(args: &[&str]) -> String {
    let o = zerobench(args);
    assert_eq!(o.status.code(), Some(0), "{args:?}\nstdout: {}\nstderr: {}", stdout(&o), stderr(&o));
    stdout(&o)
}

fn fails(args: &[&str]) -> String {
    let o = zerobench(args);
    assert_eq!(o.status.code(), Some(2), "{args:?} should fail\nstdout: {}\nstderr: {}", stdout(&o), stderr(&o));
    stderr(&o)
}

#[test]
fn hostlist_expand_and_compress() {
    assert_eq!(
        ok(&["hostlist", "expand", "node[01-03,07],gpu-a[1-2]"]),
        "node01\nnode02\nnode03\nnode07\ngpu-a1\ngpu-a2\n"
    );
    assert_eq!(ok(&["hostlist", "compress", "n01,n02,n03", "n05", "gpu-a1,gpu-a2"]), "n[01-03,05],gpu-a[1-2]\n");
    let e = fails(&["hostlist", "expand", "n[1-3"]);
    assert!(e.contains("invalid hostlist 'n[1-3' at offset 1: '[' is never closed"), "{e}");
    let e = fails(&["hostlist", "expand", "n[1-2]-ib"]);
    assert!(e.contains("a bracket must end the host name"), "{e}");
}

#[test]
fn hostfile_check_prints_the_rank_table() {
    let hf = repo("hostfiles/deepspeed.txt");
    let hf = hf.to_str().unwrap();
    insta::assert_snapshot!("hostfile-include", ok(&["hostfile", "check", hf, "--include", "worker-0:0,2@worker-1"]));
    let t = ok(&["hostfile", "check", hf, "--exclude", "worker-1:0,1"]);
    assert!(t.ends_with("6 ranks on 2 hosts (deepspeed format)\n"), "{t}");
    let e = fails(&["hostfile", "check", hf, "--include", "worker-0:7"]);
    assert!(e.contains("host 'worker-0' has slots 0-3; there is no slot 7"), "{e}");
    let e = fails(&["hostfile", "check", hf, "--include", "worker-0", "--exclude", "worker-1"]);
    assert!(e.contains("cannot be used with"), "{e}");
    for (f, fmt, ranks) in [("openmpi.txt", "openmpi", 8), ("mpich.txt", "mpich", 9)] {
        let t = ok(&["hostfile", "check", repo(&format!("hostfiles/{f}")).to_str().unwrap(), "--format", fmt]);
        assert!(t.contains(&format!("{ranks} ranks on")), "{t}");
    }
}

/// Every bad hostfile under hostfiles/bad/ is refused, naming the file and line.
#[test]
fn bad_hostfiles_are_refused_with_their_line() {
    let mut report = String::new();
    let mut names: Vec<_> = std::fs::read_dir(repo("hostfiles/bad")).unwrap().map(|e| e.unwrap().path()).collect();
    names.sort();
    for p in names {
        let e = fails(&["hostfile", "check", p.to_str().unwrap()]);
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        report.push_str(&e.replace(&repo("hostfiles/bad/").to_string_lossy().into_owned(), ""));
        assert!(e.contains(&format!("{name}:")), "{e}");
    }
    insta::assert_snapshot!("bad-hostfiles", report);
}

#[test]
fn plan_table() {
    insta::assert_snapshot!(
        "plan-gpu-cluster",
        ok(&["plan", repo("slurm/examples/gpu-cluster.yaml").to_str().unwrap()])
    );
    let t5 = ok(&["plan", repo("slurm/examples/t5-grid.yaml").to_str().unwrap()]);
    assert!(t5.contains("168 runs, method srun"), "{t5}");
    assert!(t5.contains("t5-11b_z0_offnone_mb1_1x4") && t5.contains("NO"), "{t5}");
    let json: serde_json::Value =
        serde_json::from_str(&ok(&["plan", "--json", repo("slurm/examples/demo.yaml").to_str().unwrap()])).unwrap();
    assert_eq!(json.as_array().map(Vec::len), Some(4));

    // With bus bandwidths: the time column is sent/step over the bandwidth of the run's span.
    let gpu = repo("slurm/examples/gpu-cluster.yaml");
    let runs: serde_json::Value = serde_json::from_str(&ok(&["plan", "--json", gpu.to_str().unwrap()])).unwrap();
    let timed = ok(&["plan", gpu.to_str().unwrap(), "--bus-gbps", "300", "--inter-node-bus-gbps", "40"]);
    assert!(timed.contains("comm ms:"), "{timed}");
    for (id, gbps) in [("gpt2-xl_z0_offnone_mb4_1x4", 300.0), ("gpt2-xl_z0_offnone_mb4_2x4", 40.0)] {
        let run = runs.as_array().unwrap().iter().find(|r| r["id"] == id).expect("the run");
        let want = run["comm"]["wire_bytes"].as_u64().unwrap() as f64 / (gbps * 1e9) * 1e3;
        let line = timed.lines().find(|l| l.starts_with(id)).expect("the run's row");
        assert!(line.split_whitespace().any(|cell| cell == format!("{want:.3}")), "{id}: {want:.3} ms in {line}");
    }
    for bad in [&["--bus-gbps", "0"][..], &["--bus-gbps", "fast"], &["--inter-node-bus-gbps", "40"]] {
        let out = zerobench(&[&["plan", gpu.to_str().unwrap()][..], bad].concat());
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", stderr(&out));
    }
}

/// An offloaded GPU run's notes carry the plan's ratio and say which steps it balances: exact
/// ones by default, the delayed update's with `worker.delayed_update_after`, which gets more on
/// the host (docs/launcher.md).
#[test]
fn plan_notes_the_ratio_for_exact_and_delayed_steps() {
    let dir = tempfile::tempdir().unwrap();
    let spec = "cluster: {gpus_per_node: 1, gpu_memory: 80GB}\nsweep:\n  models: gpt2-xl\n  stages: 2\n  offload: optimizer\n  micro_batches: 4\n";
    let mut notes = Vec::new();
    for (name, worker) in [("exact.yaml", ""), ("delayed.yaml", "worker: {delayed_update_after: 3}\n")] {
        let path = dir.path().join(name);
        std::fs::write(&path, format!("{worker}{spec}")).unwrap();
        let table = ok(&["plan", path.to_str().unwrap()]);
        let line =
            table.lines().find(|l| l.starts_with("gpt2-xl_z2_offopt_mb4_1x1")).expect("the run's row").to_string();
        notes.push(line);
    }
    assert!(notes[0].contains("offload_ratio 0.18 balances host and GPU in exact steps (estimate)"), "{}", notes[0]);
    assert!(notes[1].contains("offload_ratio 0.24 balances host and GPU in delayed-update steps"), "{}", notes[1]);
}

/// Bad specs: every error names the file, line, column and key, and nothing panics.
#[test]
fn bad_specs_name_file_line_and_key() {
    let cases: &[(&str, &str)] = &[
        ("unknown key", "cluster:\n  partition: debug\n  nodez: 2\nsweep:\n  models: tiny\n"),
        ("unknown top-level key", "clusters: {}\nsweep:\n  models: tiny\n"),
        ("bad stage", "sweep:\n  models: tiny\n  stages: [0, 5]\n"),
        ("bad model", "sweep:\n  models: [tiny, gpt5]\n"),
        ("hostile partition", "cluster:\n  partition: 'debug; touch x'\nsweep:\n  models: tiny\n"),
        ("bad time", "cluster:\n  time: 2h\nsweep:\n  models: tiny\n"),
        ("zero nodes", "sweep:\n  models: tiny\n  nodes: [1, 0]\n"),
        ("too many ranks", "cluster:\n  gpus_per_node: 4\nsweep:\n  models: gpt2\n  gpus_per_node: 8\n"),
        ("offload on stage 0", "sweep:\n  models: tiny\n  stages: 0\n  offload: optimizer\n"),
        ("warmup", "worker:\n  steps: 3\n  warmup: 3\nsweep:\n  models: tiny\n"),
        ("pdsh without hostfile", "launch:\n  method: pdsh\nsweep:\n  models: tiny\n"),
        ("bad include", "cluster:\n  hostfile: ../../../hostfiles/deepspeed.txt\n  include: worker-7\nlaunch:\n  method: pdsh\nsweep:\n  models: tiny\n"),
        ("bad hostfile", "cluster:\n  hostfile: ../../../hostfiles/bad/slots-zero.txt\nlaunch:\n  method: pdsh\nsweep:\n  models: tiny\n"),
        ("not yaml", "sweep: [models: {\n"),
        ("empty file", ""),
        ("wrong type", "sweep:\n  models: tiny\n  micro_batches: many\n"),
    ];
    // Specs are written next to the examples so that relative hostfile paths resolve the same way.
    let dir = tempfile::Builder::new().prefix(".bad-spec-").tempdir_in(repo("slurm/examples")).unwrap();
    let mut report = String::new();
    for (name, text) in cases {
        let p = dir.path().join("spec.yaml");
        std::fs::write(&p, text).unwrap();
        let e = fails(&["plan", p.to_str().unwrap()]);
        let e = e.replace(&dir.path().to_string_lossy().into_owned(), "[DIR]");
        assert!(e.starts_with("zerobench: error: [DIR]/spec.yaml:"), "{name}: {e}");
        report.push_str(&format!("{name}: {e}"));
    }
    insta::assert_snapshot!("bad-specs", report);
}

/// `zerobench local` with a stand-in worker: runs go one after the other under mpirun, a failed
/// run is reported and the sweep goes on, the exit code is 1, and `status` agrees.
#[test]
fn local_runs_continue_after_a_failure() {
    let dir = tempfile::tempdir().unwrap();
    let worker = dir.path().join("fake worker");
    // Fails for stage 1; otherwise writes its argv where the logs go.
    write_script(
        &worker,
        r#"for a in "$@"; do [ "$prev" = --stage ] && stage=$a; [ "$prev" = --log-dir ] && logs=$a; prev=$a; done
[ "$stage" = 1 ] && { echo 'stage 1 refuses' >&2; exit 3; }
printf '%s\n' "$@" > "$logs/argv.$OMPI_COMM_WORLD_RANK""#,
    );
    let spec = dir.path().join("local.yaml");
    std::fs::write(
        &spec,
        format!(
            "cluster:\n  time: '1'\nlaunch:\n  method: srun\n  worker: {:?}\nworker: {{device: cpu, steps: 2, warmup: 0}}\nsweep:\n  models: tiny\n  stages: [0, 1, 2]\n  ranks_per_node: 2\n",
            worker.to_str().unwrap()
        ),
    )
    .unwrap();
    let out = dir.path().join("runs");
    let o = zerobench(&["local", spec.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    let table = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{table}\n{}", stderr(&o));
    assert!(stderr(&o).contains("launch.method is srun"), "{}", stderr(&o));
    // Without a terminal, one progress line per finished run, with the time left.
    let err = stderr(&o);
    let progress: Vec<&str> = err.lines().filter(|l| l.starts_with('[')).collect();
    assert_eq!(progress.len(), 3, "{err}");
    assert!(progress[1].starts_with("[2/3] tiny_z1_offnone_mb1_1x2: failed (0:00:"), "{progress:?}");
    assert!(
        progress[2].starts_with("[3/3] tiny_z2_offnone_mb1_1x2: done (")
            && progress[2].ends_with(", about 0:00:00 left)")
    );
    let lines: Vec<&str> = table.lines().collect();
    // Header, rule, then one row per run.
    assert!(lines[2].starts_with("tiny_z0_offnone_mb1_1x2  done"), "{table}");
    assert!(lines[3].starts_with("tiny_z1_offnone_mb1_1x2  failed") && lines[3].contains("exit 3"), "{table}");
    assert!(lines[4].starts_with("tiny_z2_offnone_mb1_1x2  done"), "{table}");
    assert!(table.contains("3 runs: 3 run now, 0 skipped, 1 not done"), "{table}");
    let argv = std::fs::read_to_string(out.join("tiny_z2_offnone_mb1_1x2/logs/argv.1")).unwrap();
    assert!(
        argv.starts_with("--model\ntiny\n--stage\n2\n") && argv.ends_with("--run-id\ntiny_z2_offnone_mb1_1x2\n"),
        "{argv}"
    );
    let st = zerobench(&["status", out.to_str().unwrap()]);
    assert_eq!(st.status.code(), Some(1));
    let st = stdout(&st);
    assert!(st.contains("tiny_z1_offnone_mb1_1x2  failed  -    local"), "{st}");
    assert!(st.contains("3 runs: 2 done, 1 failed"), "{st}");
}

/// A local sweep of two 2-rank runs whose stand-in worker writes each rank's pid to
/// `logs/pid.<rank>` and sleeps; rank 1 ignores SIGTERM. Returns the spec's path.
fn stubborn_sweep(dir: &Path) -> PathBuf {
    stub_sweep(
        dir,
        r#"for a in "$@"; do [ "$prev" = --log-dir ] && logs=$a; prev=$a; done
echo $$ > "$logs/pid.$OMPI_COMM_WORLD_RANK.tmp" && mv "$logs/pid.$OMPI_COMM_WORLD_RANK.tmp" "$logs/pid.$OMPI_COMM_WORLD_RANK"
[ "$OMPI_COMM_WORLD_RANK" = 1 ] && trap '' TERM
exec sleep 120"#,
        "  models: tiny\n  stages: [0, 1]\n  ranks_per_node: 2\n",
    )
}

/// A spec of the local method whose worker is the shell script `script` (in `dir`), and whose
/// `sweep:` is `sweep` (its indented lines).
fn stub_sweep(dir: &Path, script: &str, sweep: &str) -> PathBuf {
    let worker = dir.join("worker");
    write_script(&worker, script);
    let spec = dir.join("local.yaml");
    std::fs::write(
        &spec,
        format!(
            "launch:\n  method: local\n  worker: {:?}\nworker: {{device: cpu, steps: 2, warmup: 0}}\nsweep:\n{sweep}",
            worker.to_str().unwrap()
        ),
    )
    .unwrap();
    spec
}

/// `zerobench local SPEC --out OUT` started, once the ranks of its first run (2, in `first_logs`)
/// have written their `pid.<rank>` files.
fn local_with_ranks_started(spec: &Path, out: &Path, first_logs: &Path) -> std::process::Child {
    let child = crate::support::zerobench_cmd()
        .args(["local", spec.to_str().unwrap(), "--out", out.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t = std::time::Instant::now();
    while !(first_logs.join("pid.0").is_file() && first_logs.join("pid.1").is_file()) {
        assert!(t.elapsed() < std::time::Duration::from_secs(30), "the ranks never started");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child
}

/// `--timeout 0` stopped every run the moment it started (where `cluster.time: 0` means no
/// limit): refused before anything is read or written.
#[test]
fn local_refuses_a_timeout_of_zero() {
    let out = tempfile::tempdir().unwrap();
    let o = zerobench(&["local", "no-such-spec.yaml", "--out", out.path().to_str().unwrap(), "--timeout", "0"]);
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    assert!(stderr(&o).contains("--timeout") && stderr(&o).contains("0"), "{}", stderr(&o));
    assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 0);
}

/// `zerobench local --timeout`: a run past its limit is stopped with every rank (one ignores
/// SIGTERM), recorded as a timeout, and the sweep goes on with the next run.
#[test]
fn local_stops_a_run_past_its_timeout_and_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let spec = stubborn_sweep(dir.path());
    let out = dir.path().join("runs");
    let t = std::time::Instant::now();
    let o = zerobench(&["local", spec.to_str().unwrap(), "--out", out.to_str().unwrap(), "--timeout", "2"]);
    let took = t.elapsed();
    let text = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{text}{}", stderr(&o));
    // Two runs of 2 s each, a 10 s grace at most for the stubborn rank of each.
    assert!(took < std::time::Duration::from_secs(40), "took {took:?}");
    for run in ["tiny_z0_offnone_mb1_1x2", "tiny_z1_offnone_mb1_1x2"] {
        let rec: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join(run).join("local.json")).unwrap()).unwrap();
        assert_eq!(rec["timed_out"], true, "{run}: {rec}");
        assert!(text.contains(&format!("{run}  timeout")), "{text}");
        for r in 0..2 {
            let pid: i32 =
                std::fs::read_to_string(out.join(run).join(format!("logs/pid.{r}"))).unwrap().trim().parse().unwrap();
            let t = std::time::Instant::now();
            while !gone(pid) && t.elapsed() < std::time::Duration::from_secs(5) {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            assert!(gone(pid), "{run}: rank {r} (pid {pid}) outlived its time limit");
        }
    }
    let st = stdout(&zerobench(&["status", out.to_str().unwrap()]));
    assert!(st.contains("2 runs: 2 timeout"), "{st}");
}

/// Every file under `dir` (hidden ones too) with its bytes.
fn tree(dir: &Path) -> std::collections::BTreeMap<PathBuf, Vec<u8>> {
    walkdir::WalkDir::new(dir)
        .into_iter()
        .map(|e| e.unwrap())
        // The lock names its holder's pid: not a result.
        .filter(|e| e.file_type().is_file() && e.file_name() != ".zerobench.lock")
        .map(|e| (e.path().to_path_buf(), std::fs::read(e.path()).unwrap()))
        .collect()
}

/// A process that is gone (or a zombie waiting to be reaped).
fn gone(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| s.contains(") Z "))
}

/// SIGTERM to `zerobench local` mid-run: the run's ranks (one of which ignores SIGTERM) are
/// stopped (mpirun, signalled with them, kills the stubborn one; `proctree`'s own test covers a
/// process nobody else kills); the run is recorded as cancelled, the next run never starts, and
/// `status` says so.
#[test]
fn local_stops_every_rank_when_interrupted() {
    let dir = tempfile::tempdir().unwrap();
    let spec = stubborn_sweep(dir.path());
    let out = dir.path().join("runs");
    let first = out.join("tiny_z0_offnone_mb1_1x2/logs");
    let child = local_with_ranks_started(&spec, &out, &first);
    let pids: Vec<i32> = (0..2)
        .map(|r| std::fs::read_to_string(first.join(format!("pid.{r}"))).unwrap().trim().parse().unwrap())
        .collect();
    let t = std::time::Instant::now();
    // SAFETY: kill(2) on the child we spawned.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let o = child.wait_with_output().unwrap();
    let took = t.elapsed();
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(o.status.code(), Some(1), "{text}{}", String::from_utf8_lossy(&o.stderr));
    assert!(took < std::time::Duration::from_secs(25), "took {took:?}");
    let t = std::time::Instant::now();
    while !pids.iter().all(|p| gone(*p)) && t.elapsed() < std::time::Duration::from_secs(5) {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(pids.iter().all(|p| gone(*p)), "ranks {pids:?} outlived zerobench local");
    assert!(text.contains("interrupted by SIGTERM") && text.contains("1 runs not started"), "{text}");
    let rec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("tiny_z0_offnone_mb1_1x2/local.json")).unwrap())
            .unwrap();
    assert_eq!(rec["interrupted_by"], "SIGTERM", "{rec}");
    assert!(!out.join("tiny_z1_offnone_mb1_1x2/local.json").exists(), "the next run started");
    let st = stdout(&zerobench(&["status", out.to_str().unwrap()]));
    assert!(st.contains("2 runs: 1 unsubmitted, 1 cancelled") || st.contains("1 cancelled"), "{st}");
}

/// Two commands into one output folder: while a `zerobench local` runs there, a second `local`
/// and an `ingest` into it are refused at once, naming the holder, and write nothing; once the
/// first has ended, the folder is free again.
#[test]
fn one_writer_per_output_folder() {
    let dir = tempfile::tempdir().unwrap();
    let spec = stub_sweep(
        dir.path(),
        r#"for a in "$@"; do [ "$prev" = --log-dir ] && logs=$a; prev=$a; done
touch "$logs/started.$OMPI_COMM_WORLD_RANK"; sleep 3"#,
        "  models: tiny\n  stages: 0\n  ranks_per_node: 1\n",
    );
    let out = dir.path().join("runs");
    let first = crate::support::zerobench_cmd()
        .args(["local", spec.to_str().unwrap(), "--out", out.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = out.join("tiny_z0_offnone_mb1_1x1/logs/started.0");
    let t = std::time::Instant::now();
    while !started.exists() {
        assert!(t.elapsed() < std::time::Duration::from_secs(30), "the first run never started");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let second = zerobench(&["local", spec.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert_eq!(second.status.code(), Some(2), "{}", stdout(&second));
    let why = stderr(&second);
    assert!(why.contains("is in use by another zerobench command (zerobench local, pid"), "{why}");
    let ingest = zerobench(&["ingest", out.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert_eq!(ingest.status.code(), Some(2));
    assert!(!out.join("runs.csv").exists(), "the refused ingest wrote");
    let o = first.wait_with_output().unwrap();
    assert!(o.status.success());
    let again = zerobench(&["local", spec.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert_eq!(again.status.code(), Some(0), "{}{}", stdout(&again), stderr(&again));
}

/// Runs that `plan` marks as not fitting the declared GPU memory are not rendered (and said so)
/// unless `--include-unfit`.
#[test]
fn unfit_runs_are_left_out_unless_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("s.yaml");
    std::fs::write(&spec, "cluster: {gpus_per_node: 4, gpu_memory: 16GiB}\nsweep:\n  models: gpt2-xl\n").unwrap();
    let out = dir.path().join("runs");
    let o = zerobench(&["render", spec.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    let text = stdout(&o);
    assert!(o.status.success(), "{text}{}", stderr(&o));
    assert!(text.contains("3 runs rendered, 1 left out as unfit"), "{text}");
    assert!(text.contains("gpt2-xl_z0_offnone_mb1_1x4") && text.contains("--include-unfit renders it"), "{text}");
    assert!(!out.join("gpt2-xl_z0_offnone_mb1_1x4").exists());
    let all = dir.path().join("all");
    let o = zerobench(&["render", spec.to_str().unwrap(), "--out", all.to_str().unwrap(), "--include-unfit"]);
    assert!(stdout(&o).contains("4 runs rendered, 0 left out as unfit"), "{}", stdout(&o));
    assert!(all.join("gpt2-xl_z0_offnone_mb1_1x4/job.sbatch").is_file());
}

/// The demo sweep end to end on the real worker: its `states` table shows ZeRO's saving per rank,
/// stage by stage (on CPU, where the memory table can only show process RSS).
#[test]
fn the_demo_shows_zeros_saving_per_rank() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("runs");
    let bin = crate::support::bin("zerobench-worker");
    let path = format!("{}:{}", bin.parent().unwrap().display(), std::env::var("PATH").unwrap_or_default());
    let o = crate::support::zerobench_cmd()
        .env("PATH", path)
        .args(["local", repo("slurm/examples/demo.yaml").to_str().unwrap(), "--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let tables = dir.path().join("tables");
    let o = zerobench(&["ingest", out.to_str().unwrap(), "--out", tables.to_str().unwrap(), "--format", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    // The printed table shows the saving too (in GiB with two decimals it read 0.00 everywhere).
    let text = stdout(&o);
    assert!(text.contains("Model states per rank (MiB") && !text.contains("0.00 states"), "{text}");
    let states: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(tables.join("states.json")).unwrap()).unwrap();
    let values: Vec<f64> = states["rows"]["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["rows"][0]["cells"][0]["value"].as_f64().unwrap())
        .collect();
    assert_eq!(values.len(), 4, "{states}");
    assert!(values.windows(2).all(|w| w[1] < w[0]), "stages 0-3 per rank: {values:?}");
    assert!((values[3] / values[0] - 0.5).abs() < 0.01, "fp32 stage 3 holds half of stage 0 on 2 ranks: {values:?}");
}

/// `zerobench local` into a folder it ran before: finished runs are skipped and no byte changes;
/// a failed run runs again only with `--retry-failed`, its first attempt kept whole; a spec that
/// changed a run's configuration is refused without writing anything, and `--overwrite` moves
/// the old run aside, never deleting it. `status` and `ingest` read the current runs only.
#[test]
fn local_into_the_same_folder_never_loses_results() {
    let dir = tempfile::tempdir().unwrap();
    let worker = dir.path().join("worker");
    // Stage 1 fails; the others write a log line per rank.
    write_script(
        &worker,
        r#"for a in "$@"; do [ "$prev" = --stage ] && stage=$a; [ "$prev" = --log-dir ] && logs=$a; prev=$a; done
[ "$stage" = 1 ] && { echo "stage 1 refuses" > "$logs/refusal.$OMPI_COMM_WORLD_RANK"; exit 3; }
printf '%s\n' "$@" > "$logs/argv.$OMPI_COMM_WORLD_RANK""#,
    );
    let spec = dir.path().join("local.yaml");
    let write_spec = |steps: u32| {
        std::fs::write(
            &spec,
            format!(
                "launch:\n  method: local\n  worker: {:?}\nworker: {{device: cpu, steps: {steps}, warmup: 0}}\nsweep:\n  models: tiny\n  stages: [0, 1]\n  ranks_per_node: 2\n",
                worker.to_str().unwrap()
            ),
        )
        .unwrap()
    };
    write_spec(2);
    let out = dir.path().join("runs");
    let local = |extra: &[&str]| {
        let mut args = vec!["local", spec.to_str().unwrap(), "--out", out.to_str().unwrap()];
        args.extend_from_slice(extra);
        zerobench(&args)
    };
    let first = local(&[]);
    assert_eq!(first.status.code(), Some(1), "{}", stdout(&first));
    let after_first = tree(&out);

    // Again: nothing runs, nothing changes, the table says why.
    let again = local(&[]);
    let table = stdout(&again);
    assert_eq!(again.status.code(), Some(1), "{table}{}", stderr(&again));
    assert!(table.contains("done (skipped)") && table.contains("finished earlier"), "{table}");
    assert!(table.contains("failed (skipped)") && table.contains("--retry-failed runs it again"), "{table}");
    assert!(table.contains("2 runs: 0 run now, 2 skipped, 1 not done"), "{table}");
    assert_eq!(tree(&out), after_first, "a second local changed bytes");

    // --retry-failed runs the failed one again; its first attempt is kept byte for byte.
    let retry = local(&["--retry-failed"]);
    assert_eq!(retry.status.code(), Some(1), "{}", stdout(&retry));
    assert!(stdout(&retry).contains("2 runs: 1 run now, 1 skipped, 1 not done"), "{}", stdout(&retry));
    let failed = out.join("tiny_z1_offnone_mb1_1x2");
    let attempts: Vec<PathBuf> =
        std::fs::read_dir(failed.join(".attempts")).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    for (path, bytes) in &after_first {
        let moved = path
            .strip_prefix(&failed)
            .ok()
            .filter(|rel| rel.starts_with("logs") || *rel == Path::new("local.json") || *rel == Path::new("local.out"));
        if let Some(rel) = moved {
            assert_eq!(&std::fs::read(attempts[0].join(rel)).unwrap(), bytes, "{}", rel.display());
        } else {
            assert_eq!(&std::fs::read(path).unwrap(), bytes, "{}", path.display());
        }
    }
    assert!(failed.join("logs/refusal.0").is_file(), "the retry ran");

    // A changed configuration under the same run ids: refused, naming the run and the field.
    write_spec(3);
    let before = tree(&out);
    let changed = local(&[]);
    assert_eq!(changed.status.code(), Some(2));
    let e = stderr(&changed);
    assert!(e.contains("run tiny_z0_offnone_mb1_1x2:") && e.contains("config.steps = 2, the spec now gives 3"), "{e}");
    assert_eq!(tree(&out), before, "a refused local wrote");

    // --overwrite moves the old runs aside and runs the new ones.
    let over = local(&["--overwrite"]);
    assert_eq!(over.status.code(), Some(1), "{}", stdout(&over));
    let replaced: Vec<PathBuf> = std::fs::read_dir(out.join(".replaced")).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(replaced.len(), 2, "{replaced:?}");
    let kept = tree(&out);
    for (path, bytes) in &before {
        let rel = path.strip_prefix(&out).unwrap();
        let run = rel.components().next().unwrap().as_os_str().to_string_lossy().into_owned();
        let moved = replaced.iter().find(|r| r.file_name().unwrap().to_string_lossy().starts_with(&run)).unwrap();
        let inner = rel.strip_prefix(&run).unwrap();
        assert_eq!(kept.get(&moved.join(inner)), Some(bytes), "{} lost", rel.display());
    }
    let st = stdout(&zerobench(&["status", out.to_str().unwrap()]));
    assert!(st.contains("2 runs: 1 done, 1 failed"), "{st}");
}

#[test]
fn submit_needs_out_for_a_spec_and_status_needs_runs() {
    let e = fails(&["submit", repo("slurm/examples/demo.yaml").to_str().unwrap()]);
    assert!(e.contains("say where to render it with --out"), "{e}");
    let empty = tempfile::tempdir().unwrap();
    let e = fails(&["status", empty.path().to_str().unwrap()]);
    assert!(e.contains("no run folders"), "{e}");
    let e = fails(&["status", Path::new("/nonexistent/zb").to_str().unwrap()]);
    assert!(e.contains("/nonexistent/zb"), "{e}");
}

/// Runs started outside the launcher (`bash job.sbatch`), which leaves no submission or `local`
/// record: `status` reads how they ended from the ranks' logs instead of calling them
/// `unsubmitted`.
#[test]
fn status_reads_runs_started_by_hand_from_their_logs() {
    use crate::support::{assert_ok, mpirun, run, worker};
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("by-hand.yaml");
    std::fs::write(
        &spec,
        "cluster:\n  time: '1'\nworker: {device: cpu, steps: 2, warmup: 0}\nsweep:\n  models: tiny\n  stages: [0, 2, 3]\n  ranks_per_node: 2\n",
    )
    .unwrap();
    let out = dir.path().join("runs");
    ok(&["render", spec.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    let runs = ["tiny_z0_offnone_mb1_1x2", "tiny_z3_offnone_mb1_1x2", "tiny_z2_offnone_mb1_1x2"];
    for (r, stage) in runs.iter().zip(["0", "3", "2"]) {
        let logs = out.join(r).join("logs");
        let o = run(mpirun(2)
            .arg(worker())
            .args(["--model", "tiny", "--stage", stage, "--steps", "2", "--warmup", "0"])
            .args(["--seq-len", "16", "--threads", "1", "--run-id", r, "--log-dir", logs.to_str().unwrap()]));
        assert_ok(&o, r);
    }
    // The second run's rank 1 stops before its end record (killed, as far as its log can tell).
    let rank1 = out.join(runs[1]).join("logs/rank1.jsonl");
    let text = std::fs::read_to_string(&rank1).unwrap();
    let kept: Vec<&str> = text.lines().filter(|l| !l.starts_with("{\"event\":\"end\"")).collect();
    std::fs::write(&rank1, kept.join("\n") + "\n").unwrap();
    // The third run's ranks all stop before their end records, and nothing else recorded how it
    // ended (killed with its launcher): not `unsubmitted`, which `local` would skip as never run.
    for rank in 0..2 {
        let log = out.join(runs[2]).join(format!("logs/rank{rank}.jsonl"));
        let text = std::fs::read_to_string(&log).unwrap();
        let kept: Vec<&str> = text.lines().filter(|l| !l.starts_with("{\"event\":\"end\"")).collect();
        std::fs::write(&log, kept.join("\n") + "\n").unwrap();
    }

    let st = zerobench(&["status", out.to_str().unwrap()]);
    let table = stdout(&st);
    assert_eq!(st.status.code(), Some(1), "{table}\n{}", stderr(&st));
    assert!(!table.contains("unsubmitted"), "{table}");
    let row = |r: &str| table.lines().find(|l| l.starts_with(r)).unwrap_or_else(|| panic!("{r}: {table}")).to_string();
    assert!(row(runs[0]).contains("done") && row(runs[0]).contains("logs"), "{table}");
    assert!(row(runs[1]).contains("failed") && row(runs[1]).contains("logs"), "{table}");
    assert!(row(runs[2]).contains("unknown") && row(runs[2]).contains("no record of how it ended"), "{table}");
}

/// A job Slurm requeues (a node failure, a preemption, `scontrol requeue`) runs its `job.sbatch`
/// again with `SLURM_RESTART_COUNT` set. The real worker then found the first attempt's logs and
/// refused to write over them (exit 5), so every requeued job failed. The script sets them aside
/// first: run once, then again as a restart, the second attempt ends well, its logs fresh, the
/// first attempt's kept under `.attempts/restart1-*`; run again without the variable (not a
/// restart), the worker still refuses to write over a finished run's logs.
#[test]
fn a_requeued_job_sets_the_first_attempts_logs_aside() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("s.yaml");
    std::fs::write(
        &spec,
        format!(
            "launch:\n  method: local\n  worker: {:?}\nworker: {{device: cpu, steps: 3, warmup: 1, seq_len: 32}}\nsweep:\n  models: tiny\n  stages: [1]\n",
            worker().to_str().unwrap()
        ),
    )
    .unwrap();
    let out = dir.path().join("runs");
    let o = zerobench(&["render", spec.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let run_dir = out.join("tiny_z1_offnone_mb1_1x1");
    let attempt = |restart: Option<&str>| {
        let mut c = std::process::Command::new("bash");
        c.arg(run_dir.join("job.sbatch")).env_remove("SLURM_RESTART_COUNT");
        if let Some(n) = restart {
            c.env("SLURM_RESTART_COUNT", n);
        }
        run(&mut c)
    };
    let first = attempt(None);
    assert!(first.status.success(), "{}", stderr(&first));
    let second = attempt(Some("1"));
    assert!(second.status.success(), "a requeued attempt failed: {}", stderr(&second));
    let kept: Vec<std::path::PathBuf> = std::fs::read_dir(run_dir.join(".attempts"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("restart1-"))
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert!(kept[0].join("logs/rank0.jsonl").is_file());
    assert!(run_dir.join("logs/rank0.jsonl").is_file());
    let st = zerobench(&["status", "--json", out.to_str().unwrap()]);
    assert!(stdout(&st).contains("\"done\""), "{}", stdout(&st));
    let third = attempt(None);
    assert_eq!(third.status.code(), Some(5), "not a restart: the finished run's logs are not set aside");
}

/// A mistyped spec or folder given to `submit` is named in the error (it said only "No such file
/// or directory"), exit 2, before any Slurm command runs.
#[test]
fn submit_names_a_target_that_is_not_there() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-spec.yaml");
    let o = zerobench(&["submit", missing.to_str().unwrap(), "--out", dir.path().join("x").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains(&format!("{}: neither a spec file nor a folder", missing.display())), "{}", stderr(&o));
}

/// Ranks that take seconds to write their last records when stopped (a loaded node) still write
/// them when `zerobench local` is interrupted: the rendered `mpirun` gives a signalled rank 10 s
/// before it kills it (under Open MPI's default, 1 s, they were killed first).
#[test]
fn ranks_slow_to_stop_finish_their_records_when_local_is_interrupted() {
    let dir = tempfile::tempdir().unwrap();
    let spec = stub_sweep(
        dir.path(),
        r#"for a in "$@"; do [ "$prev" = --log-dir ] && logs=$a; prev=$a; done
trap 'sleep 3; echo stopped > "$logs/records.$OMPI_COMM_WORLD_RANK"; exit 143' TERM
echo $$ > "$logs/pid.$OMPI_COMM_WORLD_RANK.tmp" && mv "$logs/pid.$OMPI_COMM_WORLD_RANK.tmp" "$logs/pid.$OMPI_COMM_WORLD_RANK"
sleep 120 & wait"#,
        "  models: tiny\n  ranks_per_node: 2\n",
    );
    let out = dir.path().join("runs");
    let logs = out.join("tiny_z0_offnone_mb1_1x2/logs");
    let child = local_with_ranks_started(&spec, &out, &logs);
    // SAFETY: kill(2) on the child we spawned.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", String::from_utf8_lossy(&o.stderr));
    for rank in 0..2 {
        assert!(logs.join(format!("records.{rank}")).is_file(), "rank {rank} was killed before its records");
    }
}

/// What a command prints that cannot be written (standard output a file on a full disk) fails it
/// with exit 2, the error naming standard output; `| head` closing it early is no error.
#[test]
fn an_unwritable_standard_output_is_named() {
    let demo = repo("slurm/examples/demo.yaml");
    let demo = demo.to_str().unwrap();
    let commands: [&[&str]; 4] = [
        &["plan", demo],
        &["predict", "--gpu", "h200", "--model", "gpt2", "--stage", "0", "--micro-batch", "4"],
        &["hostlist", "expand", "n[1-3]"],
        &["schema"],
    ];
    for args in commands {
        let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
        let o = run(zerobench_cmd().args(args).stdout(full));
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("writing standard output: No space left on device"), "{args:?}: {}", stderr(&o));
    }
    let mut head = zerobench_cmd().args(["plan", demo]).stdout(std::process::Stdio::piped()).spawn().unwrap();
    drop(head.stdout.take()); // the reader goes away before anything is written
    assert_eq!(head.wait().unwrap().code(), Some(0));
}
