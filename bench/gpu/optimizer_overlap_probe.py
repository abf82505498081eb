#!/usr/bin/env python3
"""Whether AdamW's update can hide under the backward's matrix products on one GPU.

gpt2-xl's replayed step on one H200 spends about 11 ms in AdamW (bound by the memory's bandwidth)
after about 60 ms of backward (mostly matrix products, bound by the tensor cores). Without a
loss scale, gradient clipping or accumulation, a block's update needs nothing but its own
gradients, so it could run on a second stream while the blocks before it are differentiated.
Whether that saves time depends on whether the GPU runs the two at once: a product's blocks fill
every multiprocessor, so the update can only take the ones a product leaves idle (its last wave)
and the memory-bound kernels' share of the bandwidth.

This probe runs a stand-in for gpt2-xl's backward (per block: the eight products of its four
linear layers' input and weight gradients at micro-batch 4, sequence 1024; the attention's
forward twice for its backward; three elementwise passes for the GELU's and layer norms'
gradients) and an AdamW update of each block's 30.7 M parameters (fp32 master and moments, bf16
gradient and parameter copy: 28 bytes a parameter, as the worker's kernel), and times:
- `backward`: the stand-in alone; `update`: the updates alone; `serial`: one after the other on
  one stream (what the worker does today);
- `overlap/<kernel>/<priority>`: each block's update on a second stream as soon as that block's
  backward is done, the embedding's (82 M parameters) after the last block; with the update as a
  grid-stride kernel of 16 blocks a multiprocessor (the worker's) or as one short block per 4096
  elements (so a product waiting for multiprocessors gets them as soon as a block ends), and with
  the backward's stream at high priority or both at the default.

- `backward/carveC`, `overlap/short_blocks/backward_high/carveC`: the stand-in with its products
  leaving C multiprocessors free (cuBLAS's SM count target, through torch's carveout), alone and
  with the updates beside in short blocks; `overlap/grid_stride_on_carved/...` with each update's
  loop in as many blocks as C multiprocessors hold, `update/grid_stride_onC` that update alone
  (`--carveouts`, default 8,16,24,32; `--lt` sends torch's products through cuBLASLt).

After `--warm-s` seconds of the serial variant (the card at its power limit, as in training),
`--reps` rounds of every variant in turn, each between events after a synchronisation; the median
and range of each.

    python3 bench/gpu/optimizer_overlap_probe.py --out optimizer-overlap.json
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from common import probe_header


@triton.jit
def adamw_kernel(p, m, v, g, out, n, decay, omb1, b2, omb2, step_size, inv_bc2_sqrt, eps,
                 BLOCK: tl.constexpr, PERSISTENT: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    start = pid * BLOCK
    step = nprog * BLOCK if PERSISTENT else n
    for off0 in range(start, n, step):
        off = off0 + tl.arange(0, BLOCK)
        mask = off < n
        pi = tl.load(p + off, mask=mask)
        mi = tl.load(m + off, mask=mask)
        vi = tl.load(v + off, mask=mask)
        gi = tl.load(g + off, mask=mask).to(tl.float32)
        pi = pi * decay
        mi = mi + omb1 * (gi - mi)
        vi = b2 * vi + omb2 * gi * gi
        pi = pi - step_size * mi / (tl.sqrt(vi) * inv_bc2_sqrt + eps)
        tl.store(p + off, pi, mask=mask)
        tl.store(m + off, mi, mask=mask)
        tl.store(v + off, vi, mask=mask)
        tl.store(out + off, pi.to(tl.bfloat16), mask=mask)


class Shard:
    def __init__(self, n):
        f32 = dict(device="cuda", dtype=torch.float32)
        self.n = n
        self.p = torch.randn(n, **f32) * 0.02
        self.m = torch.zeros(n, **f32)
        self.v = torch.zeros(n, **f32)
        self.g = (torch.randn(n, device="cuda") * 1e-3).to(torch.bfloat16)
        self.out = torch.empty(n, device="cuda", dtype=torch.bfloat16)

    def update(self, persistent, sms):
        """`persistent`: a grid-stride loop over the shard in at most 16 blocks a multiprocessor of
        `sms`; otherwise one short block per 4096 elements."""
        if persistent:
            # The worker's launch: 256 threads (here 1024 elements) a block, at most 16 blocks a
            # multiprocessor, a grid-stride loop.
            block = 1024
            grid = min(triton.cdiv(self.n, block), sms * 16)
        else:
            block = 4096
            grid = triton.cdiv(self.n, block)
        adamw_kernel[(grid,)](self.p, self.m, self.v, self.g, self.out, self.n, 0.99999, 0.1, 0.95,
                              0.05, 1e-4, 1.0, 1e-8, BLOCK=block, PERSISTENT=persistent,
                              num_warps=8 if not persistent else 4)


class Block:
    """The operands and outputs of one block's backward stand-in (micro-batch 4, sequence 1024)."""

    def __init__(self, d=1600, t=4096, heads=25, batch=4):
        bf = dict(device="cuda", dtype=torch.bfloat16)
        r = lambda *s: torch.randn(*s, **bf) * 0.02  # noqa: E731
        self.w = {"qkv": r(3 * d, d), "proj": r(d, d), "up": r(4 * d, d), "down": r(d, 4 * d)}
        # Each linear layer y = x W^T: its input x (t × in) and its output's gradient dy (t × out).
        self.x = {"qkv": r(t, d), "proj": r(t, d), "up": r(t, d), "down": r(t, 4 * d)}
        self.dy = {"qkv": r(t, 3 * d), "proj": r(t, d), "up": r(t, 4 * d), "down": r(t, d)}
        self.dx = {k: torch.empty_like(self.x[k]) for k in self.x}
        self.dw = {k: torch.empty_like(self.w[k]) for k in self.w}
        self.q = r(batch, heads, t // batch, d // heads)
        self.k = r(batch, heads, t // batch, d // heads)
        self.vv = r(batch, heads, t // batch, d // heads)
        self.h = (r(t, 4 * d), r(t, 4 * d), torch.empty(t, 4 * d, **bf))
        self.ln = (r(t, d), r(t, d), torch.empty(t, d, **bf))

    def backward(self):
        for name in ("down", "up", "proj", "qkv"):
            torch.mm(self.dy[name], self.w[name], out=self.dx[name])
            torch.mm(self.dy[name].t(), self.x[name], out=self.dw[name])
            if name == "up":
                torch.mul(self.h[0], self.h[1], out=self.h[2])
            if name in ("down", "qkv"):
                torch.add(self.ln[0], self.ln[1], out=self.ln[2])
            if name == "proj":
                for _ in range(2):
                    F.scaled_dot_product_attention(self.q, self.k, self.vv, is_causal=True)


def timed_round_robin(fns, reps):
    """Each of `fns` once per round, `reps` rounds, so that every variant sees the GPU's clock and
    power as they drift through the run alike (a card reaching its power limit slows within a
    second or two); the median and range of each variant's times."""
    times = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            fn()
            e1.record()
            torch.cuda.synchronize()
            times[k].append(e0.elapsed_time(e1))
    return {k: {"median_ms": statistics.median(t), "min_ms": min(t), "max_ms": max(t)} for k, t in times.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--warm-s", type=float, default=5.0)
    ap.add_argument("--carveouts", default="8,16,24,32",
                    help="multiprocessors the products leave to the update, comma-separated ('' for none)")
    ap.add_argument("--lt", action="store_true", help="torch's products through cuBLASLt (as the worker's)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    if a.lt:
        torch.backends.cuda.preferred_blas_library("cublaslt")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    d = 1600
    per_block = 12 * d * d + 13 * d  # weights and biases of a gpt2-xl block
    # Two blocks' operands, alternated, so that the L2 cache does not keep a block's weights.
    blocks = [Block(), Block()]
    shards = [Shard(per_block) for _ in range(a.layers)]
    embedding = Shard(50304 * d + 1024 * d + 2 * d)

    def backward():
        for i in range(a.layers):
            blocks[i % 2].backward()

    def update(persistent, grid_sms=sms):
        for s in shards:
            s.update(persistent, grid_sms)
        embedding.update(persistent, grid_sms)

    def serial():
        backward()
        update(True)

    def overlap(persistent, main_s, side, grid_sms=sms):
        def run():
            for i in range(a.layers):
                blocks[i % 2].backward()
                side.wait_stream(main_s)
                with torch.cuda.stream(side):
                    shards[i].update(persistent, grid_sms)
            side.wait_stream(main_s)
            with torch.cuda.stream(side):
                embedding.update(persistent, grid_sms)
            main_s.wait_stream(side)

        return run

    def carved(c, fn):
        """`fn` with every matrix product asked to leave `c` multiprocessors free (cuBLAS's SM
        count target, through torch's carveout), so that the update's blocks have them to
        themselves while a product runs."""

        def run():
            torch._C._set_sm_carveout_experimental(c)
            try:
                fn()
            finally:
                torch._C._set_sm_carveout_experimental(None)

        return run

    # Warm up (Triton's compiles, cuBLAS's and cuDNN's choices), then run the serial step for
    # `--warm-s` seconds so that the card is at its power limit, as in a training run, before any
    # variant is timed.
    for p in (True, False):
        update(p)
    backward()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < a.warm_s:
        serial()
        torch.cuda.synchronize()

    side = torch.cuda.Stream(priority=0)
    # The backward's stream at high priority (-1 is the highest torch offers): a product waiting
    # for multiprocessors gets them before the update's next blocks.
    high = torch.cuda.Stream(priority=-1)

    def on(stream, fn):
        """`fn` on `stream`, ordered after what the current stream holds and before what it is given
        next (the timing events are recorded on the current stream)."""

        def run():
            outer = torch.cuda.current_stream()
            stream.wait_stream(outer)
            with torch.cuda.stream(stream):
                fn()
            outer.wait_stream(stream)

        return run

    fns = {
        "backward": backward,
        "update": lambda: update(True),
        "update_short_blocks": lambda: update(False),
        "serial": serial,
    }
    for kernel, persistent in (("grid_stride", True), ("short_blocks", False)):
        fns[f"overlap/{kernel}/same_priority"] = overlap(persistent, torch.cuda.current_stream(), side)
        fns[f"overlap/{kernel}/backward_high"] = on(high, overlap(persistent, high, side))
    carveouts = [int(c) for c in a.carveouts.split(",") if c]
    if carveouts and not hasattr(torch._C, "_set_sm_carveout_experimental"):
        raise SystemExit("this torch has no SM carveout (torch._C._set_sm_carveout_experimental)")
    for c in carveouts:
        # Warm each carveout's products up (the heuristic's choice may differ by target).
        carved(c, backward)()
        fns[f"backward/carve{c}"] = carved(c, backward)
        fns[f"update/grid_stride_on{c}"] = lambda c=c: update(True, grid_sms=c)
        fns[f"overlap/short_blocks/backward_high/carve{c}"] = on(high, carved(c, overlap(False, high, side)))
        # The update's loop in as many blocks as the carved-out multiprocessors hold.
        fns[f"overlap/grid_stride_on_carved/backward_high/carve{c}"] = on(
            high, carved(c, overlap(True, high, side, grid_sms=c)))
    torch.cuda.synchronize()
    rows = timed_round_robin(fns, a.reps)
    for k, r in rows.items():
        print(f"{k:40s} {r['median_ms']:8.2f} ms [{r['min_ms']:.2f}, {r['max_ms']:.2f}]", flush=True)
    best = min((r["median_ms"], k) for k, r in rows.items() if k.startswith("overlap/"))
    summary = {
        "serial_ms": rows["serial"]["median_ms"],
        "best_overlap": best[1],
        "best_overlap_ms": best[0],
        "saved_ms": rows["serial"]["median_ms"] - best[0],
        "update_ms": rows["update"]["median_ms"],
        "hidden_share_of_update": (rows["serial"]["median_ms"] - best[0]) / rows["update"]["median_ms"],
    }
    print(json.dumps(summary), flush=True)
    out = {**probe_header("bench/gpu/optimizer_overlap_probe.py"), "layers": a.layers, "warm_s": a.warm_s, "params_per_block": per_block,
           "sms": sms, "carveouts": carveouts, "blas": "cublaslt" if a.lt else "default",
           "rows": rows, "summary": summary}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
