"""Reads the archive of `bench/gpu/run.sh gemm-algos` (or any archive holding its
`runs/gemm_algos_MODEL.jsonl`) and writes the JSON of bench/results: per model, every product of
one training step (forward, input and weight gradients, LM head) with libtorch's time, cuBLASLt's
heuristic's first choice, the fastest algorithm the heuristic offered, and the step's sums.

    python3 bench/gpu/report_gemm_algos.py ARCHIVE.tar.gz COMMIT > OUT.json

Times come from `examples/gemm_algos` (its module doc says how they are taken: operands rotated
so the L2 cache does not hold them, the first choice and the fastest timed again head to head).
"today" is what the worker ran before its products were timed: its own plan (the heuristic's
first choice) for the products with cuBLASLt's epilogues, libtorch's call for the others."""
import json
import os
import re
import sys

from common import archive_files


def tflops(r):
    """TFLOP/s from the GFLOP and the times. The example at d0f2603 printed these fields in other
    units (a product's a thousand times too small, a step's in PFLOP/s)."""
    if r.get("summary"):
        r["today_tflops"], r["best_tflops"] = r["gflop"] / r["today_ms"], r["gflop"] / r["best_ms"]
    elif "best_us" in r:
        r["best_tflops"] = 2 * r["m"] * r["n"] * r["k"] / r["best_us"] / 1e6


def main():
    path, commit = sys.argv[1:3]
    host, models = "", {}
    for name, text in archive_files(path):
        if name.endswith("host.txt"):
            host = text
        elif m := re.search(r"runs/gemm_algos_([^/]+)\.jsonl$", name):
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
            for r in rows:
                tflops(r)
            models[m.group(1)] = {"products": [r for r in rows if not r.get("summary")],
                                  "step": next((r for r in rows if r.get("summary")), None)}
    print(json.dumps({"benchmark": "bench/gpu/run.sh gemm-algos (examples/gemm_algos)", "commit": commit,
                      "host": host.strip().splitlines(), "raw": f"bench/results/raw/{os.path.basename(path)}",
                      "models": models},
                     indent=1))


if __name__ == "__main__":
    main()
