//! The foreign formats, on the excerpts of the public DeepSpeed studies (`tests/fixtures/foreign/`): each is
//! recognised and its numbers reported.

use zerobench_ingest::tables::Tables;
use zerobench_ingest::{ProblemKind, RunRow, Source, Status};
use zerobench_schema::{Offload, Precision, ZeroStage};

use crate::common::{foreign_fixtures, read, trainer_summary};

const GIB: f64 = (1u64 << 30) as f64;

fn rows() -> Vec<RunRow> {
    let got = read(&foreign_fixtures());
    assert!(got.problems.is_empty(), "{:#?}", got.problems);
    // The rows as the tables report them (rounded to 6 significant digits).
    Tables::build(&got.runs).runs
}

fn row<'a>(rows: &'a [RunRow], id: &str) -> &'a RunRow {
    rows.iter().find(|r| r.run_id == id).unwrap_or_else(|| panic!("no run {id}"))
}

fn gib(v: f64) -> Option<u64> {
    Some((v * GIB) as u64)
}

#[test]
fn deepspeed_memory_and_breakdown_lines() {
    let rows = rows();
    assert_eq!(rows.len(), 14);
    assert!(rows.iter().all(|r| r.source == Source::Foreign));
    let r = row(&rows, "004-mlp-zero2-offload-bf16");
    assert_eq!(
        (r.formats.as_str(), r.model.as_str(), r.stage, r.offload, r.precision),
        ("deepspeed", "mlp", Some(ZeroStage::Z2), Some(Offload::Optimizer), Some(Precision::Bf16))
    );
    // `time (ms) | fwd_microstep: 5.54 | bwd_microstep: 22.35 | ... | bwd_allreduce_microstep: 15.16 | step_microstep: 0.06`
    assert_eq!(
        (r.step_ms_median, r.forward_ms_median, r.backward_ms_median, r.optimizer_ms_median),
        (Some(27.95), Some(5.54), Some(22.35), Some(0.06))
    );
    assert_eq!(r.comm_ms_median, Some(15.16));
    // `MA 0.29 GB Max_MA 2.67 GB CA 2.93 GB Max_CA 3 GB` is the largest.
    assert_eq!((r.peak_allocated_bytes, r.peak_reserved_bytes), (gib(2.67), gib(3.0)));

    let r = row(&rows, "004-mistral-7b-zero2-offload-sdpa-bf16");
    assert_eq!((r.step_ms_median, r.comm_ms_median), (Some(8869.19), Some(462.79)));
    assert_eq!((r.peak_allocated_bytes, r.peak_reserved_bytes), (gib(43.29), gib(45.27)));
    let r = row(&rows, "004-mistral-7b-zero3-offload-fp16");
    assert_eq!((r.stage, r.precision, r.step_ms_median), (Some(ZeroStage::Z3), Some(Precision::Fp16), Some(4517.77)));
    assert_eq!(r.peak_allocated_bytes, gib(62.2));

    let r = row(&rows, "004-mlp-zero3-zeropp-bf16");
    assert_eq!(r.status, Status::Failed);
    assert_eq!(
        r.status_detail.as_deref(),
        Some("RuntimeError: self and mat2 must have the same dtype, but got BFloat16 and Half")
    );
}

#[test]
fn deepspeed_throughput_timer_lines() {
    let rows = rows();
    for (id, sps, max_alloc) in [
        ("003-cifar-zero0", 502.168, 0.23),
        ("003-cifar-zero1", 357.693, 0.16),
        ("003-cifar-zero2", 242.052, 1.96),
        ("003-cifar-zero3", 140.713, 2.01),
        ("003-cifar-zero3-offload", 53.9005, 0.31),
    ] {
        let r = row(&rows, id);
        assert_eq!(r.samples_per_s, Some(sps), "{id}");
        assert_eq!(r.peak_allocated_bytes, gib(max_alloc), "{id}");
    }
    assert_eq!(row(&rows, "003-cifar-zero3-offload").offload, Some(Offload::Optimizer));
    // A log that does not say whether it offloaded is not taken for `none`.
    assert_eq!(row(&rows, "003-cifar-zero3").offload, None);
}

