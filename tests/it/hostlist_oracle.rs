//! The hostlist parser against Slurm's own, `scontrol show hostnames`, as an oracle. scontrol
//! parses hostlists offline but needs some slurm.conf, or it looks the controller up in DNS
//! (SRV records) and sends traffic off the host: a two-line stub config prevents that.

use std::path::{Path, PathBuf};
use std::process::Command;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use zerobench_launcher::hostlist::{compress, expand};

use crate::support::installed;

fn stub_conf(dir: &Path) -> PathBuf {
    let p = dir.join("slurm.conf");
    std::fs::write(&p, "ClusterName=stub\nSlurmctldHost=localhost(127.0.0.1)\n").unwrap();
    p
}

/// scontrol's expansion, or None when it calls the expression invalid.
fn scontrol(conf: &Path, expr: &str) -> Option<Vec<String>> {
    let o = Command::new("scontrol")
        .args(["show", "hostnames", expr])
        .env("SLURM_CONF", conf)
        .output()
        .expect("scontrol runs");
    let out = String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    if out.contains("Invalid hostlist") || out.contains("error:") || !o.status.success() {
        return None;
    }
    Some(out.lines().map(str::to_string).collect())
}

fn have_scontrol() -> bool {
    installed(Command::new("scontrol").arg("--version").env("SLURM_CONF", "/dev/null"))
}

/// Expressions in the grammar: items of a prefix and up to two bracket groups (the last at the
/// end), ranges with zero-padded bounds.
fn expression() -> impl Strategy<Value = String> {
    let range = (0u32..120, 0u32..6, 0usize..4).prop_map(|(lo, len, w)| {
        if len == 0 {
            format!("{lo:0w$}")
        } else {
            format!("{lo:0w$}-{:0w$}", lo + len)
        }
    });
    let bracket = proptest::collection::vec(range, 1..4).prop_map(|r| format!("[{}]", r.join(",")));
    let item = (
        "[a-z]{1,4}[a-z-]?",
        proptest::option::of(("[a-z0-9]{0,2}-?", bracket.clone())),
        proptest::option::of(bracket),
        proptest::option::of(0u32..30),
    )
        .prop_map(|(p, mid, last, plain)| match (mid, last, plain) {
            (Some((sep, m)), Some(l), _) => format!("{p}{m}{sep}x{l}"),
            (_, Some(l), _) => format!("{p}{l}"),
            (_, None, Some(n)) => format!("{p}{n}"),
            _ => p,
        });
    proptest::collection::vec(item, 1..4).prop_map(|v| v.join(","))
}

#[test]
fn expansion_matches_scontrol() {
    if !have_scontrol() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let conf = stub_conf(dir.path());
    let mut runner = TestRunner::new(Config { cases: 150, ..Config::default() });
    runner
        .run(&expression(), |expr| {
            let ours = expand(&expr).map_err(|e| TestCaseError::fail(format!("{expr}: {e}")))?;
            prop_assert_eq!(Some(ours.clone()), scontrol(&conf, &expr), "{}", expr);
            // And our compression expands back to the same list under Slurm.
            let c = compress(&ours).unwrap();
            prop_assert_eq!(scontrol(&conf, &c), Some(ours), "{} -> {}", expr, c);
            Ok(())
        })
        .unwrap();
}

#[test]
fn rejections_match_scontrol_or_are_stricter() {
    if !have_scontrol() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let conf = stub_conf(dir.path());
    // Both refuse these.
    for e in [
        "n[01-03]x",
        "n[0-2]-ib",
        "a[1-2]b[3-4]c",
        "n[[1-2]]",
        "n[3-1]",
        "n-[a-c]",
        "n[1-3:2]",
        "n[]",
        "n[1,]",
        "n[0-99999999999]",
    ] {
        assert!(expand(e).is_err(), "we accept {e}");
        assert_eq!(scontrol(&conf, e), None, "scontrol accepts {e}");
    }
    // scontrol turns these into something (`n[1-3` into `n]`); we refuse them.
    for (e, slurm) in [("n[1-3", "n]"), ("n1]", "n1]"), ("n[1-]", "n1")] {
        assert!(expand(e).is_err(), "we accept {e}");
        assert_eq!(scontrol(&conf, e), Some(vec![slurm.to_string()]), "{e}");
    }
}
