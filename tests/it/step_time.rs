//! What a step's time means (schema version 2), checked on real ranks under `mpirun` for every
//! stage and offload setting: the interval between two step records is the later one's
//! `step_ms + overhead_ms`, the five phases add up to `step_ms`, the loop's own cost is small, and
//! every rank's summary gives the run's step time by ingest's rule (per step the slowest rank,
//! then the median).

use zerobench_schema::log::{Record, Step, SCHEMA_VERSION};
use zerobench_schema::stats::median;

use crate::support::{steps, train};

/// Relative differences, per consecutive pair of steps: the records' interval against the later
/// step's `step_ms + overhead_ms`.
fn interval_errors(steps: &[&Step]) -> Vec<f64> {
    steps
        .windows(2)
        .map(|w| {
            let interval_ms = (w[1].ts - w[0].ts) * 1e3;
            let logged = w[1].step_ms + w[1].overhead_ms;
            (interval_ms - logged).abs() / logged
        })
        .collect()
}

/// Per step, how far the five phases' sum is from `step_ms`, relative.
fn phase_errors(steps: &[&Step]) -> Vec<f64> {
    steps
        .iter()
        .map(|s| {
            let sum = s.forward_ms + s.backward_ms + s.exposed_comm_ms + s.optimizer_ms + s.other_ms;
            (sum - s.step_ms).abs() / s.step_ms
        })
        .collect()
}

#[test]
fn step_records_account_for_all_of_the_wall_time() {
    let tmp = tempfile::tempdir().unwrap();
    let cases: [(&str, &str); 6] =
        [("0", "none"), ("1", "none"), ("2", "none"), ("3", "none"), ("2", "optimizer"), ("3", "optimizer+params")];
    for (stage, offload) in cases {
        let what = format!("stage {stage}, offload {offload}");
        let dir = tmp.path().join(format!("z{stage}_{offload}"));
        let args = [
            "--model",
            "tiny",
            "--seq-len",
            "64",
            "--micro-batch",
            "2",
            "--steps",
            "14",
            "--warmup",
            "2",
            "--threads",
            "1",
            "--stage",
            stage,
            "--offload",
            offload,
        ];
        let ranks = train(2, &dir, &args);
        let mut slowest: Vec<f64> = Vec::new();
        for (r, recs) in ranks.iter().enumerate() {
            let all = steps(recs);
            assert!(
                all.iter().all(|s| s.v == SCHEMA_VERSION),
                "{what}, rank {r}: the worker writes the current version"
            );
            assert_eq!(all[0].overhead_ms, 0.0, "{what}, rank {r}: the first step has no step before it");
            let measured: Vec<&Step> = all.iter().copied().filter(|s| !s.warmup).collect();
            let interval = median(&interval_errors(&measured)).unwrap();
            assert!(
                interval <= 0.01,
                "{what}, rank {r}: record intervals differ from step + overhead by {:.3}% (median)",
                interval * 100.0
            );
            let phases = median(&phase_errors(&measured)).unwrap();
            assert!(phases <= 0.01, "{what}, rank {r}: phases differ from the step by {:.3}% (median)", phases * 100.0);
            for s in &measured {
                assert!(s.overhead_ms > 0.0, "{what}, rank {r}, step {}: the loop's own cost is measured", s.step);
                assert!(s.other_ms >= 0.0 && s.exposed_comm_ms >= 0.0);
            }
            if slowest.is_empty() {
                slowest = measured.iter().map(|s| s.step_ms).collect();
            } else {
                for (m, s) in slowest.iter_mut().zip(&measured) {
                    *m = m.max(s.step_ms);
                }
            }
        }
        // Every rank's summary is the run's: the median over steps of the slowest rank.
        let want = median(&slowest).unwrap();
        for (r, recs) in ranks.iter().enumerate() {
            let Some(Record::End(end)) = recs.last() else { panic!("{what}, rank {r}: no end record") };
            let got = end.summary.expect("a summary").step_ms_median;
            assert!(
                (got - want).abs() <= 1e-9 * want,
                "{what}, rank {r}: summary {got} ms, slowest-rank median {want} ms"
            );
        }
    }
}
