//! The committed GPU logs (`bench/results/raw/`, NCCL and the copy-engine transport on 2×H200)
//! against the closed forms the CPU tests hold the worker to: every step of every run without
//! offload moved exactly the bytes `zerobench_schema::traffic` gives.

use std::process::Command;

use zerobench_schema::log::Record;
use zerobench_schema::Offload;

use crate::support::{assert_ok, assert_traffic, records, repo, run};

/// Archives of runs on 1 and 2 GPUs at every stage: gpt2 and gpt2-xl, NCCL with several bucket
/// sizes, prefetch depths and CTA limits, and the copy engines.
const ARCHIVES: &[&str] = &["gpu-2026-11-22-run4", "gpu-2026-11-22-x2-knobs", "gpu-2026-11-22-x2-copy-engines"];

#[test]
fn gpu_runs_moved_the_closed_form_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for name in ARCHIVES {
        let archive = repo(&format!("bench/results/raw/{name}.tar.gz"));
        let dir = tmp.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        assert_ok(&run(Command::new("tar").arg("xzf").arg(&archive).arg("-C").arg(&dir)), &format!("tar {name}"));
        for entry in walkdir::WalkDir::new(&dir).sort_by_file_name() {
            let entry = entry.unwrap();
            let file = entry.file_name().to_string_lossy();
            if !(file.starts_with("rank") && file.ends_with(".jsonl")) {
                continue;
            }
            let recs = records(entry.path());
            let Some(Record::Start(start)) = recs.first() else { continue };
            if start.config.offload != Offload::None || start.device.kind != "cuda" {
                continue;
            }
            assert_traffic(&recs);
            checked += 1;
        }
    }
    // 143 rank logs: stages 0-3 on 1 and 2 GPUs, prefetch 1-3, NCCL and both copy-engine modes.
    assert_eq!(checked, 143, "GPU rank logs checked");
}
