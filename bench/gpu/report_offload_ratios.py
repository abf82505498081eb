"""Reads the runs of `bench/gpu/run.sh offload-ratios` and prints, per offload ratio and mode (exact,
delayed update), offload's step time, where it went, and the step over its bound.

    python3 bench/gpu/report_offload_ratios.py RUNS HOST.txt COMMIT > offload-ratios.json

Run folders are `or_<exact|delayed>_r<ratio>_<round>` and `or_none_1` (no offload). Per run: the
median step and phases over its measured steps (common.offload_run). The bound is
bench/gpu/report_ratio.py's:

    bound = max(GPU compute + the GPU's share of the update, the host's share of the update, transfers)

per rank, with the host's update of every rank on the host at the AdamW rate measured in the same
call (`cpu_adamw.json`) and each rank's transfers over the pinned copy bandwidth measured alone
(`copies.jsonl`). Per (mode, ratio): the median over
rounds, and which of the bound's three terms is the largest. A failed run shows as null."""
import json
import os
import statistics
import sys

from common import host_date, host_rates, offload_rows, offload_run


def main():
    runs_dir, host, commit = sys.argv[1], open(sys.argv[2]).read(), sys.argv[3]
    adamw, bw = host_rates(runs_dir)
    base = offload_run(os.path.join(runs_dir, "or_none_1"))
    rate = adamw["adamw_params_per_s"] if adamw else None
    gpus = base["ranks"] if base else None
    rows = offload_rows(runs_dir, r"or_(?P<mode>\w+?)_r(?P<ratio>[\d.]+)_(?P<round>\d+)",
                        {"mode": str, "ratio": float, "round": int}, base, rate, bw)
    summary = []
    for mode, ratio in sorted({(r["mode"], r["ratio"]) for r in rows}):
        mine = [r for r in rows if (r["mode"], r["ratio"]) == (mode, ratio)]
        ok = [r for r in mine if r["result"]]
        m = lambda f: round(statistics.median(f(r) for r in ok), 3) if ok else None
        bounded = ok and all("bound" in r for r in ok)
        terms = ("gpu_ms", "host_adamw_ms", "transfer_ms")
        summary.append({"mode": mode, "ratio": ratio, "runs": len(ok), "failed": len(mine) - len(ok),
                        "step_ms": m(lambda r: r["result"]["step_ms"]),
                        "forward_ms": m(lambda r: r["result"]["forward_ms"]),
                        "backward_ms": m(lambda r: r["result"]["backward_ms"]),
                        "optimizer_ms": m(lambda r: r["result"]["optimizer_ms"]),
                        "bound_ms": m(lambda r: r["bound"]["bound_ms"]) if bounded else None,
                        "bound_term": max(terms, key=lambda t: ok[0]["bound"][t]) if bounded else None,
                        "step_over_bound": m(lambda r: r["bound"]["step_over_bound"]) if bounded else None,
                        "step_ms_by_round": [r["result"]["step_ms"] for r in ok]})
    print(json.dumps({
        "benchmark": "offload-ratios: Twin-Flow's ratio, exact and with the delayed update; gpt2-xl, micro-batch 4, "
                     "sequence 1024, stage 2, bf16 (bench/gpu/report_offload_ratios.py)",
        "date": host_date(host), "host": host.strip().splitlines(), "commit": commit,
        "gpus": gpus,
        "copy_gbps_alone": bw, "cpu_adamw": adamw, "no_offload": base, "summary": summary, "runs": rows,
    }, indent=1))


if __name__ == "__main__":
    main()
