//! What the crate's tests of Slurm-facing code share: a rendered sweep, and stub commands put
//! first on `PATH`. `PATH` belongs to the whole process, so only tests that run in a process of
//! their own (`rusty_fork_test!`) call [`first_on_path`].

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::plan::Plan;

/// The spec `yaml` planned and rendered under `out`: the plan and its run folders.
pub fn render_sweep(yaml: &str, out: &Path) -> (Plan, Vec<PathBuf>) {
    let plan = Plan::build(crate::spec::Spec::parse(yaml, Path::new("s.yaml")).unwrap()).unwrap();
    let dirs = crate::render::render(&plan, out).unwrap();
    (plan, dirs)
}

/// Records job `job_id` as submitted for the run folder `dir` (its `slurm.json`), as `submit` does.
pub fn submitted(dir: &Path, job_id: &str) {
    let rec = crate::submit::SlurmRecord {
        job_id: job_id.into(),
        array_job_id: None,
        array_task_id: None,
        dependency: None,
        submitted_at: 1,
        script: dir.join("job.sbatch"),
    };
    std::fs::write(dir.join(crate::submit::SLURM_RECORD), serde_json::to_string(&rec).unwrap()).unwrap();
}

/// Writes an executable `sh` script `name` into `dir` running `body`.
pub fn stub(dir: &Path, name: &str, body: &str) {
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Puts `dir` first on this process's `PATH`.
pub fn first_on_path(dir: &Path) {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let path = std::env::join_paths(std::iter::once(dir.to_path_buf()).chain(std::env::split_paths(&path))).unwrap();
    std::env::set_var("PATH", path);
}
