"""Reads the archive of `bench/gpu/run.sh grad-accum` (gpt2-xl micro-batch 4, gradient accumulation
8, stages 0-3 on 1 and 2 GPUs, and stage 3 on 2 GPUs over NCCL's network transport) and writes the
JSON of bench/results and a Markdown table.

    python3 bench/gpu/report_scaling.py ARCHIVE.tar.gz --json OUT.json --md OUT.md

Step time is the run's (per step the slowest rank, then the median over measured steps:
common.read_archive), by the definition of schema version 2. Per-GPU throughput relative to one
GPU = (tokens/s per GPU on N GPUs) / (tokens/s on 1 GPU of the same stage), both from this call."""
import argparse
import json
import re

from common import gib, host_date, median, read_archive, run_parts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("archive")
    ap.add_argument("--json", required=True)
    ap.add_argument("--md", required=True)
    a = ap.parse_args()
    host, logs, _ = read_archive(a.archive)
    rows = []
    for name, recs in sorted(logs.items()):
        m = re.match(r"ga8_gpt2-xl_z(\d)_(\d)gpu(_net)?$", name)
        if not m:
            continue
        start, setup, steps = run_parts(recs)
        step_ms = median(steps, "step_ms")
        gpus = int(m.group(2))
        tokens = steps[0]["tokens"]
        rows.append({
            "run": name, "stage": int(m.group(1)), "gpus": gpus, "network_transport_only": bool(m.group(3)),
            "grad_accum": start["config"]["grad_accum"], "steps_measured": len(steps),
            "step_ms": step_ms, "tokens_per_step": tokens,
            "tokens_per_s_per_gpu": tokens / (step_ms / 1e3) / gpus,
            "exposed_comm_ms": median(steps, "exposed_comm_ms"),
            "peak_allocated_bytes": max(s["memory"].get("peak_allocated_bytes", 0) for s in steps),
            "final_loss": steps[-1]["loss"],
        })
    one = {r["stage"]: r["tokens_per_s_per_gpu"] for r in rows if r["gpus"] == 1}
    for r in rows:
        r["per_gpu_vs_1gpu"] = round(r["tokens_per_s_per_gpu"] / one[r["stage"]], 4) if r["stage"] in one else None
    out = {"benchmark": "bench/gpu/run.sh grad-accum", "date": host_date(host), "host": host.strip().splitlines(),
           "step_time_definition": "schema version 2: a step ends when all of its device work has", "runs": rows}
    with open(a.json, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    lines = ["| stage | GPUs | transport | step ms | tokens/s/GPU | vs 1 GPU | exposed comm ms | peak alloc GiB |",
             "|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["stage"], r["gpus"], r["network_transport_only"])):
        transport = "network only" if r["network_transport_only"] else ("NVLink" if r["gpus"] > 1 else "—")
        ratio = f"{r['per_gpu_vs_1gpu']:.3f}" if r["per_gpu_vs_1gpu"] is not None else ""
        lines.append(f"| {r['stage']} | {r['gpus']} | {transport} | {r['step_ms']:.1f} | {r['tokens_per_s_per_gpu']:,.0f} | "
                     f"{ratio} | {r['exposed_comm_ms']:.2f} | {gib(r['peak_allocated_bytes'])} |")
    with open(a.md, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
