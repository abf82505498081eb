"""The PyTorch reference zerobench is compared with: a nanoGPT-style GPT-2 (same shapes as
zerobench's presets: vocabulary 50257, 1024 positions, pre-LN blocks with biases, tanh GELU, causal
scaled-dot-product attention, tied LM head) trained in bf16 with fused AdamW, on one GPU eagerly
(`--mode eager`) or through torch.compile (`--mode compile`; `--mode compile-reduce-overhead`,
which replays forward and backward from CUDA graphs; `--mode compile-max-autotune`, which also
times its matrix products' candidate kernels, Triton's and cuBLAS's, at compile time and keeps the
fastest, as zerobench times cuBLASLt's algorithms), with DDP (`--mode ddp`) or with
FSDP2's `fully_shard` per block (`--mode fsdp2`), through DeepSpeed's ZeRO at a stage
(`--mode deepspeed --stage N`: bf16, DeepSpeed's own AdamW (FusedAdam, JIT-built on first use),
overlap_comm and contiguous_gradients, its default bucket sizes), or through DeepSpeed's ZeRO
stage 2 with the optimizer offloaded to the host (`--mode deepspeed-offload`: DeepSpeed's
recommended ZeRO-Offload configuration, bf16, DeepSpeedCPUAdam on pinned memory, overlap_comm and
contiguous_gradients). The DeepSpeed modes run through torchrun. `--mode eager-update-beside` is
eager with what zerobench does on one GPU replaying its steps (worker/src/zero/beside.rs): each
block's fused AdamW step runs on a stream of its own as soon as the last of the block's gradients
is accumulated (a hook per parameter), while the backward goes on at the highest stream priority.
torch.compile's modes cannot take it: their compiled backward hands every gradient back at its end.

The LM head is padded exactly as zerobench pads its own (worker/src/model/ops.rs, `lm_loss`): the
50257-row weight gets zero rows up to a multiple of 64 (50304) inside the product and the extra
logits are sliced off before the loss, so both run the same arithmetic on aligned shapes
(`--no-pad-head` for the unpadded head). A step is timed as zerobench times it: from its start to
the completion of all of its device work (`torch.cuda.synchronize()`).

eager and ddp keep fp32 parameters and run the model under bf16 autocast (nanoGPT's recipe);
fsdp2 shards fp32 parameters and computes in bf16 (MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=fp32)). `--master-weights` (eager and the compiled modes) keeps the parameters as
zerobench keeps them instead: bf16 parameters the model computes with, no autocast (so no cast of
a weight or a gradient inside forward and backward), and fp32 master copies that fused AdamW
updates, the gradients copied into the masters' before the update and the masters back into the
parameters after it; the loss is taken over fp32 logits either way. `--fused-update` gives that
update zerobench's single pass: flat masters and moments, the gradients gathered into one flat bf16
buffer, and one compiled AdamW over all of it that writes the bf16 weights. Data are seeded random
tokens. Prints one JSON line on rank 0, with every measured step's time (under torchrun, each
step the slowest rank's: before 2026-12-04 rank 0's own, up to 0.12% shorter on 2 GPUs).

    python3 reference.py --mode eager --model gpt2 --micro-batch 16
    torchrun --standalone --nproc_per_node=2 reference.py --mode ddp --model gpt2 --micro-batch 16
"""
import argparse
import json
import os
import statistics
import sys
import time

# The modes one process runs (plain `python3`); the others run under torchrun. Declared before
# torch is imported so that `reference.py --single-process-modes` (what bench/gpu/run.sh asks)
# answers without it.
SINGLE_PROCESS_MODES = ("eager", "eager-update-beside", "compile", "compile-reduce-overhead", "compile-max-autotune")
DISTRIBUTED_MODES = ("ddp", "fsdp2", "deepspeed", "deepspeed-offload")
if __name__ == "__main__" and sys.argv[1:] == ["--single-process-modes"]:
    print(" ".join(SINGLE_PROCESS_MODES))
    sys.exit(0)