#[test]
fn flops_profiler_and_trainer_dicts() {
    let rows = rows();
    let r = row(&rows, "001-ds-zero1-t5small-3gpus");
    assert_eq!(r.formats, "deepspeed+hf-trainer");
    assert_eq!(
        (r.model.as_str(), r.stage, r.gpus, r.micro_batch),
        ("t5-small", Some(ZeroStage::Z1), Some(3), Some(32))
    );
    // Profiler: iter latency 487.61 ms = fwd 60 + bwd 287.7 + step 139.91; FLOPS per GPU 2.35 TFLOPS.
    assert_eq!(
        (r.step_ms_median, r.forward_ms_median, r.backward_ms_median, r.optimizer_ms_median),
        (Some(487.61), Some(60.0), Some(287.7), Some(139.91))
    );
    assert_eq!(r.tflops_per_s_per_gpu, Some(2.35));
    assert_eq!(r.tflops_per_s, Some(7.05));
    // Trainer: the median of the three workers' train_samples_per_second.
    assert_eq!((r.samples_per_s, r.ranks_read, r.final_loss), (Some(183.358), 3, Some(0.232401)));

    let r = row(&rows, "001-t5-small-no-ds");
    assert_eq!((r.formats.as_str(), r.samples_per_s, r.step_ms_median), ("hf-trainer", Some(227.686), Some(140.469)));
    let r = row(&rows, "001-ds-zero3-offload-t5large-3gpus");
    assert_eq!(
        (r.gpus, r.samples_per_s, r.samples_per_s_per_gpu, r.step_ms_median),
        (Some(3), Some(15.308), Some(5.10267), Some(6250.0))
    );
}

#[test]
fn nvidia_smi_csv_and_out_of_memory() {
    let rows = rows();
    let r = row(&rows, "constructed-nvidia-smi-gpt2-zero2-mbs8-2gpus");
    assert_eq!(r.formats, "deepspeed+nvidia-smi");
    assert_eq!(r.gpu.as_deref(), Some("NVIDIA H100 80GB HBM3"));
    assert_eq!(r.peak_nvml_used_bytes, Some(22528 << 20));
    assert_eq!(r.device_memory_bytes, Some(81559 << 20));
    // Time-weighted mean power: GPU 0 620 W over 1 s ([N/A] skipped), GPU 1 (640 + 2·660)/3 s.
    assert_eq!(r.avg_power_w_per_gpu, Some(636.667));
    // run.json gives seq 1024: 120.5 samples/s × 1024 tokens; energy = 1273.33 W / tokens/s.
    assert_eq!(r.tokens_per_s, Some(123392.0));
    assert_eq!(r.energy_j_per_token, Some(0.0103194));
    assert_eq!(r.peak_tflops_per_gpu, Some(989.0));
    assert!(r.mfu.is_some_and(|m| m > 0.0 && m < 1.0));

    let r = row(&rows, "constructed-gpt2-zero0-mbs32-1gpus-oom");
    assert_eq!((r.status, r.stage, r.micro_batch, r.gpus), (Status::Oom, Some(ZeroStage::Z0), Some(32), Some(1)));
    assert!(r.status_detail.as_deref().is_some_and(|d| d.contains("CUDA out of memory")));
}

