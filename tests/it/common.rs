//! Helpers shared by the test modules.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub use crate::support::root;

/// A file under the workspace root.
pub fn repo(rel: &str) -> PathBuf {
    root().join(rel)
}

/// The `zerobench` binary of the profile these tests were built with. `cargo test --workspace`
/// (what `scripts/test.sh` runs) builds it; a lone `cargo test -p zerobench-e2e` does not.
pub fn zerobench_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>/deps/<test>");
    let bin = profile_dir.join("zerobench");
    assert!(
        bin.is_file(),
        "{} is missing: run `cargo test --workspace` or `cargo build -p zerobench` first",
        bin.display()
    );
    bin
}

/// Runs `zerobench ARGS` with a clean diagnostic level.
pub fn zerobench(args: &[&str]) -> Output {
    Command::new(zerobench_bin()).args(args).env_remove("RUST_LOG").output().expect("zerobench runs")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The local test cluster's `SLURM_CONF`, when `scripts/test.sh` started one. Without it the
/// Slurm tests are skipped with a message, unless `ZEROBENCH_REQUIRE_SLURM` says they must run
/// (as `scripts/test.sh` does), in which case they fail.
pub fn slurm_conf() -> Option<PathBuf> {
    match std::env::var_os("ZEROBENCH_SLURM_CONF") {
        Some(c) => Some(PathBuf::from(c)),
        None if std::env::var_os("ZEROBENCH_REQUIRE_SLURM").is_some() => {
            panic!("ZEROBENCH_REQUIRE_SLURM is set but ZEROBENCH_SLURM_CONF is not: start slurm/local-cluster.sh up")
        }
        None => {
            eprintln!("SKIPPED: no local Slurm (scripts/test.sh starts one and sets ZEROBENCH_SLURM_CONF)");
            None
        }
    }
}
