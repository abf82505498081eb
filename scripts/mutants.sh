#!/usr/bin/env bash
# `make mutants`: mutation testing of the crates without libtorch (schema, launcher, ingest) with
# cargo-mutants (`cargo install cargo-mutants --locked`). Each mutant is one small change to a
# function (a `+` for a `-`, a body replaced by a default, a condition negated); the crate's tests
# must fail on it. Long on 2 cores (thousands of mutants), so not part of `make test`.
#
#   scripts/mutants.sh [PACKAGE...]          # default: zerobench-schema zerobench-launcher zerobench-ingest
#   MUTANTS_SHARD=0/4 scripts/mutants.sh ... # a quarter of them (cargo-mutants --shard)
#   MUTANTS_SHARDING=round-robin              # every 4th mutant instead of a consecutive quarter:
#                                             # a sample spread over the whole crate
#
# Writes mutants.out/ (cargo-mutants' own report) and bench/results/mutants-<package>.json (with a
# shard, mutants-<package>-shard<K>.json, so that shards run one after another keep their results): the
# counts, the share caught among the viable mutants, every surviving mutant with whether
# bench/mutants-accepted.txt accepts it (equivalent mutants and the like, one line of reason each),
# and every mutant that ran (scripts/mutants-remainder.sh reads it).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/mutants-common.sh
mutants_prepare "$0" "$@"
packages=("$@")
[ ${#packages[@]} -gt 0 ] || packages=(zerobench-schema zerobench-launcher zerobench-ingest)
for p in "${packages[@]}"; do
  out="mutants.out/$p" result="bench/results/mutants-$p.json"
  shard=()
  if [ -n "${MUTANTS_SHARD:-}" ]; then
    shard=(--shard "$MUTANTS_SHARD")
    out="$out-shard${MUTANTS_SHARD%%/*}" result="bench/results/mutants-$p-shard${MUTANTS_SHARD%%/*}.json"
    if [ "${MUTANTS_SHARDING:-slice}" = round-robin ]; then
      shard+=(--sharding round-robin)
      out="$out-of${MUTANTS_SHARD##*/}-rr" result="${result%.json}-of${MUTANTS_SHARD##*/}-round-robin.json"
    fi
  fi
  mkdir -p "$out"
  mutants_run "$p" "$out" "${shard[@]}"
  python3 - "$out/mutants.out/outcomes.json" "$p" "${MUTANTS_SHARD:-all}${MUTANTS_SHARD:+ ${MUTANTS_SHARDING:-slice}}" > "$result" <<'PY'
import json, sys
sys.path.insert(0, "scripts")
from mutants_common import result
print(json.dumps(result(*sys.argv[1:4]), indent=1))
PY
  echo "$p: $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["counts"], "caught", d["caught_share_of_viable"])' "$result")"
done