/// A T5 run's FLOPs per token are counted as the worker counts them: at the target length the
/// launcher's `run.json` gives, else the worker's default (a quarter of the input), not at a
/// target as long as the input.
#[test]
fn t5_flops_per_token_agree_with_the_worker() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = zerobench_schema::RunConfig::new(zerobench_schema::ModelPreset::T5Small, ZeroStage::Z1);
    cfg.seq_len = 512;
    for target_len in [None, Some(64)] {
        cfg.target_len = target_len;
        let dir = tmp.path().join(format!("t5-{target_len:?}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("train.log"), "RunningAvgSamplesPerSec=100.0, CurrSamplesPerSec=101.0\n").unwrap();
        let run_json = serde_json::json!({"id": "t5", "config": cfg, "world_size": 2, "nodes": 1});
        std::fs::write(dir.join("run.json"), run_json.to_string()).unwrap();
        let got = read(&dir);
        assert!(got.problems.is_empty(), "{:#?}", got.problems);
        let r = &got.runs[0].row;
        assert_eq!((r.seq_len, r.gpus), (Some(512), Some(2)));
        assert_eq!(r.flops_per_token, Some(cfg.train_flops_per_token()), "{target_len:?}");
    }
}

/// A foreign run's identity comes from the folders below the root given to ingest only: the
/// root's own name and the folders above it (a temporary folder `.tmp3z2k` read as stage 2 once)
/// say where the logs are kept, not what ran.
#[test]
fn identity_only_from_folders_below_the_root() {
    let tmp = tempfile::tempdir().unwrap();
    let above = tmp.path().join("zero2_bs16_t5-large_4gpus");
    let root = above.join("z3_mbs64_gpt2-xl_8gpus_bf16_offload");
    let line = "RunningAvgSamplesPerSec=100.0, CurrSamplesPerSec=101.0\n";
    for dir in ["plain", "zero1-t5-small"] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
        std::fs::write(root.join(dir).join("train.log"), line).unwrap();
    }
    let got = read(&root);
    assert!(got.problems.is_empty(), "{:#?}", got.problems);
    let rows = Tables::build(&got.runs).runs;
    assert_eq!(rows.len(), 2);
    let identity = |r: &RunRow| (r.model.clone(), r.stage, r.micro_batch, r.gpus, r.precision, r.offload);
    assert_eq!(identity(row(&rows, "plain")), ("unknown".to_string(), None, None, None, None, None));
    assert_eq!(
        identity(row(&rows, "zero1-t5-small")),
        ("t5-small".to_string(), Some(ZeroStage::Z1), None, None, None, None)
    );
}

/// Text beside the logs that no reader recognises is not a run: notes in a `.txt` file, and a
/// Trainer summary quoted in a file whose extension no log has (`.md`).
#[test]
fn text_no_reader_recognises_is_not_a_run() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("notes");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("notes.txt"), "tried zero-3 on 4 GPUs, see the other folder\n").unwrap();
    std::fs::write(dir.join("summary.md"), trainer_summary(7.119)).unwrap();
    let got = read(tmp.path());
    assert!(got.runs.is_empty(), "{:?}", got.runs.iter().map(|r| &r.row.run_id).collect::<Vec<_>>());
    // The same quote in a log file is a run: the line is one a reader recognises.
    std::fs::copy(dir.join("summary.md"), dir.join("train.log")).unwrap();
    assert_eq!(read(tmp.path()).runs.len(), 1);
}

/// The folder ingest writes into, inside a folder it reads, is skipped (its CSV tables would
/// otherwise be read as logs); the runs beside it are read. Given as a folder to read, it is read.
#[test]
fn the_output_folder_is_skipped_below_a_root_not_as_one() {
    use zerobench_ingest::{ingest, NoProgress, Options};
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    crate::common::run("r", zerobench_schema::ModelPreset::Gpt2, ZeroStage::Z1, 4, 2, 50.0)
        .write(&root.join("r"))
        .unwrap();
    let out = root.join("report");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::copy(foreign_fixtures().join("001-t5-small-no-ds/train.log"), out.join("train.log")).unwrap();
    let opts = Options { skip: vec![out.clone()], ..Options::default() };
    let got = ingest(&[root.to_path_buf()], &opts, &NoProgress);
    let ids: Vec<&str> = got.runs.iter().map(|r| r.row.run_id.as_str()).collect();
    assert_eq!(ids, ["r"]);
    let alone = ingest(std::slice::from_ref(&out), &opts, &NoProgress);
    assert_eq!(alone.runs.len(), 1);
}

