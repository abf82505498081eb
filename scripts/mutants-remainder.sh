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
# the results ran, all of them run again. Writes bench/results/mutants-PACKAGE-remainder.json, in the
# form of scripts/mutants.sh's results.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/mutants-common.sh
mutants_prepare "$0" "$@"
package=${1:?usage: scripts/mutants-remainder.sh PACKAGE}
list=$(mktemp)
trap 'rm -f "$list"' EXIT
cargo mutants -p "$package" --list > "$list"
mapfile -t res < <(python3 - "$package" "$list" <<'PY'
import collections, glob, json, sys
sys.path.insert(0, "scripts")
from mutants_common import placeless, placeless_pattern
package, listed = sys.argv[1:3]
ran = collections.Counter()
for path in glob.glob(f"bench/results/mutants-{package}*.json"):
    if path.endswith("-recheck.json") or path.endswith("-remainder.json"):
        continue
    d = json.load(open(path))
    if "ran" not in d:
        sys.exit(f"{path} has no list of the mutants it ran")
    ran.update(placeless(m) for m in d["ran"])
now = collections.Counter(placeless(l.strip()) for l in open(listed) if l.strip())
for key, n in sorted(now.items()):
    if n > ran[key]:
        name = next(l.strip() for l in open(listed) if placeless(l.strip()) == key)
        print("--re=" + placeless_pattern(name))
PY
)
[ ${#res[@]} -gt 0 ] || { echo "$package: every mutant has run"; exit 0; }
echo "$package: ${#res[@]} mutant names left to run"
out="mutants.out/$package-remainder"
mutants_run "$package" "$out" "${res[@]}"
python3 - "$out/mutants.out/outcomes.json" "$package" > "bench/results/mutants-$package-remainder.json" <<'PY'
import json, sys
sys.path.insert(0, "scripts")
from mutants_common import result
print(json.dumps(result(sys.argv[1], sys.argv[2], "remainder", "scripts/mutants-remainder.sh"), indent=1))
PY
echo "$package remainder: $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["counts"], "caught", d["caught_share_of_viable"])' "bench/results/mutants-$package-remainder.json")"
