#!/usr/bin/env bash
# Ranks sharing a host, on hosts no fit has seen (bench/costmodel/ranks_sharing.py): a host's
# offloaded runs (folders or1, or2, or4: 1, 2 and 4 ranks) priced by the shipped H100 model, and by
# the per-rank AdamW rate each folder's cpu_adamw.json measured with as many ranks at once as its
# runs had (the model's sharing exponent set to the one that rate implies,
# log(reference / per-rank rate) / log(ranks)).
#
#   bench/costmodel/check-ranks-sharing.sh [NAME...]   (after `make build`; default: x4 x2, the
#       archives bench/results/raw/gpu-DATE-h100NAME-ranks-sharing.tar.gz; writes
#       bench/results/costmodel-h100-ranks-sharing-NAME.json)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ZB=$PWD/${BIN:-target/release}/zerobench
model=$PWD/costmodel/models/h100.json
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(x4 x2)
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
for name in "${names[@]}"; do
archive=$(find bench/results/raw -name "gpu-*-h100$name-ranks-sharing.tar.gz" | sort | tail -n 1)
[ -n "$archive" ] || { echo "check-ranks-sharing.sh: no archive gpu-*-h100$name-ranks-sharing.tar.gz" >&2; exit 2; }
work=$root/$name
mkdir -p "$work"
tar -xzf "$archive" -C "$work"
find "$work" -depth -type d -name 'or_none_*' -exec rm -rf {} +
folders=() dirs=()
for n in 1 2 4; do
  if [ -d "$work/or$n/runs" ]; then folders+=("$n"); dirs+=("or$n/runs"); fi
done
(cd "$work" && "$ZB" ingest "${dirs[@]}" --cost-model "$model" --out shipped --format csv -q 2>/dev/null) ||
  [ $? -eq 1 ]
# Each folder of N ranks priced with the exponent its own cpu_adamw.json implies for N.
for n in "${folders[@]}"; do
  e=$(python3 -c '
import json, math, sys
fit = json.load(open(sys.argv[1]))["fits"][0]
n = sys.argv[3]
d = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
rate = d["ranks"][n]["adamw_params_per_s_per_rank"] / 1e9 if n != "1" else None
print(0.0 if rate is None else math.log(fit["host_adamw_gparams_per_s"] / rate) / math.log(int(n)))
' "$model" "$work/or$n/runs/cpu_adamw.json" "$n")
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); d["fits"][0]["step"]["offload.sharing_exponent"]=float(sys.argv[2]); json.dump(d, open(sys.argv[3], "w"))' \
    "$model" "$e" "$work/m$n.json"
  (cd "$work" && "$ZB" ingest "or$n/runs" --cost-model "m$n.json" --out "measured$n" --format csv -q 2>/dev/null) || [ $? -eq 1 ]
done
(head -n 1 "$work/measured${folders[0]}/predicted.csv"; for n in "${folders[@]}"; do tail -n +2 "$work/measured$n/predicted.csv"; done) \
  > "$work/measured.csv"
out=bench/results/costmodel-h100-ranks-sharing-$name.json
python3 bench/costmodel/ranks_sharing.py "$work/shipped/predicted.csv" "$work/measured.csv" "$work" \
  "$work/or${folders[-1]}/host.txt" "$model" "$archive" > "$out"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1], json.dumps(d["summary"]), json.dumps(d["cpu_adamw"]))' "$out"
done
