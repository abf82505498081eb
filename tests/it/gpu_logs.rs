//! The committed GPU logs (`bench/results/raw/`: NCCL and the copy-engine transport on 1 and 2
//! H200s, one H100) against the closed forms the CPU tests hold the worker to: every step of every
//! run moved exactly the bytes `zerobench_schema::traffic` gives; and the logs written since the
//! step-time definition of schema version 2 against that definition.

use std::process::Command;

use std::path::{Path, PathBuf};

use zerobench_schema::log::{Record, Step};

use crate::support::{assert_ok, assert_traffic, records, repo, run, steps};

/// The committed archives of GPU rank logs of earlier builds (with [`CURRENT_ONE_GPU_ARCHIVES`],
/// every one but `x2-copy-engines-first`, whose runs predate the final form of the copy-engine
/// option (`copy_engines: true`) and no longer parse).
const EARLIER_ARCHIVES: &[&str] = &[
    "gpu-2026-11-21-smoke",
    "gpu-2026-11-22-offload-faults",
    "gpu-2026-11-22-offload1-fits",
    "gpu-2026-11-22-x2-offload-forward-order",
    "gpu-2026-11-22-x2-verify-offload",
    "gpu-2026-11-22-run3",
    "gpu-2026-11-22-run4",
    "gpu-2026-11-22-x2-knobs",
    "gpu-2026-11-22-x2-copy-engines",
    "gpu-2026-11-22-x2-copy-engines-xl",
    "gpu-2026-11-22-x2-interference-a",
    "gpu-2026-11-22-x2-interference-b",
    "gpu-2026-11-22-x2-t5",
    "gpu-2026-11-22-x2-t5-fits",
    "gpu-2026-11-23-step-time",
];

/// Archives of the engine as it is now on one GPU (from 96d5287: stages 2 and 3 write gradients in
/// place, stage 3 keeps its parameters whole): `stage-ab`, `step-ab` and `same-losses` (every
/// stage, accumulation, each offload), the cost model's one-GPU runs at stages 0 and 3,
/// `step-time` (ec8ce60; 9ce8758 and 5a45d02, gpt2 and gpt2-xl, eager and replayed, and 5a45d02's
/// gpt2-xl again; 5a45d02's replayed updates beside the backward) and `kernels`. The comparisons also hold the base build's runs, in folders named
/// `*_base*` by `bench/gpu/run.sh` (logs of these builds do not name their commit:
/// `start.versions.commit` came later).
const CURRENT_ONE_GPU_ARCHIVES: &[&str] = &[
    "gpu-2026-12-02-stage-ab-h200x1-96d5287",
    "gpu-2026-12-02-h200x1-costmodel-z0z3-96d5287",
    "gpu-2026-12-02-step-ab-h200x1-c919ace",
    "gpu-2026-12-02-same-losses-h200x1-ec8ce60",
    "gpu-2026-12-02-step-time-gpt2-xl-h200x1-ec8ce60",
    "gpu-2026-12-02-kernels-gpt2-xl-h200x1-ec8ce60",
    "gpu-2026-12-03-step-time-h200x1-9ce8758",
    "gpu-2026-12-03-step-time-h200x1-5a45d02",
    "gpu-2026-12-03-step-time-refs-beside-h200x1-5a45d02",
];

/// Archives written by schema version 2's worker (step time = all of the step's work): the first,
/// and the latest three `step-time` calls on one GPU.
const V2_ARCHIVES: &[&str] = &[
    "gpu-2026-11-23-step-time",
    "gpu-2026-12-03-step-time-h200x1-9ce8758",
    "gpu-2026-12-03-step-time-h200x1-5a45d02",
    "gpu-2026-12-03-step-time-refs-beside-h200x1-5a45d02",
];

/// Unpacks an archive of `bench/results/raw/` into `tmp/name` and returns that folder.
fn unpack(tmp: &Path, name: &str) -> PathBuf {
    let archive = repo(&format!("bench/results/raw/{name}.tar.gz"));
    let dir = tmp.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    assert_ok(&run(Command::new("tar").arg("xzf").arg(&archive).arg("-C").arg(&dir)), &format!("tar {name}"));
    dir
}

/// Unpacks an archive of `bench/results/raw/` into `tmp` and returns its rank logs, by path.
fn rank_logs(tmp: &Path, name: &str) -> Vec<PathBuf> {
    let dir = unpack(tmp, name);
    walkdir::WalkDir::new(&dir)
        .sort_by_file_name()
        .into_iter()
        .map(|e| e.unwrap().into_path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|f| f.to_string_lossy().starts_with("rank") && p.extension().is_some_and(|x| x == "jsonl"))
        })
        .collect()
}

