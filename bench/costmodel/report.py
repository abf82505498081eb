"""A shipped cost model against the held-out runs: `zerobench predict --json` for each, next to
what it measured. Prints one JSON document (bench/results/costmodel-KIND.json). Held-out runs that
did not complete (a preset that does not fit the GPU) are listed, not predicted.

usage: report.py ZEROBENCH MODEL.json HOLDOUT_RUNS.csv FIT_REPORT.md KIND SOURCE...
"""
import csv
import datetime
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gpu"))
from common import archive_files, host_date  # noqa: E402
from results import DEVICE_BOUND_UTIL_PCT, mean_abs  # noqa: E402

# The columns of ingest's runs table that name a configuration, as `zerobench predict` is given it:
# runs that agree on all of them are repeats of one configuration.
CONFIGURATION = ("model", "stage", "micro_batch", "seq_len", "gpus", "grad_accum", "offload")

zerobench, model, runs_csv, fit_md, kind = sys.argv[1:6]
sources = sys.argv[6:]
# Each held-out run's host AdamW rate as ingest found it (its cpu_adamw.json), and its price as
# ingest gives it (the run as it ran: its logged buffers and gathers): the `predicted` table beside
# the runs table, which fit-shipped.sh has ingest write with the model.
ingest_priced = {r["run_id"]: r for r in csv.DictReader(open(os.path.join(os.path.dirname(runs_csv), "predicted.csv")))}
rates = {k: float(r["host_adamw_gparams_per_s"]) for k, r in ingest_priced.items() if r["host_adamw_gparams_per_s"]}
fit = json.load(open(model))["fits"][0]
rows, incomplete = [], []
for r in csv.DictReader(open(runs_csv)):
    if not r["step_ms_median"]:
        incomplete.append({"run": r["run_id"], "status": r.get("status", "")})
        continue
    args = [zerobench, "predict", "--gpu", kind, "--json", "--cost-model", model]
    for k in CONFIGURATION:
        args += ["--" + k.replace("_", "-"), r[k]]
    # The offload settings the model prices, from the run's variant (RunConfig::variant), as
    # `zerobench fit` reads them; they are part of the configuration.
    knobs = dict(kv.split("=", 1) for kv in r["variant"].split(",") if "=" in kv)
    priced = {k: knobs[k] for k in ("offload_ratio", "delayed_update_after") if k in knobs}
    if "offload_ratio" in priced:
        args += ["--offload-ratio", priced["offload_ratio"]]
    if "delayed_update_after" in priced:
        args.append("--delayed-update")
    rate = rates.get(r["run_id"]) if r["offload"] != "none" else None
    if rate:
        args += ["--host-adamw-rate", str(rate)]
    p = json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout)
    step, mem = float(r["step_ms_median"]), int(r["peak_allocated_bytes"])
    # `predict` prices this build's engine. A run of an earlier build that gathered stage 3's
    # parameters on one GPU, which this build keeps whole, is priced as it ran: ingest's price of
    # it (the model's, with the run's logged gathers), the interval scaled to it (the interval of
    # the bound this build's price falls in: ingest's table does not name the bound).
    as_logged = r["param_path"] != p["param_path"]
    if as_logged:
        logged = float(ingest_priced[r["run_id"]]["predicted_step_ms"])
        p["step_ms_interval"] = [x * logged / p["step_ms"] for x in p["step_ms_interval"]]
        p["step_ms"] = logged
    # `predict` prices this build's engine; a run's persistent buffers are exact for the build
    # that ran, which may have placed them otherwise (stages 2 and 3 on one GPU staged their
    # gradients until this build wrote them in place): its peak is compared with the prediction
    # holding the buffers the run logged, as `zerobench fit` and `ingest --cost-model` take them.
    predicted_mem = p["peak_allocated_bytes"] - p["engine_buffer_bytes"] + int(r["state_buffer_bytes"])
    rows.append({
        "configuration": " ".join([f"{k}={r[k]}" for k in CONFIGURATION] + [f"{k}={v}" for k, v in priced.items()]),
        "run": r["run_id"], "dir": r["dir"], "gpu_util_pct": float(r["gpu_util_pct_mean"] or "nan"),
        "host_adamw_gparams_per_s": rate,
        "step_ms": step, "predicted_step_ms": round(p["step_ms"], 2),
        "step_error_pct": round((p["step_ms"] / step - 1) * 100, 1),
        "predicted_step_ms_interval": [round(x, 2) for x in p["step_ms_interval"]],
        "interval_of": p["step_ms_interval_of"],
        "in_interval": p["step_ms_interval"][0] <= step <= p["step_ms_interval"][1],
        "priced_as_gathered": as_logged,
        "peak_allocated_bytes": mem, "predicted_peak_allocated_bytes": predicted_mem,
        "memory_error_pct": round((predicted_mem / mem - 1) * 100, 2),
        "extrapolated": p["extrapolated"],
    })


