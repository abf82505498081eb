"""How far apart the stages of one configuration measure on one GPU, where they compute the same
work: from a fitted model file (costmodel/models/KIND.json, which lists every run it was fitted on
with its configuration and step time), per group of one-GPU runs without offload that differ only
in the stage (model, micro-batch, sequence, accumulation, precision), stage 3's median over stage
0's, and whether the two stages' runs overlap (the slowest run of the faster stage at least as slow
as the fastest run of the other).

    python3 bench/costmodel/stages.py costmodel/models/h100.json > bench/results/costmodel-h100-stages.json

Prints one JSON document: per group the runs of each stage and the ratio; over the groups the
median, smallest and largest ratio, and how many overlap."""
import collections
import json
import statistics
import sys


def main():
    path = sys.argv[1]
    groups = collections.defaultdict(lambda: collections.defaultdict(list))
    for fit in json.load(open(path))["fits"]:
        for run in fit["runs"]:
            q, c = run["query"], run["query"]["config"]
            if q["gpus"] != 1 or c["offload"] != "none":
                continue
            name = f"{fit['gpu']} {c['precision']} {c['model']} mb{c['micro_batch']} s{c['seq_len']} ga{c['grad_accum']}"
            groups[name][c["stage"]].append(run["step_ms"])
    rows = []
    for name, by_stage in sorted(groups.items()):
        if 0 not in by_stage or 3 not in by_stage:
            continue
        z0, z3 = sorted(by_stage[0]), sorted(by_stage[3])
        fast, slow = (z0, z3) if statistics.median(z0) <= statistics.median(z3) else (z3, z0)
        rows.append({"group": name, "stage0_ms": [round(x, 3) for x in z0], "stage3_ms": [round(x, 3) for x in z3],
                     "stage3_over_stage0": round(statistics.median(z3) / statistics.median(z0), 3),
                     "overlap": fast[-1] >= slow[0]})
    ratios = [r["stage3_over_stage0"] for r in rows]
    print(json.dumps({
        "benchmark": "bench/costmodel/stages.py: one-GPU groups with stages 0 and 3, stage 3's median step over stage 0's",
        "source": path,
        "summary": {"groups": len(rows), "median": round(statistics.median(ratios), 3) if ratios else None,
                    "min": min(ratios, default=None), "max": max(ratios, default=None),
                    "overlapping": sum(r["overlap"] for r in rows)},
        "groups": rows}, indent=1))


if __name__ == "__main__":
    main()
