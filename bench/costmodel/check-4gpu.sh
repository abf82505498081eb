#!/usr/bin/env bash
# The cost model at 4 GPUs, a GPU count no fit has seen (bench/costmodel/four_gpus.py): the runs of
# one 4xH100 host, two rounds, priced by `zerobench ingest --cost-model`.
#
#   bench/costmodel/check-4gpu.sh [MODEL OUT LABEL]   (after `make build`; default: the shipped
#       H100 model, bench/results/costmodel-h100-4gpu.json). The shipped model is fitted on the
#       host's offloaded runs; bench/results/costmodel-h100-4gpu-before.json is the model of e552d66,
#       fitted without them (`git show e552d66:costmodel/models/h100.json`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ZB=$PWD/${BIN:-target/release}/zerobench
model=$(realpath "${1:-costmodel/models/h100.json}")
out=${2:-bench/results/costmodel-h100-4gpu.json}
archives=(bench/results/raw/gpu-2026-11-27-h100x4-costmodel-e51bf6b.tar.gz
  bench/results/raw/gpu-2026-11-27-h100x4-costmodel-e51bf6b-round2.tar.gz)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
dirs=()
for i in "${!archives[@]}"; do
  mkdir -p "$work/r$((i + 1))"
  tar -xzf "${archives[$i]}" -C "$work/r$((i + 1))"
  while read -r d; do dirs+=("$d"); done < <(cd "$work" && find "r$((i + 1))" -type d -name runs | sort)
done
# Exit 1: the rounds share run ids (each is then named with its folder).
(cd "$work" && "$ZB" ingest "${dirs[@]}" --cost-model "$model" --out p --format csv -q 2>/dev/null) || [ $? -eq 1 ]
host=$(find "$work/r1" -name host.txt | sort | head -n 1)
label=${3:-"costmodel/models/h100.json (shipped; the host's offloaded runs fitted)"}
python3 bench/costmodel/four_gpus.py "$work/p/predicted.csv" "$host" "$label" "${archives[@]}" > "$out"
python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["summary"]))' "$out"
