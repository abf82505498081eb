"""Reads the runs of `bench/gpu/run.sh launch-cpu` and prints, per configuration, the steps with the
launching threads free (`--launch-cpu none`) and on one CPU (`--launch-cpu auto`, or a CPU number).

    python3 bench/gpu/report_launch_cpu.py RUNS HOST.txt COMMIT > launch-cpu.json

Run folders are `lc/<configuration>_<none|auto|CPU>_<round>`; the settings take turns within each
round. Per configuration and setting: every run's median step (of its measured steps) and its
coefficient of variation over them, the median of the runs' medians, and the spread between runs
(largest median over smallest, minus one). Per configuration and setting other than none: its
median over none's, and the range of the paired ratios, round by round. A run that failed shows as null."""
import glob
import json
import os
import re
import statistics
import sys

from common import rank0_records, runs_of_a_setting, steadiness


def run_summary(run_dir):
    recs = rank0_records(run_dir)
    util = [r["gpu_util_pct"] for r in recs
            if r["event"] == "step" and not r["warmup"] and r.get("gpu_util_pct") is not None]
    start = next((r for r in recs if r["event"] == "start"), {})
    return steadiness(recs) | {"gpu_util_pct": statistics.median(util) if util else None,
                               "launch_cpu": start.get("device", {}).get("launch_cpu")}


def main():
    runs, host, commit = sys.argv[1:4]
    cases, settings = {}, set()
    for d in sorted(glob.glob(os.path.join(runs, "lc", "*"))):
        m = re.fullmatch(r"(.+)_(none|auto|\d+)_(\d+)", os.path.basename(d))
        if not m or not os.path.isdir(d):
            continue
        name, setting, rnd = m.groups()
        settings.add(setting)
        cases.setdefault(name, {}).setdefault(setting, {})[int(rnd)] = run_summary(d)
    # none first, then auto, then CPU numbers
    settings = sorted(settings, key=lambda s: (s != "none", s != "auto", int(s) if s.isdigit() else 0))
    table = []
    for name, by in sorted(cases.items()):
        row = {"configuration": name}
        for setting in settings:
            rs = by.get(setting, {})
            row[setting] = runs_of_a_setting([r["step_ms"] for r in rs.values()],
                                             {str(k): v for k, v in sorted(rs.items())})
        n = row.get("none", {}).get("median_step_ms")
        for setting in settings[1:]:
            a = row[setting]["median_step_ms"]
            paired = [by[setting][k]["step_ms"] / by["none"][k]["step_ms"]
                      for k in sorted(set(by.get(setting, {})) & set(by.get("none", {})))
                      if by[setting][k]["step_ms"] and by["none"][k]["step_ms"]]
            row[setting]["over_none"] = round(a / n, 4) if a and n else None
            row[setting]["paired_over_none"] = [round(min(paired), 4), round(max(paired), 4)] if paired else None
        table.append(row)
    spreads = {s: [r[s]["spread"] for r in table if r[s]["spread"] is not None] for s in settings}
    summary = {"configurations": len(table),
               "over_none": {s: {r["configuration"]: r[s]["over_none"] for r in table} for s in settings[1:]},
               "mean_spread": {s: round(statistics.mean(v), 4) if v else None for s, v in spreads.items()},
               "failed_runs": sum(r[s]["failed"] for r in table for s in settings)}
    print(json.dumps({"benchmark": "bench/gpu/run.sh launch-cpu", "commit": commit,
                      "host": open(host).read().strip().splitlines(),
                      "step_time": "median of each run's measured steps (LC_STEPS, default 60, 10 warm-up)",
                      "spread": "largest run median over smallest, minus one, per configuration and setting",
                      "summary": summary, "configurations": table}, indent=1))


if __name__ == "__main__":
    main()
