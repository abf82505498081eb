//! ZeRO-Offload on CPU over MPI: every offload setting trains the same model as stage 0 on one
//! rank, and holds exactly the device and host bytes `model_state_split` gives.

use std::path::Path;

use zerobench_schema::log::Record;
use zerobench_schema::memory::{model_state_split, padded_params};
use zerobench_schema::{ModelPreset, Offload, Precision, ZeroStage};

use crate::support::{assert_ok, losses, mpirun, records, root, run, worker};

fn train(n: usize, dir: &Path, args: &[String]) -> Vec<Vec<Record>> {
    let out = run(mpirun(n).arg(worker()).args(args).arg("--log-dir").arg(dir));
    assert_ok(&out, &format!("{n} ranks {args:?}"));
    (0..n).map(|r| records(&dir.join(format!("rank{r}.jsonl")))).collect()
}

fn args(extra: &[&str]) -> Vec<String> {
    let text = root().join("tests/data/declaration-of-independence.txt").display().to_string();
    ["--model", "tiny", "--seq-len", "64", "--precision", "fp32", "--lr", "1e-3", "--steps", "20", "--threads", "1", "--data", &text]
        .iter()
        .chain(extra)
        .map(|s| s.to_string())
        .collect()
}

#[test]
fn offloaded_stages_follow_stage_0_and_split_states_as_the_formulas_say() {
    let tmp = tempfile::tempdir().unwrap();
    let reference = losses(&train(1, &tmp.path().join("ref"), &args(&["--stage", "0", "--micro-batch", "6"]))[0]);
    let spec = ModelPreset::Tiny.spec();
    // (stage, offload, ranks, micro-batch, accumulation)
    let cases = [
        (ZeroStage::Z1, Offload::Optimizer, 2, 3, 1),
        (ZeroStage::Z2, Offload::Optimizer, 3, 2, 1),
        (ZeroStage::Z2, Offload::Optimizer, 2, 1, 3),
        (ZeroStage::Z3, Offload::Optimizer, 2, 3, 1),
        (ZeroStage::Z3, Offload::OptimizerParams, 3, 2, 1),
        (ZeroStage::Z3, Offload::OptimizerParams, 2, 1, 3),
    ];
    for (stage, offload, n, mb, ga) in cases {
        let (st, off, mb_s, ga_s) = (stage.to_string(), offload.to_string(), mb.to_string(), ga.to_string());
        let dir = tmp.path().join(format!("z{st}_{off}_n{n}_ga{ga}"));
        let ranks = train(n, &dir, &args(&["--stage", &st, "--offload", &off, "--micro-batch", &mb_s, "--grad-accum", &ga_s]));
        let got = losses(&ranks[0]);
        let diff = got.iter().zip(&reference).map(|(a, b)| ((a - b) / b).abs()).fold(0.0, f64::max);
        assert!(diff <= 1e-5, "stage {st} offload {off} on {n} ranks, accumulation {ga}: relative loss difference {diff:e}");
        let want = model_state_split(stage, Precision::Fp32, offload, ga, padded_params(&spec, n as u64), n as u64);
        for recs in &ranks {
            let setup = recs.iter().find_map(|r| if let Record::Setup(s) = r { Some(s) } else { None }).unwrap();
            assert_eq!(setup.model_state, want.device, "stage {st} offload {off}");
            assert_eq!(setup.host_state_bytes, want.host_bytes, "stage {st} offload {off}");
            assert_eq!(setup.host_state_expected_bytes, Some(want.host_bytes));
            assert!(want.host_bytes > 0);
        }
        // The gradient shards went to the host and the parameters came back.
        let step = ranks[0].iter().rev().find_map(|r| if let Record::Step(s) = r { Some(s) } else { None }).unwrap();
        assert!(step.comm["d2h"].calls > 0 && step.comm["h2d"].calls > 0, "{:?}", step.comm);
    }
}

#[test]
fn offload_in_fp16_skips_overflowing_steps_before_any_update() {
    let tmp = tempfile::tempdir().unwrap();
    let a = args(&["--stage", "2", "--offload", "optimizer", "--micro-batch", "2", "--loss-scale-power", "24"]);
    let a: Vec<String> = a.into_iter().map(|s| if s == "fp32" { "fp16".into() } else { s }).collect();
    let ranks = train(2, tmp.path(), &a);
    let steps: Vec<_> = ranks[0].iter().filter_map(|r| if let Record::Step(s) = r { Some(s.clone()) } else { None }).collect();
    assert!(steps[0].skipped);
    let applied = steps.iter().position(|s| !s.skipped).expect("the scale comes down");
    assert!(steps[applied..].iter().all(|s| !s.skipped));
    assert!(steps.last().unwrap().loss < steps[0].loss, "it learns once steps apply");
}
