#!/usr/bin/env bash
# Ranks sharing a host, on a 4xH100 host no fit has seen (bench/costmodel/ranks_sharing.py): its
# offloaded runs priced by the shipped H100 model, and by the per-rank AdamW rate each folder's
# cpu_adamw.json measured with as many ranks at once as its runs had (the model's sharing exponent
# set to the one that rate implies, log(reference / per-rank rate) / log(ranks)).
#
#   bench/costmodel/check-ranks-sharing.sh   (after `make build`; writes
#                                             bench/results/costmodel-h100-ranks-sharing.json)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ZB=$PWD/${BIN:-target/release}/zerobench
model=$PWD/costmodel/models/h100.json
archive=bench/results/raw/gpu-2026-11-27-h100x4-ranks-sharing.tar.gz
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar -xzf "$archive" -C "$work"
find "$work" -depth -type d -name 'or_none_*' -exec rm -rf {} +
(cd "$work" && "$ZB" ingest or1/runs or2/runs or4/runs --cost-model "$model" --out shipped --format csv -q 2>/dev/null) ||
  [ $? -eq 1 ]
# Each folder of N ranks priced with the exponent its own cpu_adamw.json implies for N.
for n in 1 2 4; do
  e=$(python3 -c '
import json, math, sys
fit = json.load(open(sys.argv[1]))["fits"][0]
n = sys.argv[3]
d = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
rate = d["ranks"][n]["adamw_params_per_s_per_rank"] / 1e9 if n != "1" else None
print(0.0 if rate is None else math.log(fit["host_adamw_gparams_per_s"] / rate) / math.log(int(n)))
' "$model" "$work/or$n/runs/cpu_adamw.json" "$n" 2>/dev/null || echo 0)
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); d["fits"][0]["step"]["offload.sharing_exponent"]=float(sys.argv[2]); json.dump(d, open(sys.argv[3], "w"))' \
    "$model" "$e" "$work/m$n.json"
  (cd "$work" && "$ZB" ingest "or$n/runs" --cost-model "m$n.json" --out "measured$n" --format csv -q 2>/dev/null) || [ $? -eq 1 ]
done
(head -n 1 "$work/measured1/predicted.csv"; for n in 1 2 4; do tail -n +2 "$work/measured$n/predicted.csv"; done) > "$work/measured.csv"
python3 bench/costmodel/ranks_sharing.py "$work/shipped/predicted.csv" "$work/measured.csv" "$work" \
  "$work/or4/host.txt" "$model" "$archive" > bench/results/costmodel-h100-ranks-sharing.json
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps(d["summary"]), json.dumps(d["cpu_adamw"]))' \
  bench/results/costmodel-h100-ranks-sharing.json
