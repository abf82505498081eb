"""Reads the runs of `bench/gpu/run.sh step-ab` (this build and BASE_BIN alternating on one GPU)
and prints, per configuration, every run's step time (the median of its measured steps), forward
and backward time, peak allocated memory and losses, and the new build's median over the base's.

    python3 bench/gpu/report_ab.py RUNS HOST.txt NEW_COMMIT BASE_COMMIT > step-ab.json

Run names are `ab_<case>_<new|base>_<round>`. A ratio is only taken where both builds have every
round; a failed run shows as null."""
import glob
import json
import os
import re
import statistics
import sys

from common import build_summary, json_lines, slowest_rank_steps


def summary(run_dir):
    """The run's summary, each step's time the slowest rank's (common.read_archive's rule; with
    `AB_GPUS` above 1 a run has several rank logs)."""
    by_rank = {}
    for f in glob.glob(os.path.join(run_dir, "rank*.jsonl")):
        if m := re.fullmatch(r"rank(\d+)\.jsonl", os.path.basename(f)):
            by_rank[int(m.group(1))] = json_lines(open(f).read())
    return build_summary(slowest_rank_steps(by_rank)) if 0 in by_rank else None


def largest_difference(runs_a, runs_b):
    """The largest difference of any step's loss between any run of `runs_a` and any of `runs_b`."""
    return max(abs(x - y) for a in runs_a for b in runs_b for x, y in zip(a["losses"], b["losses"]))


def main():
    runs, host, new_commit, base_commit = sys.argv[1:5]
    names = [os.path.basename(d) for d in glob.glob(os.path.join(runs, "ab_*")) if os.path.isdir(d)]
    parsed = [m.groups() for n in names if (m := re.fullmatch(r"ab_(.+)_(new|base)_(\d+)", n))]
    cases = []
    for case in sorted({c for c, _, _ in parsed}):
        rounds = sorted({int(r) for c, _, r in parsed if c == case})
        side = {w: [summary(os.path.join(runs, f"ab_{case}_{w}_{r}")) for r in rounds] for w in ("new", "base")}
        complete = all(s is not None for w in side for s in side[w])
        ratio = None
        if complete:
            ratio = round(statistics.median(s["step_ms"] for s in side["new"])
                          / statistics.median(s["step_ms"] for s in side["base"]), 4)
        worst_loss = spread = None
        if complete:
            worst_loss = largest_difference(side["new"], side["base"])
            # Runs of one build differ too (atomics in libtorch's and cuDNN's backward kernels):
            # the largest difference between the base build's own rounds, for scale.
            if len(rounds) > 1:
                spread = largest_difference(side["base"][:1], side["base"][1:])
        cases.append({"case": case, "rounds": rounds, "new": side["new"], "base": side["base"],
                      "new_over_base": ratio, "largest_loss_difference": worst_loss,
                      "base_rounds_largest_loss_difference": spread})
    print(json.dumps({"benchmark": "bench/gpu/run.sh step-ab", "commit": new_commit, "base_commit": base_commit,
                      "host": open(host).read().strip().splitlines(),
                      "step_time": "median of the measured steps (AB_STEPS, default 20, of which 4 warm-up), sequence 1024",
                      "cases": cases}, indent=1))


if __name__ == "__main__":
    main()
