//! The committed GPU logs (`bench/results/raw/`: NCCL and the copy-engine transport on 1 and 2
//! H200s) against the closed forms the CPU tests hold the worker to: every step of every run moved
//! exactly the bytes `zerobench_schema::traffic` gives.

use std::process::Command;

use zerobench_schema::log::Record;

use crate::support::{assert_ok, assert_traffic, records, repo, run, steps};

/// Every committed archive of GPU rank logs but `x2-copy-engines-first`, whose runs predate the
/// final form of the copy-engine option (`copy_engines: true`) and no longer parse.
const ARCHIVES: &[&str] = &[
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
];

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
            // A run out of memory before its first step moved nothing.
            if start.device.kind != "cuda" || steps(&recs).is_empty() {
                continue;
            }
            assert_traffic(&recs);
            checked += 1;
        }
    }
    // 490 rank logs: gpt2, gpt2-xl, t5-large, t5-3b, t5-11b, mistral-7b, tiny-llama and tiny in
    // bf16; stages 0-3 on 1 and 2 GPUs; prefetch 1-3; hpZ; optimizer and parameter offload; NCCL
    // and both copy-engine modes.
    assert_eq!(checked, 490, "GPU rank logs checked");
}
