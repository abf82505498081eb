//! The worker on CPU over MPI: every ZeRO stage trains the same model as stage 0 on one rank,
//! holds exactly the model states the ZeRO formulas give, learns from real text, logs valid
//! records, and rejects bad input cleanly.

use std::path::Path;
use std::process::Command;

use zerobench_schema::log::{ErrorClass, Record, RunStatus};
use zerobench_schema::memory::{model_state_bytes, padded_params, ParamPath};
use zerobench_schema::{ModelPreset, Precision, ZeroStage};

use crate::support::{
    assert_ok, assert_traffic, bin, losses, max_rel_diff, mpirun, on_text, records, repo, run, setup, stderr, steps,
    train, worker, TINY_FP32,
};

#[test]
fn every_stage_follows_stage_0_on_one_rank() {
    let tmp = tempfile::tempdir().unwrap();
    // The reference: one rank, the whole global batch of 6 sequences at once.
    let reference = losses(
        &train(1, &tmp.path().join("ref"), &on_text(&[TINY_FP32, &["--stage", "0", "--micro-batch", "6"]].concat()))[0],
    );
    assert_eq!(reference.len(), 20);
    let first = reference[0];
    let last = reference[reference.len() - 3..].iter().sum::<f64>() / 3.0;
    assert!(first - last > 1.0, "training on text lowers the loss: {first} -> {last}");

    // (ranks, micro-batch, grad-accum): the same 6 sequences per step, split differently.
    for (n, mb, ga) in [(1, 6, 1), (2, 3, 1), (3, 2, 1), (2, 1, 3)] {
        for stage in ["0", "1", "2", "3"] {
            if n == 1 && stage == "0" {
                continue;
            }
            let (mb_s, ga_s) = (mb.to_string(), ga.to_string());
            let args =
                on_text(&[TINY_FP32, &["--stage", stage, "--micro-batch", &mb_s, "--grad-accum", &ga_s]].concat());
            let ranks = train(n, &tmp.path().join(format!("z{stage}_n{n}_ga{ga}")), &args);
            // Every rank logs the same global loss, having moved the closed form's bytes.
            for r in &ranks {
                assert_eq!(losses(r), losses(&ranks[0]));
                assert_traffic(r);
            }
            let diff = max_rel_diff(&losses(&ranks[0]), &reference);
            assert!(
                diff <= 1e-5,
                "stage {stage} on {n} ranks (micro-batch {mb}, accumulation {ga}): relative loss difference {diff:e}"
            );
        }
    }
}

#[test]
fn model_states_equal_the_zero_formulas() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = ModelPreset::Tiny.spec();
    for precision in [Precision::Bf16, Precision::Fp32] {
        for n in [1usize, 2, 3] {
            for stage in ZeroStage::ALL {
                let dir = tmp.path().join(format!("{precision}_{n}_{stage}"));
                let (st, pr) = (stage.to_string(), precision.to_string());
                let ranks = train(
                    n,
                    &dir,
                    &[
                        "--model",
                        "tiny",
                        "--seq-len",
                        "16",
                        "--steps",
                        "2",
                        "--warmup",
                        "1",
                        "--stage",
                        &st,
                        "--precision",
                        &pr,
                        "--threads",
                        "1",
                    ],
                );
                let psi = padded_params(&spec, n as u64);
                let want = model_state_bytes(stage, precision, psi, n as u64);
                // The closed forms of the ZeRO paper, written out: mixed precision keeps 2-byte
                // parameters and gradients and 12 bytes of optimizer state (fp32 master copy, Adam's
                // m and v) per parameter; fp32 keeps 4, 4 and 8 (no separate master copy).
                let (p, n64, mixed) = (psi, n as u64, precision != Precision::Fp32);
                let total = match stage {
                    ZeroStage::Z0 => 16 * p,
                    ZeroStage::Z1 if mixed => 4 * p + 12 * p / n64,
                    ZeroStage::Z1 => 8 * p + 8 * p / n64,
                    ZeroStage::Z2 if mixed => 2 * p + 14 * p / n64,
                    ZeroStage::Z2 => 4 * p + 12 * p / n64,
                    ZeroStage::Z3 => 16 * p / n64,
                };
                assert_eq!(want.total(), total, "{precision} stage {stage} on {n} ranks");
                for recs in &ranks {
                    assert_traffic(recs);
                    let got = setup(recs);
                    assert_eq!(got.padded_params, psi);
                    assert_eq!(got.model_state, want, "{precision} stage {stage} on {n} ranks");
                    // The log's own comparison, which ingest reports, agrees.
                    assert_eq!(got.model_state_expected, got.model_state);
                    // The buffers the planner predicts are the ones the engine allocates.
                    let engine = zerobench_schema::config::EngineConfig::default();
                    let buffers = zerobench_schema::memory::engine_buffer_bytes(
                        &spec,
                        stage,
                        precision,
                        zerobench_schema::config::Offload::None,
                        &engine,
                        n as u64,
                    );
                    assert_eq!(
                        got.buffers_bytes.values().sum::<u64>(),
                        buffers,
                        "{precision} stage {stage} on {n} ranks"
                    );
                    // Gather slots exactly where stage 3 shards its parameters: on several ranks.
                    let sharded = stage == ZeroStage::Z3 && n > 1;
                    assert_eq!(
                        ParamPath::logged(&got.buffers_bytes) == ParamPath::Sharded,
                        sharded,
                        "{precision} stage {stage} on {n} ranks: {:?}",
                        got.buffers_bytes
                    );
                }
            }
        }
    }
    // Padding is bounded by world × alignment per unit.
    assert!(padded_params(&spec, 3) - spec.param_count() < spec.units().len() as u64 * 3 * 128);
}

