//! ZeRO-Offload on CPU over MPI: every offload setting trains the same model as stage 0 on one
//! rank, and holds exactly the device and host bytes `model_state_split` gives.

use zerobench_schema::memory::{model_state_split, padded_params};
use zerobench_schema::{ModelPreset, Offload, Precision, ZeroStage};

use crate::support::{assert_traffic, losses, max_rel_diff, on_text, setup, steps, train, TINY_FP32};

#[test]
fn offloaded_stages_follow_stage_0_and_split_states_as_the_formulas_say() {
    let tmp = tempfile::tempdir().unwrap();
    let reference = losses(
        &train(1, &tmp.path().join("ref"), &on_text(&[TINY_FP32, &["--stage", "0", "--micro-batch", "6"]].concat()))[0],
    );
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
        let args = on_text(
            &[TINY_FP32, &["--stage", &st, "--offload", &off, "--micro-batch", &mb_s, "--grad-accum", &ga_s]].concat(),
        );
        let ranks = train(n, &dir, &args);
        let diff = max_rel_diff(&losses(&ranks[0]), &reference);
        assert!(
            diff <= 1e-5,
            "stage {st} offload {off} on {n} ranks, accumulation {ga}: relative loss difference {diff:e}"
        );

        let psi = padded_params(&spec, n as u64);
        let want = model_state_split(stage, Precision::Fp32, offload, ga, psi, n as u64);
        // ZeRO-Offload's split written out for fp32 (no separate master copy): the host keeps the
        // rank's shard of the weights, Adam's m and v and the gradient, 16 bytes per parameter,
        // and 4 more for the fp32 accumulator when micro-steps accumulate outside stage 1's device
        // gradient buffer; the device keeps what the stage does not partition, and stage 3 with
        // offloaded parameters nothing at all.
        let (p, n64) = (psi, n as u64);
        let accumulator = if ga > 1 && stage != ZeroStage::Z1 { 4 * p / n64 } else { 0 };
        assert_eq!(want.host_bytes, 16 * p / n64 + accumulator, "stage {st} offload {off}");
        let device = match (stage, offload) {
            (ZeroStage::Z1, _) => 8 * p,
            (ZeroStage::Z2, _) => 4 * p,
            (ZeroStage::Z3, Offload::Optimizer) => 4 * p / n64,
            _ => 0,
        };
        assert_eq!(want.device.total(), device, "stage {st} offload {off}");
        for recs in &ranks {
            let got = setup(recs);
            assert_eq!(got.model_state, want.device, "stage {st} offload {off}");
            assert_eq!(got.host_state_bytes, want.host_bytes, "stage {st} offload {off}");
            // The log's own comparison, which ingest reports, agrees.
            assert_eq!(got.host_state_expected_bytes, Some(got.host_state_bytes));
        }
        for recs in &ranks {
            assert_traffic(recs);
        }
        // The gradient shards went to the host and the parameters came back.
        let step = steps(&ranks[0]).pop().expect("step records");
        assert!(step.comm["d2h"].calls > 0 && step.comm["h2d"].calls > 0, "{:?}", step.comm);
    }
}

#[test]
fn offload_in_fp16_skips_overflowing_steps_before_any_update() {
    let tmp = tempfile::tempdir().unwrap();
    let fp16: Vec<&str> = TINY_FP32.iter().map(|&s| if s == "fp32" { "fp16" } else { s }).collect();
    let args = on_text(
        &[&fp16[..], &["--stage", "2", "--offload", "optimizer", "--micro-batch", "2", "--loss-scale-power", "24"]]
            .concat(),
    );
    let ranks = train(2, tmp.path(), &args);
    let steps = steps(&ranks[0]);
    assert!(steps[0].skipped);
    let applied = steps.iter().position(|s| !s.skipped).expect("the scale comes down");
    assert!(steps[applied..].iter().all(|s| !s.skipped));
    assert!(steps.last().unwrap().loss < steps[0].loss, "it learns once steps apply");
}
