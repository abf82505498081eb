"""A host no fit has seen: its runs priced by a model fitted without them, through `zerobench ingest
--cost-model`, with the host's AdamW rate (its cpu_adamw.json beside the runs) and without it.
Prints one JSON document (bench/results/costmodel-KIND-new-host-NAME.json): the mean absolute
step error both ways, over all the host's runs, the device-bound and launch-bound ones apart, the
held-out ones (cm-holdout) and the offloaded ones (the only runs the rate prices), and every run.

And the fastest stage, over the groups of the host's configurations that differ only in the stage:
the stage the model prices fastest (with the host's rate) against the stage whose runs' median is
fastest, the runs of the fitted sweeps of the same configurations counted as repeats beside the
host's own (they are measurements too, on another host). A group's repeats decide its fastest stage
when every stage has three runs or more and each run of the fastest is faster than each run of the
others (docs/cost-model.md, "The fastest stage").

Written by `NEW_HOST=NAME bench/costmodel/fit-shipped.sh KIND`.

usage: new_host.py WITH/ WITHOUT/predicted.csv KIND NEW_HOST FITTED/runs.csv SOURCE...
  (WITH/ holds `zerobench ingest --cost-model`'s predicted.csv and runs.csv)
"""
import csv
import datetime
import json
import os
import statistics
import sys

from results import DEVICE_BOUND_UTIL_PCT, mean_abs

with_dir, without_csv, kind, host, fitted_csv = sys.argv[1:6]
with_csv = os.path.join(with_dir, "predicted.csv")
sources = sys.argv[6:]


def read(path):
    """Run id -> its row of the predicted table, for the runs the model priced."""
    return {r["run_id"]: r for r in csv.DictReader(open(path)) if r["predicted_step_ms"]}


def mape(rows, key):
    return mean_abs(r[key] for r in rows)


# What a run measured, but its stage: the key of its stage-choice group.
GROUP = ("model", "variant", "micro_batch", "seq_len", "gpus", "nodes", "grad_accum", "offload")


def config(r):
    return tuple(r[k] for k in GROUP)


def fastest_stage(priced, host_rows, fitted_rows):
    """The model's stage choice against the measured fastest stage, over the host's groups."""
    measured = {}  # (group, stage) -> step medians of every run, the host's and the fitted sweeps'
    for r in list(host_rows.values()) + fitted_rows:
        if r["status"] == "ok" and r["step_ms_median"]:
            measured.setdefault((config(r), r["stage"]), []).append(float(r["step_ms_median"]))
    predicted = {}  # group -> stage -> predicted step (one per configuration)
    for i, p in priced.items():
        predicted.setdefault(config(host_rows[i]), {})[p["stage"]] = float(p["predicted_step_ms"])
    out = {"groups": 0, "right": 0, "within_2pct": 0, "decided": 0, "decided_right": 0,
           "repeats_show_choice_slower": 0, "cost_pct": [], "misses": []}
    for group, stages in sorted(predicted.items()):
        # Stages none of whose runs completed (a configuration that did not fit) choose nothing.
        stages = {s: p for s, p in stages.items() if (group, s) in measured}
        if len(stages) < 2:
            continue
        runs = {s: measured[(group, s)] for s in stages}
        median = {s: statistics.median(v) for s, v in runs.items()}
        best = min(median, key=median.get)
        chosen = min(stages, key=stages.get)
        out["groups"] += 1
        out["right"] += chosen == best
        out["within_2pct"] += median[chosen] <= 1.02 * median[best]
        out["cost_pct"].append(100 * (median[chosen] / median[best] - 1))
        faster = lambda s: len(runs[s]) >= 3 and len(runs[best]) >= 3 and max(runs[best]) < min(runs[s])
        decided = all(faster(s) for s in stages if s != best)
        out["decided"] += decided
        out["decided_right"] += decided and chosen == best
        out["repeats_show_choice_slower"] += chosen != best and faster(chosen)
        if chosen != best:
            out["misses"].append({"group": dict(zip(GROUP, group)),
                                  "chosen": chosen, "fastest": best,
                                  "medians_ms": {s: round(m, 2) for s, m in median.items()},
                                  "runs": {s: len(v) for s, v in runs.items()}})
    cost = out.pop("cost_pct")
    out["cost_pct"] = {"mean": round(statistics.mean(cost), 1), "max": round(max(cost), 1)} if cost else None
    return out


priced, blind = read(with_csv), read(without_csv)
host_rows = {r["run_id"]: r for r in csv.DictReader(open(os.path.join(with_dir, "runs.csv")))}
fitted_rows = list(csv.DictReader(open(fitted_csv)))
runs = sorted(set(priced) & set(blind))
offloaded = [i for i in runs if priced[i]["offload"] != "none"]
busy = lambda i: float(host_rows[i]["gpu_util_pct_mean"] or 0) >= DEVICE_BOUND_UTIL_PCT
device_bound = [i for i in runs if priced[i]["offload"] == "none" and busy(i)]
launch_bound = [i for i in runs if priced[i]["offload"] == "none" and not busy(i)]
held_out = [i for i in runs if i.startswith("cm-holdout/")]
rows = [{
    "run": i, "offload": priced[i]["offload"], "step_ms": float(priced[i]["step_ms"]),
    "host_adamw_gparams_per_s": float(priced[i]["host_adamw_gparams_per_s"] or "nan"),
    "predicted_step_ms": float(priced[i]["predicted_step_ms"]), "step_error_pct": float(priced[i]["step_error_pct"]),
    "without_rate": {"host_adamw_gparams_per_s": float(blind[i]["host_adamw_gparams_per_s"] or "nan"),
                     "predicted_step_ms": float(blind[i]["predicted_step_ms"]),
                     "step_error_pct": float(blind[i]["step_error_pct"])},
} for i in runs]
print(json.dumps({
    "benchmark": "cost model on a host no fit has seen: fitted without its sweep, its runs priced by "
                 "`zerobench ingest --cost-model` with and without the host's AdamW rate",
    "date": datetime.date.today().isoformat(),
    "kind": kind,
    "new_host": host,
    "fitted_on": sources,
    "summary": {
        "runs": len(runs), "offloaded_runs": len(offloaded),
        "step_mape_pct": {"with_rate": mape([priced[i] for i in runs], "step_error_pct"),
                          "without_rate": mape([blind[i] for i in runs], "step_error_pct")},
        "offloaded_step_mape_pct": {"with_rate": mape([priced[i] for i in offloaded], "step_error_pct"),
                                    "without_rate": mape([blind[i] for i in offloaded], "step_error_pct")},
        "device_bound": {"runs": len(device_bound), "step_mape_pct": mape([priced[i] for i in device_bound], "step_error_pct")},
        "launch_bound": {"runs": len(launch_bound), "step_mape_pct": mape([priced[i] for i in launch_bound], "step_error_pct")},
        "held_out": {"runs": len(held_out), "step_mape_pct": mape([priced[i] for i in held_out], "step_error_pct")},
        "memory_mape_pct": mape([priced[i] for i in runs if priced[i]["memory_error_pct"]], "memory_error_pct"),
    },
    "fastest_stage": fastest_stage({i: priced[i] for i in runs}, host_rows, fitted_rows),
    "runs": rows,
}, indent=1))
