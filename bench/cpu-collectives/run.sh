#!/usr/bin/env bash
# What the CPU collectives cost a training step: gpt2 (124M parameters, fp32) on 2 CPU ranks of
# this host, 1 thread each, stages 2 and 3, launched over MPI (`mpirun`) and with the environment
# convention (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT: c10d's Gloo). BASELINE_WORKER=PATH adds
# a third row per stage from another build of the worker launched the same way (an earlier
# commit's, to compare an engine change; BASELINE_NAME says which in the result). Each row is the
# median over steps 2.. of rank 0's step time and of each collective's time, with its bytes
# (nccl-tests' convention).
# Writes bench/results/cpu-collectives.json (override with OUT=...).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
[ -n "${LIBTORCH:-}" ] || eval "$(make -s env)"
out=${OUT:-bench/results/cpu-collectives.json}
steps=${STEPS:-8}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cargo build --release --locked -p zerobench-worker --bins
worker=target/release/zerobench-worker
args=(--model gpt2 --seq-len 64 --micro-batch 1 --steps "$steps" --threads 1 --stall-timeout-s 0)

env_ranks() {  # env_ranks BINARY LOGDIR ARGS...: two ranks that meet at a store on a free port
  local bin=$1 dir=$2 port
  shift 2
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  for r in 0 1; do
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      "$bin" "$@" --log-dir "$dir" > "$dir.$r.out" 2>&1 &
  done
  wait
}

for stage in 2 3; do
  mkdir -p "$work/s$stage"
  mpirun -np 2 --bind-to none "$worker" "${args[@]}" --stage "$stage" --log-dir "$work/s$stage/mpi" > "$work/s$stage/mpi.out" 2>&1
  env_ranks "$worker" "$work/s$stage/env" "${args[@]}" --stage "$stage"
  if [ -n "${BASELINE_WORKER:-}" ]; then
    env_ranks "$BASELINE_WORKER" "$work/s$stage/baseline" "${args[@]}" --stage "$stage"
  fi
done

python3 - "$work" "$out" "${BASELINE_NAME:-${BASELINE_WORKER:-}}" <<'PY'
import datetime, json, os, platform, statistics, subprocess, sys
work, out, baseline = sys.argv[1:4]
git = lambda *a: subprocess.run(["git", *a], capture_output=True, text=True).stdout.strip()
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), None)
rows = []
for stage in (2, 3):
    for launch in ("mpi", "env", "baseline"):
        log = os.path.join(work, f"s{stage}", launch, "rank0.jsonl")
        if not os.path.exists(log):
            continue
        recs = [json.loads(l) for l in open(log)]
        start = next(r for r in recs if r["event"] == "start")
        steps = [r for r in recs if r["event"] == "step" and r["step"] >= 2]
        if not steps:
            sys.exit(f"{log}: no step past the first two:\n" + open(os.path.join(work, f"s{stage}", f"{launch}.0.out")).read()[-2000:])
        comm = {}
        for kind in sorted({k for r in steps for k in r.get("comm", {})}):
            ms = statistics.median(r["comm"][kind]["ms"] for r in steps)
            b = steps[0]["comm"][kind]["bytes"]
            comm[kind] = {"median_ms": round(ms, 1), "bytes": b, "gb_per_s": round(b / ms / 1e6, 2)}
        rows.append({
            "stage": stage, "launch": launch, "comm_backend": start["comm_backend"],
            "median_step_ms": round(statistics.median(r["step_ms"] for r in steps), 1),
            "steps_measured": len(steps), "comm": comm,
        })
json.dump({
    "benchmark": "bench/cpu-collectives/run.sh",
    "what": "gpt2 fp32, seq 64, micro-batch 1, 2 CPU ranks x 1 thread; medians over steps 2.. of rank 0",
    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "host": platform.node(), "cpu": cpu, "cores": os.cpu_count(),
    "commit": git("rev-parse", "--short", "HEAD") + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else ""),
    "baseline": baseline or None,
    "rows": rows,
}, open(out, "w"), indent=1)
for r in rows:
    print(r["stage"], r["launch"], r["comm_backend"], r["median_step_ms"], {k: (v["median_ms"], v["gb_per_s"]) for k, v in r["comm"].items()})
PY
