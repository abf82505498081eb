"""Reads the runs of `bench/gpu/run.sh binding` and prints how steady launch-bound steps are in each
mode: alone on the host, two at once free on the host, two at once each bound to its GPU's local
CPUs.

    python3 bench/gpu/report_binding.py RUNS HOST.txt COMMIT > binding.json

Run folders are `bind-<mode>/<costmodel run>_gpu<I>_<round>`. Per configuration and mode: every
run's median step (of its measured steps), the spread between runs (largest median over smallest,
minus one), and the runs' mean coefficient of variation over their measured steps. The summary
averages those over the configurations, per mode; a failed run shows as null."""
import glob
import json
import os
import re
import statistics
import sys

from common import rank0_records, runs_of_a_setting, steadiness

MODES = ("alone", "free", "bound")


def main():
    runs, host, commit = sys.argv[1:4]
    cases = {}
    for d in sorted(glob.glob(os.path.join(runs, "bind-*", "*"))):
        m = re.fullmatch(r"bind-(\w+)/(.+)_gpu(\d)_(\d+)", os.path.relpath(d, runs))
        if not m or not os.path.isdir(d):
            continue
        mode, name, gpu, rnd = m.groups()
        run = {"gpu": int(gpu), "round": int(rnd)} | steadiness(rank0_records(d))
        cases.setdefault(name, {}).setdefault(mode, []).append(run)
    table = []
    for name, modes in sorted(cases.items()):
        row = {"run": name}
        for mode, rs in modes.items():
            ok = [r for r in rs if r["step_ms"] is not None]
            row[mode] = runs_of_a_setting([r["step_ms"] for r in rs], rs)
            row[mode]["mean_cv"] = round(statistics.mean(r["cv"] for r in ok), 4) if ok else None
        table.append(row)
    summary = {}
    for mode in MODES:
        every = [r[mode] for r in table if mode in r]
        rows = [r for r in every if r["spread"] is not None]
        if rows:
            summary[mode] = {"configurations": len(rows),
                             "mean_spread": round(statistics.mean(r["spread"] for r in rows), 4),
                             "mean_cv": round(statistics.mean(r["mean_cv"] for r in rows), 4),
                             "failed_runs": sum(r["failed"] for r in every)}
    print(json.dumps({"benchmark": "bench/gpu/run.sh binding", "commit": commit,
                      "host": open(host).read().strip().splitlines(),
                      "step_time": "median of each run's 20 measured steps (30, 10 warm-up)",
                      "spread": "largest run median over smallest, minus one, per configuration and mode",
                      "summary": summary, "configurations": table}, indent=1))


if __name__ == "__main__":
    main()