/// The FLOPs profiler's world size names the GPU count where nothing else does (the folder's
/// name here says nothing); a Trainer that reports no steps per second gives no step time.
#[test]
fn gpus_from_the_profiler_and_no_step_time_from_no_steps() {
    let tmp = tempfile::tempdir().unwrap();
    let (profiled, stalled) = (tmp.path().join("run-a"), tmp.path().join("run-b"));
    let fixture = foreign_fixtures().join("001-ds-zero1-t5small-3gpus");
    for dir in [&profiled, &stalled] {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::copy(fixture.join("zprofiler_result.txt"), profiled.join("zprofiler_result.txt")).unwrap();
    std::fs::write(stalled.join("train.log"), trainer_summary(0.0)).unwrap();
    let got = read(tmp.path());
    let by_id = |id: &str| &got.runs.iter().find(|r| r.row.run_id == id).unwrap_or_else(|| panic!("no {id}")).row;
    assert_eq!(by_id("run-a").gpus, Some(3));
    assert_eq!(by_id("run-b").step_ms_median, None);
}

/// DeepSpeed's step breakdowns: the first two are warm-up and left out, unless leaving them out
/// would leave none (a log that printed every few hundred steps). A run.json that is no JSON
/// object is reported, not read.
#[test]
fn few_breakdowns_are_all_kept_and_a_bad_run_json_is_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ds-run");
    std::fs::create_dir_all(&dir).unwrap();
    let breakdown = |fwd: f64| {
        format!(
            "[2024-01-01 10:00:00,000] [INFO] [logging.py:128:log_dist] [Rank 0] time (ms) | fwd_microstep: {fwd:.2} \
             | bwd_microstep: 20.00 | step_microstep: 5.00\n"
        )
    };
    std::fs::write(dir.join("train.log"), breakdown(10.0) + &breakdown(10.0)).unwrap();
    std::fs::write(dir.join("run.json"), "[1, 2]").unwrap();
    let got = read(tmp.path());
    assert_eq!(got.runs.len(), 1);
    assert_eq!(got.runs[0].row.step_ms_median, Some(35.0));
    assert!(
        got.problems.iter().any(|p| p.to_string().contains("run.json is not a JSON object")),
        "{:#?}",
        got.problems
    );
}

/// A Trainer that reports no samples per second, beside an nvidia-smi log: the GPUs' power is
/// kept, and there is no energy per token rather than an infinite one.
#[test]
fn no_throughput_gives_no_energy_per_token() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("hf-run");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("run.json"), r#"{"model": "gpt2", "seq_len": 512, "world_size": 1}"#).unwrap();
    std::fs::write(
        dir.join("train.log"),
        "{'train_runtime': 10.0, 'train_samples_per_second': 0.0, 'train_steps_per_second': 0.0, 'epoch': 1.0}\n",
    )
    .unwrap();
    std::fs::write(dir.join("gpu.csv"), "index, memory.used [MiB], power.draw [W]\n0, 1000 MiB, 300.0 W\n").unwrap();
    let got = read(tmp.path());
    assert_eq!(got.runs.len(), 1, "{:#?}", got.problems);
    let row = &got.runs[0].row;
    assert_eq!((row.tokens_per_s, row.avg_power_w_per_gpu, row.energy_j_per_token), (Some(0.0), Some(300.0), None));
}

