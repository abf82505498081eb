#!/usr/bin/env bash
# The shipped cost model on a build it was not fitted on (bench/costmodel/new_build.py): one host's
# sweep at that build (`bench/gpu/run.sh costmodel`, here CM_MATCH='gpt2*' on a 1xH100 host at
# ce2c6d2, where GPT-2's nodes write the weights' gradients in place), priced by
# `zerobench ingest --cost-model` without refitting. The sweeps at b98eb1a (AdamW's vector loads
# and cuBLASLt's epilogues too) were checked the same way:
#
#   bench/costmodel/check-build.sh bench/results/raw/gpu-2026-11-27-h100x1o-costmodel-gpt2-b98eb1a.tar.gz \
#       b98eb1a costmodel/models/h100.json bench/results/costmodel-h100-new-build-b98eb1a-h100x1.json
#   (and h100x2e… to …-b98eb1a-h100x2.json: a 2×H100 host, its 2-GPU runs too)
#
#   bench/costmodel/check-build.sh [ARCHIVE COMMIT MODEL OUT]   (after `make build`; default: that
#       sweep, its build, the shipped H100 model, bench/results/costmodel-h100-new-build-ce2c6d2.json)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ZB=$PWD/${BIN:-target/release}/zerobench
archive=${1:-bench/results/raw/gpu-2026-11-27-h100x1n-costmodel-gpt2-ce2c6d2.tar.gz}
commit=${2:-ce2c6d2}
model=${3:-costmodel/models/h100.json}
out=${4:-bench/results/costmodel-h100-new-build-ce2c6d2.json}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar -xzf "$archive" -C "$work"
model_path=$(realpath "$model")
(cd "$work" && "$ZB" ingest runs/cm-fit runs/cm-holdout --cost-model "$model_path" --out p --format csv -q)
python3 bench/costmodel/new_build.py "$work/p/predicted.csv" "$work/p/runs.csv" "$work/host.txt" "$model" "$commit" "$archive" > "$out"
python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["summary"]))' "$out"