#[test]
fn gpu_runs_moved_the_closed_form_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut checked, mut graphs) = (0, 0);
    for name in EARLIER_ARCHIVES.iter().chain(CURRENT_ONE_GPU_ARCHIVES) {
        for path in rank_logs(tmp.path(), name) {
            let recs = records(&path);
            let Some(Record::Start(start)) = recs.first() else { continue };
            // A run out of memory before its first step moved nothing.
            if start.device.kind != "cuda" || steps(&recs).is_empty() {
                continue;
            }
            if start.config.cuda_graph {
                // One rank replaying graphs: its collectives are copies on the compute stream
                // (comm/solo.rs), none of them communication, warm-up steps included.
                let logged: Vec<_> = steps(&recs).iter().filter(|s| !s.comm.is_empty()).map(|s| s.step).collect();
                assert!(logged.is_empty(), "{}: --cuda-graph steps {logged:?} log collectives", path.display());
                graphs += 1;
            } else {
                assert_traffic(&recs);
            }
            checked += 1;
        }
    }
    // 736 rank logs: gpt2, gpt2-xl, t5-large, t5-3b, t5-11b, mistral-7b, tiny-llama and tiny in
    // bf16; stages 0-3 on 1 and 2 GPUs; prefetch 1-3; hpZ; optimizer and parameter offload; NCCL
    // and both copy-engine modes; one-GPU stage 3 gathering (earlier builds) and not (96d5287);
    // 36 of them replaying CUDA graphs.
    assert_eq!((checked, graphs), (736, 36), "GPU rank logs checked, of them replaying graphs");
}

/// The current engine's GPU logs kept the parameters as `ParamPath::of` says and allocated the
/// buffers `engine_buffer_bytes` gives: on one GPU, stage 3 gathers only with its parameters on
/// the host, and stages 2 and 3 stage gradients only with an offloaded optimizer.
#[test]
fn current_one_gpu_logs_keep_parameters_as_the_schema_says() {
    use zerobench_schema::memory::{engine_buffer_bytes, ParamPath};
    let tmp = tempfile::tempdir().unwrap();
    let (mut checked, mut whole_stage_3) = (0, 0);
    for name in CURRENT_ONE_GPU_ARCHIVES {
        for path in rank_logs(tmp.path(), name) {
            let recs = records(&path);
            let Some(Record::Start(start)) = recs.first() else { continue };
            let run = path.parent().and_then(Path::file_name).map(|n| n.to_string_lossy().into_owned());
            if start.device.kind != "cuda" || steps(&recs).is_empty() || run.is_none_or(|n| n.contains("_base")) {
                continue;
            }
            let (c, world) = (&start.config, u64::from(start.world_size));
            let s = crate::support::setup(&recs);
            let what = format!("{}: {} stage {} offload {}", path.display(), c.model, c.stage, c.offload);
            assert_eq!(ParamPath::logged(&s.buffers_bytes), ParamPath::of(c.stage, world, c.offload), "{what}");
            let buffers = engine_buffer_bytes(&c.model.spec(), c.stage, c.precision, c.offload, &c.engine, world);
            assert_eq!(s.buffers_bytes.values().sum::<u64>(), buffers, "{what}");
            checked += 1;
            whole_stage_3 +=
                usize::from(c.stage == zerobench_schema::ZeroStage::Z3 && c.offload == zerobench_schema::Offload::None);
        }
    }
    // 188 logs of 96d5287, c919ace, ec8ce60, 9ce8758 and 5a45d02, 66 of them stage 3 without
    // offload.
    assert_eq!((checked, whole_stage_3), (188, 66), "GPU rank logs checked, of them stage 3 kept whole");
}

