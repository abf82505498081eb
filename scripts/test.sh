#!/usr/bin/env bash
# `make test`: format and lint checks, then every test of the workspace, in release mode so the
# libtorch-heavy builds are shared with `make build`. Expects the environment `make` exports
# (LIBTORCH, LD_LIBRARY_PATH, ...).
#
# The launcher's tests need a real Slurm: this starts the project's local cluster
# (slurm/local-cluster.sh: 2 fake nodes with 4 fake GPUs each) on free ports in a private
# folder, points the tests at it, and stops it on exit, whatever happens.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Style first, so a formatting, lint or doc-link slip fails before the local Slurm starts
# (rustfmt.toml and the workspace's [lints] say what the code follows).
cargo fmt --all --check
cargo clippy --release --locked --workspace --all-targets -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --release --locked --workspace --no-deps

if [ "$(id -u)" = 0 ]; then
  ZB_SLURM_DIR=$(mktemp -d /tmp/zerobench-slurm.XXXXXX)
  export ZB_SLURM_DIR
  # The first of a few port ranges that nothing listens on (another cluster may be up here).
  for port in 6817 7017 7217 7417 7617; do
    if ZB_SLURM_PORT=$port slurm/local-cluster.sh ports-free; then export ZB_SLURM_PORT=$port; break; fi
  done
  # Stop the cluster whatever happens; keep its logs only when something failed.
  trap 'rc=$?; slurm/local-cluster.sh down || true; if [ "$rc" = 0 ]; then rm -rf "$ZB_SLURM_DIR"; else echo "local Slurm logs: $ZB_SLURM_DIR/log" >&2; fi' EXIT
  slurm/local-cluster.sh up
  export ZEROBENCH_SLURM_CONF=$ZB_SLURM_DIR/etc/slurm.conf
  # From here a missing cluster or worker fails the tests instead of skipping them.
  export ZEROBENCH_REQUIRE_SLURM=1
elif [ "${CI:-}" = true ]; then
  echo "scripts/test.sh: CI must run as root to start the local Slurm" >&2
  exit 1
else
  echo "scripts/test.sh: not root, so no local Slurm: the Slurm tests will be skipped" >&2
fi

# The end-to-end tests run the release binaries; `cargo test` alone does not rebuild them.
cargo build --release --locked --workspace --bins
cargo test --release --locked --workspace "$@"
