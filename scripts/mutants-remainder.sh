#!/usr/bin/env bash
# Runs the mutants of PACKAGE that none of its results in bench/results/ ran. Shards that ran one
# after another on a tree that changed between them (tests added, code moved or split) leave some
# of the current tree's mutants in no shard; this runs those, so that the shards and the remainder
# together cover every mutant of the tree once.
#
#   scripts/mutants-remainder.sh zerobench-ingest
#
# A mutant counts as run when a result's "ran" list holds one with the same file, column, change
# and function (its line may have moved); where the tree now has more mutants of that name than
# the results ran (earlier remainders included), all of them run again. Writes
# bench/results/mutants-PACKAGE-remainder.json (then -remainder2.json, ...), in the form of
# scripts/mutants.sh's results.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/mutants-common.sh
mutants_prepare "$0" "$@"
package=${1:?usage: scripts/mutants-remainder.sh PACKAGE}
list=$(mktemp) keys=$(mktemp)
trap 'rm -f "$list" "$keys"' EXIT
cargo mutants -p "$package" --list > "$list"
mapfile -t res < <(python3 - "$package" "$list" "$keys" <<'PY'
import collections, glob, json, sys
sys.path.insert(0, "scripts")
from mutants_common import placeless, placeless_pattern
package, listed, keys = sys.argv[1:4]
ran = collections.Counter()
for path in glob.glob(f"bench/results/mutants-{package}*.json"):
    if path.endswith("-recheck.json"):
        continue
    d = json.load(open(path))
    if "ran" not in d:
        sys.exit(f"{path} has no list of the mutants it ran")
    ran.update(placeless(m) for m in d["ran"])
# The tree's mutants by placeless name: how many, and the first one's name (for its pattern).
now, first = collections.Counter(), {}
for name in (l.strip() for l in open(listed)):
    if name:
        now[placeless(name)] += 1
        first.setdefault(placeless(name), name)
with open(keys, "w") as k:
    for key, n in sorted(now.items()):
        if n > ran[key]:
            print("--re=" + placeless_pattern(first[key]))
            print(key, file=k)
PY
)
[ ${#res[@]} -gt 0 ] || { echo "$package: every mutant has run"; exit 0; }
echo "$package: ${#res[@]} mutant names left to run"
# An earlier remainder's result stays: this one is -remainder2.json, -remainder3.json, ...
n=""
while [ -e "bench/results/mutants-$package-remainder$n.json" ]; do n=$(( ${n:-1} + 1 )); done
result="bench/results/mutants-$package-remainder$n.json"
out="mutants.out/$package-remainder$n"
mutants_run "$package" "$out" "${res[@]}"
# Only the outcomes asked for: cargo-mutants 27.1 runs its "delete field" mutants whatever --re
# says, and those ran in the shards already.
python3 - "$out/mutants.out/outcomes.json" "$package" "$keys" > "$result" <<'PY'
import json, sys
sys.path.insert(0, "scripts")
from mutants_common import result
keys = {l.rstrip("\n") for l in open(sys.argv[3])}
print(json.dumps(result(sys.argv[1], sys.argv[2], "remainder", "scripts/mutants-remainder.sh", keys), indent=1))
PY
echo "$package remainder: $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["counts"], "caught", d["caught_share_of_viable"])' "$result")"
