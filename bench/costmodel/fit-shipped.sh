#!/usr/bin/env bash
# Fits the cost models zerobench ships (costmodel/models/KIND.json) from the committed sweeps, and
# checks each against the held-out runs of its sweeps (bench/results/costmodel-KIND.json).
#
#   bench/costmodel/fit-shipped.sh [KIND...]     (after `make build`; default: h200 h100)
#
# The sweeps are bench/gpu/run.sh's `costmodel` phase (bench/gpu/costmodel-runs.txt). H200: one
# sweep on a 2×H200 host at 5a3944b, 30 steps (10 warm-up), one-GPU runs two at a time; the three
# earlier H200 sweeps (gpu-2026-11-24-costmodel-short, -11-24-costmodel, -11-26-costmodel, committed
# beside it) measured builds before GPT-2's recomputation and kernels, T5's fused attention and
# the vectorised loss, and are no longer fitted. H100: on one 2×H100 host once, 30 steps (one-GPU
# runs two at a time), and on a 1×H100 host twice, 30 steps, one run at a time (its held-out runs
# were run once, with the first sweep); GPT-2's runs
# again on a 2×H100 host after its blocks began recomputing in backward (121ccdb), which superseded
# the GPT-2 runs of the H100 sweeps before it; then every run again on a 2×H100 host (1858462)
# after T5's position bias let SDPA take a fused kernel and the cross-entropy kernel moved 16 bytes
# per load, which changed every family's step (and T5's memory); and GPT-2's runs once more on a
# 2×H100 host (9dd1533) after its layer norms, bias gradients and GELU gradient became the worker's
# own kernels (GPT-2's steps 3-9% shorter), which supersede that sweep's GPT-2 runs; and the
# one-GPU runs without host work once more on another 2×H100 host (5a3944b), one at a time, as
# repeats: their launch-bound steps took 1.1-2× the earlier hosts' (the builds' steps are equal on
# one host: bench/results/gpu-2026-11-26-launch-bound-builds-h100x1.json).
# Their runs of the set `fit` are fitted on; those of `holdout` (other presets, micro-batches,
# sequence lengths) never are.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
BIN=${BIN:-target/release}
ZB=$PWD/$BIN/zerobench
sweeps() {  # the archives of a kind's sweeps, as NAME:ARCHIVE (under bench/results/raw)
  case $1 in
    h200) echo "now:gpu-2026-11-26-h200x2-costmodel-5a3944b" ;;
    h100) echo "all:gpu-2026-11-26-h100x2-costmodel-1858462 gpt2:gpu-2026-11-26-h100x2-costmodel-gpt2-9dd1533 alone:gpu-2026-11-26-h100x2-costmodel-alone-5a3944b" ;;
    *) echo "fit-shipped.sh: no sweeps for GPU kind '$1' (h200, h100)" >&2; return 2 ;;
  esac
}
superseded() {  # runs a sweep measured again after an engine change, as NAME:PATTERN: the runs
  # whose names match PATTERN in the sweeps listed before NAME are neither fitted on nor held out
  case $1 in
    h100) echo "gpt2:gpt2*" ;;
    *) echo "" ;;
  esac
}
kinds=("$@")
[ ${#kinds[@]} -gt 0 ] || kinds=(h200 h100)
for kind in "${kinds[@]}"; do
  list=$(sweeps "$kind")
  work=$(mktemp -d)
  fits=() holdouts=() sources=()
  for s in $list; do
    mkdir -p "$work/${s%%:*}"
    tar -xzf "bench/results/raw/${s#*:}.tar.gz" -C "$work/${s%%:*}"
    fits+=("${s%%:*}/runs/cm-fit")
    [ ! -d "$work/${s%%:*}/runs/cm-holdout" ] || holdouts+=("${s%%:*}/runs/cm-holdout")
    sources+=("bench/results/raw/${s#*:}.tar.gz")
  done
  read -r -a sups <<< "$(superseded "$kind")"
  for sup in "${sups[@]}"; do
    for s in $list; do
      [ "${s%%:*}" != "${sup%%:*}" ] || break
      for set in cm-fit cm-holdout; do
        [ ! -d "$work/${s%%:*}/runs/$set" ] || (cd "$work/${s%%:*}/runs/$set" && shopt -s nullglob && rm -rf -- ${sup#*:} ${sup#*:}.out)
      done
    done
  done
  (cd "$work" && "$ZB" fit "${fits[@]}" --out model.json --validate) > "$work/fit.md"
  cp "$work/model.json" "costmodel/models/$kind.json"
  # Exit 1: runs that failed (a preset that does not fit the GPU) or sweeps sharing run ids (each
  # is then named with its folder, relative to $work).
  (cd "$work" && "$ZB" ingest "${holdouts[@]}" --out holdout --format csv -q 2>/dev/null) || [ $? -eq 1 ]
  python3 bench/costmodel/report.py "$ZB" "costmodel/models/$kind.json" "$work/holdout/runs.csv" "$work/fit.md" \
    "$kind" "${sources[@]}" > "bench/results/costmodel-$kind.json"
  sed -n 1p "$work/fit.md"
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("held out:", json.dumps(d["held_out"]["summary"]))' \
    "bench/results/costmodel-$kind.json"
  rm -rf "$work"
done