/// The commit checked out in this repository.
fn git_head() -> String {
    let out = Command::new("git").args(["rev-parse", "HEAD"]).current_dir(repo(".")).output().expect("git runs");
    assert!(out.status.success(), "the tests run in the repository's checkout");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[test]
fn logs_follow_the_schema_from_start_to_end() {
    let tmp = tempfile::tempdir().unwrap();
    let ranks = train(
        2,
        tmp.path(),
        &[
            "--model",
            "tiny",
            "--stage",
            "3",
            "--steps",
            "5",
            "--seq-len",
            "32",
            "--micro-batch",
            "2",
            "--run-id",
            "schema-check",
        ],
    );
    for (r, recs) in ranks.iter().enumerate() {
        let kinds: Vec<&str> = recs.iter().map(Record::event).collect();
        assert_eq!(kinds, ["start", "setup", "step", "step", "step", "step", "step", "end"], "rank {r}");
        match (&recs[0], recs.last().unwrap()) {
            (Record::Start(s), Record::End(e)) => {
                assert_eq!(s.run_id, "schema-check");
                assert_eq!((s.rank, s.world_size, s.local_rank, s.local_size), (r as u32, 2, r as u32, 2));
                assert_eq!(s.rank_source, "mpi");
                assert_eq!(s.comm_backend, "mpi");
                // The host as the kernel describes it: every online CPU, not only the rank's.
                let m = s.machine.as_ref().expect("start.machine");
                let usable = std::thread::available_parallelism().unwrap().get() as u32;
                assert!(m.cpus >= usable && !m.cpu_model.is_empty(), "{m:?}");
                assert!(m.memory_bytes.is_some_and(|b| b > 1 << 30), "{m:?}");
                // The build names its commit: the one checked out, which the tests were built from.
                assert_eq!(
                    s.versions.commit.as_deref(),
                    Some(git_head().as_str()),
                    "the worker binary was built at another commit: `make build` (what `make test` does first)"
                );
                assert_eq!(e.status, RunStatus::Ok);
                assert_eq!(e.steps_completed, 5);
                assert!(e.summary.is_some());
            }
            other => panic!("{other:?}"),
        }
        for rec in recs {
            if let Record::Step(s) = rec {
                assert_eq!(s.warmup, s.step < 2);
                assert_eq!(s.tokens, 2 * 2 * 32);
                assert!(s.step_ms > 0.0 && s.comm_ms >= 0.0 && s.comm_ms <= s.step_ms * 1.01);
                // Stage 3 moves parameters with all-gathers and gradients with reduce-scatters.
                assert!(s.comm["all_gather"].calls > 0 && s.comm["reduce_scatter"].calls > 0, "{:?}", s.comm);
                assert!(s.memory.rss_bytes > 0);
            }
        }
    }
}

#[test]
fn fp16_overflowing_steps_are_skipped_and_logged() {
    let tmp = tempfile::tempdir().unwrap();
    // A loss scale of 2^40 overflows fp16 gradients; the scaler halves it until they fit.
    let ranks = train(
        2,
        tmp.path(),
        &[
            "--model",
            "tiny",
            "--stage",
            "2",
            "--precision",
            "fp16",
            "--loss-scale-power",
            "40",
            "--steps",
            "30",
            "--seq-len",
            "32",
            "--threads",
            "1",
        ],
    );
    let steps = steps(&ranks[0]);
    assert!(steps[0].skipped, "first step overflows");
    assert_eq!(steps[0].loss_scale, Some(2f64.powi(40)));
    assert_eq!(steps[1].loss_scale, Some(2f64.powi(39)));
    let applied = steps.iter().position(|s| !s.skipped).expect("the scale comes down until a step applies");
    assert!(steps[applied..].iter().all(|s| !s.skipped));
    assert!(steps.iter().all(|s| s.loss.is_some_and(f64::is_finite)));
}

/// A run whose loss stops being a finite number (fp16 at a learning rate that diverges) ends
/// `ok` and writes its losses as `null`, which the schema allows and ingest reads: the run is
/// `ok` with every step measured and no final loss, not `incomplete` with its steps refused.
#[test]
fn a_diverged_run_logs_null_losses_that_ingest_reads() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("div");
    let flags = ["--model", "tiny", "--stage", "2", "--precision", "fp16", "--lr", "1e4", "--steps", "12"];
    let ranks = train(2, &dir, &[&flags[..], &["--seq-len", "32", "--threads", "1"]].concat());
    let steps = steps(&ranks[0]);
    assert!(steps.iter().any(|s| s.loss.is_none()), "no step lost its loss: {:?}", losses_or_none(&steps));
    let ingested =
        zerobench_ingest::ingest(std::slice::from_ref(&dir), &Default::default(), &zerobench_ingest::NoProgress);
    assert!(ingested.problems.is_empty(), "{:#?}", ingested.problems);
    let row = &ingested.runs[0].row;
    assert_eq!((row.status, row.steps_measured, row.partial_steps), (zerobench_ingest::Status::Ok, 10, 0));
    let last_finite = steps.last().and_then(|s| s.loss);
    assert_eq!(row.final_loss, last_finite, "the last step's loss, or none");
}

