"""`zerobench plan`'s communication figures against the GPU runs of one device call: how much of
the planned communication time shows up in the measured step.

    python3 bench/gpu/report_plan.py ARCHIVE.tar.gz --zerobench target/release/zerobench \
        --json OUT.json --md OUT.md

For every run on 2 GPUs at the default engine settings (no CTA limit), with NCCL:
* `sent/step` and the collectives' bytes, from `zerobench plan --json` on a spec of the same
  model, stage, micro-batch and world (the planner's closed form, which the e2e tests hold the
  worker's logs to);
* the planned communication time without overlap, `comm ms`, at the bus bandwidth the same call
  measured for each collective alone (`runs/collectives_zerobench.jsonl`, nccl_bw, its largest
  size: the ceiling), and at the bandwidth the run's own collectives reached in the step;
* the measured step time, and its growth over the same call's one-GPU run of the same stage.
"""
import argparse
import json
import os
import subprocess
import tempfile

from common import host_date, json_lines, median, read_archive, run_parts

FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
          "all_gather": lambda n: (n - 1) / n}


def read_call(path):
    """The rank-0 logs, host.txt and nccl_bw's results of one device call."""
    host, logs, files = read_archive(path)
    collectives = [c for name, text in files.items() if name.endswith("runs/collectives_zerobench.jsonl")
                   for c in json_lines(text)]
    return logs, host, collectives


def planned(zerobench, model, stage, micro_batch, world):
    """The planner's collectives for one run: {kind: bytes per step}."""
    spec = (f"cluster: {{gpus_per_node: {world}}}\nsweep:\n  models: {model}\n  stages: {stage}\n"
            f"  micro_batches: {micro_batch}\n  ranks_per_node: {world}\n")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "spec.yaml")
        with open(path, "w") as f:
            f.write(spec)
        out = subprocess.run([zerobench, "plan", "--json", path], check=True, capture_output=True, text=True)
    (run,) = json.loads(out.stdout)
    return run["comm"]


def comm_ms(bytes_by_kind, world, gbps_by_kind):
    return sum(b * FACTOR[k](world) / (gbps_by_kind[k] * 1e9) * 1e3 for k, b in bytes_by_kind.items())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("archive")
    ap.add_argument("--zerobench", default="target/release/zerobench")
    ap.add_argument("--json", required=True)
    ap.add_argument("--md", required=True)
    a = ap.parse_args()
    logs, host, collectives = read_call(a.archive)
    largest = max(c["bytes"] for c in collectives)
    ceiling = {c["op"]: c["busbw_gbps"] for c in collectives if c["bytes"] == largest}
    one_gpu = {}
    for name, recs in logs.items():
        start, _, steps = run_parts(recs)
        if start["world_size"] == 1 and steps:
            cfg = start["config"]
            one_gpu[(cfg["model"], cfg["stage"])] = median(steps, "step_ms")
    rows = []
    for name, recs in sorted(logs.items()):
        start, _, steps = run_parts(recs)
        cfg, world = start["config"], start["world_size"]
        if world != 2 or not steps or cfg["engine"].get("comm_ctas") or cfg["engine"].get("copy_engines"):
            continue
        if name.startswith(("correct_", "profile_")):
            continue
        plan = planned(a.zerobench, cfg["model"], cfg["stage"], cfg["micro_batch"], world)
        kinds = plan["bytes"]
        # What the run's collectives reached in the step: bytes × factor over their time, per kind.
        in_step = {k: median(steps, lambda s, k=k: s["comm"][k]["bus_gbps"]) for k in kinds}
        step = median(steps, "step_ms")
        base = one_gpu[(cfg["model"], cfg["stage"])]
        rows.append({
            "run": name, "model": cfg["model"], "stage": cfg["stage"], "micro_batch": cfg["micro_batch"],
            "gpus": world, "sent_per_step_bytes": plan["wire_bytes"], "bytes_per_step": kinds,
            "ceiling_busbw_gbps": {k: ceiling[k] for k in kinds},
            "comm_ms_at_ceiling": round(comm_ms(kinds, world, ceiling), 3),
            "in_step_busbw_gbps": {k: round(v, 1) for k, v in in_step.items()},
            "comm_ms_at_in_step_busbw": round(comm_ms(kinds, world, in_step), 3),
            "measured_comm_ms": round(median(steps, "comm_ms"), 3),
            "measured_exposed_comm_ms": round(median(steps, "exposed_comm_ms"), 3),
            "step_ms": round(step, 2), "one_gpu_step_ms": round(base, 2),
            "step_growth_ms": round(step - base, 2),
        })
    for r in rows:
        assert abs(r["comm_ms_at_in_step_busbw"] - r["measured_comm_ms"]) <= 0.02 * r["measured_comm_ms"] + 0.05, r
    result = {
        "benchmark": "zerobench plan's communication time against measured GPU steps",
        "date": host_date(host), "host": host, "source": os.path.basename(a.archive),
        "ceiling_bytes": largest, "rows": rows,
    }
    with open(a.json, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    with open(a.md, "w") as f:
        f.write("| run | sent/step | comm ms at nccl_bw's ceiling | collectives' time in the step | "
                "exposed | step growth over 1 GPU |\n|---|---|---|---|---|---|\n")
        for r in rows:
            f.write(f"| {r['run']} | {r['sent_per_step_bytes'] / 2**30:.2f} GiB | {r['comm_ms_at_ceiling']:.2f} | "
                    f"{r['measured_comm_ms']:.2f} | {r['measured_exposed_comm_ms']:.2f} | "
                    f"{r['step_growth_ms']:.2f} |\n")


if __name__ == "__main__":
    main()
