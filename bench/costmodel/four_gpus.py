"""The cost model at 4 GPUs of one host, a GPU count no fit has seen: the 2-GPU configurations of
the sweep on 4 GPUs (`bench/gpu/run.sh costmodel` with CM_LIST=bench/gpu/costmodel-runs-4gpu.txt)
and gpt2-xl's offload ratios with 2 and 4 ranks sharing the host (`offload-ratios`, OR_GPUS=2 and
4), two rounds, priced through `zerobench ingest --cost-model`. Prints one JSON document
(bench/results/costmodel-h100-4gpu.json): the mean absolute step error without offload (per
family) and with it (per ranks per host), and every run. Written by
bench/costmodel/check-4gpu.sh.

usage: four_gpus.py PREDICTED.csv HOST.txt MODEL SOURCE...
"""
import csv
import json
import sys

from results import header, mean_abs

predicted, host_txt, model = sys.argv[1:4]
sources = sys.argv[4:]
rows = [r for r in csv.DictReader(open(predicted)) if r["predicted_step_ms"]]


def mape(rs):
    v = [float(r["step_error_pct"]) for r in rs]
    return {"runs": len(v), "step_mape_pct": mean_abs(v),
            "step_error_pct_range": [round(min(v), 1), round(max(v), 1)] if v else None}


family = lambda r: r["model"].split("-")[0]
# Without offload: the 4-GPU runs (the offload rounds' runs without it included).
plain = [r for r in rows if r["offload"] == "none" and r["gpus"] == "4"]
offloaded = [r for r in rows if r["offload"] != "none"]
print(json.dumps({
    **header(
        "cost model at 4 GPUs of one 4xH100 host (64 cores): its runs without offload, at a GPU "
        "count no fit has seen, and its offloaded ones with two and four ranks per host, priced by "
        "`zerobench ingest --cost-model` (whether the model was fitted on the offloaded ones: `model`)",
        host_txt,
    ),
    "model": model,
    "sources": sources,
    "summary": {
        "without_offload_4_gpus": {"all": mape(plain), "gpt2-xl": mape([r for r in plain if r["model"] == "gpt2-xl"]),
                                   **{f: mape([r for r in plain if family(r) == f])
                                      for f in sorted({family(r) for r in plain})}},
        "offloaded": {f"{g} GPUs": mape([r for r in offloaded if r["gpus"] == g])
                      for g in sorted({r["gpus"] for r in offloaded})},
    },
    "runs": [{"run": r["run_id"], "model": r["model"], "stage": int(r["stage"]), "gpus": int(r["gpus"]),
              "offload": r["offload"], "step_ms": float(r["step_ms"]),
              "predicted_step_ms": float(r["predicted_step_ms"]), "step_error_pct": float(r["step_error_pct"]),
              "notes": r["notes"]} for r in rows],
}, indent=1))
