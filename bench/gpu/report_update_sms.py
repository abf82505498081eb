"""Reads the runs of `bench/gpu/run.sh update-sms` (one build replaying its steps on one GPU, with
each `--update-sms` in turn) and prints, per configuration and value, every round's step time (the
median of its measured steps), backward and optimizer phases, peak allocated memory and losses,
and each value's median step over that of `--update-sms 0` (the products taking every
multiprocessor, as the worker ran before the carve-out).

    python3 bench/gpu/report_update_sms.py RUNS HOST.txt COMMIT > update-sms.json

Run names are `us_<case>_sms<value>_<round>`. A ratio is only taken where both values have every
round; a failed run shows as null."""
import glob
import json
import os
import re
import statistics
import sys

from report_ab import largest_difference, summary


def main():
    runs, host, commit = sys.argv[1:4]
    names = [os.path.basename(d) for d in glob.glob(os.path.join(runs, "us_*")) if os.path.isdir(d)]
    parsed = [m.groups() for n in names if (m := re.fullmatch(r"us_(.+)_sms(\d+)_(\d+)", n))]
    cases = []
    for case in sorted({c for c, _, _ in parsed}):
        rounds = sorted({int(r) for c, _, r in parsed if c == case})
        values = sorted({int(v) for c, v, _ in parsed if c == case})
        runs_of = {v: [summary(os.path.join(runs, f"us_{case}_sms{v}_{r}")) for r in rounds] for v in values}
        median = {v: statistics.median(s["step_ms"] for s in rs) if all(rs) else None for v, rs in runs_of.items()}
        none = median.get(0)
        over = {str(v): round(m / none, 4) if m is not None and none else None for v, m in median.items()}
        worst = {str(v): largest_difference(rs, runs_of[0]) if all(rs) and all(runs_of.get(0, [None])) else None
                 for v, rs in runs_of.items() if v != 0}
        cases.append({"case": case, "rounds": rounds,
                      "runs": {str(v): rs for v, rs in runs_of.items()},
                      "median_step_ms": {str(v): m for v, m in median.items()},
                      "over_none": over, "largest_loss_difference_from_none": worst})
    print(json.dumps({"benchmark": "bench/gpu/run.sh update-sms", "commit": commit,
                      "host": open(host).read().strip().splitlines(),
                      "step_time": "median of the measured steps (US_STEPS, default 20, of which 4 warm-up), "
                                   "sequence 1024, --cuda-graph",
                      "cases": cases}, indent=1))


if __name__ == "__main__":
    main()
