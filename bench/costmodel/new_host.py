"""A host no fit has seen: its runs priced by a model fitted without them, through `zerobench ingest
--cost-model`, with the host's AdamW rate (its cpu_adamw.json beside the runs) and without it.
Prints one JSON document (bench/results/costmodel-KIND-new-host-NAME.json): the mean absolute
step error both ways, over all the host's runs and over the offloaded ones (the only runs the rate
prices), and every run. Written by `NEW_HOST=NAME bench/costmodel/fit-shipped.sh KIND`.

usage: new_host.py WITH/predicted.csv WITHOUT/predicted.csv KIND NEW_HOST SOURCE...
"""
import csv
import datetime
import json
import sys

from results import mean_abs

with_csv, without_csv, kind, host = sys.argv[1:5]
sources = sys.argv[5:]


def read(path):
    """Run id -> its row of the predicted table, for the runs the model priced."""
    return {r["run_id"]: r for r in csv.DictReader(open(path)) if r["predicted_step_ms"]}


def mape(rows, key):
    return mean_abs(r[key] for r in rows)


priced, blind = read(with_csv), read(without_csv)
runs = sorted(set(priced) & set(blind))
offloaded = [i for i in runs if priced[i]["offload"] != "none"]
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
    },
    "runs": rows,
}, indent=1))
