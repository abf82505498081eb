#!/usr/bin/env python3
"""Summarises a trace written by `zerobench-worker --profile-step N --torch-profile` (or by
`bench/gpu/reference.py --torch-profile PATH`).

    bench/gpu/torch_profile_summary.py LOGDIR/torch-profile-rank0.json [--top 15] [--json]

Prints, for the profiled step: its span; per host thread the operators at the top of the call
stack (count, time); the CUDA runtime calls (launches, synchronisations, copies); the kernels
(count, summed time, the time the GPU had at least one kernel running, the largest by summed
time); the kernels' time by class (`CLASSES`: matrix products, attention, the optimizer's update,
copies and sets, the rest); the gaps of the GPU longer than 50 us (time the device waited for
the host); the time from the first kernel's start to the last one's end; and the shorter gaps
between kernels that follow each other (their number, sum and median: a launch's latency, which
a CUDA graph's replay pays too), also by the kinds of the nodes on either side (a replayed
graph's memset nodes wait longer than its kernel nodes).
"""
import argparse
import collections
import json
import sys


# A kernel's class: the first whose pattern its name contains (memcpy and memset events are
# "copies and sets"). cuBLAS(Lt)'s Hopper kernels are named nvjet_*; cuDNN's attention is
# *sdpa* with its cudnn::fusion helpers (dO·O before the backward pass, dQ to 16 bits after it);
# zerobench's fused AdamW is adamw_*, torch's FusedOptimizerTensorListMetadata.
CLASSES = (
    ("matrix products", ("nvjet", "gemm", "cutlass", "xmma")),
    ("attention", ("sdpa", "flash", "fmha", "cudnn::fusion")),
    ("optimizer", ("adamw", "FusedOptimizerTensorListMetadata")),
)


def kernel_class(event):
    if event.get("cat") in ("gpu_memcpy", "gpu_memset"):
        return "copies and sets"
    name = event["name"]
    return next((c for c, pats in CLASSES if any(p in name for p in pats)), "other")


def node_kind(event):
    """A GPU event's kind, for the gaps on either side of it: kernel, memset or memcpy."""
    return {"gpu_memset": "memset", "gpu_memcpy": "memcpy"}.get(event.get("cat"), "kernel")


def union_ms(intervals):
    total, end = 0.0, None
    for s, e, *_ in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total / 1e3


def top_level(events):
    """Events not nested inside another of the same thread."""
    out = []
    by_tid = collections.defaultdict(list)
    for e in events:
        by_tid[e["tid"]].append(e)
    for tid, evs in by_tid.items():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        end = -1.0
        for e in evs:
            if e["ts"] >= end:
                out.append(e)
                end = e["ts"] + e["dur"]
    return out