/// A DeepSpeed log of `wall_clock_breakdown`: per optimizer step, `accum` micro-step lines
/// (`fwd_microstep`, ...) and then the global timers' line (`fwd`, ...), which sums them. Step `i`
/// (0-based) has micro-steps of forward `10 + i`, backward 20, optimizer 1 (the boundary's) or 0.
/// With `global` false the global lines are left out (an excerpt of micro-step lines).
fn wall_clock_log(steps: u32, accum: u32, global: bool) -> String {
    let stamp = "[2024-01-01 10:00:00,000] [INFO]";
    let mut log = format!("{stamp} [config.py:1000:print]   gradient_accumulation_steps .. {accum}\n");
    for i in 0..steps {
        let fwd = 10.0 + f64::from(i);
        for m in 0..accum {
            let opt = if m + 1 == accum { 1.0 } else { 0.0 };
            log.push_str(&format!(
                "{stamp} [logging.py:128:log_dist] [Rank 0] time (ms) | fwd_microstep: {fwd:.2} | bwd_microstep: 20.00 \
                 | bwd_inner_microstep: 15.00 | bwd_allreduce_microstep: 5.00 | step_microstep: {opt:.2}\n"
            ));
        }
        if global {
            let n = f64::from(accum);
            log.push_str(&format!(
                "{stamp} [logging.py:128:log_dist] [Rank 0] time (ms) | fwd: {:.2} | bwd: {:.2} | bwd_inner: {:.2} \
                 | bwd_allreduce: {:.2} | step: 1.00\n",
                fwd * n,
                20.0 * n,
                15.0 * n,
                5.0 * n
            ));
        }
    }
    log
}

/// DeepSpeed prints a breakdown line per micro-step and one per optimizer step: each optimizer
/// step is one step, at its whole time, with accumulation 1 and 4, and warmup drops optimizer
/// steps. Micro-step lines alone are summed per accumulation.
#[test]
fn deepspeed_micro_and_global_breakdowns_are_one_step() {
    for (accum, global) in [(1, true), (4, true), (4, false), (1, false)] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("ds-run");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("train.log"), wall_clock_log(10, accum, global)).unwrap();
        let got = read(tmp.path());
        assert_eq!(got.runs.len(), 1, "{:#?}", got.problems);
        let r = &got.runs[0].row;
        let n = f64::from(accum);
        // Steps 2..10 are measured (forward 12..19 per micro-step): the median's forward is 15.5.
        let what = format!("accumulation {accum}, global lines {global}");
        assert_eq!((r.grad_accum, r.warmup_steps, r.steps_measured), (Some(accum), 2, 8), "{what}");
        assert_eq!(r.forward_ms_median, Some(15.5 * n), "{what}");
        assert_eq!(r.backward_ms_median, Some(20.0 * n), "{what}");
        assert_eq!(r.optimizer_ms_median, Some(1.0), "{what}");
        assert_eq!(r.comm_ms_median, Some(5.0 * n), "{what}");
        assert_eq!(r.step_ms_median, Some(15.5 * n + 20.0 * n + 1.0), "{what}");
    }
}

