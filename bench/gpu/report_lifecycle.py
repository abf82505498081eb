"""Reads the runs of `bench/gpu/run.sh lifecycle` (the worker's start-up and ending on a GPU host)
and checks each against what docs/reliability.md promises; prints lifecycle.json.

    python3 bench/gpu/report_lifecycle.py RUNS HOST.txt COMMIT > lifecycle.json

Each case left RUNS/lc_<case>.rc (mpirun's exit code and the milliseconds it took), its output
RUNS/lc_<case>.out and its logs RUNS/lc_<case>/rank<N>.jsonl. A case passes when its records and
exit codes are the promised ones; `ok` is whether every case did."""
import json
import os
import sys

from common import json_lines


def records(runs, case, rank=0):
    f = os.path.join(runs, f"lc_{case}", f"rank{rank}.jsonl")
    return json_lines(open(f).read()) if os.path.exists(f) else []


def events(recs):
    return [r.get("event") for r in recs]


def last_error(recs):
    return next((r for r in reversed(recs) if r.get("event") == "error"), None)


def end_of(recs):
    return recs[-1] if recs and recs[-1].get("event") == "end" else None


def check(runs, case):
    """(promise, passed, what was seen) of one case."""
    rc_file = os.path.join(runs, f"lc_{case}.rc")
    if not os.path.exists(rc_file):
        return "ran", False, {"missing": rc_file}
    rc, ms = (int(x) for x in open(rc_file).read().split())
    out = open(os.path.join(runs, f"lc_{case}.out"), errors="replace").read()
    recs = records(runs, case)
    seen = {"mpirun_rc": rc, "ms": ms, "events": sorted(set(events(recs))), "first": events(recs)[:1],
            "output_tail": out[-600:]}
    err, end = last_error(recs), end_of(recs)
    if err:
        seen["error"] = {k: err.get(k) for k in ("class", "message")}
    if end:
        seen["end"] = {k: end.get(k) for k in ("status", "exit_code", "steps_completed")}
    if case == "normal":
        ok = rc == 0 and events(recs)[:2] == ["start", "setup"] and end is not None and end["status"] == "ok"
        return "a run that ends normally: start, setup, its steps, end ok, exit 0", ok, seen
    if case == "nccl_init":
        ok = (events(recs)[:1] == ["start"] and err is not None and err["class"] == "comm"
              and end is not None and end["exit_code"] == 4 and rc != 0)
        return "NCCL that cannot start is logged after `start`: error (comm), end, exit 4", ok, seen
    if case == "auto_two":
        # Refused before any log opened, at once (it waited for the 300 s stall limit before).
        no_log = not records(runs, case, 0) and not records(runs, case, 1)
        ok = rc != 0 and ms < 60_000 and no_log and "on the CPU" in out
        return "two ranks with --device auto on a host of one GPU: refused at once, no log", ok, seen
    sig = {"usr1": ("SIGUSR1", 10), "usr1_mpirun": ("SIGUSR1", 10), "term": ("SIGTERM", 15)}.get(case)
    if sig:
        name, number = sig
        ok = (err is not None and err["class"] == "terminated" and name in err["message"]
              and end is not None and end["exit_code"] == 128 + number)
        to = " through mpirun, which forwards it" if case.endswith("_mpirun") else ""
        return f"{name} to a running rank{to}: error (terminated, names it), end, exit {128 + number}", ok, seen
    return "known case", False, seen


def main():
    runs, host, commit = sys.argv[1:4]
    cases = []
    for case in ("normal", "nccl_init", "auto_two", "usr1", "usr1_mpirun", "term"):
        promise, ok, seen = check(runs, case)
        cases.append({"case": case, "promise": promise, "ok": ok, "seen": seen})
    print(json.dumps({
        "benchmark": "lifecycle",
        "host": open(host).read().splitlines() if os.path.exists(host) else None,
        "commit": commit,
        # Open MPI's launcher: under `isolated` (some container hosts) mpirun forwards no signal.
        "environment": {k: os.environ.get(k) for k in ("OMPI_MCA_plm",)},
        "ok": all(c["ok"] for c in cases),
        "cases": cases,
    }, indent=1))


if __name__ == "__main__":
    main()
