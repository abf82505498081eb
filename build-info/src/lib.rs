//! The git commit this build of zerobench was made from (see `build.rs`): the worker writes it
//! into every log's `start.versions.commit`, so a result names the build that measured it.

/// The full hash of the commit checked out when this crate was built; `None` for a build outside
/// a git checkout without `ZEROBENCH_BUILD_COMMIT` set.
pub const COMMIT: Option<&str> = option_env!("ZEROBENCH_BUILD_COMMIT");

#[cfg(test)]
mod tests {
    /// Built in a git checkout (a clone, as `make test` runs), the stamp is the commit checked
    /// out, as `git rev-parse HEAD` prints it now: the build script ran again when HEAD moved.
    #[test]
    fn the_stamp_is_the_checked_out_commit() {
        let out = std::process::Command::new("git")
            .args(["rev-parse", "HEAD"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .expect("git runs");
        assert!(out.status.success(), "the tests run in the repository's checkout");
        let head = String::from_utf8(out.stdout).unwrap();
        assert_eq!(super::COMMIT, Some(head.trim()));
    }
}
