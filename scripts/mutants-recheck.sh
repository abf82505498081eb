#!/usr/bin/env bash
# Runs again, on the tree as it is now, the survivors of one scripts/mutants.sh result that
# bench/mutants-accepted.txt does not accept: after tests were added for them, which of them the
# crate's tests now catch.
#
#   scripts/mutants-recheck.sh bench/results/mutants-zerobench-launcher-shard3.json
#
# Writes the same path with `-recheck` before `.json`: the package, the file rechecked, and each
# survivor's outcome now.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/mutants-common.sh
mutants_prepare "$0" "$@"
result=${1:?usage: scripts/mutants-recheck.sh RESULT.json}
package=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["package"])' "$result")
mapfile -t res < <(python3 - "$result" <<'PY'
import json, sys
sys.path.insert(0, "scripts")
from mutants_common import accepted, placeless_pattern
accepted = accepted()
for m in json.load(open(sys.argv[1]))["missed"]:
    if m["mutant"] not in accepted:
        # Found by file, column, change and function: lines added above it move its line.
        print("--re=" + placeless_pattern(m["mutant"]))
PY
)
[ ${#res[@]} -gt 0 ] || { echo "$result: no survivor to recheck"; exit 0; }
out="mutants.out/recheck-$(basename "$result" .json)"
mutants_run "$package" "$out" "${res[@]}"
python3 - "$out/mutants.out/outcomes.json" "$package" "$result" > "${result%.json}-recheck.json" <<'PY'
import datetime, json, socket, sys
sys.path.insert(0, "scripts")
from mutants_common import outcomes
path, package, rechecked = sys.argv[1:4]
rows = [{"mutant": name, "outcome": s} for name, s in outcomes(path)]
counts = {}
for r in rows:
    counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
print(json.dumps({"benchmark": "scripts/mutants-recheck.sh", "package": package, "rechecked": rechecked,
                  "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  "host": socket.gethostname(), "counts": counts, "outcomes": rows}, indent=1))
PY
echo "$package: $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["counts"])' "${result%.json}-recheck.json")"
