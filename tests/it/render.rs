//! Snapshots of what `zerobench render` writes for each example spec: `job.sbatch`, pdsh's
//! `node.sh`, the hostfiles, and the key parts of `run.json`. Paths of the temporary output
//! folder are replaced by `[OUT]` and the repository by `[REPO]`.

use std::path::Path;

use zerobench_launcher::render::render;
use zerobench_launcher::{Plan, Spec};

use crate::support::{repo, root};

fn render_example(name: &str) -> (tempfile::TempDir, Plan) {
    let plan = Plan::build(Spec::load(&repo(&format!("slurm/examples/{name}.yaml"))).expect("example loads"))
        .expect("example plans");
    let out = tempfile::tempdir().expect("tempdir");
    render(&plan, out.path()).expect("renders");
    (out, plan)
}

fn filters(out: &Path) -> Vec<(String, &'static str)> {
    let out = std::fs::canonicalize(out).expect("canonical");
    vec![
        (regex_escape(&out.to_string_lossy()), "[OUT]"),
        (regex_escape(&root().to_string_lossy()), "[REPO]"),
        (r"zerobench \d+\.\d+\.\d+".into(), "zerobench [VERSION]"),
    ]
}

fn regex_escape(s: &str) -> String {
    s.chars().fold(String::new(), |mut a, c| {
        if "\\.+*?()|[]{}^$#&-~".contains(c) {
            a.push('\\');
        }
        a.push(c);
        a
    })
}

/// Snapshots `run/file` as `snap@<run>-<file>`.
fn snap_file(out: &Path, run: &str, file: &str) {
    snap(out, run, file, &format!("{run}-{file}"));
}

/// Snapshots `run/file` as `snap@<suffix>` (insta names snapshots after the function that takes
/// them), for files that the run's name alone does not tell apart.
fn snap(out: &Path, run: &str, file: &str, suffix: &str) {
    let text = std::fs::read_to_string(out.join(run).join(file)).unwrap_or_else(|e| panic!("{run}/{file}: {e}"));
    let f = filters(out);
    let f: Vec<(&str, &str)> = f.iter().map(|(a, b)| (a.as_str(), *b)).collect();
    insta::with_settings!({ filters => f, snapshot_suffix => suffix }, {
        insta::assert_snapshot!(text);
    });
}

#[test]
fn demo_local() {
    let (out, _) = render_example("demo");
    snap_file(out.path(), "tiny_z3_offnone_mb4_1x2_fp32", "job.sbatch");
}

#[test]
fn gpu_cluster_srun() {
    let (out, plan) = render_example("gpu-cluster");
    assert_eq!(plan.runs.len(), 16);
    snap_file(out.path(), "gpt2-xl_z3_offnone_mb4_2x4", "job.sbatch");
}

#[test]
fn pdsh_with_include() {
    let (out, _) = render_example("pdsh");
    let run = "gpt2-medium_z3_offnone_mb8_2x2";
    snap_file(out.path(), run, "job.sbatch");
    snap_file(out.path(), run, "node.sh");
    snap_file(out.path(), run, "hostfile.deepspeed");
}

#[test]
fn torchrun_env_ranks() {
    let (out, plan) = render_example("torchrun");
    assert_eq!(plan.runs.len(), 2);
    assert!(plan.runs.iter().all(|r| r.warnings.is_empty()), "{:?}", plan.runs[0].warnings);
    snap_file(out.path(), "gpt2-medium_z3_offnone_mb4_2x4", "job.sbatch");
}

#[test]
fn mpirun_in_allocation() {
    let (out, _) = render_example("mpirun");
    snap_file(out.path(), "gpt2_z0_offnone_mb2_2x2_fp32", "job.sbatch");
}

#[test]
fn t5_grid_offload_renders_with_its_memory_split() {
    let (out, plan) = render_example("t5-grid");
    assert_eq!(plan.runs.len(), 3 * 8 * (4 + 2 + 1));
    snap_file(out.path(), "t5-3b_z3_offparams_mb16_1x4", "job.sbatch");
    let rec: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.path().join("t5-3b_z3_offparams_mb16_1x4/run.json")).unwrap(),
    )
    .unwrap();
    let f = filters(out.path());
    let f: Vec<(&str, &str)> = f.iter().map(|(a, b)| (a.as_str(), *b)).collect();
    let keep = serde_json::json!({
        "id": rec["id"], "method": rec["method"], "world_size": rec["world_size"], "model_state": rec["model_state"],
        "device_state_bytes": rec["device_state_bytes"], "host_state_bytes": rec["host_state_bytes"], "fit": rec["fit"],
        "warnings": rec["warnings"], "worker_argv": rec["worker_argv"], "launch_argv": rec["launch_argv"],
    });
    insta::with_settings!({ filters => f }, {
        insta::assert_json_snapshot!("t5-3b_z3_offparams_mb16_1x4-run.json", keep);
    });
}

/// An MPICH and an Open MPI hostfile run, from a spec written here.
#[test]
fn mpirun_with_hostfiles() {
    let dir = tempfile::tempdir().unwrap();
    for (imp, hf, fmt) in [("openmpi", "openmpi.txt", "openmpi"), ("mpich", "mpich.txt", "mpich")] {
        let spec = dir.path().join(format!("{imp}.yaml"));
        std::fs::write(
            &spec,
            format!(
                "cluster:\n  hostfile: {}\n  hostfile_format: {fmt}\n  env: {{OMP_NUM_THREADS: '2'}}\nlaunch:\n  method: mpirun\n  mpi_impl: {imp}\nsweep:\n  models: tiny\n  stages: 1\n  nodes: 2\n  ranks_per_node: 3\n",
                repo(&format!("hostfiles/{hf}")).display()
            ),
        )
        .unwrap();
        let plan = Plan::build(Spec::load(&spec).unwrap()).unwrap();
        let out = dir.path().join(format!("out-{imp}"));
        render(&plan, &out).unwrap();
        let run = "tiny_z1_offnone_mb1_2x3";
        // Both implementations render a run of the same name: the suffix names the implementation.
        snap(&out, run, "job.sbatch", &format!("{run}-{imp}-job.sbatch"));
        snap_file(&out, run, &format!("hostfile.{imp}"));
    }
}
