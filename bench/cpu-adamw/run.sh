#!/usr/bin/env bash
# The CPU AdamW benchmark (docs/results/cpu-adamw.md): parameters updated per second by the Rust AdamW that
# ZeRO-Offload runs, against this host's memory bandwidth (STREAM triad), in the same run.
# Writes bench/results/cpu-adamw-<host>.json (override with OUT=...). Target: >= 70% of the bound.
#   bench/cpu-adamw/run.sh [PARAMS] [THREADS]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
if [ -z "${BIN:-}" ]; then
  eval "$(make -s env)"
  cargo build --release -q -p zerobench-worker --example cpu_adamw
  BIN=target/release/examples/cpu_adamw
fi
host=$(hostname -s)
out=${OUT:-bench/results/cpu-adamw-$host.json}
result=$("$BIN" "${1:-100000000}" ${2:-})
python3 - "$result" "$out" <<'PY'
import datetime, json, platform, subprocess, sys
r = json.loads(sys.argv[1])
r["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
r["host"] = platform.node()
r["kernel"] = platform.release()
r["rustc"] = subprocess.run(["rustc", "--version"], capture_output=True, text=True).stdout.strip() or None
r["target_met"] = r["fraction_of_bandwidth"] >= 0.7
json.dump(r, open(sys.argv[2], "w"), indent=1)
print(json.dumps(r))
PY
