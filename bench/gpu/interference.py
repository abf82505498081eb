"""How much a transfer running beside training slows the training down, by transfer engine.

One process drives two GPUs. On each, a stack of GPT-2-XL-shaped blocks (bf16, micro-batch 4,
sequence 1024) runs forward and backward on the compute stream, timed with CUDA events, while a
side stream moves data between the GPUs in one of five ways:

  none      nothing (the reference)
  nccl-ar   NCCL all-reduce (thread blocks on the SMs move and add the data)
  nccl-rs   NCCL reduce-scatter
  nccl-ag   NCCL all-gather
  ce        peer copies in both directions (the copy engines move the data; no SMs)
  ce+add    peer copies plus the elementwise add a reduce-scatter built on them needs

Each mode is measured --reps times, each time right after a run with nothing beside it (the
GPUs' clocks drift as they warm, by as much as the effects measured). Each line of output is one
JSON object per mode: the median slowdown against that run, compute ms per iteration, and the
bytes per second each GPU's side stream moved while compute ran. Progress goes to stderr.

Limits: one Python thread launches both GPUs' work op by op, so a single measurement varies by
about +-10% on the shared H200 hosts; only the median over many repetitions means anything, and
differences of a few percent stay within the noise (docs/results/collectives.md quotes three calls).

  python3 bench/gpu/interference.py [--iters 20] [--mb 4] [--blocks 6] [--reps 7]
"""

import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F


def block_params(dev, d=1600):
    g = torch.Generator(device=dev).manual_seed(0)
    mk = lambda *s: (torch.randn(*s, device=dev, dtype=torch.bfloat16, generator=g) * 0.02).requires_grad_()
    return [mk(3 * d, d), mk(d, d), mk(4 * d, d), mk(d, 4 * d), mk(d), mk(d)]


