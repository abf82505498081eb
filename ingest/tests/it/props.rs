//! Property tests of the aggregations: the result does not depend on the order of lines or on
//! where files are cut for parallel reading; the figures equal a plain reference computation;
//! perfectly linear scaling has efficiency 1.

use std::fs;
use std::path::Path;

use proptest::prelude::*;
use zerobench_ingest::synth::{Fate, SynthRun};
use zerobench_ingest::tables::Tables;
use zerobench_ingest::{Options, RunReport};
use zerobench_schema::log::{CommStats, Record};
use zerobench_schema::{ModelPreset, Offload, ZeroStage};

use crate::common::{read_with, run};

fn without_dirs(mut runs: Vec<RunReport>) -> Vec<RunReport> {
    for r in &mut runs {
        r.row.dir.clear();
    }
    runs
}

/// Rewrites every log in `dir` with its lines after the first in a seeded random order (a
/// half-written last line stays last: it has no newline).
fn shuffle_logs(dir: &Path, seed: u64) {
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let text = fs::read(&p).unwrap();
        let complete = text.ends_with(b"\n");
        let mut lines: Vec<&[u8]> = text.split(|b| *b == b'\n').collect();
        let partial = lines.pop().filter(|_| !complete);
        let (first, rest) = lines.split_at_mut(1);
        let mut state = seed;
        for i in (1..rest.len()).rev() {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            rest.swap(i, (state >> 33) as usize % (i + 1));
        }
        let mut out = first[0].to_vec();
        out.push(b'\n');
        for l in rest.iter() {
            out.extend_from_slice(l);
            out.push(b'\n');
        }
        if let Some(p) = partial {
            out.extend_from_slice(p);
        }
        fs::write(&p, out).unwrap();
    }
}

fn stage(i: u8) -> ZeroStage {
    ZeroStage::try_from(i).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn line_order_and_cuts_do_not_change_the_result(
        world in 1u32..5,
        steps in 3u32..10,
        st in 0u8..4,
        chunk in 1u64..4000,
        seed in any::<u64>(),
        fate in 0u8..4,
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let mut r = run("p", ModelPreset::Gpt2, stage(st), 4, world, 60.0);
        r.config.steps = steps;
        r.seed = seed;
        r.fate = match fate {
            0 => Fate::Ok,
            1 => Fate::Oom { rank: world - 1, step: steps - 1 },
            2 => Fate::Failed { rank: 0, step: 1 },
            _ => Fate::Killed { after: steps - 1 },
        };
        r.write(&tmp.path().join("a/run")).unwrap();
        r.write(&tmp.path().join("b/run")).unwrap();
        shuffle_logs(&tmp.path().join("b/run"), seed);
        let a = read_with(&tmp.path().join("a"), &Options::default());
        let b = read_with(&tmp.path().join("b"), &Options { chunk_bytes: chunk, ..Options::default() });
        prop_assert_eq!(a.problems.len(), b.problems.len());
        prop_assert_eq!(a.stats.lines, b.stats.lines);
        prop_assert_eq!(without_dirs(a.runs), without_dirs(b.runs));
    }

    #[test]
    fn figures_equal_a_reference_computation(
        world in 1u32..5,
        steps in 3u32..12,
        warmup in 0u32..3,
        jitter in 0.0f64..0.6,
        seed in any::<u64>(),
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let mut r: SynthRun = run("q", ModelPreset::Gpt2Medium, ZeroStage::Z0, 2, world, 75.0);
        r.config.steps = steps;
        r.jitter = jitter;
        r.seed = seed;
        r.write(tmp.path()).unwrap();
        let got = read_with(tmp.path(), &Options { warmup: Some(warmup), ..Options::default() });
        let row = &got.runs[0].row;

        // Reference: the slowest rank per step, steps from `warmup` on, numpy's linear quantiles.
        let mut per_step = vec![f64::MIN; steps as usize];
        let mut tokens = vec![0u64; steps as usize];
        let (mut ar_bytes, mut ar_ms) = (0f64, 0f64);
        let mut wall_ms = 0f64;
        for rank in 0..world {
            let mut own = 0f64;
            for rec in r.records(rank) {
                if let Record::Step(s) = rec {
                    per_step[s.step as usize] = per_step[s.step as usize].max(s.step_ms);
                    tokens[s.step as usize] = s.tokens;
                    if s.step >= warmup {
                        own += s.step_ms;
                        if let Some(c) = s.comm.get("all_reduce") {
                            ar_bytes += c.bytes as f64;
                            ar_ms += c.ms;
                        }
                    }
                }
            }
            wall_ms = wall_ms.max(own);
        }
        let mut t: Vec<f64> = per_step[warmup as usize..].to_vec();
        let total_ms = wall_ms;
        let total_tokens: u64 = tokens[warmup as usize..].iter().sum();
        t.sort_by(f64::total_cmp);
        let q = |p: f64| {
            let pos = p * (t.len() - 1) as f64;
            let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
            t[lo] + (t[hi] - t[lo]) * (pos - lo as f64)
        };
        let close = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() <= 1e-5 * b.abs().max(1e-9));
        prop_assert_eq!(row.steps_measured, steps - warmup);
        prop_assert!(close(row.step_ms_median, q(0.5)), "{:?} {}", row.step_ms_median, q(0.5));
        prop_assert!(close(row.step_ms_p10, q(0.1)));
        prop_assert!(close(row.step_ms_p90, q(0.9)));
        prop_assert!(close(row.tokens_per_s, total_tokens as f64 / total_ms * 1e3));
        if world > 1 {
            let c = &got.runs[0].collectives[0];
            prop_assert_eq!(c.kind.as_str(), "all_reduce");
            let factor = 2.0 * f64::from(world - 1) / f64::from(world);
            prop_assert!(close(c.busbw_gbps, ar_bytes / (ar_ms * 1e6) * factor), "{:?}", c.busbw_gbps);
        } else {
            prop_assert!(got.runs[0].collectives.is_empty());
        }
    }

    #[test]
    fn perfectly_linear_scaling_has_efficiency_one(step_ms in 1.0f64..500.0, mbs in 1u32..16, st in 0u8..4) {
        let tmp = tempfile::tempdir().unwrap();
        for gpus in [1u32, 2, 3, 4, 8] {
            let mut r = run(&format!("s{gpus}"), ModelPreset::Gpt2, stage(st), mbs, gpus, step_ms);
            r.jitter = 0.0;
            r.write(&tmp.path().join(format!("g{gpus}"))).unwrap();
        }
        let got = read_with(tmp.path(), &Options::default());
        let rows = Tables::build(&got.runs).scaling;
        prop_assert_eq!(rows.len(), 5);
        for r in rows {
            prop_assert_eq!(r.baseline_gpus, 1);
            prop_assert!((r.efficiency - 1.0).abs() < 1e-9, "{:?}", r);
            prop_assert!((r.speedup - f64::from(r.gpus)).abs() < 1e-5 * f64::from(r.gpus));
        }
    }
}

