//! The worker launched torchrun-style: plain processes with RANK, WORLD_SIZE, MASTER_ADDR and
//! MASTER_PORT, meeting at rank 0's TCP store, with CPU collectives over c10d's Gloo. They train
//! the same model as MPI ranks at every stage, a rank that never arrives or dies fails the others
//! within a bounded time, and a wrong environment is refused naming the variable.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use zerobench_schema::log::Record;

use crate::support::{
    assert_ok, assert_traffic, bin, free_port, losses, max_rel_diff, on_text, records, run, stderr, stdout, steps,
    train, worker, TINY_FP32,
};

/// `program` as rank `rank` of `world`, meeting at 127.0.0.1:`port`.
fn rank_cmd(program: &Path, rank: usize, world: usize, port: u16) -> Command {
    let mut c = Command::new(program);
    c.env("RANK", rank.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Starts ranks `ranks` of a world of `world` running `program ARGS`.
fn spawn<S: AsRef<std::ffi::OsStr>>(program: &Path, ranks: &[usize], world: usize, args: &[S]) -> Vec<Child> {
    let port = free_port();
    ranks.iter().map(|&r| rank_cmd(program, r, world, port).args(args).spawn().expect("start a rank")).collect()
}

/// Waits for every rank, failing the test if one takes longer than `limit`.
fn wait_all(children: Vec<Child>, limit: Duration) -> Vec<Output> {
    let deadline = Instant::now() + limit;
    children
        .into_iter()
        .map(|mut c| {
            while c.try_wait().expect("wait").is_none() {
                if Instant::now() > deadline {
                    let _ = c.kill();
                    panic!("a rank did not stop within {limit:?}: {:?}", c.wait_with_output().map(|o| stderr(&o)));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            c.wait_with_output().expect("output")
        })
        .collect()
}

/// Runs `n` env-launched ranks of the worker with `args` into `dir`; each rank's records.
fn train_env<S: AsRef<std::ffi::OsStr> + std::fmt::Debug>(n: usize, dir: &Path, args: &[S]) -> Vec<Vec<Record>> {
    let ranks: Vec<usize> = (0..n).collect();
    let mut all: Vec<std::ffi::OsString> = args.iter().map(|a| a.as_ref().to_owned()).collect();
    all.extend(["--log-dir".into(), dir.into()]);
    for (r, out) in wait_all(spawn(&worker(), &ranks, n, &all), Duration::from_secs(600)).iter().enumerate() {
        assert_ok(out, &format!("rank {r} of {n} {args:?}"));
    }
    (0..n).map(|r| records(&dir.join(format!("rank{r}.jsonl")))).collect()
}

#[test]
fn gloo_collectives_hold_closed_forms_on_2_to_4_ranks() {
    let bin = bin("examples/collectives");
    for n in 2..=4 {
        let ranks: Vec<usize> = (0..n).collect();
        let outs = wait_all(spawn(&bin, &ranks, n, &[] as &[&str]), Duration::from_secs(120));
        for (r, out) in outs.iter().enumerate() {
            assert_ok(out, &format!("rank {r} of {n}"));
        }
        assert!(stdout(&outs[0]).contains(&format!("gloo collectives ok on {n} rank(s)")), "{}", stdout(&outs[0]));
    }
}

#[test]
fn env_ranks_train_the_same_model_as_mpi_ranks_at_every_stage() {
    let tmp = tempfile::tempdir().unwrap();
    for (n, mb) in [(2, "3"), (3, "2"), (4, "1")] {
        for stage in ["0", "1", "2", "3"] {
            let args = on_text(&[TINY_FP32, &["--stage", stage, "--micro-batch", mb]].concat());
            let mpi = train(n, &tmp.path().join(format!("mpi_z{stage}_n{n}")), &args);
            let env = train_env(n, &tmp.path().join(format!("env_z{stage}_n{n}")), &args);
            for (r, recs) in env.iter().enumerate() {
                let Some(Record::Start(start)) = recs.first() else { panic!("a log starts with its start record") };
                assert_eq!((start.rank_source.as_str(), start.comm_backend.as_str()), ("env", "gloo"));
                assert_eq!((start.rank as usize, start.local_rank as usize, start.local_size as usize), (r, r, n));
                assert_eq!(losses(recs), losses(&env[0]), "every rank logs the same global loss");
                assert_traffic(recs);
            }
            assert_eq!(losses(&env[0]).len(), 20);
            let diff = max_rel_diff(&losses(&env[0]), &losses(&mpi[0]));
            assert!(diff <= 1e-5, "stage {stage} on {n} env ranks against MPI: relative loss difference {diff:e}");
        }
    }
    // hpZ's groups meet through the same store.
    let args = on_text(&[TINY_FP32, &["--stage", "3", "--hpz", "2", "--micro-batch", "1"]].concat());
    let mpi = train(4, &tmp.path().join("mpi_hpz"), &args);
    let env = train_env(4, &tmp.path().join("env_hpz"), &args);
    let diff = max_rel_diff(&losses(&env[0]), &losses(&mpi[0]));
    assert!(diff <= 1e-5, "hpZ on 4 env ranks against MPI: relative loss difference {diff:e}");
    let step = steps(&env[3]).pop().expect("step records").clone();
    assert!(step.comm["all_gather_group"].calls > 0, "{:?}", step.comm);
}

#[test]
fn a_rank_that_never_arrives_fails_the_others_within_the_timeout() {
    let tmp = tempfile::tempdir().unwrap();
    let args = ["--model", "tiny", "--stage", "1", "--rendezvous-timeout-s", "3", "--log-dir"];
    // Rank 0 alone: it hosts the store and waits for rank 1. Rank 1 alone: no store to reach.
    for (rank, says) in [(0, "1/2 clients joined"), (1, "rendezvous at 127.0.0.1:")] {
        let t0 = Instant::now();
        let mut a: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        a.push(tmp.path().join(format!("alone{rank}")).display().to_string());
        let out = wait_all(spawn(&worker(), &[rank], 2, &a), Duration::from_secs(60)).remove(0);
        let took = t0.elapsed();
        assert_eq!(out.status.code(), Some(4), "rank {rank} alone: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains(says) && err.contains("timeout 3 s"), "rank {rank} alone: {err}");
        assert!(took < Duration::from_secs(30), "rank {rank} alone took {took:?} to fail");
    }
}

#[test]
fn a_rank_that_dies_fails_the_others_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("logs");
    let args: Vec<String> = [
        "--model",
        "tiny",
        "--stage",
        "2",
        "--seq-len",
        "64",
        "--steps",
        "100000",
        "--threads",
        "1",
        "--stall-timeout-s",
        "0",
        "--log-dir",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([dir.display().to_string()])
    .collect();
    let mut ranks = spawn(&worker(), &[0, 1], 2, &args);
    // Once rank 1 has trained a step, kill it.
    let deadline = Instant::now() + Duration::from_secs(120);
    while !std::fs::read_to_string(dir.join("rank1.jsonl")).is_ok_and(|t| t.contains("\"event\":\"step\"")) {
        assert!(Instant::now() < deadline, "rank 1 trained no step");
        std::thread::sleep(Duration::from_millis(100));
    }
    ranks[1].kill().unwrap();
    let killed_at = Instant::now();
    let out = wait_all(ranks, Duration::from_secs(60)).remove(0);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(killed_at.elapsed() < Duration::from_secs(20), "rank 0 took {:?}", killed_at.elapsed());
    // Gloo names the connection rank 1's death broke by the peer's address, and how it broke
    // (as rank 0 was reading or writing).
    let err = stderr(&out);
    let broke = ["reset by peer", "closed by peer", "Broken pipe"].iter().any(|m| err.contains(m));
    assert!(err.contains("communication failed") && err.contains("[127.0.0.1]") && broke, "{err}");
}

#[test]
fn a_wrong_environment_is_refused_naming_the_variable() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("logs");
    let base = ["--model", "tiny", "--stage", "0", "--log-dir", log.to_str().unwrap()];
    let busy = TcpListener::bind("127.0.0.1:0").unwrap();
    let busy_port = busy.local_addr().unwrap().port().to_string();
    // (environment, flags, exit code, what stderr says)
    type Case<'a> = (&'a [(&'a str, &'a str)], &'a [&'a str], i32, &'a str);
    let cases: &[Case] = &[
        (&[("RANK", "2"), ("WORLD_SIZE", "2")], &[], 2, "RANK=2 is not below WORLD_SIZE=2"),
        (&[("RANK", "one"), ("WORLD_SIZE", "2")], &[], 2, "RANK=\"one\" is not a non-negative number"),
        (&[("WORLD_SIZE", "2"), ("RANK", "0"), ("MASTER_PORT", "")], &[], 2, "needs MASTER_PORT"),
        (&[("WORLD_SIZE", "2"), ("RANK", "0"), ("MASTER_PORT", "http")], &[], 2, "MASTER_PORT=\"http\""),
        (&[("WORLD_SIZE", "2"), ("RANK", "1"), ("MASTER_ADDR", "")], &[], 2, "needs MASTER_ADDR"),
        (&[("WORLD_SIZE", "2")], &["--rendezvous", "mpi"], 2, "MPI started this process alone while WORLD_SIZE=2"),
        (&[], &["--rendezvous", "env"], 2, "needs WORLD_SIZE"),
        (&[("WORLD_SIZE", "2"), ("RANK", "0"), ("MASTER_PORT", &busy_port)], &[], 4, "rendezvous at 127.0.0.1:"),
        (&[], &["--rendezvous-timeout-s", "0"], 2, "--rendezvous-timeout-s"),
    ];
    for (env, flags, code, says) in cases {
        let mut c = Command::new(worker());
        c.args(base).args(*flags);
        c.env("MASTER_ADDR", "127.0.0.1").env("MASTER_PORT", free_port().to_string());
        for k in ["RANK", "WORLD_SIZE", "LOCAL_RANK"] {
            c.env_remove(k);
        }
        for (k, v) in *env {
            c.env(k, v);
        }
        let t0 = Instant::now();
        let out = run(&mut c);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(*code), "{env:?} {flags:?}: {err}");
        assert!(err.contains(says), "{env:?} {flags:?}: {err}");
        assert!(t0.elapsed() < Duration::from_secs(30), "{env:?} took {:?}", t0.elapsed());
        assert!(!log.join("rank0.jsonl").exists(), "{env:?}: refused before the log opens");
    }
    drop(busy);
}
