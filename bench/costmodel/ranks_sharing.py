"""Ranks sharing a host, on a host no fit has seen: gpt2-xl's offloaded runs with one, two (and
four) ranks on one host (`bench/gpu/run.sh offload-ratios` with OR_GPUS=1, 2, 4 and
CPU_ADAMW_RANKS=2,4), priced by the shipped model (its fitted sharing exponent) and by what each
rank got when that many `examples/cpu_adamw` ran at once on the host (the exponent that rate
implies: log(reference rate / rate per rank) / log(ranks)). Prints one JSON document
(bench/results/costmodel-h100-ranks-sharing-NAME.json). Written by
bench/costmodel/check-ranks-sharing.sh.

usage: ranks_sharing.py SHIPPED.csv MEASURED.csv RUNS_DIR HOST.txt MODEL SOURCE
  SHIPPED.csv: `zerobench ingest --cost-model` with the shipped model; MEASURED.csv: the same with
  each folder's measured exponent (the script that calls this makes it)
"""
import csv
import glob
import json
import os
import sys

from results import header, mean_abs

shipped_csv, measured_csv, runs_dir, host_txt, model, source = sys.argv[1:7]
fit = json.load(open(model))["fits"][0]
reference, exponent = fit["host_adamw_gparams_per_s"], fit["step"]["offload.sharing_exponent"]


def read(path):
    """(GPUs, run id) -> row: the folders of 1, 2 and 4 GPUs share run ids, which one ingest of them
    all names with their folders and one ingest per folder does not."""
    return {(r["gpus"], r["run_id"].split("@")[0]): r for r in csv.DictReader(open(path))
            if r["predicted_step_ms"] and r["offload"] != "none"}


shipped, measured = read(shipped_csv), read(measured_csv)
rates = {}
for f in sorted(glob.glob(os.path.join(runs_dir, "*", "runs", "cpu_adamw.json"))):
    d = json.loads(open(f).read().strip().splitlines()[-1])
    rates[os.path.relpath(f, runs_dir)] = {
        "one_process_gparams_per_s": round(d["adamw_params_per_s"] / 1e9, 3),
        "per_rank_gparams_per_s": {n: round(v["adamw_params_per_s_per_rank"] / 1e9, 3) for n, v in d["ranks"].items()},
        "sum_gparams_per_s": {n: round(v["adamw_params_per_s_sum"] / 1e9, 3) for n, v in d["ranks"].items()},
    }


def mape(rows, gpus):
    return mean_abs(r["step_error_pct"] for r in rows.values() if r["gpus"] == gpus)


gpus = sorted({r["gpus"] for r in shipped.values()}, key=int)
print(json.dumps({
    **header(
        "ranks sharing a host's AdamW under offload, on a host no fit has seen: "
        "gpt2-xl at stage 2, ratios 0.3/0.5/1, exact and delayed, on 1, 2 (and 4) GPUs, priced by the "
        "shipped model's sharing exponent and by the per-rank rate examples/cpu_adamw measured with "
        "that many ranks at once",
        host_txt,
    ),
    "model": model,
    "reference_gparams_per_s": round(reference, 3),
    "shipped_sharing_exponent": exponent,
    "source": source,
    "cpu_adamw": rates,
    "summary": {f"{g} GPUs": {"runs": sum(r["gpus"] == g for r in shipped.values()),
                              "step_mape_pct_shipped": mape(shipped, g),
                              "step_mape_pct_measured_per_rank": mape(measured, g)} for g in gpus},
    "runs": [{"run": i[1], "gpus": int(r["gpus"]), "step_ms": float(r["step_ms"]),
              "predicted_step_ms_shipped": float(r["predicted_step_ms"]),
              "step_error_pct_shipped": float(r["step_error_pct"]),
              "predicted_step_ms_measured_per_rank": float(measured[i]["predicted_step_ms"]),
              "step_error_pct_measured_per_rank": float(measured[i]["step_error_pct"])}
             for i, r in sorted(shipped.items(), key=lambda kv: (int(kv[0][0]), kv[0][1]))],
}, indent=1))
