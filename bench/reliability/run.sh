#!/usr/bin/env bash
# The times docs/reliability.md quotes, measured on this host: how long each CPU fault of
# tests/it/reliability.rs takes to be handled (the tests print `reliability-timing NAME SECONDS`),
# and how long the fuzz campaign takes per parser. Writes bench/results/reliability-cpu.json
# (override with OUT=...), with the host, the date and the commit measured.
#   bench/reliability/run.sh                # 1 000 000 fuzz inputs per parser
#   CASES=20000 bench/reliability/run.sh    # what CI runs
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
[ -n "${LIBTORCH:-}" ] || eval "$(make -s env)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=${OUT:-bench/results/reliability-cpu.json}
cases=${CASES:-1000000}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Everything built first, so that the times are of the tests alone.
cargo build --release --workspace --bins
cargo test --release -p zerobench-e2e -p zerobench-launcher -p zerobench-ingest --no-run
cut -d' ' -f1-3 /proc/loadavg > "$work/load"

# One test at a time, so that no fault is timed on a host busy with another.
cargo test --release -p zerobench-e2e reliability:: -- --nocapture --test-threads=1 2>&1 | tee "$work/faults.log"

# Each fuzz test alone; libtest's "finished in" is the test binary's own time.
fuzz() {  # fuzz LOG VARIABLE CARGO-TEST-ARGS... -- TEST
  local log=$1 var=$2
  shift 2
  env "$var=$cases" cargo test --release "$@" --exact 2>&1 | tee "$work/$log"
}
fuzz hostlist ZEROBENCH_FUZZ_CASES -p zerobench-launcher --test fuzz -- hostlist_expand_and_compress_never_panic
fuzz hostfiles ZEROBENCH_FUZZ_CASES -p zerobench-launcher --test fuzz -- hostfile_parsers_never_panic
fuzz specs ZEROBENCH_FUZZ_CASES -p zerobench-launcher --test fuzz -- spec_loader_never_panics
fuzz loglines ZEROBENCH_FUZZ_LINES -p zerobench-ingest --test it -- fastpath::a_fuzzed_log_never_panics

python3 - "$work" "$cases" "$out" <<'PY'
import datetime, json, os, platform, re, subprocess, sys
work, cases, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
read = lambda name: open(os.path.join(work, name)).read()
git = lambda *a: subprocess.run(["git", *a], capture_output=True, text=True).stdout.strip()
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), None)

def finished(log):
    """The seconds libtest reports for the one test that ran; fails unless it passed."""
    m = re.search(r"test result: ok\. 1 passed.*finished in ([\d.]+)s", read(log))
    if not m:
        sys.exit(f"{log}: the test did not pass alone:\n{read(log)[-2000:]}")
    return float(m.group(1))

# Anywhere on a line: with --nocapture libtest's "test NAME ..." may precede it.
faults = {m.group(1): float(m.group(2)) for m in re.finditer(r"reliability-timing (\S+) ([\d.]+)", read("faults.log"))}
if "test result: ok." not in read("faults.log") or len(faults) < 5:
    sys.exit("the reliability tests failed or printed too few timings")
fuzz = [
    {"parser": "hostlist expand + compress", "test": "launcher/tests/fuzz.rs hostlist_expand_and_compress_never_panic", "log": "hostlist"},
    {"parser": "hostfiles, all three formats", "test": "launcher/tests/fuzz.rs hostfile_parsers_never_panic", "log": "hostfiles"},
    {"parser": "experiment specs (YAML)", "test": "launcher/tests/fuzz.rs spec_loader_never_panics", "log": "specs"},
    {"parser": "log lines through ingest's reader", "test": "ingest/tests/it/fastpath.rs a_fuzzed_log_never_panics", "log": "loglines"},
]
for f in fuzz:
    f["inputs"] = cases
    f["seconds"] = finished(f.pop("log"))
result = {
    "benchmark": "reliability-cpu",
    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "host": platform.node(), "cpu": cpu, "cores": os.cpu_count(),
    "load_average_before": read("load").split(),
    "commit": git("rev-parse", "HEAD"),
    "worktree_clean": git("status", "--porcelain", "--untracked-files=no") == "",
    "rustc": subprocess.run(["rustc", "--version"], capture_output=True, text=True).stdout.strip() or None,
    "fault_seconds": faults,
    "fuzz": fuzz,
}
json.dump(result, open(out, "w"), indent=1)
print(json.dumps(result, indent=1))
PY
