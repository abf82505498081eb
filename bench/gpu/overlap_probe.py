"""Does an AdamW update on a second stream hide under gpt2-xl-shaped backward products?

One H200/H100, bf16 products of gpt2-xl's four matrix shapes per block (each product's input and
weight gradient, 4096 tokens: micro-batch 4 x sequence 1024) and one pointwise pass per block, 48
blocks in backward order; then torch's fused AdamW over fp32 tensors of a block's parameter count
(28 bytes per parameter, as zerobench's kernel moves). Timed (CUDA events, median of 8 after 2
warm-up): the products alone, the updates alone, one after the other, and each block's update
issued on a second stream as soon as that block's products are (as an update in backward would
run), with both streams at the same priority and with the products' stream at a higher one.

    python3 bench/gpu/overlap_probe.py OUT.json
"""
import json, subprocess, sys, torch, statistics as st

from common import probe_header
torch.backends.cuda.matmul.allow_tf32 = True
dev = "cuda"
d, T, L = 1600, 4096, 48
shapes = [(d, 3 * d), (d, d), (d, 4 * d), (4 * d, d)]
bf = torch.bfloat16
layers = []
for _ in range(L):
    lay = []
    for (i, o) in shapes:
        W = torch.randn(o, i, device=dev, dtype=bf) * 0.02
        X = torch.randn(T, i, device=dev, dtype=bf)
        dY = torch.randn(T, o, device=dev, dtype=bf)
        dX = torch.empty(T, i, device=dev, dtype=bf)
        dW = torch.empty(o, i, device=dev, dtype=bf)
        lay.append((W, X, dY, dX, dW))
    h = torch.randn(T, 4 * d, device=dev, dtype=bf)
    layers.append((lay, h))
n_per = sum(i * o for i, o in shapes) + 13 * d  # ~ a block's parameters
opt = []
for _ in range(L):
    p = torch.randn(n_per, device=dev)
    g = torch.randn(n_per, device=dev)
    m = torch.zeros(n_per, device=dev)
    v = torch.zeros(n_per, device=dev)
    opt.append(([p], [g], [m], [v]))
step_t = torch.tensor(1.0, device=dev)

def layer_bwd(k):
    lay, h = layers[k]
    for (W, X, dY, dX, dW) in lay:
        torch.mm(dY, W, out=dX)
        torch.mm(dY.t(), X, out=dW)
    torch.nn.functional.gelu(h, approximate="tanh")  # a pointwise pass like the GELU's gradient

def adam(k):
    p, g, m, v = opt[k]
    torch._fused_adamw_(p, g, m, v, [], [step_t], lr=1e-4, beta1=0.9, beta2=0.95,
                        weight_decay=0.1, eps=1e-8, amsgrad=False, maximize=False)

def timed(fn, reps=8):
    out = []
    for r in range(reps + 2):
        torch.cuda.synchronize()
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize()
        if r >= 2: out.append(a.elapsed_time(b))
    return st.median(out), min(out), max(out)

def bwd_only():
    for k in reversed(range(L)): layer_bwd(k)
def adam_only():
    for k in reversed(range(L)): adam(k)
def serial():
    bwd_only(); adam_only()
def overlapped(side):
    main = torch.cuda.current_stream()
    for k in reversed(range(L)):
        layer_bwd(k)
        ev = torch.cuda.Event(); ev.record(main)
        side.wait_event(ev)
        with torch.cuda.stream(side):
            adam(k)
    done = torch.cuda.Event(); done.record(side); main.wait_event(done)

smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout.strip().splitlines()[0]
res = {**probe_header("bench/gpu/overlap_probe.py"), "nvidia_smi": smi, "params": n_per * L,
       "ms": "median, min, max over 8 repeats"}
res["bwd_ms"] = timed(bwd_only)
res["adam_ms"] = timed(adam_only)
res["serial_ms"] = timed(serial)
lo = torch.cuda.Stream(priority=0)
res["overlap_same_priority_ms"] = timed(lambda: overlapped(lo))
hi_main = torch.cuda.Stream(priority=-1)
with torch.cuda.stream(hi_main):
    res["overlap_main_high_ms"] = timed(lambda: overlapped(torch.cuda.Stream(priority=0)))
res["hidden_share_of_updates"] = (res["serial_ms"][0] - min(res["overlap_same_priority_ms"][0], res["overlap_main_high_ms"][0])) / res["adam_ms"][0]
json.dump(res, open(sys.argv[1], "w"), indent=1)
print(json.dumps(res))
