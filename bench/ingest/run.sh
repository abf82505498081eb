#!/usr/bin/env bash
# The ingest benchmark, end to end: builds the release binaries, installs polars and DuckDB into
# .cache/, generates about 1.1 GB of worker logs (deterministic; kept in .cache/ for reuse), then
# times zerobench ingest against them and writes bench/results/ingest.json.
#
#   bench/ingest/run.sh                      # the committed configuration
#   SIZE_MB=300 REPS=1 bench/ingest/run.sh   # a quicker look
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
size_mb="${SIZE_MB:-1100}"
reps="${REPS:-5}"
threads="${THREADS:-2}"
data="${ZEROBENCH_BENCH_DATA:-$root/.cache/bench-ingest/${size_mb}mb}"
venv="${ZEROBENCH_BENCH_VENV:-$root/.cache/venv-bench-ingest}"

cargo build --release --locked -p zerobench -p zerobench-bench-ingest
bench/ingest/setup-venv.sh
if [[ ! -f "$data/.complete" ]]; then
    rm -rf "$data"
    target/release/gen-ingest-logs --out "$data/logs" --target-mb "$size_mb" >/dev/null
    touch "$data/.complete"
fi
"$venv/bin/python" bench/ingest/bench.py --data "$data/logs" --zerobench target/release/zerobench \
    --reps "$reps" --threads "$threads" --out "${OUT:-bench/results/ingest.json}"
