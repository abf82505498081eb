#!/usr/bin/env bash
# Fits the cost model zerobench ships (costmodel/models/h200.json) from the committed sweeps, and
# checks it against the held-out runs of the same sweeps (bench/results/costmodel-h200.json).
#
#   bench/costmodel/fit-shipped.sh      (after `make build`; writes both files)
#
# The sweeps are bench/gpu/run.sh's `costmodel` phase (bench/gpu/costmodel-runs.txt) run twice on
# one 2×H200 host: 12 steps (4 warm-up) and 30 steps (10 warm-up). Their runs of the set `fit` are
# fitted on; those of `holdout` (other presets, micro-batches, sequence lengths) never are.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
BIN=${BIN:-target/release}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for s in short:gpu-2026-11-24-costmodel-short long:gpu-2026-11-24-costmodel; do
  mkdir -p "$work/${s%%:*}"
  tar -xzf "bench/results/raw/${s#*:}.tar.gz" -C "$work/${s%%:*}"
done
(cd "$work" && "$OLDPWD/$BIN/zerobench" fit short/runs/cm-fit long/runs/cm-fit --out model.json --validate) > "$work/fit.md"
cp "$work/model.json" costmodel/models/h200.json
# Exit 1: the two sweeps share run ids (each is then named with its folder, relative to $work).
(cd "$work" && "$OLDPWD/$BIN/zerobench" ingest short/runs/cm-holdout long/runs/cm-holdout --out holdout --format csv -q 2>/dev/null) \
  || [ $? -eq 1 ]
python3 bench/costmodel/report.py "$BIN/zerobench" costmodel/models/h200.json "$work/holdout/runs.csv" "$work/fit.md" \
  > bench/results/costmodel-h200.json
sed -n 1p "$work/fit.md"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("held out:", json.dumps(d["held_out"]["summary"]))' bench/results/costmodel-h200.json