def summarise(path, top):
    with open(path) as f:
        trace = json.load(f)
    evs = [e for e in trace["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    cat = collections.defaultdict(list)
    for e in evs:
        cat[e.get("cat", "")].append(e)
    t0 = min(e["ts"] for e in evs)
    t1 = max(e["ts"] + e["dur"] for e in evs)
    ops = top_level(cat["cpu_op"])
    threads = collections.defaultdict(lambda: [0, 0.0])
    for e in ops:
        threads[e["tid"]][0] += 1
        threads[e["tid"]][1] += e["dur"] / 1e3
    op_names = collections.defaultdict(lambda: [0, 0.0])
    for e in ops:
        op_names[e["name"]][0] += 1
        op_names[e["name"]][1] += e["dur"] / 1e3
    runtime = collections.defaultdict(lambda: [0, 0.0])
    for e in cat["cuda_runtime"] + cat["cuda_driver"]:
        runtime[e["name"]][0] += 1
        runtime[e["name"]][1] += e["dur"] / 1e3
    kernels = cat["kernel"] + cat["gpu_memcpy"] + cat["gpu_memset"]
    by_kernel = collections.defaultdict(lambda: [0, 0.0])
    for e in kernels:
        by_kernel[e["name"][:90]][0] += 1
        by_kernel[e["name"][:90]][1] += e["dur"] / 1e3
    classes = collections.defaultdict(lambda: [0, 0.0])
    for e in kernels:
        c = classes[kernel_class(e)]
        c[0] += 1
        c[1] += e["dur"] / 1e3
    ks = sorted((e["ts"], e["ts"] + e["dur"], node_kind(e)) for e in kernels)
    # Every idle stretch between the first kernel's start and the last one's end: the long ones
    # (the device waited for the host) apart from the short ones between kernels that follow each
    # other (a launch's latency, in a CUDA graph's replay too), the short ones also by the kinds of
    # the nodes on either side (the one that ended last before the gap, the one that starts it).
    gaps, short, end, end_kind = [], [], None, None
    by_kinds = collections.defaultdict(lambda: [0, 0.0])
    for s, e, kind in ks:
        if end is not None and s > end:
            if s - end > 50:
                gaps.append((s - end) / 1e3)
            else:
                short.append((s - end) / 1e3)
                b = by_kinds[f"{end_kind} -> {kind}"]
                b[0] += 1
                b[1] += (s - end) / 1e3
        if end is None or e > end:
            end, end_kind = e, kind
    short.sort()
    return {
        "span_ms": (t1 - t0) / 1e3,
        "threads": {str(k): {"top_ops": v[0], "ms": round(v[1], 3)} for k, v in threads.items()},
        "top_ops": sorted(([k, v[0], round(v[1], 3)] for k, v in op_names.items()), key=lambda r: -r[2])[:top],
        "runtime": sorted(([k, v[0], round(v[1], 3)] for k, v in runtime.items()), key=lambda r: -r[2])[:top],
        "kernels": len(kernels),
        "kernel_ms": round(sum(e["dur"] for e in kernels) / 1e3, 3),
        "kernel_classes": {c: {"count": n, "ms": round(ms, 3)} for c, (n, ms) in sorted(classes.items())},
        "gpu_busy_ms": round(union_ms(ks), 3),
        "gaps_over_50us": len(gaps),
        "gap_ms": round(sum(gaps), 3),
        "first_to_last_kernel_ms": round((ks[-1][1] - ks[0][0]) / 1e3, 3) if ks else 0.0,
        "short_gaps": len(short),
        "short_gap_ms": round(sum(short), 3),
        "short_gap_median_us": round(short[len(short) // 2] * 1e3, 2) if short else 0.0,
        "short_gaps_by_kinds": {k: {"count": n, "ms": round(ms, 3), "mean_us": round(ms / n * 1e3, 2)}
                                for k, (n, ms) in sorted(by_kinds.items())},
        "top_kernels": sorted(([k, v[0], round(v[1], 3)] for k, v in by_kernel.items()), key=lambda r: -r[2])[:top],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", nargs="+")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    for path in a.trace:
        s = summarise(path, a.top)
        if a.json:
            print(json.dumps({"trace": path, **s}))
            continue
        print(f"== {path}")
        print(f"span {s['span_ms']:.2f} ms; kernels {s['kernels']}, {s['kernel_ms']:.2f} ms summed, "
              f"GPU busy {s['gpu_busy_ms']:.2f} ms; {s['gaps_over_50us']} gaps > 50 us, {s['gap_ms']:.2f} ms; "
              f"{s['short_gaps']} shorter, {s['short_gap_ms']:.2f} ms (median {s['short_gap_median_us']:.1f} us)")
        print("  by class: " + "; ".join(f"{c} {v['ms']:.2f} ms ({v['count']})" for c, v in s["kernel_classes"].items()))
        print("  short gaps by the nodes on either side: " + "; ".join(
            f"{k} {v['count']} x {v['mean_us']:.2f} us" for k, v in s["short_gaps_by_kinds"].items()))
        for tid, t in s["threads"].items():
            print(f"  thread {tid}: {t['top_ops']} top-level operators, {t['ms']:.2f} ms")
        for title, rows in (("operators", s["top_ops"]), ("runtime", s["runtime"]), ("kernels", s["top_kernels"])):
            print(f"  {title}:")
            for name, n, ms in rows:
                print(f"    {ms:9.3f} ms {n:6d}  {name}")


if __name__ == "__main__":
    sys.exit(main())