fn losses_or_none(steps: &[&zerobench_schema::log::Step]) -> Vec<Option<f64>> {
    steps.iter().map(|s| s.loss).collect()
}

#[test]
fn mpi_collectives_hold_closed_forms_on_1_to_4_ranks() {
    let bin = bin("examples/collectives");
    for n in 1..=4 {
        let out = run(mpirun(n).arg(&bin));
        assert_ok(&out, &format!("collectives on {n} ranks"));
        assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("collectives ok on {n} rank(s)")));
    }
}

/// Runs the worker alone and returns (exit code, stderr).
fn worker_alone(args: &[&str]) -> (i32, String) {
    let out = run(Command::new(worker()).args(args));
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn bad_flags_fail_before_any_work_and_name_the_flag() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("logs");
    let d = d.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["--model", "gpt5", "--stage", "0"], "--model"),
        (&["--model", "tiny", "--stage", "4"], "--stage"),
        (&["--model", "tiny", "--stage", "0", "--precision", "fp8"], "--precision"),
        (&["--model", "tiny", "--stage", "0", "--offload", "optimizer"], "--offload"),
        (&["--model", "tiny", "--stage", "2", "--offload", "optimizer+params"], "--offload"),
        (&["--model", "tiny", "--stage", "2", "--offload-ratio", "0.5"], "--offload-ratio"),
        (&["--model", "tiny", "--stage", "2", "--offload", "optimizer", "--offload-ratio", "0"], "--offload-ratio"),
        (&["--model", "tiny", "--stage", "2", "--offload", "optimizer", "--offload-ratio=-0.5"], "--offload-ratio"),
        (&["--model", "tiny", "--stage", "2", "--offload", "optimizer", "--offload-ratio", "1.5"], "--offload-ratio"),
        (&["--model", "tiny", "--stage", "2", "--offload", "optimizer", "--offload-ratio", "NaN"], "--offload-ratio"),
        (&["--model", "tiny", "--stage", "2", "--offload", "optimizer", "--offload-ratio", "half"], "--offload-ratio"),
        (&["--model", "tiny", "--stage", "2", "--delayed-update"], "--delayed-update"),
        (
            &["--model", "tiny", "--stage", "2", "--offload", "optimizer", "--delayed-update-after", "3"],
            "--delayed-update",
        ),
        (
            &["--model", "tiny", "--stage", "2", "--offload", "optimizer", "--delayed-update", "--precision", "fp16"],
            "--delayed-update",
        ),
        (
            &["--model", "tiny", "--stage", "2", "--offload", "optimizer", "--delayed-update", "--grad-accum", "2"],
            "--delayed-update",
        ),
        (&["--model", "tiny", "--stage", "1", "--steps", "2", "--warmup", "2"], "--warmup"),
        (&["--model", "tiny", "--stage", "1", "--micro-batch", "0"], "--micro-batch"),
        (&["--model", "tiny", "--stage", "1", "--seq-len", "100000"], "--seq-len"),
        (&["--model", "tiny", "--stage", "1", "--steps=-3"], "--steps"),
        (&["--model", "tiny", "--stage", "1", "--target-len", "8"], "--target-len"),
        (&["--model", "tiny-t5", "--stage", "1", "--target-len", "0"], "--target-len"),
        (&["--model", "mlp", "--stage", "1", "--data", "text.txt"], "--data"),
        (&["--model", "tiny", "--stage", "0", "--threads", "0"], "--threads"),
        (&["--model", "tiny", "--stage", "0", "--threads", "100000"], "--threads"),
        (&["--model", "tiny", "--stage", "0", "--launch-cpu", "first"], "--launch-cpu"),
        (&["--model", "tiny", "--stage", "0", "--device", "cpu", "--launch-cpu", "0"], "--launch-cpu"),
        (&["--model", "tiny", "--stage", "0", "--beta1", "2"], "--beta1"),
        (&["--model", "tiny", "--stage", "0", "--beta2", "1"], "--beta2"),
        (&["--model", "tiny", "--stage", "0", "--eps", "0"], "--eps"),
        (&["--model", "tiny", "--stage", "0", "--weight-decay=-1"], "--weight-decay"),
        // A delay past the last step delays nothing, while the run is labelled delayed.
        (
            &[
                "--model",
                "tiny",
                "--stage",
                "2",
                "--offload",
                "optimizer",
                "--delayed-update",
                "--delayed-update-after",
                "100",
                "--steps",
                "3",
            ],
            "--delayed-update-after",
        ),
        // Waits beyond a year overflowed libtorch's store deadline and the stall clock.
        (&["--model", "tiny", "--stage", "0", "--rendezvous-timeout-s", "10000000000"], "--rendezvous-timeout-s"),
        (&["--model", "tiny", "--stage", "0", "--stall-timeout-s", "18446744073709551615"], "--stall-timeout-s"),
    ];
    for (args, needle) in cases {
        let mut all = args.to_vec();
        all.extend(["--log-dir", d]);
        let (code, err) = worker_alone(&all);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: message should name {needle}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(!Path::new(d).join("rank0.jsonl").exists(), "{args:?} wrote a log");
    }
}

