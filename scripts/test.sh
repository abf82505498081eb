#!/usr/bin/env bash
# `make test`: every test of the workspace, in release mode so the libtorch-heavy builds are shared
# with `make build`. Expects the environment `make` exports (LIBTORCH, LD_LIBRARY_PATH, ...).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec cargo test --release --locked --workspace "$@"