import torch  # noqa: E402 (after the question above, which needs no torch)
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {"gpt2": (12, 768, 12), "gpt2-medium": (24, 1024, 16), "gpt2-large": (36, 1280, 20), "gpt2-xl": (48, 1600, 25)}
VOCAB, POSITIONS = 50257, 1024
# zerobench's HEAD_ALIGN: the LM head's rows are padded to a multiple of this inside the product.
HEAD_ALIGN = 64


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.h, c // self.h).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, d, heads, pad_head=True):
        super().__init__()
        self.head_rows = -(-VOCAB // HEAD_ALIGN) * HEAD_ALIGN if pad_head else VOCAB
        self.wte, self.wpe = nn.Embedding(VOCAB, d), nn.Embedding(POSITIONS, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        w = self.wte.weight
        if self.head_rows > VOCAB:
            w = F.pad(w, (0, 0, 0, self.head_rows - VOCAB))
        logits = F.linear(self.ln_f(x), w)[..., :VOCAB]
        return F.cross_entropy(logits.reshape(-1, VOCAB).float(), targets.reshape(-1))


class MasterAdamW:
    """`--master-weights`' optimizer: fused AdamW over fp32 masters of bf16 parameters. A step
    copies the parameters' bf16 gradients into the masters' fp32 ones, updates the masters and
    copies them back into the parameters: the fused update between two foreach copies, about 14
    bytes a parameter more than one pass (`FlatMasterAdamW`)."""

    def __init__(self, weights, masters):
        self.weights, self.masters = weights, masters
        self.adamw = torch.optim.AdamW(masters, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)

    def step(self):
        torch._foreach_copy_([m.grad for m in self.masters], [w.grad for w in self.weights])
        self.adamw.step()
        with torch.no_grad():
            torch._foreach_copy_(self.weights, self.masters)

    def zero_grad(self, set_to_none=True):
        for w in self.weights:
            w.grad = None


def adamw_flat(w, g, m, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay):
    """AdamW (torch.optim.AdamW's arithmetic) over flat fp32 masters `m` from bf16 gradients `g`,
    writing the bf16 weights `w`: compiled, one pass reads g, m and the moments and writes m, the
    moments and w (28 bytes a parameter, as zerobench's update)."""
    step += 1
    g = g.float()
    m.mul_(1 - lr * weight_decay)
    exp_avg.lerp_(g, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    step_size = lr / (1 - beta1 ** step)
    denom = exp_avg_sq.sqrt() / (1 - beta2 ** step).sqrt() + eps
    m.sub_(step_size * exp_avg / denom)
    w.copy_(m)


class FlatMasterAdamW:
    """`--master-weights --fused-update`' optimizer: the parameters become views of one flat bf16
    buffer, their fp32 masters and moments flat tensors, and a step gathers the gradients into one
    flat bf16 buffer (a copy: 4 bytes a parameter) and updates all of it in one compiled pass
    (`adamw_flat`)."""

    def __init__(self, weights, flat_masters):
        dev = weights[0].device
        n = flat_masters.numel()
        self.w = torch.empty(n, dtype=torch.bfloat16, device=dev)
        self.g = torch.empty(n, dtype=torch.bfloat16, device=dev)
        self.m = flat_masters
        self.exp_avg, self.exp_avg_sq = torch.zeros_like(self.m), torch.zeros_like(self.m)
        self.step_t = torch.zeros((), dtype=torch.float32, device=dev)
        at = 0
        for p in weights:
            view = self.w[at:at + p.numel()].view_as(p)
            view.copy_(p.detach())
            p.data = view
            at += p.numel()
        self.weights = weights
        self.update = torch.compile(adamw_flat, fullgraph=True)

    def step(self):
        torch.cat([p.grad.reshape(-1) for p in self.weights], out=self.g)
        self.update(self.w, self.g, self.m, self.exp_avg, self.exp_avg_sq, self.step_t,
                    3e-4, 0.9, 0.95, 1e-8, 0.1)

    def zero_grad(self, set_to_none=True):
        for w in self.weights:
            w.grad = None


def update_beside(model, a, dev):
    """`--mode eager-update-beside`: the step function, and None for the loop's optimizer. One fused
    AdamW per unit zerobench updates apart (each block; the embeddings, whose tied weight's
    gradient is complete last, with the final layer norm), stepped on a low-priority stream by the
    hook of the unit's last parameter to have its gradient accumulated, while the backward runs on
    a stream at the highest priority; the step waits for every update at its end."""
    urgent = torch.cuda.Stream(device=dev, priority=-1)
    beside = torch.cuda.Stream(device=dev, priority=0)
    adamw = dict(lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    units = [list(b.parameters()) for b in model.blocks]
    units.append([model.wte.weight, model.wpe.weight, *model.ln_f.parameters()])
    opts = [torch.optim.AdamW(u, **adamw) for u in units]
    unit_of = {p: i for i, u in enumerate(units) for p in u}
    pending = [0] * len(units)

    def hook(p):
        i = unit_of[p]
        pending[i] -= 1
        if pending[i]:
            return
        # Backward's thread computes on the urgent stream (the forward's); the update waits for
        # what it has issued so far, and the gradients stay allocated until the update has read
        # them.
        beside.wait_stream(torch.cuda.current_stream(dev))
        for q in units[i]:
            q.grad.record_stream(beside)
        with torch.cuda.stream(beside):
            opts[i].step()
            opts[i].zero_grad(set_to_none=True)

    for p in unit_of:
        p.register_post_accumulate_grad_hook(hook)
    gen = torch.Generator(device=dev).manual_seed(1234)

    def step():
        for i, u in enumerate(units):
            pending[i] = len(u)
        outer = torch.cuda.current_stream(dev)
        urgent.wait_stream(outer)
        urgent.wait_stream(beside)  # the last step's updates, before the parameters are read
        with torch.cuda.stream(urgent):
            data = torch.randint(0, VOCAB, (a.micro_batch, a.seq_len + 1), device=dev, generator=gen)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(data[:, :-1], data[:, 1:])
            loss.backward()
        outer.wait_stream(urgent)
        outer.wait_stream(beside)
        return loss

    return step, None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=SINGLE_PROCESS_MODES + DISTRIBUTED_MODES, required=True)
    ap.add_argument("--stage", type=int, choices=[0, 1, 2, 3], default=2, help="ZeRO stage of --mode deepspeed")
    ap.add_argument("--no-pad-head", dest="pad_head", action="store_false")
    ap.add_argument("--master-weights", action="store_true",
                    help="bf16 parameters with fp32 master copies, no autocast (eager and compiled modes)")
    ap.add_argument("--fused-update", action="store_true",
                    help="with --master-weights: one compiled pass over flat states updates every parameter")
    ap.add_argument("--model", choices=list(PRESETS), default="gpt2")
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--torch-profile", metavar="PATH",
                    help="after the timed steps, record one more with torch.profiler (host operators, every CUDA "
                         "kernel, copy and set) into PATH, a Chrome trace (bench/gpu/torch_profile_summary.py reads "
                         "it); single-process modes only")
    a = ap.parse_args()

    distributed = a.mode in DISTRIBUTED_MODES
    if a.master_weights and (distributed or a.mode == "eager-update-beside"):
        sys.exit(f"--master-weights is for eager and the compiled modes, not {a.mode}")
    if a.fused_update and not a.master_weights:
        sys.exit("--fused-update goes with --master-weights")
    # The compiled modes that replay CUDA graphs (max-autotune does too).
    graphs = a.mode in ("compile-reduce-overhead", "compile-max-autotune")
    if distributed:
        dist.init_process_group("nccl")
        rank, world, local = dist.get_rank(), dist.get_world_size(), int(os.environ["LOCAL_RANK"])
    else:
        rank, world, local = 0, 1, 0
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    torch.manual_seed(0)
    model = GPT(*PRESETS[a.model], pad_head=a.pad_head).to(dev)
    head_rows = model.head_rows
    params = sum(p.numel() for p in model.parameters())
    autocast = True
    if a.mode == "ddp":
        model = nn.parallel.DistributedDataParallel(model, device_ids=[local])
    elif a.mode == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for blk in model.blocks:
            fully_shard(blk, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        autocast = False
    if a.mode in ("deepspeed", "deepspeed-offload"):
        import deepspeed

        if a.mode == "deepspeed":
            zero = {"stage": a.stage, "overlap_comm": True, "contiguous_gradients": True}
        else:
            zero = {
                "stage": 2,
                "offload_optimizer": {"device": "cpu", "pin_memory": True},
                "overlap_comm": True,
                "contiguous_gradients": True,
                "reduce_bucket_size": 5e8,
                "allgather_bucket_size": 5e8,
            }
        config = {
            "train_micro_batch_size_per_gpu": a.micro_batch,
            "gradient_accumulation_steps": 1,
            "bf16": {"enabled": True},
            "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "weight_decay": 0.1}},
            "zero_optimization": zero,
            "steps_per_print": 1 << 30,
        }
        client = None
        if a.mode == "deepspeed":
            # DeepSpeed's own AdamW is FusedAdam, JIT-built with nvcc; where that build fails,
            # torch's fused AdamW (as fast) is given instead, and the result says which ran.
            try:
                from deepspeed.ops.op_builder import FusedAdamBuilder

                # DeepSpeed 0.19.8 cannot parse an architecture with a suffix ("9.0a") in
                # TORCH_CUDA_ARCH_LIST; without the list it builds for this GPU.
                os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
                FusedAdamBuilder().load()
            except Exception as e:  # noqa: BLE001 - any build failure falls back
                print(f"FusedAdam unavailable ({e}); torch's fused AdamW instead", file=sys.stderr)
                del config["optimizer"]
                client = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), optimizer=client,
                                               config=config)
        gen = torch.Generator(device=dev).manual_seed(1234 + rank)

        def ds_step():
            data = torch.randint(0, VOCAB, (a.micro_batch, a.seq_len + 1), device=dev, generator=gen)
            loss = engine(data[:, :-1], data[:, 1:])
            engine.backward(loss)
            engine.step()
            return loss

        step_fn = ds_step
        opt = None
    elif a.mode == "eager-update-beside":
        step_fn, opt = update_beside(model, a, dev)
    elif a.master_weights:
        # The masters start from the fp32 initialisation, then the model computes in bf16.
        weights = list(model.parameters())
        autocast = False
        if a.fused_update:
            flat_masters = torch.cat([p.detach().reshape(-1) for p in weights])
            model.to(torch.bfloat16)
            opt = FlatMasterAdamW(weights, flat_masters)
        else:
            masters = [p.detach().clone() for p in weights]
            for m in masters:
                m.grad = torch.empty_like(m)
            model.to(torch.bfloat16)
            opt = MasterAdamW(weights, masters)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    if a.mode == "compile":
        model = torch.compile(model)
    elif a.mode == "compile-reduce-overhead":
        # torch.compile replaying forward and backward from CUDA graphs (what zerobench's
        # --cuda-graph does; the optimizer step stays outside the graphs there too).
        model = torch.compile(model, mode="reduce-overhead")
    elif a.mode == "compile-max-autotune":
        model = torch.compile(model, mode="max-autotune")
    gen = torch.Generator(device=dev).manual_seed(1234 + rank)

    def step():
        if graphs:
            # A new iteration: the graphs may overwrite the last one's outputs.
            torch.compiler.cudagraph_mark_step_begin()
        data = torch.randint(0, VOCAB, (a.micro_batch, a.seq_len + 1), device=dev, generator=gen)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            loss = model(data[:, :-1], data[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    if a.mode not in ("eager-update-beside", "deepspeed", "deepspeed-offload"):
        step_fn = step
    times = []
    # The wall-clock span of the measured steps (Unix seconds), which bench/gpu/run.sh clocks
    # matches with the GPU's clock samples.
    measured_unix = [None, None]
    for i in range(a.steps):
        # The peak over the measured steps; with CUDA graphs over the whole run, since replays
        # allocate nothing and their memory was allocated while recording, in the warm-up.
        if i == a.warmup and not graphs:
            torch.cuda.reset_peak_memory_stats(dev)
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        loss = step_fn()
        loss.item()
        torch.cuda.synchronize(dev)
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
            if measured_unix[0] is None:
                measured_unix[0] = time.time() - times[-1]
            measured_unix[1] = time.time()
    if distributed:
        # Each step the slowest rank's time, as bench/gpu/common.py takes zerobench's (one
        # collective after the timed steps).
        slowest = torch.tensor(times, dtype=torch.float64, device=dev)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        times = slowest.tolist()
    # The same median as bench/gpu/report.py takes of zerobench's steps (the mean of the two middle
    # times for an even count). The references of 2026-11-22 took the upper of the two instead.
    med = statistics.median(times)
    tokens = a.micro_batch * a.seq_len
    peaks = torch.cuda.max_memory_allocated(dev), torch.cuda.max_memory_reserved(dev)
    if a.torch_profile:
        if distributed:
            sys.exit("--torch-profile profiles the single-process modes only")
        # What zerobench's --torch-profile records of its step: every kernel, the ones CUDA graphs
        # replay included. The step is not among the timed ones.
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step_fn()
            torch.cuda.synchronize(dev)
        prof.export_chrome_trace(a.torch_profile)
    if rank == 0:
        print(json.dumps({
            "impl": f"deepspeed-z{a.stage}" if a.mode == "deepspeed" else f"pytorch-{a.mode}" + ("-master" if a.master_weights else "") + ("-fused" if a.fused_update else ""), "model": a.model, "micro_batch": a.micro_batch, "seq_len": a.seq_len,
            "gpus": world, "params": params, "vocab": VOCAB, "head_rows": head_rows, "steps": len(times), "step_ms_median": med * 1e3,
            "tokens_per_s_per_gpu": tokens / med, "final_loss": float(loss), "measured_unix": measured_unix,
            "step_ms": [round(t * 1e3, 4) for t in times], "parameters": "DeepSpeed's bf16" if a.mode in ("deepspeed", "deepspeed-offload")
            else "bf16, fp32 masters, one fused update" if a.fused_update else "bf16, fp32 masters" if a.master_weights
            else "fp32, bf16 compute (FSDP2's policy)" if a.mode == "fsdp2" else "fp32 under bf16 autocast",
            "peak_allocated_bytes": peaks[0],
            "peak_reserved_bytes": peaks[1],
            "torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
            "gpu": torch.cuda.get_device_name(dev),
            **({"deepspeed": deepspeed.__version__, "zero_optimization": config["zero_optimization"],
                "optimizer": f"{type(engine.optimizer).__name__}"
                             f"({type(getattr(engine, 'basic_optimizer', None)).__name__})"}
               if a.mode in ("deepspeed", "deepspeed-offload") else {}),
        }), flush=True)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
