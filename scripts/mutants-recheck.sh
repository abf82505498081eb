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
# In a PID namespace of its own, so that a mutant signalling pid -1 reaches only the tests.
[ -n "${ZB_IN_PID_NAMESPACE:-}" ] || exec scripts/in-pid-namespace.sh "$0" "$@"
result=${1:?usage: scripts/mutants-recheck.sh RESULT.json}
command -v cargo-mutants >/dev/null || { echo "cargo-mutants is not installed: cargo install cargo-mutants --locked" >&2; exit 2; }
package=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["package"])' "$result")
mapfile -t res < <(python3 - "$result" <<'PY'
import json, re, sys
accepted = {l.partition(" # ")[0].strip() for l in open("bench/mutants-accepted.txt") if l.strip() and not l.startswith("#")}
for m in json.load(open(sys.argv[1]))["missed"]:
    if m["mutant"] not in accepted:
        print("--re=^" + re.escape(m["mutant"]) + "$")
PY
)
[ ${#res[@]} -gt 0 ] || { echo "$result: no survivor to recheck"; exit 0; }
out="mutants.out/recheck-$(basename "$result" .json)"
rc=0
cargo mutants -p "$package" --output "$out" --no-shuffle "${res[@]}" \
  --cargo-test-arg=--lib --cargo-test-arg=--tests || rc=$?
[ "$rc" = 0 ] || [ "$rc" = 2 ] || [ "$rc" = 3 ] || exit "$rc"
python3 - "$out/mutants.out/outcomes.json" "$package" "$result" > "${result%.json}-recheck.json" <<'PY'
import datetime, json, socket, sys
path, package, rechecked = sys.argv[1:4]
o = json.load(open(path))
rows = [{"mutant": r["scenario"]["Mutant"]["name"], "outcome": r["summary"]}
        for r in o["outcomes"] if isinstance(r["scenario"], dict)]
counts = {}
for r in rows:
    counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
print(json.dumps({"benchmark": "scripts/mutants-recheck.sh", "package": package, "rechecked": rechecked,
                  "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  "host": socket.gethostname(), "counts": counts, "outcomes": rows}, indent=1))
PY
echo "$package: $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["counts"])' "${result%.json}-recheck.json")"
