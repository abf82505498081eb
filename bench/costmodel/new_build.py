"""The shipped cost model on a build it was not fitted on: one host's sweep (`bench/gpu/run.sh
costmodel`) at that build, priced by `zerobench ingest --cost-model` without refitting. Prints one
JSON document (bench/results/costmodel-KIND-new-build-COMMIT[-HOST].json): the mean absolute step
and peak-memory errors over all runs, the runs without offload (those of fitted configurations and
the held-out ones apart; those that kept the GPU busy and those set by the host apart) and the
offloaded ones, and every run. Written by bench/costmodel/check-build.sh.

usage: new_build.py PREDICTED.csv RUNS.csv HOST.txt MODEL COMMIT SOURCE
"""
import csv
import json
import statistics
import sys

from results import DEVICE_BOUND_UTIL_PCT, header, mean_abs

predicted, runs_csv, host_txt, model, commit, source = sys.argv[1:7]
priced = [r for r in csv.DictReader(open(predicted)) if r["predicted_step_ms"]]
# A run that did not complete (out of memory: mistral-7b at stage 0 on an 80 GB GPU) has no step
# time to compare; it is listed apart, its peak being that of the failed allocation.
rows = [r for r in priced if r["step_ms"]]
not_completed = sorted(r["run_id"] for r in priced if not r["step_ms"])
# The GPU's mean utilisation over the measured steps (NVML), from ingest's run table.
util = {r["run_id"]: float(r["gpu_util_pct_mean"]) for r in csv.DictReader(open(runs_csv)) if r["gpu_util_pct_mean"]}


def summary(rs):
    step = [float(r["step_error_pct"]) for r in rs]
    return {"runs": len(rs),
            "step_mape_pct": mean_abs(step),
            "step_mean_error_pct": round(statistics.mean(step), 1) if step else None,
            "peak_allocated_mape_pct": mean_abs((r["memory_error_pct"] for r in rs if r["memory_error_pct"]), 2)}


plain = [r for r in rows if r["offload"] == "none"]
print(json.dumps({
    **header("the shipped cost model on a build it was not fitted on: one host's sweep at that build, "
             "priced by `zerobench ingest --cost-model`", host_txt),
    "model": model,
    "build": commit,
    "source": source,
    "summary": {
        "all": summary(rows),
        "without_offload": summary(plain),
        "without_offload_fitted_configurations": summary([r for r in plain if r["run_id"].startswith("cm-fit/")]),
        "without_offload_held_out_configurations": summary([r for r in plain if r["run_id"].startswith("cm-holdout/")]),
        "without_offload_device_bound": summary([r for r in plain if util.get(r["run_id"], 0) >= DEVICE_BOUND_UTIL_PCT]),
        "without_offload_launch_bound": summary([r for r in plain if util.get(r["run_id"], 0) < DEVICE_BOUND_UTIL_PCT]),
        "offloaded": summary([r for r in rows if r["offload"] != "none"]),
    },
    "not_completed": not_completed,
    "runs": [{"run": r["run_id"], "step_ms": float(r["step_ms"]), "predicted_step_ms": float(r["predicted_step_ms"]),
              "step_error_pct": round(float(r["step_error_pct"]), 2),
              "memory_error_pct": round(float(r["memory_error_pct"]), 2) if r["memory_error_pct"] else None,
              "gpu_util_pct": util.get(r["run_id"])}
             for r in rows],
}, indent=1))