/// A `run.json` of some keys only (`{"seq_len": 1024}`, as the docs suggest) gives those; the
/// stage, offload and precision DeepSpeed printed in the log still come from the log.
#[test]
fn a_partial_run_json_leaves_the_rest_to_the_logs() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    std::fs::create_dir_all(&dir).unwrap();
    let log = foreign_fixtures().join("004-mlp-zero2-offload-bf16/deepspeed.log");
    std::fs::copy(log, dir.join("deepspeed.log")).unwrap();
    std::fs::write(dir.join("run.json"), r#"{"seq_len": 1024}"#).unwrap();
    let got = read(tmp.path());
    assert_eq!(got.runs.len(), 1, "{:#?}", got.problems);
    let r = &got.runs[0].row;
    assert_eq!(
        (r.seq_len, r.stage, r.offload, r.precision),
        (Some(1024), Some(ZeroStage::Z2), Some(Offload::Optimizer), Some(Precision::Bf16))
    );
    // run.json comes first: a key it has overrides the log.
    std::fs::write(dir.join("run.json"), r#"{"seq_len": 1024, "precision": "fp32"}"#).unwrap();
    let got = read(tmp.path());
    assert_eq!((got.runs[0].row.stage, got.runs[0].row.precision), (Some(ZeroStage::Z2), Some(Precision::Fp32)));
}

/// nvidia-smi logs of two nodes in one run folder, each of GPUs 0-7: 16 GPUs, each drawing its
/// own power, so the energy per token is that of all 16, not of 8.
#[test]
fn nvidia_smi_logs_of_two_nodes_are_sixteen_gpus() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("hf-run");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("run.json"), r#"{"model": "gpt2", "seq_len": 1000, "world_size": 16, "nodes": 2}"#)
        .unwrap();
    std::fs::write(
        dir.join("train.log"),
        "{'train_runtime': 10.0, 'train_samples_per_second': 16.0, 'train_steps_per_second': 1.0, 'epoch': 1.0}\n",
    )
    .unwrap();
    for (node, watts) in [(0, 100.0), (1, 300.0)] {
        let mut csv = "index, memory.used [MiB], power.draw [W]\n".to_string();
        for gpu in 0..8 {
            csv.push_str(&format!("{gpu}, {} MiB, {watts:.1} W\n", 1000 * (node + 1)));
        }
        std::fs::write(dir.join(format!("smi-node{node}.csv")), csv).unwrap();
    }
    let got = read(tmp.path());
    assert_eq!(got.runs.len(), 1, "{:#?}", got.problems);
    let r = &got.runs[0].row;
    // 16 000 tokens/s; 8 × 100 W + 8 × 300 W = 3200 W.
    assert_eq!((r.tokens_per_s, r.avg_power_w_per_gpu), (Some(16_000.0), Some(200.0)));
    assert_eq!(r.energy_j_per_token, Some(0.2));
    assert_eq!(r.peak_nvml_used_bytes, Some(2000 << 20));
}

/// A DeepSpeed run whose Slurm output ends with slurmstepd's verdict ended as Slurm says, as a
/// zerobench run would: a job killed at its time limit is `timeout`, not `ok` (and leaves the
/// scaling table), one killed for its memory `oom`, a cancelled one `cancelled`; the verdict is
/// the row's detail. The same log without the verdict is `ok`.
#[test]
fn slurms_verdict_in_a_foreign_runs_output_is_its_end() {
    let log = std::fs::read_to_string(foreign_fixtures().join("004-mlp-zero2-offload-bf16/deepspeed.log")).unwrap();
    let status = |tail: &str| {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("run.json"), r#"{"world_size": 2}"#).unwrap();
        let rate = "[2026-11-20 09:59:00,000] [INFO] [timer.py:260:stop] epoch=0/micro_step=10/global_step=10, RunningAvgSamplesPerSec=120.5, CurrSamplesPerSec=121.0\n";
        std::fs::write(dir.join("slurm-42.out"), format!("{log}{rate}{tail}")).unwrap();
        let got = read(tmp.path());
        assert_eq!(got.runs.len(), 1, "{:#?}", got.problems);
        let r = &got.runs[0].row;
        (r.status, r.status_detail.clone().unwrap_or_default(), Tables::build(&got.runs).scaling.len())
    };
    let ok = status("");
    assert_eq!((ok.0, ok.2), (Status::Ok, 1));
    let (st, detail, scaling) =
        status("slurmstepd: error: *** JOB 42 ON n1 CANCELLED AT 2026-11-20T10:00:00 DUE TO TIME LIMIT ***\n");
    assert_eq!((st, scaling), (Status::Timeout, 0));
    assert!(detail.contains("time limit"), "{detail}");
    assert_eq!(status("slurmstepd: error: Detected 1 oom_kill event in StepId=42.0.\n").0, Status::Oom);
    assert_eq!(
        status("slurmstepd: error: *** JOB 42 ON n1 CANCELLED AT 2026-11-20T10:00:00 ***\n").0,
        Status::Cancelled
    );
}