#[test]
fn sublinear_scaling_is_not_efficiency_one() {
    // The property above must be able to fail: slower steps at more GPUs lower the efficiency.
    let tmp = tempfile::tempdir().unwrap();
    for (gpus, ms) in [(1u32, 100.0), (2, 125.0)] {
        let mut r = run(&format!("s{gpus}"), ModelPreset::Gpt2, ZeroStage::Z1, 4, gpus, ms);
        r.jitter = 0.0;
        r.write(&tmp.path().join(format!("g{gpus}"))).unwrap();
    }
    let rows = Tables::build(&read_with(tmp.path(), &Options::default()).runs).scaling;
    assert_eq!(rows[1].efficiency, 0.8);
    assert_eq!(rows[1].speedup, 1.6);
}

/// An offload run with hpZ (stage 3, groups of 2 of its 4 ranks), whose steps carry the kinds such
/// runs add: the copies `d2h` and `h2d`, and `all_gather_group` on the group's communicator. Each
/// is accounted per rank and step, with its own bus-bandwidth factor: 1 for a copy, (g−1)/g over
/// the g ranks of the group for a group collective, (n−1)/n over the world for the world's.
#[test]
fn offload_and_hpz_kinds_get_their_bus_bandwidth() {
    let tmp = tempfile::tempdir().unwrap();
    let mut r = run("hpz", ModelPreset::Gpt2, ZeroStage::Z3, 4, 4, 60.0);
    r.config.offload = Offload::Optimizer;
    r.config.engine.hpz = Some(2);
    let added = [("d2h", 400_000_000u64, 8.0), ("h2d", 200_000_000, 4.0), ("all_gather_group", 300_000_000, 2.0)];
    for rank in 0..4 {
        let mut log = String::new();
        for mut rec in r.records(rank) {
            if let Record::Step(s) = &mut rec {
                for (name, bytes, ms) in added {
                    let stats = CommStats { calls: 2, bytes, ms, max_bytes: bytes / 2, bus_gbps: None };
                    s.comm.insert(name.to_string(), stats);
                }
            }
            log += &serde_json::to_string(&rec).unwrap();
            log.push('\n');
        }
        fs::write(tmp.path().join(format!("rank{rank}.jsonl")), log).unwrap();
    }
    let got = read_with(tmp.path(), &Options::default());
    assert!(got.problems.is_empty(), "{:#?}", got.problems);
    let kinds = &got.runs[0].collectives;
    let kind = |name: &str| kinds.iter().find(|c| c.kind == name).unwrap_or_else(|| panic!("no {name} row"));
    for (name, bytes, ms) in added {
        let c = kind(name);
        assert_eq!((c.calls_per_step, c.bytes_per_step, c.ms_per_step), (2.0, bytes as f64, ms), "{name}");
        let algbw = bytes as f64 / (ms * 1e6);
        let factor = if name == "all_gather_group" { 0.5 } else { 1.0 };
        assert_eq!((c.algbw_gbps, c.busbw_factor), (Some(algbw), Some(factor)), "{name}");
        assert_eq!(c.busbw_gbps, Some(algbw * factor), "{name}");
    }
    assert_eq!(kind("all_gather").busbw_factor, Some(0.75));
}
