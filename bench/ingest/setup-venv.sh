#!/usr/bin/env bash
# Installs the two reference readers the ingest benchmark compares against (polars, DuckDB) from
# PyPI into a virtual environment under the git-ignored .cache/ folder. Idempotent.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="${ZEROBENCH_BENCH_VENV:-$root/.cache/venv-bench-ingest}"
if [[ ! -x "$venv/bin/python" ]]; then
    python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c 'import polars, duckdb' 2>/dev/null; then
    "$venv/bin/pip" install --quiet --disable-pip-version-check 'polars>=1' 'duckdb>=1'
fi
"$venv/bin/python" -c 'import polars, duckdb; print("polars", polars.__version__, "duckdb", duckdb.__version__)'
