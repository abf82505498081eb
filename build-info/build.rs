//! Stamps `ZEROBENCH_BUILD_COMMIT`: the commit `git rev-parse HEAD` names in the checkout being
//! built, or `$ZEROBENCH_BUILD_COMMIT` where it is set (a build outside a git checkout, a
//! packager's). Runs again when HEAD or a branch moves, not when a file is edited: a build with
//! uncommitted changes carries the commit they sit on. A crate of its own so that a new commit
//! rebuilds this small crate and its dependents' Rust, not the worker's C++ shim.

use std::path::PathBuf;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let s = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !s.trim().is_empty()).then(|| s.trim().to_string())
}

fn main() {
    println!("cargo:rerun-if-env-changed=ZEROBENCH_BUILD_COMMIT");
    if let Ok(commit) = std::env::var("ZEROBENCH_BUILD_COMMIT") {
        println!("cargo:rustc-env=ZEROBENCH_BUILD_COMMIT={commit}");
        return;
    }
    let Some(git_dir) = git(&["rev-parse", "--absolute-git-dir"]).map(PathBuf::from) else { return };
    for watched in ["HEAD", "refs/heads", "packed-refs"] {
        println!("cargo:rerun-if-changed={}", git_dir.join(watched).display());
    }
    if let Some(commit) = git(&["rev-parse", "HEAD"]) {
        println!("cargo:rustc-env=ZEROBENCH_BUILD_COMMIT={commit}");
    }
}