#[test]
fn unusable_log_folders_stop_the_rank_before_training() {
    let tmp = tempfile::tempdir().unwrap();
    // A file where the folder should be.
    let file = tmp.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let (code, err) = worker_alone(&["--model", "tiny", "--stage", "0", "--log-dir", file.to_str().unwrap()]);
    assert_eq!(code, 5, "{err}");
    assert!(err.contains("not-a-dir") && err.contains("is a file, not a folder"), "{err}");
    // An earlier run's log is never overwritten silently.
    let dir = tmp.path().join("run");
    let args =
        ["--model", "tiny", "--stage", "0", "--steps", "3", "--seq-len", "16", "--log-dir", dir.to_str().unwrap()];
    assert_eq!(worker_alone(&args).0, 0);
    let before = std::fs::read(dir.join("rank0.jsonl")).unwrap();
    let (code, err) = worker_alone(&args);
    assert_eq!(code, 5);
    assert!(err.contains("--overwrite"), "{err}");
    assert_eq!(std::fs::read(dir.join("rank0.jsonl")).unwrap(), before);
    // A link planted where the log goes is refused, with --overwrite too: its target keeps its
    // bytes (--overwrite truncated it before).
    let planted = tmp.path().join("planted");
    std::fs::create_dir_all(&planted).unwrap();
    let victim = tmp.path().join("someone-elses-file");
    std::fs::write(&victim, b"precious").unwrap();
    std::os::unix::fs::symlink(&victim, planted.join("rank0.jsonl")).unwrap();
    for extra in [&[][..], &["--overwrite"][..]] {
        let mut all = vec!["--model", "tiny", "--stage", "0", "--steps", "3", "--seq-len", "16"];
        all.extend(["--log-dir", planted.to_str().unwrap()]);
        all.extend(extra);
        let (code, err) = worker_alone(&all);
        assert_eq!(code, 5, "{extra:?}: {err}");
        assert!(err.contains("symbolic link"), "{extra:?}: {err}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious", "{extra:?}");
    }
}

/// A log that one rank alone cannot open (its name taken by an earlier, smaller run) stops every
/// rank at once with that rank's exit code, and the others leave no log behind; before, rank 0
/// left and rank 1 waited in its first collective until the stall limit (300 s, exit code 4).
#[test]
fn a_log_one_rank_cannot_open_stops_every_rank() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let flags = ["--model", "tiny", "--stage", "2", "--steps", "3", "--seq-len", "16", "--threads", "1"];
    let one = run(mpirun(1).arg(worker()).args(flags).arg("--log-dir").arg(&dir));
    assert_ok(&one, "one rank");
    let before = std::fs::read(dir.join("rank0.jsonl")).unwrap();
    let two = run(mpirun(2).arg(worker()).args(flags).arg("--log-dir").arg(&dir));
    assert_eq!(two.status.code(), Some(5), "{}", stderr(&two));
    let err = stderr(&two);
    assert!(err.contains("rank0.jsonl exists"), "{err}");
    assert!(err.contains("rank 0 could not open its log"), "{err}");
    assert_eq!(std::fs::read(dir.join("rank0.jsonl")).unwrap(), before);
    assert!(!dir.join("rank1.jsonl").exists(), "rank 1 left a log of a run that never ran");
    // --overwrite replaces the run's logs, and removes the logs of ranks this run does not have.
    let one = run(mpirun(1).arg(worker()).args(flags).arg("--log-dir").arg(&dir).arg("--overwrite"));
    assert_ok(&one, "one rank over two");
    let two = run(mpirun(2).arg(worker()).args(flags).arg("--log-dir").arg(&dir).arg("--overwrite"));
    assert_ok(&two, "two ranks over one");
    let one = run(mpirun(1).arg(worker()).args(flags).arg("--log-dir").arg(&dir).arg("--overwrite"));
    assert_ok(&one, "one rank over two");
    let mut left: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    left.sort();
    assert_eq!(left, ["rank0.jsonl"]);
}

/// Ranks started with other flags (an MPMD launch) are refused on every rank, the differing one
/// naming the field, before any log is written; before, they trained different models against
/// each other or hung in a collective.
#[test]
fn ranks_started_with_other_flags_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let common = ["--model", "tiny", "--stage", "2", "--steps", "3", "--threads", "1"];
    let out = run(mpirun(1)
        .arg(worker())
        .args(common)
        .args(["--seq-len", "16", "--log-dir"])
        .arg(&dir)
        .args([":", "-np", "1"])
        .arg(worker())
        .args(common)
        .args(["--seq-len", "32", "--log-dir"])
        .arg(&dir));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("rank(s) 1 started with other flags than rank 0 (this rank's `seq_len` differs)"), "{err}");
    assert!(!dir.exists(), "a refused run wrote into its log folder");
}