def measured_on(source):
    """The dates of a source archive's host.txt files (bench/gpu/run.sh writes one a call), or of
    the host.txt files under a source folder, as bench/gpu's reports read them."""
    if os.path.isdir(source):
        texts = (open(os.path.join(root, "host.txt")).read() for root, _, names in os.walk(source) if "host.txt" in names)
    else:
        texts = (text for name, text in archive_files(source) if os.path.basename(name) == "host.txt")
    return sorted({d for d in map(host_date, texts) if d})


def mape(key, sel):
    return mean_abs(x[key] for x in sel)


def by_configuration(rows):
    """Each configuration's median over its runs (on several hosts) against the median of their
    predictions (each run priced at its host's AdamW rate), and the
    runs' own spread: the mean over runs of |run - its configuration's median| / run, the per-run
    error left to a prediction of every median exactly. The same definitions as
    `zerobench fit --validate` applies to its k-fold predictions (costmodel/src/validate.rs,
    `ConfigurationError`); the CLI gives them for held-out runs nowhere, hence this copy."""
    groups = {}
    for x in rows:
        groups.setdefault(x["configuration"], []).append(x)
    errors, spread = [], []
    for xs in groups.values():
        med = statistics.median(x["step_ms"] for x in xs)
        # Runs on hosts of different AdamW rates are priced apart: the median of their predictions.
        predicted = statistics.median(x["predicted_step_ms"] for x in xs)
        errors.append(abs(predicted / med - 1) * 100)
        spread += [abs(x["step_ms"] - med) / x["step_ms"] * 100 for x in xs]
    return {"configurations": len(groups), "repeated": sum(len(xs) > 1 for xs in groups.values()),
            "step_mape_pct": round(statistics.mean(errors), 1) if errors else None,
            "repeat_floor_pct": round(statistics.mean(spread), 1) if spread else None}


device = [x for x in rows if x["gpu_util_pct"] >= DEVICE_BOUND_UTIL_PCT]
launch = [x for x in rows if not x["gpu_util_pct"] >= DEVICE_BOUND_UTIL_PCT]
v = fit["validation"]
print(json.dumps({
    "benchmark": "cost model: k-fold validation on the fitted runs, and held-out runs predicted by `zerobench predict`",
    # The day this report was made; when its runs were measured is `measured`, per source.
    "date": datetime.date.today().isoformat(),
    "gpu": fit["gpu"],
    "sources": sources,
    "measured": {src: measured_on(src) for src in sources},
    "validation": {k: v[k] for k in ("folds", "configurations", "runs", "step_mape_pct", "memory_mape_pct",
                                     "device_bound", "launch_bound", "by_configuration", "stage_choice",
                                     "groups")},
    "held_out": {
        "summary": {"runs": len(rows), "step_mape_pct": mape("step_error_pct", rows),
                    "device_bound_step_mape_pct": mape("step_error_pct", device), "device_bound_runs": len(device),
                    "launch_bound_step_mape_pct": mape("step_error_pct", launch), "launch_bound_runs": len(launch),
                    "memory_mape_pct": mape("memory_error_pct", rows),
                    # The interval is the k-fold errors' 5th-95th percentiles: about 90% should fall in it.
                    "step_in_interval": sum(x["in_interval"] for x in rows),
                    "by_configuration": by_configuration(rows)},
        "runs": rows,
        "not_completed": incomplete,
    },
    "fit_report": open(fit_md).read(),
}, indent=1))
