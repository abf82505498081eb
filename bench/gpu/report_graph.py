"""Reads the runs of `bench/gpu/run.sh cuda-graph` and prints its JSON (bench/results): the step
time of each launch-bound case with the worker in BASE_BIN, this build eager and this build
replaying CUDA graphs (`--cuda-graph`), two runs each, alternating; and, per configuration, how
far a replayed run's losses are from an eager run's, beside how far two eager runs are apart.

    python3 bench/gpu/report_graph.py RUNS HOST.TXT COMMIT BASE_COMMIT > cuda-graph.json

A run's step time is its median over measured steps (one rank: its own `step_ms`)."""
import json
import os
import statistics
import sys

from common import json_lines, median, run_parts


def load(runs, name):
    path = f"{runs}/{name}/rank0.jsonl"
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return run_parts(json_lines(f.read()))


def speed(runs, case):
    out = {"case": case}
    for which in ("base", "eager", "graph"):
        parts = [load(runs, f"graph_{case}_{which}_{rep}") for rep in (1, 2)]
        if not all(parts):
            out[which] = None
            continue
        steps = [p[2] for p in parts]
        out[which] = {
            "step_ms": [round(median(s, "step_ms"), 3) for s in steps],
            **{k: round(statistics.median(median(s, k) for s in steps), 3)
               for k in ("forward_ms", "backward_ms", "optimizer_ms", "other_ms")},
            "peak_allocated_bytes": max(r["memory"]["peak_allocated_bytes"] for s in steps for r in s),
            "peak_reserved_bytes": max(r["memory"]["peak_reserved_bytes"] for s in steps for r in s),
        }
    med = lambda w: statistics.median(out[w]["step_ms"]) if out.get(w) else None
    ratio = lambda a, b: round(med(a) / med(b), 4) if med(a) and med(b) else None
    out["graph_over_base"] = ratio("graph", "base")
    out["eager_over_base"] = ratio("eager", "base")
    out["graph_over_eager"] = ratio("graph", "eager")
    return out


def losses(runs, case):
    """Every step's loss (warm-up included: the capture step and the first replays too), and the
    held-out losses where the run evaluates."""
    curves, evals = {}, {}
    for which in ("eager", "eager2", "graph"):
        path = f"{runs}/losses_{case}_{which}/rank0.jsonl"
        recs = json_lines(open(path).read()) if os.path.exists(path) else []
        curves[which] = [r["loss"] for r in recs if r.get("event") == "step"] or None
        evals[which] = [r["loss"] for r in recs if r.get("event") == "eval"] or None

    def gap(series, a, b):
        if not series[a] or not series[b] or len(series[a]) != len(series[b]):
            return None
        return max(abs(x - y) for x, y in zip(series[a], series[b]))
    out = {"case": case, "steps": len(curves["eager"] or []), "graph_vs_eager_max_abs": gap(curves, "graph", "eager"),
           "eager_vs_eager_max_abs": gap(curves, "eager2", "eager"), "curves": curves}
    if any(evals.values()):
        out.update({"evals": evals, "eval_graph_vs_eager_max_abs": gap(evals, "graph", "eager"),
                    "eval_eager_vs_eager_max_abs": gap(evals, "eager2", "eager")})
    return out


def main():
    runs, host, commit, base = sys.argv[1:5]
    names = os.listdir(runs)
    speed_cases = sorted({n.split("_")[1] for n in names if n.startswith("graph_") and not n.endswith(".out")})
    loss_cases = sorted({n.split("_")[1] for n in names if n.startswith("losses_") and not n.endswith(".out")})
    print(json.dumps({
        "benchmark": "bench/gpu/run.sh cuda-graph", "commit": commit, "base_commit": base,
        "host": open(host).read().strip().splitlines(),
        "speed": [speed(runs, c) for c in speed_cases],
        "losses": [losses(runs, c) for c in loss_cases],
    }, indent=1))


if __name__ == "__main__":
    main()
