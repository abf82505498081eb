"""How much of AdamW's time can hide behind backward on one GPU?

The reference GPT-2 of `reference.py` (eager, bf16 autocast over fp32 parameters, fused AdamW)
trained three ways, alternating, in one process:

* `after`: the usual loop: backward, then one fused AdamW step over every parameter;
* `in-backward`: each group's fused AdamW (a block's parameters; the embeddings, final norm)
  launched from the parameters' post-accumulate-grad hooks as soon as backward has produced the
  group's last gradient, on the same stream;
* `in-backward-side`: the same launched on a second stream, so that the update (bound by the
  memory's bandwidth) can run beside backward's matrix products (bound by arithmetic).

A step ends when all its device work has. Prints one JSON object: the median step of each way
and the step's parts measured alone (forward+backward without an update; the update alone).

    python3 optimizer_overlap.py --model gpt2-xl --micro-batch 4
"""
import argparse
import json
import socket
import subprocess
import statistics
import time

import torch

from reference import GPT, PRESETS, VOCAB

ADAMW = dict(lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)


def groups_of(model):
    """Parameter groups in the order backward finishes them: each block, then the rest."""
    out = [list(b.parameters()) for b in model.blocks]
    seen = {id(p) for g in out for p in g}
    out.append([p for p in model.parameters() if id(p) not in seen])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=list(PRESETS), default="gpt2-xl")
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=6, help="rounds of every way, alternating")
    ap.add_argument("--steps", type=int, default=4, help="measured steps per way per round")
    a = ap.parse_args()
    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    model = GPT(*PRESETS[a.model]).to(dev)
    groups = groups_of(model)
    opts = [torch.optim.AdamW(g, **ADAMW) for g in groups]
    side = torch.cuda.Stream(dev)
    gen = torch.Generator(device=dev).manual_seed(1234)
    state = {"way": "after", "pending": None}

    def group_done(gi):
        opt = opts[gi]
        if state["way"] == "in-backward-side":
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):
                opt.step()
            for p in groups[gi]:
                p.grad.record_stream(side)
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)

    owner = {}
    for gi, g in enumerate(groups):
        for p in g:
            owner[p] = gi

    def hook(p):
        if state["way"] == "after":
            return
        gi = owner[p]
        state["pending"][gi] -= 1
        if state["pending"][gi] == 0:
            group_done(gi)

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def fwd_bwd():
        data = torch.randint(0, VOCAB, (a.micro_batch, a.seq_len + 1), device=dev, generator=gen)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(data[:, :-1], data[:, 1:])
        loss.backward()
        return loss

    def step(way):
        state["way"] = way
        state["pending"] = [len(g) for g in groups]
        loss = fwd_bwd()
        if way == "after":
            for o in opts:
                o.step()
                o.zero_grad(set_to_none=True)
        else:
            assert all(n == 0 for n in state["pending"]), "a group never finished"
            torch.cuda.current_stream(dev).wait_stream(side)
        return loss

    def timed(fn):
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        loss = fn()
        if loss is not None:
            loss.item()
        torch.cuda.synchronize(dev)
        return (time.perf_counter() - t0) * 1e3

    def update_only():
        for o in opts:
            o.step()

    def fwd_bwd_only():
        state["way"] = "after"
        loss = fwd_bwd()
        for o in opts:
            o.zero_grad(set_to_none=True)
        return loss

    ways = {"after": lambda: step("after"), "in-backward": lambda: step("in-backward"),
            "in-backward-side": lambda: step("in-backward-side"), "forward-backward": fwd_bwd_only}
    times = {w: [] for w in ways}
    times["update"] = []
    for w, fn in ways.items():  # warm-up: every way twice
        timed(fn)
        timed(fn)
    # The update alone needs gradients: keep one backward's.
    for r in range(a.rounds):
        for w, fn in ways.items():
            for _ in range(a.steps):
                times[w].append(timed(fn))
        state["way"] = "after"
        fwd_bwd()
        for _ in range(a.steps):
            times["update"].append(timed(update_only))
        for o in opts:
            o.zero_grad(set_to_none=True)
    med = {w: statistics.median(t) for w, t in times.items()}
    print(json.dumps({
        "model": a.model, "micro_batch": a.micro_batch, "seq_len": a.seq_len, "groups": len(groups),
        "steps_per_way": len(times["after"]), "median_ms": med,
        "hidden_share_of_update": {
            w: (med["after"] - med[w]) / med["update"] for w in ("in-backward", "in-backward-side")},
        "torch": torch.__version__, "gpu": torch.cuda.get_device_name(dev), "host": socket.gethostname(),
        "driver": subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True).stdout.split("\n")[0],
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }), flush=True)


if __name__ == "__main__":
    main()
