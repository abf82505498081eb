#!/usr/bin/env python3
"""libtorch's attention kernels (SDPA's backends) on GPT-2's shapes, forward and backward.

GPT-2 takes q, k and v as views of one product's output ([batch, seq, 3 * d] split in three,
each viewed as heads and transposed), causal, bf16: here the same tensors for gpt2-xl at
micro-batch 4 and gpt2 at 16 (sequence 1024, heads of 64), run through each backend libtorch
has for them (cuDNN's, flash attention, memory-efficient attention) and through its default
choice. Per backend: the median of `--reps` forward passes, and of forward plus backward passes,
timed by CUDA events, and the largest difference of the output and of the input gradient from
the default's.

    python3 bench/gpu/sdpa_backends.py --out sdpa.json
"""
import argparse
import contextlib
import json
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from common import probe_header

SHAPES = {"gpt2-xl": (4, 1024, 1600), "gpt2": (16, 1024, 768)}
BACKENDS = {
    "default": None,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
}


def attention(qkv, d):
    b, t, _ = qkv.shape
    q, k, v = (x.view(b, t, d // 64, 64).transpose(1, 2) for x in qkv.split(d, 2))
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def timed(fn, reps):
    times = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1))
    return statistics.median(times)


def run(model, backend, reps):
    b, t, d = SHAPES[model]
    gen = torch.Generator(device="cuda").manual_seed(0)
    qkv = torch.randn(b, t, 3 * d, device="cuda", generator=gen, dtype=torch.bfloat16).requires_grad_()
    g = torch.randn(b, d // 64, t, 64, device="cuda", generator=gen, dtype=torch.bfloat16)
    with sdpa_kernel(BACKENDS[backend]) if BACKENDS[backend] is not None else contextlib.nullcontext():
        try:
            y = attention(qkv, d)
        except RuntimeError as e:
            return {"model": model, "backend": backend, "error": str(e).splitlines()[0]}

        def fwd():
            with torch.no_grad():
                attention(qkv, d)

        def fwd_bwd():
            qkv.grad = None
            attention(qkv, d).backward(g)

        for _ in range(3):
            fwd_bwd()
        torch.cuda.synchronize()
        row = {"model": model, "backend": backend, "forward_ms": timed(fwd, reps), "forward_backward_ms": timed(fwd_bwd, reps)}
        fwd_bwd()
        return row, y.detach(), qkv.grad.detach().clone()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    rows = []
    for model in SHAPES:
        base = None
        for backend in BACKENDS:
            got = run(model, backend, a.reps)
            if isinstance(got, dict):
                rows.append(got)
                print(json.dumps(got), flush=True)
                continue
            row, y, grad = got
            if base is None:
                base = (y, grad)
            row["output_max_abs_diff_from_default"] = (y.float() - base[0].float()).abs().max().item()
            row["grad_max_abs_diff_from_default"] = (grad.float() - base[1].float()).abs().max().item()
            rows.append(row)
            print(json.dumps(row), flush=True)
    out = {**probe_header("bench/gpu/sdpa_backends.py"), "cudnn": torch.backends.cudnn.version(), "reps": a.reps, "rows": rows}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
