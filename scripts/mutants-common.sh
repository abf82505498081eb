# Sourced by scripts/mutants.sh and scripts/mutants-recheck.sh: the steps both take.

# mutants_prepare "$0" "$@": re-runs the script in a PID namespace of its own (a mutant signalling
# pid -1 then reaches only the tests) and checks that cargo-mutants is there.
mutants_prepare() {
  [ -n "${ZB_IN_PID_NAMESPACE:-}" ] || exec scripts/in-pid-namespace.sh "$@"
  command -v cargo-mutants >/dev/null || { echo "cargo-mutants is not installed: cargo install cargo-mutants --locked" >&2; exit 2; }
}

# mutants_run PACKAGE OUT [ARG...]: cargo-mutants over PACKAGE's library and integration tests
# (debug builds, no doctests; the cost model's as below), its report in OUT. Exit 2 (mutants
# survived) and 3 (some timed out) are findings, not failures of the script.
mutants_run() {
  local package=$1 out=$2 rc=0
  shift 2
  local tests=(--cargo-test-arg=--lib --cargo-test-arg=--tests)
  if [ "$package" = zerobench-costmodel ]; then
    # The fit's and the prices' tests are slow in a debug build (four minutes against ten
    # seconds), and the CLI's cost-model tests run the fit end to end on synthetic logs: both
    # packages' tests, in release, the CLI's cost-model file only. cargo-mutants' own baseline
    # runs the mutated package's tests alone, which have no `costmodel` target: the unmutated
    # tree is tested here instead, and the time limits are set rather than measured.
    cargo test --profile release -p zerobench-costmodel -p zerobench --lib --test costmodel >/dev/null
    tests=(--profile release --test-package zerobench-costmodel --test-package zerobench
      --cargo-test-arg=--lib --cargo-test-arg=--test=costmodel
      --baseline skip --timeout 240 --build-timeout 900)
  fi
  cargo mutants -p "$package" --output "$out" --no-shuffle "$@" "${tests[@]}" || rc=$?
  [ "$rc" = 0 ] || [ "$rc" = 2 ] || [ "$rc" = 3 ] || exit "$rc"
}
