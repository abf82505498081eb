#!/usr/bin/env bash
# Fits the cost models zerobench ships (costmodel/models/KIND.json) from the committed sweeps, and
# checks each against the held-out runs of its sweeps (bench/results/costmodel-KIND.json).
#
#   bench/costmodel/fit-shipped.sh [KIND...]     (after `make build`; default: h200 h100)
#
# The sweeps are bench/gpu/run.sh's `costmodel` phase (bench/gpu/costmodel-runs.txt), 30 steps of
# which 10 warm-up. H200: one sweep on a 2×H200 host at 41cf013, the engine as it shipped then, one run at
# a time, with the host's examples/cpu_adamw in runs/cpu_adamw.json. The sweep at 5a3944b (one-GPU
# runs two at a time; its device-bound steps 1.05× as long, its offloaded steps waiting for all of
# the host's updates) and the three before it (gpu-2026-11-24-costmodel-short, -11-24-costmodel,
# -11-26-costmodel: before GPT-2's recomputation and kernels, T5's fused attention and the
# vectorised loss) are committed beside it and no longer fitted. The one-GPU runs of the list at
# 8fda613 on a second H200 host (a 1×H200, the fitted runs twice) are `check-only`: never fitted,
# they are what `NEW_HOST=x1` prices (fitted beside the first sweep, they made the held-out
# configurations' error worse: docs/cost-model.md, "On a second H200 host"). So is the T5 list
# (bench/gpu/costmodel-runs-t5.txt: busy T5 shapes) at 5309edc on a 1×H200 host, twice, which
# `NEW_HOST=t5` prices (fitted, it left T5's rates but the activation term's where they were:
# docs/cost-model.md, "T5 where the GPU sets the step"), and that list's busy shapes at sequence
# 2048 (`t5s`, another call on a 1×H200 host, twice). So are the list's one-GPU runs at stages 0
# and 3 at 96d5287 (`z03`: stage 3 on one GPU keeping its parameters whole, which the fitted
# sweeps' builds gathered; two calls on one 1×H200 host, once each).
# So are the list's 28 runs that kept the GPU busy in the fitted sweep, at e9fd36e (`busy`: the
# engine as it ships where the GPU sets the step; twice each on a 1×H200 host;
# bench/gpu/costmodel-runs-busy-h200.txt).
# A sweep marked `superseded` lends only the runs that no fitted sweep listed before it ran (by set
# and name; bench/costmodel/keep_runs.py): listed after a one-GPU sweep of a later build's GPT-2
# runs, 41cf013's sweep would lend its other families' and its 2-GPU runs
# (docs/cost-model.md, "Refitting from a one-GPU host").
# H100: sweeps after the trainer's segment loop moved onto libtorch's autograd thread (launch-bound
# steps 0.87-0.93×), one run at a time. Without offload, the whole list (one GPU and two, held out
# too) at eed3e13 on a 2×H100 host: the engine as it ships, whose device-bound steps take 0.95× and
# launch-bound steps 0.83-0.93× as long as at the builds of the sweeps it replaces, which ran the
# same list (35b4299 on a 2×H100 and a 1×H100 host; 691c208 on a second 1×H100 host, the 2-GPU runs
# three times on a second 2×H100 host, T5's configurations that keep the GPU busy twice on a third
# 1×H100 host and the ten 2-GPU configurations added since twice on a third 2×H100 host). Those are
# committed beside it and no longer fitted
# (bench/results/costmodel-h100-new-build-eed3e13-h100x2.json prices the eed3e13 sweep with the
# model fitted on them). One host's launch-bound runs would set the host's terms by that host (the
# eed3e13 host ran them 0.79-0.94× as long as three others did), so the GPT-2 sweeps of ce2c6d2 and
# b98eb1a on three more H100 hosts (1×, 1×, 2×) lend their launch-bound one-GPU runs without offload
# (`launch-only`); their busy runs measured device work the builds since made 2-5% shorter and are
# left out. A configuration's runs on several hosts are fitted as repeats. The H100 sweeps before
# them (1858462, 9dd1533, 5a3944b) measured builds whose launch-bound steps have changed since. The
# runs of the set `fit` are fitted on; those of `holdout` (other presets, micro-batches, sequence
# lengths) never are.
#
# Offload on the H100: the 16 offloaded runs at 9f0fd0c (the next forward waits for each unit's
# host update at its first use) on four more 1×H100 hosts, each with the host's examples/cpu_adamw
# in runs/cpu_adamw.json, and bench/gpu/run.sh offload-ratios on the same hosts (gpt2-xl at ratios
# below 1, exact and delayed); the same 16 at e51bf6b twice each on two more 1×H100 hosts and one
# GPU of a fourth 2×H100 host; and the eed3e13 sweep's 16, each with its host's rate. The offloaded
# runs of the earlier sweeps (35b4299, 691c208, and the archives h100x1c/x1e/x1f/x1g, which hold
# nothing else) measured exact steps that waited for all of the host's updates and are not fitted.
# Ranks sharing a host: the same offload-ratios on 2 GPUs of three 2×H100 hosts (the delayed runs
# of the two at 9f0fd0c left out: `ratios-exact`) and the two-ranks comparison of a fourth (mr/g1:
# one GPU, mr/g2: two); and on a 4xH100 host (64 cores) the same with 4 ranks and with 2, two
# rounds (its 4-GPU runs without offload are checked apart: bench/costmodel/check-4gpu.sh).
#
# NEW_HOST=NAME (one sweep of the kind's list) checks the model on a host no fit has seen instead:
# it fits without that sweep, prices each of its runs with `zerobench ingest --cost-model`, once
# with the host's AdamW rate beside them and once without, and writes
# bench/results/costmodel-KIND-new-host-NAME.json (bench/costmodel/new_host.py); the shipped files are
# left alone.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
BIN=${BIN:-target/release}
ZB=$PWD/$BIN/zerobench
sweeps() {  # the archives of a kind's sweeps, as NAME:ARCHIVE[:MARK] (under bench/results/raw)
  case $1 in
    h200) echo "now:gpu-2026-11-28-h200x2-costmodel-41cf013 t5:gpu-2026-12-02-h200x1-costmodel-t5-5309edc:check-only t5s:gpu-2026-12-02-h200x1-costmodel-t5-s2048-5309edc:check-only x1:gpu-2026-12-02-h200x1-costmodel-8fda613:check-only z03:gpu-2026-12-02-h200x1-costmodel-z0z3-96d5287:check-only busy:gpu-2026-12-04-h200x1-costmodel-busy-e9fd36e:check-only" ;;
    h100) echo "x2f:gpu-2026-11-28-h100x2f-costmodel-eed3e13 x1n:gpu-2026-11-27-h100x1n-costmodel-gpt2-ce2c6d2:launch-only x1o:gpu-2026-11-27-h100x1o-costmodel-gpt2-b98eb1a:launch-only x2e:gpu-2026-11-27-h100x2e-costmodel-gpt2-b98eb1a:launch-only x1h:gpu-2026-11-27-h100x1h-costmodel-offload-9f0fd0c x1i:gpu-2026-11-27-h100x1i-costmodel-offload-9f0fd0c x1j:gpu-2026-11-27-h100x1j-costmodel-offload-9f0fd0c x1k:gpu-2026-11-27-h100x1k-costmodel-offload-9f0fd0c x1l:gpu-2026-11-27-h100x1l-costmodel-offload-e51bf6b x1m:gpu-2026-11-27-h100x1m-costmodel-offload-e51bf6b x2d:gpu-2026-11-27-h100x2d-costmodel-offload-e51bf6b r1:gpu-2026-11-27-offload-ratios-h100x1:ratios r1b:gpu-2026-11-27-offload-ratios-h100x1b:ratios r1c:gpu-2026-11-27-offload-ratios-h100x1c:ratios r1d:gpu-2026-11-27-offload-ratios-h100x1d:ratios r2:gpu-2026-11-27-offload-ratios-h100x2:ratios-exact r2b:gpu-2026-11-27-offload-ratios-h100x2b:ratios-exact r2c:gpu-2026-11-27-offload-ratios-h100x2c:ratios r2d:gpu-2026-11-27-offload-two-ranks-h100x2:ratios r4:gpu-2026-11-27-h100x4-costmodel-e51bf6b:ratios r4b:gpu-2026-11-27-h100x4-costmodel-e51bf6b-round2:ratios" ;;
    *) echo "fit-shipped.sh: no sweeps for GPU kind '$1' (h200, h100)" >&2; return 2 ;;
  esac
}
kinds=("$@")
[ ${#kinds[@]} -gt 0 ] || kinds=(h200 h100)
for kind in "${kinds[@]}"; do
  list=$(sweeps "$kind")
  work=$(mktemp -d)
  fits=() holdouts=() sources=() unseen=() fitted_roots=()
  for s in $list; do
    IFS=: read -r name archive mark <<< "$s"
    mkdir -p "$work/$name"
    tar -xzf "bench/results/raw/$archive.tar.gz" -C "$work/$name"
    # The host's AdamW rate (examples/cpu_adamw, runs/cpu_adamw.json where the sweep measured one)
    # goes where `zerobench fit` and `ingest` look for it: beside the runs, inside the folders they
    # are given (docs/cost-model.md, "The host's AdamW rate").
    while read -r f; do
      for d in "$(dirname "$f")"/cm-fit "$(dirname "$f")"/cm-holdout; do [ -d "$d" ] && cp "$f" "$d/"; done
    done < <(find "$work/$name" -name cpu_adamw.json)
    # `launch-only`: a sweep of an earlier build lends its launch-bound one-GPU runs without
    # offload, and nothing else; `superseded`: the runs that none of the fitted sweeps listed
    # before it ran (bench/costmodel/keep_runs.py).
    if [ "$mark" = launch-only ] || [ "$mark" = superseded ]; then
      (cd "$work" && "$ZB" ingest "$name" --out "$name.ingest" --format csv -q 2>/dev/null) || [ $? -eq 1 ]
      python3 bench/costmodel/keep_runs.py "$mark" "$work/$name.ingest/runs.csv" "$work" "${fitted_roots[@]}"
      rm -rf "$work/$name.ingest"
    fi
    # An archive holds one sweep (runs/) or, where a host ran the list again, its repeats too
    # (repeat-N/runs/): every set folder in it counts.
    # `ratios`: bench/gpu/run.sh offload-ratios (gpt2-xl at offload ratios below 1, exact and with
    # the delayed update): its offloaded runs are fitted; not its run without offload, which would
    # weigh one stage of its stage-choice group with another host's repeats.
    # `ratios-exact`: the same, without its delayed runs, which measured the delayed update on 2
    # GPUs before its all-gathers moved to the next forward (ef213a0: 4% shorter since).
    if [ "$mark" = ratios-exact ]; then
      find "$work/$name" -depth -type d -name 'or_delayed_*' -exec rm -rf {} +
      mark=ratios
    fi
    if [ "$mark" = ratios ]; then
      # The 4-GPU sweep's runs without offload (cm-holdout) are checked apart, at a GPU count no
      # fit has seen (bench/costmodel/check-4gpu.sh).
      find "$work/$name" -depth -type d \( -name 'or_none_*' -o -name 'cm-*' \) -exec rm -rf {} +
      while read -r d; do
        if [ -n "$(find "$work/$d" -mindepth 1 -maxdepth 1 -type d -name 'or_*' -print -quit)" ]; then fits+=("$d"); fi
      done < <(cd "$work" && find "$name" -type d -name runs | sort)
    fi
    # NEW_HOST: that sweep's runs, fitted and held out alike, are the host no fit has seen.
    # `check-only`: a sweep kept for that check and never fitted (below).
    if [ "$name" = "${NEW_HOST:-}" ]; then
      while read -r d; do unseen+=("$d"); done < <(cd "$work" && find "$name" -type d -name 'cm-*' | sort)
      continue
    fi
    [ "$mark" = check-only ] && continue
    fitted_roots+=("$work/$name")
    while read -r d; do fits+=("$d"); done < <(cd "$work" && find "$name" -type d -name cm-fit | sort)
    while read -r d; do holdouts+=("$d"); done < <(cd "$work" && find "$name" -type d -name cm-holdout | sort)
    sources+=("bench/results/raw/$archive.tar.gz")
  done
  if [ -n "${NEW_HOST:-}" ]; then
    [ ${#unseen[@]} -gt 0 ] || { echo "fit-shipped.sh: NEW_HOST=$NEW_HOST is not a sweep of $kind" >&2; exit 2; }
    (cd "$work" && "$ZB" fit "${fits[@]}" --out model.json) > /dev/null
    # Its runs priced by `zerobench ingest --cost-model`, with the host's rate beside them and
    # without it.
    (cd "$work" && "$ZB" ingest "${unseen[@]}" --cost-model model.json --out with --format csv -q) || [ $? -eq 1 ]
    # The stage choice, with the fitted sweeps' runs (held out too) as repeats of the same
    # configurations beside the host's.
    (cd "$work" && "$ZB" ingest "${unseen[@]}" "${fits[@]}" "${holdouts[@]}" --cost-model model.json --out choice \
      --format csv -q 2>/dev/null) || [ $? -eq 1 ]
    (cd "$work" && for d in "${unseen[@]}"; do rm -f "$d/cpu_adamw.json"; done)
    (cd "$work" && "$ZB" ingest "${unseen[@]}" --cost-model model.json --out without --format csv -q) || [ $? -eq 1 ]
    python3 bench/costmodel/new_host.py "$work/with" "$work/without/predicted.csv" "$kind" \
      "$NEW_HOST" "$work/choice/stage-choice.csv" "${sources[@]}" > "bench/results/costmodel-$kind-new-host-$NEW_HOST.json"
    python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["summary"]))' \
      "bench/results/costmodel-$kind-new-host-$NEW_HOST.json"
    rm -rf "$work"
    continue
  fi
  # The fitted sweeps' builds, from their archives' names, for the logs of workers before the
  # build stamp: the model says which engine it measured.
  builds=()
  for src in "${sources[@]}"; do
    if [[ $src =~ -([0-9a-f]{7})\.tar\.gz$ ]]; then builds+=(--build "${BASH_REMATCH[1]}"); fi
  done
  (cd "$work" && "$ZB" fit "${fits[@]}" --out model.json --validate "${builds[@]}") > "$work/fit.md"
  cp "$work/model.json" "costmodel/models/$kind.json"
  # Exit 1: runs that failed (a preset that does not fit the GPU) or sweeps sharing run ids (each
  # is then named with its folder, relative to $work).
  # With the model, so that its `predicted` table names each held-out run's host AdamW rate.
  (cd "$work" && "$ZB" ingest "${holdouts[@]}" --cost-model model.json --out holdout --format csv -q 2>/dev/null) ||
    [ $? -eq 1 ]
  python3 bench/costmodel/report.py "$ZB" "costmodel/models/$kind.json" "$work/holdout/runs.csv" "$work/fit.md" \
    "$kind" "${sources[@]}" > "bench/results/costmodel-$kind.json"
  sed -n 1p "$work/fit.md"
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("held out:", json.dumps(d["held_out"]["summary"]))' \
    "bench/results/costmodel-$kind.json"
  rm -rf "$work"
done