def block(x, p, heads=25):
    qkv_w, proj_w, fc_w, fc2_w, ln1, ln2 = p
    b, t, d = x.shape
    h = F.layer_norm(x, (d,), ln1)
    q, k, v = F.linear(h, qkv_w).split(d, dim=2)
    q, k, v = (z.view(b, t, heads, d // heads).transpose(1, 2) for z in (q, k, v))
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
    x = x + F.linear(a, proj_w)
    h = F.layer_norm(x, (d,), ln2)
    return x + F.linear(F.gelu(F.linear(h, fc_w), approximate="tanh"), fc2_w)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--mb", type=int, default=4)
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--mib", type=int, default=128, help="size of each side-stream transfer")
    ap.add_argument("--reps", type=int, default=7)
    a = ap.parse_args()
    devs = [torch.device("cuda", i) for i in range(2)]
    params = [[block_params(d) for _ in range(a.blocks)] for d in devs]
    xs = [torch.randn(a.mb, 1024, 1600, device=d, dtype=torch.bfloat16, requires_grad=True) for d in devs]
    side = [torch.cuda.Stream(device=d) for d in devs]
    n = a.mib * 2**20 // 2
    src = [torch.ones(n, device=d, dtype=torch.bfloat16) for d in devs]
    dst = [torch.zeros(n, device=d, dtype=torch.bfloat16) for d in devs]
    recv = [torch.zeros(n, device=d, dtype=torch.bfloat16) for d in devs]
    half = [torch.zeros(n // 2, device=d, dtype=torch.bfloat16) for d in devs]

    def step(i):
        with torch.cuda.device(i):
            y = xs[i]
            for p in params[i]:
                y = block(y, p)
            y.float().square().mean().backward()

    def side_ops(mode, k):
        """Queues k transfers on the side streams; returns bytes each GPU sends per transfer."""
        for _ in range(k):
            if mode == "nccl-ar":
                torch.cuda.nccl.all_reduce(src, streams=side)
            elif mode == "nccl-rs":
                torch.cuda.nccl.reduce_scatter(src, half, streams=side)
            elif mode == "nccl-ag":
                torch.cuda.nccl.all_gather(half, dst, streams=side)
            elif mode in ("ce", "ce+add"):
                # Both devices' current streams are the side streams: a copy between GPUs orders
                # itself after the current streams of both ends, and must not wait for compute.
                with torch.cuda.stream(side[0]), torch.cuda.stream(side[1]):
                    for i in range(2):
                        with torch.cuda.device(i):
                            recv[1 - i][: n // 2].copy_(src[i][: n // 2], non_blocking=True)
                if mode == "ce+add":
                    for i in range(2):
                        with torch.cuda.device(i), torch.cuda.stream(side[i]):
                            side[i].wait_stream(side[1 - i])
                            torch.add(src[i][n // 2 :], recv[i][: n // 2], out=half[i])
        # Bytes each GPU sends per transfer (bus bytes for two ranks).
        return {"nccl-ar": 2 * n, "nccl-rs": n, "nccl-ag": n, "ce": n, "ce+add": n}.get(mode, 0)

    modes = ("nccl-ar", "nccl-rs", "nccl-ag", "ce", "ce+add")
    for i in range(2):  # warm up every path
        step(i)
    for mode in modes:
        side_ops(mode, 2)
    for d in devs:
        torch.cuda.synchronize(d)

    def measure(mode, window_ms):
        """Compute ms per iteration on each GPU with `mode` beside it, and the side stream's rate."""
        k = 0
        if mode != "none":
            # As many transfers as keep the side stream busy through the compute window.
            t0 = time.perf_counter()
            side_ops(mode, 4)
            for d in devs:
                torch.cuda.synchronize(d)
            k = max(1, int(window_ms / 1e3 / ((time.perf_counter() - t0) / 4)))
        ev = lambda: [torch.cuda.Event(enable_timing=True) for _ in devs]
        start, end, s_start, s_end = ev(), ev(), ev(), ev()
        for i in range(2):
            s_start[i].record(side[i])
        sent = side_ops(mode, k) * k
        for i in range(2):
            s_end[i].record(side[i])
            start[i].record(torch.cuda.current_stream(devs[i]))
        for _ in range(a.iters):
            for i in range(2):
                step(i)
        for i in range(2):
            end[i].record(torch.cuda.current_stream(devs[i]))
        for d in devs:
            torch.cuda.synchronize(d)
        ms = [start[i].elapsed_time(end[i]) / a.iters for i in range(2)]
        side_ms = max(s_start[i].elapsed_time(s_end[i]) for i in range(2)) if k else 0.0
        return sum(ms) / 2, (sent / (side_ms / 1e3) / 1e9 if k else 0.0), k

    # Each mode is measured right after a run with nothing beside it, and compared with that run:
    # the GPUs' clocks drift as they warm, by as much as the effects measured here.
    window = measure("none", 0)[0] * a.iters
    rows = {m: [] for m in modes}
    for rep in range(a.reps):
        for mode in modes:
            base, _, _ = measure("none", 0)
            ms, gbps, k = measure(mode, window)
            rows[mode].append((ms / base, ms, base, gbps, k))
            print(json.dumps({"rep": rep, "mode": mode, "compute_ms": round(ms, 3), "none_ms": round(base, 3),
                              "slowdown": round(ms / base, 4), "side_gbps": round(gbps, 1), "transfers": k}),
                  file=sys.stderr, flush=True)
    for mode in modes:
        r = sorted(rows[mode])
        med = r[len(r) // 2]
        print(json.dumps({"mode": mode, "reps": len(r), "slowdown_median": round(med[0], 4),
                          "slowdowns": [round(x[0], 4) for x in rows[mode]], "compute_ms": round(med[1], 3),
                          "none_ms": round(med[2], 3), "side_gbps": round(med[3], 1),
                          "compute_window_ms": round(window, 1), "mib_per_transfer": a.mib}), flush=True)


if __name__ == "__main__":
    main()
