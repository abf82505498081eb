//! The real thing: render a 2-run CPU sweep, submit it with sbatch to the local Slurm, let
//! `srun --mpi=pmix` start the real `zerobench-worker` ranks, wait for the jobs, and validate
//! every line of `rank0.jsonl` and `rank1.jsonl` against the log schema. Once with both ranks on
//! one node and once with one rank on each of two fake nodes, so node rank and local rank differ.
//!
//! The same with the torchrun method: `srun --mpi=none`, each task given RANK, WORLD_SIZE,
//! LOCAL_RANK, MASTER_ADDR and MASTER_PORT by the rendered wrapper, the ranks meeting at rank 0's
//! TCP store.
//!
//! Needs the worker (`support::bin`, with the libtorch environment of `make env`) and the local
//! Slurm; `scripts/test.sh` provides both.

use std::path::PathBuf;
use std::time::Duration;

use zerobench_schema::log::{Record, RunStatus};

use crate::slurm::{wait_final, zb};
use crate::support::{job_output, log_tails, records, slurm_conf, stderr, stdout, steps, worker, write_script};

fn sweep_on(method: &str, nodes: u32, ranks_per_node: u32) {
    let Some(conf) = slurm_conf() else { return };
    let worker = worker();
    let dir = tempfile::tempdir().unwrap();
    // The fake nodes' names do not resolve; they all are this host. This scontrol expands
    // hostlists as Slurm's does, then names the host by address (the torchrun method's MASTER_ADDR).
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    write_script(
        &bin.join("scontrol"),
        "set -o pipefail\n/usr/bin/scontrol \"$@\" | sed -E 's/^node[0-9]+$/127.0.0.1/'",
    );
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let spec = dir.path().join("e2e.yaml");
    std::fs::write(
        &spec,
        format!(
            "cluster:\n  partition: debug\n  time: '5'\n  env:\n    OMP_NUM_THREADS: '1'\n    OMPI_MCA_btl: self,tcp\n    PATH: {path:?}\n\
             launch:\n  method: {method}\n  worker: {:?}\nworker:\n  device: cpu\n  steps: 4\n  warmup: 1\n  seq_len: 32\n\
             sweep:\n  models: tiny\n  stages: [0, 3]\n  precision: fp32\n  micro_batches: 2\n  nodes: {nodes}\n  ranks_per_node: {ranks_per_node}\n",
            worker.to_str().unwrap()
        ),
    )
    .unwrap();
    let out = dir.path().join("runs");
    let o = zb(&conf, &["submit", spec.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let rows = wait_final(&conf, &out, Duration::from_secs(300));
    for row in &rows {
        let run_dir = PathBuf::from(row["dir"].as_str().unwrap());
        let output = job_output(&run_dir);
        assert_eq!(row["state"], "done", "{row:#}\njob output:\n{output}\nrank logs:\n{}", log_tails(&run_dir));
        for rank in 0..nodes * ranks_per_node {
            let log = run_dir.join(format!("logs/rank{rank}.jsonl"));
            assert!(log.is_file(), "{} is missing; job output:\n{output}", log.display());
            let recs = records(&log);
            let Some(Record::Start(start)) = recs.first() else {
                panic!("{}: first record is not start", log.display())
            };
            assert_eq!(start.rank, rank);
            assert_eq!(start.world_size, nodes * ranks_per_node);
            assert_eq!(start.nodes, nodes, "{}", log.display());
            assert_eq!(start.node_rank, rank / ranks_per_node, "{}", log.display());
            assert_eq!(start.local_rank, rank % ranks_per_node, "{}", log.display());
            assert_eq!(start.run_id, row["id"].as_str().unwrap());
            let source = if method == "torchrun" { "env" } else { "mpi" };
            assert_eq!(start.rank_source, source, "{}", log.display());
            assert!(steps(&recs).len() >= 4, "{}", log.display());
            assert!(matches!(recs.last(), Some(Record::End(e)) if e.status == RunStatus::Ok), "{}", log.display());
        }
    }
}

#[test]
fn two_ranks_on_one_node() {
    sweep_on("srun", 1, 2);
}

#[test]
fn one_rank_on_each_of_two_nodes() {
    sweep_on("srun", 2, 1);
}

#[test]
fn torchrun_two_ranks_on_one_node() {
    sweep_on("torchrun", 1, 2);
}

#[test]
fn torchrun_one_rank_on_each_of_two_nodes() {
    sweep_on("torchrun", 2, 1);
}
