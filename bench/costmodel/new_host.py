"""A host no fit has seen: its runs priced by a model fitted without them, through `zerobench ingest
--cost-model`, with the host's AdamW rate (its cpu_adamw.json beside the runs) and without it.
Prints one JSON document (bench/results/costmodel-KIND-new-host-NAME.json): the mean absolute
step error both ways, over all the host's runs, the device-bound and launch-bound ones apart, the
held-out ones (cm-holdout) and the offloaded ones (the only runs the rate prices), and every run.

And the fastest stage, over the groups of the host's configurations that differ only in the stage:
the stage-choice table of `zerobench ingest --cost-model` over the host's runs and the fitted
sweeps' (their runs of the same configurations count as repeats beside the host's own: they are
measurements too, on another host), its groups whose every stage the host ran. Which stage
the model chooses, which is fastest and whether the repeats decide it are that table's
(costmodel/src/validate.rs, `stage_choices`; docs/cost-model.md, "The fastest stage"); this sums it.

Written by `NEW_HOST=NAME bench/costmodel/fit-shipped.sh KIND`.

usage: new_host.py WITH/ WITHOUT/predicted.csv KIND NEW_HOST CHOICE/stage-choice.csv SOURCE...
  (WITH/ holds `zerobench ingest --cost-model`'s predicted.csv and runs.csv)
"""
import csv
import datetime
import json
import os
import statistics
import sys

from results import DEVICE_BOUND_UTIL_PCT, mean_abs

with_dir, without_csv, kind, host, choice_csv = sys.argv[1:6]
with_csv = os.path.join(with_dir, "predicted.csv")
sources = sys.argv[6:]


def read(path):
    """Run id -> its row of the predicted table, for the runs the model priced."""
    return {r["run_id"]: r for r in csv.DictReader(open(path)) if r["predicted_step_ms"]}


def mape(rows, key):
    return mean_abs(r[key] for r in rows)


# What a run measured, but its stage: the key of its stage-choice group (the stage-choice
# table's columns as the runs table writes them).
GROUP = ("model", "variant", "micro_batch", "seq_len", "gpus", "nodes", "grad_accum", "offload")


def config(r):
    return tuple(r[k] for k in GROUP)


def fastest_stage(choice_csv, host_rows):
    """The stage-choice table's groups whose every stage the host ran, summed."""
    host = {(config(r), r["stage"]) for r in host_rows.values()}
    rows = [r for r in csv.DictReader(open(choice_csv))
            if all((config(r), s) in host for s in r["stages"].split(";"))]
    flag = lambda r, k: r[k] == "true"
    out = {"groups": len(rows), "right": sum(flag(r, "right") for r in rows),
           "within_2pct": sum(flag(r, "right_within_tie") for r in rows),
           "decided": sum(flag(r, "decided") for r in rows),
           "decided_right": sum(flag(r, "decided") and flag(r, "right") for r in rows),
           "repeats_show_choice_slower": sum(flag(r, "shown_slower") for r in rows)}
    out["misses"] = [{"group": {k: r[k] for k in GROUP},
                      "chosen": r["chosen_stage"], "fastest": r["fastest_stage"],
                      "medians_ms": {s: round(float(m), 2) for s, m in zip(r["stages"].split(";"), r["step_ms"].split(";"))},
                      "runs": {s: int(n) for s, n in zip(r["stages"].split(";"), r["runs"].split(";"))}}
                     for r in rows if not flag(r, "right")]
    cost = [float(r["regret_pct"]) for r in rows]
    out["cost_pct"] = {"mean": round(statistics.mean(cost), 1), "max": round(max(cost), 1)} if cost else None
    return out


priced, blind = read(with_csv), read(without_csv)
host_rows = {r["run_id"]: r for r in csv.DictReader(open(os.path.join(with_dir, "runs.csv")))}
runs = sorted(set(priced) & set(blind))
offloaded = [i for i in runs if priced[i]["offload"] != "none"]
busy = lambda i: float(host_rows[i]["gpu_util_pct_mean"] or 0) >= DEVICE_BOUND_UTIL_PCT
device_bound = [i for i in runs if priced[i]["offload"] == "none" and busy(i)]
launch_bound = [i for i in runs if priced[i]["offload"] == "none" and not busy(i)]
held_out = [i for i in runs if i.startswith("cm-holdout/")]
# A sweep without the host's rate beside it (examples/cpu_adamw) has none: null, as strict JSON readers
# take it (json.dumps would write NaN, which they refuse).
rate = lambda row: float(row["host_adamw_gparams_per_s"]) if row["host_adamw_gparams_per_s"] else None
rows = [{
    "run": i, "offload": priced[i]["offload"], "step_ms": float(priced[i]["step_ms"]),
    "host_adamw_gparams_per_s": rate(priced[i]),
    "predicted_step_ms": float(priced[i]["predicted_step_ms"]), "step_error_pct": float(priced[i]["step_error_pct"]),
    "without_rate": {"host_adamw_gparams_per_s": rate(blind[i]),
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
    "fastest_stage": fastest_stage(choice_csv, host_rows),
    "runs": rows,
}, indent=1, allow_nan=False))