/// Schema version 2 on a GPU: the interval between two step records is the later one's
/// `step_ms + overhead_ms` within 1% (so the step holds all of the device's work: version 1's logs
/// of the same runs were 8-30% short), the loop's own cost is at most 1% of the step (median), and
/// the five phases add up to the step within 1%.
#[test]
fn gpu_step_records_account_for_all_of_the_wall_time() {
    let tmp = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for name in V2_ARCHIVES {
        for path in rank_logs(tmp.path(), name) {
            let recs = records(&path);
            let what = path.display().to_string();
            let measured: Vec<&Step> = steps(&recs).into_iter().filter(|s| !s.warmup).collect();
            assert!(measured.len() >= 10, "{what}: {} measured steps", measured.len());
            for w in measured.windows(2) {
                let (a, b) = (w[0], w[1]);
                let ratio = (b.ts - a.ts) * 1e3 / (b.step_ms + b.overhead_ms);
                assert!((ratio - 1.0).abs() <= 0.01, "{what}, step {}: interval / (step + overhead) = {ratio}", b.step);
            }
            let mut share: Vec<f64> = measured.iter().map(|s| s.overhead_ms / s.step_ms).collect();
            share.sort_by(f64::total_cmp);
            let median = share[share.len() / 2];
            assert!(median <= 0.01, "{what}: the loop's own cost is {median} of the step (median)");
            for s in &measured {
                let sum = s.forward_ms + s.backward_ms + s.exposed_comm_ms + s.optimizer_ms + s.other_ms;
                assert!(
                    (sum / s.step_ms - 1.0).abs() <= 0.01,
                    "{what}, step {}: phases {sum} ms, step {} ms",
                    s.step,
                    s.step_ms
                );
            }
            checked += 1;
        }
    }
    // gpt2 (micro-batch 16) and gpt2-xl (micro-batch 4), stages 0-3: one H100, eager; one H200
    // (9ce8758 and 5a45d02, the latter's gpt2-xl twice), eager and replayed.
    assert_eq!(checked, 48, "version 2 GPU rank logs checked");
}

/// The step-breakdown plot of every committed GPU run: each bar adds up to its run's median step
/// within 1%. Version 1's backward contains its reductions, and the bars once stacked its exposed
/// communication on top again: T5-large at stage 3 on 2 H200s drew a 345.8 ms bar for a 198.9 ms
/// step. That run is among these.
#[test]
fn every_breakdown_bar_of_the_gpu_runs_is_its_median_step() {
    use zerobench_ingest::report::plot::breakdown_bars;
    use zerobench_ingest::tables::Tables;
    let tmp = tempfile::tempdir().unwrap();
    let mut bars_checked = 0;
    let mut double_counted_before = 0;
    for name in EARLIER_ARCHIVES.iter().chain(CURRENT_ONE_GPU_ARCHIVES) {
        let dir = unpack(tmp.path(), name);
        let got = zerobench_ingest::ingest(&[dir], &Default::default(), &zerobench_ingest::NoProgress);
        let rows = Tables::build(&got.runs).runs;
        let with_steps: Vec<_> = rows.iter().filter(|r| r.step_ms_median.is_some()).collect();
        let bars = breakdown_bars(&rows);
        assert_eq!(bars.len(), with_steps.len(), "{name}");
        for ((label, parts), row) in bars.iter().zip(&with_steps) {
            let step = row.step_ms_median.unwrap();
            let sum: f64 = parts.iter().sum();
            assert!((sum - step).abs() <= 0.01 * step, "{name} {label}: bar {sum} for a {step} ms step {parts:?}");
            let medians =
                [row.forward_ms_median, row.backward_ms_median, row.optimizer_ms_median, row.exposed_comm_ms_median];
            if medians.iter().flatten().sum::<f64>() > 1.05 * step {
                double_counted_before += 1;
            }
            bars_checked += 1;
        }
    }
    assert!(bars_checked >= 50, "{bars_checked}");
    // NVML utilisation of the version 2 runs: present, a percentage, busy, and the mean at least
    // 0.9 of the 10th percentile (90% of the steps read it or more; the mean can lie below it:
    // 9ce8758's gpt2 at stage 0 read 96% at the 10th percentile and 92.1% on average).
    for name in V2_ARCHIVES {
        let got =
            zerobench_ingest::ingest(&[tmp.path().join(name)], &Default::default(), &zerobench_ingest::NoProgress);
        for r in &got.runs {
            let (Some(mean), Some(p10)) = (r.row.gpu_util_pct_mean, r.row.gpu_util_pct_p10) else {
                panic!("{}: no utilisation", r.row.run_id)
            };
            assert!(
                (0.0..=100.0).contains(&mean)
                    && (0.0..=100.0).contains(&p10)
                    && 0.9 * p10 <= mean + 1e-9
                    && mean > 50.0,
                "{}: {mean} {p10}",
                r.row.run_id
            );
        }
    }
    assert!(double_counted_before >= 1, "the archives hold no run the old bars overstated");
}