/// A Slurm output whose progress bar redraws one line 20,000 times with `\r` (over a MiB without
/// a newline), the Trainer's result at its end: the result is read (a carriage return ends a line),
/// and CRLF line ends change nothing. A line over the limit without any is skipped and reported
/// with its file and line, not dropped in silence.
#[test]
fn progress_bars_redrawn_with_carriage_returns_do_not_hide_the_result() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("gpt2_z2_mbs8_2gpus");
    std::fs::create_dir_all(&dir).unwrap();
    let bar: String =
        (0..20_000).map(|i| format!("\r {:3}%|#####     | {i}/20000 [01:00<00:00, 7.8it/s]", i / 200)).collect();
    assert!(bar.len() > 1 << 20);
    let result = "{'train_runtime': 512.25, 'train_samples_per_second': 62.47, 'train_steps_per_second': 7.809, 'train_loss': 3.6325, 'epoch': 1.0}";
    std::fs::write(dir.join("slurm-42.out"), format!("starting\r\n{bar}{result}\r\n")).unwrap();
    let got = read(tmp.path());
    assert!(got.problems.is_empty(), "{:#?}", got.problems);
    assert_eq!(got.runs.len(), 1);
    assert_eq!(got.runs[0].row.samples_per_s, Some(62.47));

    std::fs::write(dir.join("slurm-42.out"), format!("{}\n{result}\n", "x".repeat(2 << 20))).unwrap();
    let got = read(tmp.path());
    assert_eq!(got.runs.len(), 1);
    let long: Vec<_> = got.problems.iter().filter(|p| matches!(p.kind, ProblemKind::LineTooLong { .. })).collect();
    assert_eq!(long.len(), 1, "{:#?}", got.problems);
    assert_eq!((long[0].path.clone(), long[0].line), (dir.join("slurm-42.out"), Some(1)));
}

/// Files that cannot be one run's are not joined, whatever they share: two DeepSpeed logs of one
/// printed configuration run half an hour apart (a sweep over what the configuration does not
/// print) are two runs, while the same logs at one time (two ranks) are one; Trainer results in
/// files named apart (`bert-base.log`, `bert-large.log`) are a run each, in files named alike but
/// for digits (`node0.log`, `node1.log`) one.
#[test]
fn logs_that_cannot_be_one_runs_are_not_joined() {
    let log = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/mixed/gpt2-medium-flat/ds_engine_z2_mbs8.log"),
    )
    .unwrap();
    let later = log.replace("2026-11-20 10:0", "2026-11-20 10:3");
    let runs = |files: &[(&str, &str)]| {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("sweep");
        std::fs::create_dir_all(&dir).unwrap();
        for (name, text) in files {
            std::fs::write(dir.join(name), text).unwrap();
        }
        let mut ids: Vec<String> = read(tmp.path()).runs.into_iter().map(|r| r.row.run_id).collect();
        ids.sort();
        ids
    };
    assert_eq!(
        runs(&[("gpt2-medium_seq512.log", &log), ("gpt2-medium_seq2048.log", &later)]),
        ["sweep/gpt2-medium_seq2048", "sweep/gpt2-medium_seq512"]
    );
    assert_eq!(runs(&[("rank0.log", &log), ("rank1.log", &log)]), ["sweep"]);
    let result = |samples: f64| {
        format!("{{'train_runtime': 100.0, 'train_samples_per_second': {samples}, 'train_steps_per_second': 5.0, 'train_loss': 1.0, 'epoch': 1.0}}\n")
    };
    let (a, b, c) = (result(500.0), result(100.0), result(90.0));
    assert_eq!(
        runs(&[("bert-base.log", &a), ("bert-large.log", &b), ("roberta-large.log", &c)]),
        ["sweep/bert-base", "sweep/bert-large", "sweep/roberta-large"]
    );
    assert_eq!(runs(&[("node0.log", &a), ("node1.log", &b)]), ["sweep"]);
}
