#!/usr/bin/env bash
# Runs again, on the tree as it is now, the survivors of scripts/mutants.sh results that
# bench/mutants-accepted.txt does not accept: after tests were added for them, which of them the
# crate's tests now catch. Several results of one package are rechecked in one cargo-mutants run
# (one baseline build and test for all).
#
#   scripts/mutants-recheck.sh bench/results/mutants-zerobench-launcher-shard3.json [RESULT.json...]
#
# Writes, per result, the same path with `-recheck` before `.json`: the package, the file
# rechecked, and the outcome now of each mutant found for its survivors. A survivor is found by
# its file, column, change and function, so that lines added above it do not lose it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/mutants-common.sh
mutants_prepare "$0" "$@"
[ $# -gt 0 ] || { echo "usage: scripts/mutants-recheck.sh RESULT.json [RESULT.json...]" >&2; exit 2; }
package=$(python3 - "$@" <<'PY'
import json, sys
packages = {json.load(open(p))["package"] for p in sys.argv[1:]}
if len(packages) != 1:
    sys.exit(f"results of several packages: {sorted(packages)}; recheck one package at a time")
print(packages.pop())
PY
)
mapfile -t res < <(python3 - "$@" <<'PY'
import json, sys
sys.path.insert(0, "scripts")
from mutants_common import accepted, placeless_pattern
accepted = accepted()
patterns = {placeless_pattern(m["mutant"]) for p in sys.argv[1:] for m in json.load(open(p))["missed"]
            if m["mutant"] not in accepted}
for p in sorted(patterns):
    print("--re=" + p)
PY
)
[ ${#res[@]} -gt 0 ] || { echo "$*: no survivor to recheck"; exit 0; }
out="mutants.out/recheck-$(basename "$1" .json)${2:+-and-$(( $# - 1 ))-more}"
mutants_run "$package" "$out" "${res[@]}"
python3 - "$out/mutants.out/outcomes.json" "$package" "$@" <<'PY'
import datetime, json, socket, sys
sys.path.insert(0, "scripts")
from mutants_common import accepted, outcomes, placeless
path, package, results = sys.argv[1], sys.argv[2], sys.argv[3:]
accepted = accepted()
found = outcomes(path)
for result in results:
    wanted = {placeless(m["mutant"]) for m in json.load(open(result))["missed"] if m["mutant"] not in accepted}
    rows = [{"mutant": name, "outcome": s} for name, s in found if placeless(name) in wanted]
    counts = {}
    for r in rows:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    with open(result[: -len(".json")] + "-recheck.json", "w") as f:
        json.dump({"benchmark": "scripts/mutants-recheck.sh", "package": package, "rechecked": result,
                   "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   "host": socket.gethostname(), "counts": counts, "outcomes": rows}, f, indent=1)
        f.write("\n")
    print(f"{result}: {counts}")
PY