/// A micro-batch far beyond host memory (`--micro-batch 1000000000`) is an out-of-memory result
/// with its records, exit code 3, not an abort.
#[test]
fn a_micro_batch_beyond_host_memory_is_an_oom_result() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("logs");
    let (code, err) = worker_alone(&[
        "--model",
        "tiny",
        "--stage",
        "0",
        "--device",
        "cpu",
        "--micro-batch",
        "1000000000",
        "--log-dir",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(code, 3, "{err}");
    let recs = records(&dir.join("rank0.jsonl"));
    let kinds: Vec<&str> = recs.iter().map(Record::event).collect();
    // Refused before any state is allocated: a CPU step's micro-batches count in its host memory.
    assert_eq!(kinds, ["start", "error", "end"]);
    match (&recs[1], &recs[2]) {
        (Record::Error(e), Record::End(end)) => {
            assert_eq!(e.class, ErrorClass::Oom);
            // 10^9 sequences of the tiny preset's 256 + 1 tokens, 8 bytes each, beside the states.
            let batch = 1_000_000_000u64 * 257 * 8;
            assert!(e.requested_bytes.is_some_and(|b| b > batch && b < batch + (1 << 30)), "{}", e.message);
            assert!(e.message.contains("micro-batches"), "{}", e.message);
            assert_eq!((end.status, end.exit_code), (RunStatus::Oom, 3));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_failure_during_training_is_logged_with_its_class() {
    let tmp = tempfile::tempdir().unwrap();
    // A data file too short for the sequence length is an io failure found after start-up.
    let short = tmp.path().join("short.txt");
    std::fs::write(&short, b"too short").unwrap();
    let dir = tmp.path().join("logs");
    let (code, err) = worker_alone(&[
        "--model",
        "tiny",
        "--stage",
        "0",
        "--seq-len",
        "64",
        "--data",
        short.to_str().unwrap(),
        "--log-dir",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(code, 5, "{err}");
    let recs = records(&dir.join("rank0.jsonl"));
    let kinds: Vec<&str> = recs.iter().map(Record::event).collect();
    assert_eq!(kinds, ["start", "error", "end"]);
    match (&recs[1], &recs[2]) {
        (Record::Error(e), Record::End(end)) => {
            assert_eq!(e.class, ErrorClass::Io);
            assert!(e.message.contains("short.txt"));
            assert_eq!(end.status, RunStatus::Failed);
            assert_eq!(end.exit_code, 5);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn hpz_keeps_backward_gathers_in_the_group_and_trains_the_same_model() {
    let tmp = tempfile::tempdir().unwrap();
    let reference = losses(
        &train(1, &tmp.path().join("ref"), &on_text(&[TINY_FP32, &["--stage", "0", "--micro-batch", "4"]].concat()))[0],
    );
    let ranks = train(
        4,
        &tmp.path().join("hpz"),
        &on_text(&[TINY_FP32, &["--stage", "3", "--hpz", "2", "--micro-batch", "1"]].concat()),
    );
    let diff = max_rel_diff(&losses(&ranks[0]), &reference);
    assert!(diff <= 1e-5, "hpZ on 4 ranks in groups of 2: relative loss difference {diff:e}");
    let spec = ModelPreset::Tiny.spec();
    for recs in &ranks {
        // The secondary partition: this rank's half of every unit, within its group of 2.
        assert_eq!(setup(recs).buffers_bytes["hpz_secondary"], padded_params(&spec, 4) / 2 * 4);
        assert_traffic(recs);
        let step = steps(recs).pop().expect("step records");
        // Forward gathers go over all ranks, backward ones over the group.
        assert!(step.comm["all_gather"].calls > 0 && step.comm["all_gather_group"].calls > 0, "{:?}", step.comm);
    }
    // A group size that does not divide the ranks is refused before any work.
    let bad = run(mpirun(3)
        .arg(worker())
        .args(["--model", "tiny", "--stage", "3", "--hpz", "2", "--log-dir"])
        .arg(tmp.path().join("bad")));
    assert_eq!(bad.status.code(), Some(2), "{}", String::from_utf8_lossy(&bad.stderr));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--hpz"));
}

/// `--eval-every 5`: after steps 5, 10, 15 and 20 every rank logs the mean loss over one global
/// batch held out of the text. The held-out batch is the same however it is split over ranks,
/// micro-steps and stages, so every split logs the reference's evaluation losses; the evaluation's
/// gathers stay out of the step records; ingest reports the last evaluation and its perplexity.
#[test]
fn evaluation_holds_out_text_and_every_split_agrees_on_its_loss() {
    let tmp = tempfile::tempdir().unwrap();
    let evals = |recs: &[Record]| -> Vec<(u32, f64)> {
        recs.iter()
            .filter_map(|r| if let Record::Eval(e) = r { Some((e.step, e.loss.expect("a finite loss"))) } else { None })
            .collect()
    };
    let flags = |extra: &[&str]| on_text(&[TINY_FP32, &["--eval-every", "5"], extra].concat());
    let reference = train(1, &tmp.path().join("ref"), &flags(&["--stage", "0", "--micro-batch", "4"]));
    let want = evals(&reference[0]);
    assert_eq!(want.iter().map(|e| e.0).collect::<Vec<_>>(), [4, 9, 14, 19]);
    assert!(want[0].1 - want[3].1 > 0.5, "the held-out loss falls as the model learns: {want:?}");
    let splits: [(usize, &[&str]); 4] = [
        (2, &["--stage", "3", "--micro-batch", "2"]),
        (2, &["--stage", "2", "--micro-batch", "1", "--grad-accum", "2"]),
        (1, &["--stage", "1", "--micro-batch", "2", "--grad-accum", "2"]),
        (4, &["--stage", "3", "--micro-batch", "1", "--hpz", "2"]),
    ];
    for (i, (n, split)) in splits.into_iter().enumerate() {
        let dir = tmp.path().join(format!("split{i}"));
        let ranks = train(n, &dir, &flags(split));
        for r in &ranks {
            let got = evals(r);
            assert_eq!(got.len(), want.len(), "{split:?} on {n} ranks: {got:?}");
            for ((s, l), (s0, l0)) in got.iter().zip(&want) {
                assert_eq!(s, s0);
                assert!(((l - l0) / l0).abs() <= 1e-5, "{split:?} on {n} ranks after step {s}: {l} vs {l0}");
            }
            // The evaluation's collectives are not charged to any step.
            assert_traffic(r);
        }
        let ingested =
            zerobench_ingest::ingest(std::slice::from_ref(&dir), &Default::default(), &zerobench_ingest::NoProgress);
        let rows = zerobench_ingest::tables::Tables::build(&ingested.runs).runs;
        // The tables show 6 significant digits.
        let last = evals(&ranks[0])[3].1;
        let near = |got: Option<f64>, want: f64| got.is_some_and(|g| ((g - want) / want).abs() < 1e-5);
        assert_eq!(rows.len(), 1, "{:?}", ingested.problems);
        assert!(near(rows[0].eval_loss, last) && near(rows[0].perplexity, last.exp()), "{:?} for {last}", rows[0]);
    }
    // Training with evaluation reads only the text before its held-out end: other samples, other
    // losses than without it.
    let plain =
        train(1, &tmp.path().join("plain"), &on_text(&[TINY_FP32, &["--stage", "0", "--micro-batch", "4"]].concat()));
    assert!(evals(&plain[0]).is_empty());
    assert_ne!(losses(&plain[0]), losses(&reference[0]));
}

#[test]
fn copy_engines_are_refused_without_gpus() {
    let tmp = tempfile::tempdir().unwrap();
    for (value, device, says) in [("all-gather", "cpu", "not with --device cpu"), ("some", "auto", "all-gather, all")] {
        let out = run(std::process::Command::new(worker())
            .args(["--model", "tiny", "--stage", "3", "--device", device, "--copy-engines", value, "--log-dir"])
            .arg(tmp.path().join(value)));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("--copy-engines") && stderr.contains(says), "{stderr}");
    }
}

/// `--cuda-graph` replays GPU work: refused on a CPU (asked for, and found by `auto` on a host
/// without a GPU: before the log opens, as a bad flag is, so no log holds an `error` without a
/// `start`), and beside the per-segment timers of `--trace` and `--profile-step`; each refusal
/// names the flag.
#[test]
fn cuda_graphs_are_refused_without_gpus_and_beside_segment_timers() {
    let tmp = tempfile::tempdir().unwrap();
    let cases: [(&str, &[&str], &str); 4] = [
        ("cpu", &["--device", "cpu"], "not with --device cpu"),
        ("auto", &["--device", "auto"], "found no GPU"),
        ("trace", &["--device", "cpu", "--trace"], "--trace"),
        ("profile", &["--device", "cpu", "--profile-step", "2"], "--profile-step"),
    ];
    for (name, extra, says) in cases {
        if name == "auto" && std::path::Path::new("/dev/nvidia0").exists() {
            continue; // a GPU host: auto finds it
        }
        let out = run(Command::new(worker())
            .args(["--model", "tiny", "--stage", "0", "--steps", "4", "--warmup", "2", "--cuda-graph"])
            .args(extra)
            .arg("--log-dir")
            .arg(tmp.path().join(name)));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {stderr}");
        assert!(stderr.contains("--cuda-graph") && stderr.contains(says), "{name}: {stderr}");
    }
    if !std::path::Path::new("/dev/nvidia0").exists() {
        assert!(!tmp.path().join("auto").exists(), "a run refused for its device wrote a log");
        // Two ranks asking for a GPU on a host without one: both refused at once, no log.
        let out = run(mpirun(2)
            .arg(worker())
            .args(["--model", "tiny", "--stage", "0", "--steps", "3", "--device", "cuda", "--log-dir"])
            .arg(tmp.path().join("cuda")));
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(stderr(&out).contains("--device cuda was requested"), "{}", stderr(&out));
        assert!(!tmp.path().join("cuda").exists(), "a run refused for its device wrote a log");
    }
}

/// `--torch-profile` writes libtorch's trace of the profiled step (its operators, as Chrome trace
/// events) beside the log, and asks for `--profile-step` (or `--cuda-graph`); a step past the
/// run's is refused.
#[test]
fn torch_profile_traces_the_profiled_step() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("p");
    let out = run(Command::new(worker())
        .args(["--model", "tiny", "--stage", "0", "--steps", "3", "--warmup", "1", "--device", "cpu", "--threads", "1"])
        .args(["--profile-step", "1", "--torch-profile", "--log-dir"])
        .arg(&dir));
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(dir.join("torch-profile-rank0.json")).expect("the trace");
    let trace: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let ops: Vec<&str> = trace["traceEvents"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["cat"] == "cpu_op")
        .filter_map(|e| e["name"].as_str())
        .collect();
    // The model's products, and the backward pass (the autograd engine's nodes).
    assert!(
        ops.iter().any(|n| n.starts_with("aten::addmm") || n.starts_with("aten::mm")),
        "{:?}",
        &ops[..ops.len().min(20)]
    );
    assert!(ops.iter().any(|n| n.starts_with("autograd::engine::evaluate_function")), "no backward operators");

    let alone = run(Command::new(worker())
        .args(["--model", "tiny", "--stage", "0", "--device", "cpu", "--torch-profile", "--log-dir"])
        .arg(tmp.path().join("alone")));
    let stderr = String::from_utf8_lossy(&alone.stderr);
    assert_eq!(alone.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--profile-step"), "{stderr}");

    // A step the run never reaches is refused before anything runs, naming the flag.
    let dir = tmp.path().join("past");
    let past = run(Command::new(worker())
        .args(["--model", "tiny", "--stage", "0", "--device", "cpu", "--threads", "1", "--steps", "3"])
        .args(["--profile-step", "3", "--torch-profile", "--log-dir"])
        .arg(&dir));
    let stderr = String::from_utf8_lossy(&past.stderr);
    assert_eq!(past.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--profile-step 3 is past the run's last step, 2"), "{stderr}");
    assert!(!dir.join("torch-profile-rank0.json").exists());
}

/// The smallest model on the CPU, short sequences: a rank whose steps take milliseconds, for the
/// tests of what happens around its log.
const TINY_CPU: [&str; 8] = ["--model", "tiny", "--stage", "0", "--device", "cpu", "--seq-len", "16"];

/// Standard error that cannot be written (a Slurm output file on a full disk) loses the worker's
/// messages, not its exit code (it aborted, 134, after an `end` saying 0); a log past a file-size
/// limit (`ulimit -f`) ends the rank with exit 5 naming the log (it was killed by SIGXFSZ, 153,
/// with no word).
#[test]
fn a_full_stderr_or_a_file_size_limit_ends_the_rank_as_its_log_says() {
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("full-stderr");
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
    let status = Command::new(worker())
        .args(TINY_CPU)
        .args(["--steps", "3", "--log-dir", logs.to_str().unwrap()])
        .stderr(full)
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(0));
    let end = std::fs::read_to_string(logs.join("rank0.jsonl")).unwrap();
    assert!(end.lines().last().unwrap().contains("\"status\":\"ok\""), "{end}");
    // The rank alone (an MPI singleton, whose start failed inside Open MPI under the limit) and
    // one met through the environment.
    for rendezvous in ["mpi", "env"] {
        let logs = tmp.path().join(format!("limited-{rendezvous}"));
        let mut rank = Command::new("sh");
        rank.arg("-c")
            .arg("ulimit -f 3 && exec \"$0\" \"$@\"")
            .arg(worker())
            .args(TINY_CPU)
            .args(["--steps", "200", "--rendezvous", rendezvous, "--log-dir", logs.to_str().unwrap()])
            .env_remove("PMIX_MCA_gds");
        if rendezvous == "env" {
            rank.env("RANK", "0")
                .env("WORLD_SIZE", "1")
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", crate::support::free_port().to_string());
        }
        let out = rank.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(5), "{rendezvous}: {err}");
        assert!(err.contains("rank0.jsonl") && err.contains("File too large"), "{rendezvous}: {err}");
        // The line the limit cut is taken back: whole records only (it ended mid-record).
        let log = std::fs::read_to_string(logs.join("rank0.jsonl")).unwrap();
        assert!(log.ends_with('\n'), "{log}");
        assert!(log.lines().all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok()), "{log}");
    }
}

/// A log folder removed while the run goes on takes every record with it: the rank says so and
/// exits 5 (it exited 0 with its summary, as if its results were somewhere).
#[test]
fn a_log_removed_during_the_run_is_a_failure() {
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("gone");
    let child = Command::new(worker())
        .args(TINY_CPU)
        .args(["--steps", "3000", "--log-dir", logs.to_str().unwrap()])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t = std::time::Instant::now();
    while std::fs::read_to_string(logs.join("rank0.jsonl")).map_or(0, |l| l.matches("\"event\":\"step\"").count()) < 5 {
        assert!(t.elapsed() < std::time::Duration::from_secs(60), "no steps");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    std::fs::remove_dir_all(&logs).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{err}");
    assert!(err.contains("was removed during the run"), "{err}");
}

/// A rank signalled the moment its log exists (before its `start` record is written, or even
/// before its signal thread runs) still leaves a log that begins with `start` and ends with
/// `error` and `end`: it left `error`+`end` with no `start` (which ingest cannot attribute), or an
/// empty log that the next run into the folder refused, in most such runs. Eight tries, each
/// with the signal sent within a fraction of a millisecond of the log's creation.
#[test]
fn a_rank_signalled_as_its_log_opens_still_logs_its_start() {
    let tmp = tempfile::tempdir().unwrap();
    for i in 0..8 {
        let logs = tmp.path().join(format!("try{i}"));
        let log = logs.join("rank0.jsonl");
        let mut child = Command::new(worker())
            .args(TINY_CPU)
            .args(["--steps", "100000", "--log-dir", logs.to_str().unwrap()])
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let t = std::time::Instant::now();
        while !log.exists() && t.elapsed() < std::time::Duration::from_secs(60) {
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        // SAFETY: a signal to the child this test started.
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
        assert_eq!(child.wait().unwrap().code(), Some(143), "try {i}");
        let text = std::fs::read_to_string(&log).unwrap();
        let events: Vec<String> = text
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["event"].as_str().unwrap().to_string())
            .filter(|e| e != "step" && e != "setup")
            .collect();
        assert_eq!(events, ["start", "error", "end"], "try {i}: {text}");
    }
}

/// `--trace` keeps the rank log's rules: a link planted under the trace's name is never written
/// through (its target keeps its bytes), an earlier trace is replaced only with `--overwrite`,
/// and a trace that cannot be written fails the run (exit 5, `error` naming it) instead of an
/// exit 0 with the trace missing.
#[test]
fn a_trace_is_never_written_through_a_link_nor_over_an_earlier_one() {
    let tmp = tempfile::tempdir().unwrap();
    let trace = |dir: &Path, extra: &[&str]| {
        let mut c = Command::new(worker());
        c.args(TINY_CPU).args(["--steps", "3", "--trace"]);
        run(c.args(extra).arg("--log-dir").arg(dir))
    };
    let victim = tmp.path().join("victim");
    std::fs::write(&victim, "precious").unwrap();
    let linked = tmp.path().join("linked");
    std::fs::create_dir(&linked).unwrap();
    std::os::unix::fs::symlink(&victim, linked.join("trace-rank0.json")).unwrap();
    let out = trace(&linked, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{err}");
    assert!(err.contains("trace-rank0.json") && err.contains("--overwrite"), "{err}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    let log = std::fs::read_to_string(linked.join("rank0.jsonl")).unwrap();
    assert!(log.contains("\"class\":\"io\"") && log.contains("\"exit_code\":5"), "{log}");
    // With --overwrite the link is replaced by the trace, its target untouched.
    let out = trace(&linked, &["--overwrite"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(std::fs::symlink_metadata(linked.join("trace-rank0.json")).unwrap().is_file());
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    let spans: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(linked.join("trace-rank0.json")).unwrap()).unwrap();
    assert!(spans["traceEvents"].as_array().is_some_and(|e| e.len() > 2), "{spans}");
}

/// Counts far past what a run can hold are results, not slow deaths: a `--grad-accum` whose
/// micro-batches a CPU step cannot hold at once is an `oom` result before any step (it grew
/// memory step by step and ended as an internal error); a `--prefetch` past the model's units
/// gathers into one slot a unit (it allocated a slot per prefetch step: an `oom` result for a
/// run that fits).
#[test]
fn counts_past_what_a_run_can_hold_are_results_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("accum");
    let out = run(Command::new(worker()).args(TINY_CPU).args([
        "--steps",
        "3",
        "--grad-accum",
        "4294967295",
        "--log-dir",
        logs.to_str().unwrap(),
    ]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("micro-batches"), "{err}");
    let log = std::fs::read_to_string(logs.join("rank0.jsonl")).unwrap();
    assert!(log.contains("\"status\":\"oom\"") && !log.contains("\"event\":\"step\""), "{log}");
    let out = run(mpirun(2)
        .arg(worker())
        .args(["--model", "tiny", "--stage", "3", "--device", "cpu", "--seq-len", "16", "--steps", "3"])
        .args(["--prefetch", "4294967295", "--log-dir"])
        .arg(tmp.path().join("prefetch")));
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
}

/// A rank whose log's disk fills mid-run (a 64 KiB tmpfs, mounted in a mount namespace of the
/// test's own) stops while the room it keeps beyond the log is left, and its log ends with its
/// `error` (io, naming the log) and `end` (exit 5): the last step record was cut off and nothing
/// came after it, so ingest read a killed rank, not a failed one.
#[test]
fn a_full_disk_leaves_room_for_the_last_records() {
    let tmp = tempfile::tempdir().unwrap();
    let mnt = tmp.path().join("small");
    std::fs::create_dir(&mnt).unwrap();
    let out = Command::new("unshare")
        .args(["-m", "sh", "-c"])
        .arg("m=$1 w=$2; shift 2; mount -t tmpfs -o size=64k tmpfs \"$m\" || exit 99; \"$w\" \"$@\"; rc=$?; cp -r \"$m/logs\" \"$m.copy\"; exit $rc")
        .arg("sh")
        .arg(&mnt)
        .arg(worker())
        .args(TINY_CPU)
        .args(["--steps", "400"])
        .arg("--log-dir")
        .arg(mnt.join("logs"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{err}");
    assert!(err.contains("no room left for the log's last records"), "{err}");
    let copy = tmp.path().join("small.copy");
    let recs = records(&copy.join("rank0.jsonl"));
    let last: Vec<&str> = recs.iter().rev().take(2).map(Record::event).collect();
    assert_eq!(last, ["end", "error"]);
    assert!(recs.iter().filter(|r| r.event() == "step").count() > 10);
}
