#!/usr/bin/env python3
"""How long a CUDA graph's launch keeps the GPU waiting, by the graph's node count.

A graph of N small kernels (each adds 1 to one element; about a microsecond of GPU work) is
replayed with the GPU idle before it: the host's time inside the launch call, and the GPU's time
from an event recorded before the launch to one recorded after it, median of the replays. Where
the launch costs the host about as much as the event interval grows with N, the GPU waits for the
launch before it starts the graph's first kernel. The same graph split in two (its first
`--head` kernels a graph of their own, launched first) shows whether a small first graph hides the
launch of the rest. With `--profile`, the replays run again under torch.profiler, as
`bench/gpu/run.sh kernels` profiles a step, to show what the profiler adds to the launch.

    python3 bench/gpu/graph_launch_probe.py --out graph-launch.json
"""
import argparse
import json
import statistics
import time

import torch

from common import probe_header


def capture(n, x):
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            x.add_(1)
    return g


def timed(graphs, reps):
    host, gpu = [], []
    for _ in range(reps):
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        t0 = time.perf_counter()
        for g in graphs:
            g.replay()
        t1 = time.perf_counter()
        e1.record()
        torch.cuda.synchronize()
        host.append((t1 - t0) * 1e6)
        gpu.append(e0.elapsed_time(e1) * 1e3)
    return {"host_launch_us": statistics.median(host), "gpu_interval_us": statistics.median(gpu)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", default="50,300,600,1200")
    ap.add_argument("--head", type=int, default=20)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    x = torch.zeros(1, device="cuda")
    rows = []
    for n in [int(s) for s in a.nodes.split(",")]:
        whole = capture(n, x)
        head, rest = capture(a.head, x), capture(n - a.head, x)
        # The GPU time of the kernels alone: the graph replayed back to back, GPU busy throughout.
        for g in (whole, head, rest):
            g.replay()
        torch.cuda.synchronize()
        row = {"nodes": n, "whole": timed([whole], a.reps), "split": timed([head, rest], a.reps)}
        busy = timed([whole] * 5, a.reps)
        row["kernels_us_busy"] = busy["gpu_interval_us"] / 5
        if a.profile:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
                row["whole_profiled"] = timed([whole], 5)
        rows.append(row)
        print(json.dumps(row), flush=True)
    out = {**probe_header("bench/gpu/graph_launch_probe.py"), "head": a.head, "rows": rows}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
