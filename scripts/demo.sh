#!/usr/bin/env bash
# `make demo`: the demo sweep (slurm/examples/demo.yaml: the tiny GPT-2, ZeRO stages 0-3, 2 ranks
# on this host's CPU) through `zerobench local`, then the state of every run, then the tables
# (`zerobench ingest`: latency, memory, scaling, communication; CSV, Markdown, JSON, SVG in
# demo-runs/tables).
# Expects the environment `make` exports (LIBTORCH, LD_LIBRARY_PATH, ...).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="$PWD/target/release:$PATH"   # the spec names the worker as zerobench-worker
rc=0
zerobench local slurm/examples/demo.yaml --out demo-runs || rc=$?
echo
zerobench status demo-runs || rc=$?
echo
zerobench ingest demo-runs --out demo-runs/tables || rc=$?
exit "$rc"
