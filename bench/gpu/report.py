"""Turns the result archives of bench/gpu/run.sh into bench/results/gpu-<date>.json and the
Markdown tables of docs/results/ (correctness.md, collectives.md, per-module.md).

    python3 bench/gpu/report.py PRIMARY.tar.gz [CONTEXT.tar.gz] --json OUT.json --md OUT.md

PRIMARY holds the runs the targets are computed from (zerobench and the eager reference of the same
run); CONTEXT, if given, adds the DDP/FSDP2 references and the zerobench runs of its own run.
Step time is the median over measured steps of the slowest rank's step time (common.read_archive);
throughput per GPU = tokens per step / world size / median step time. MFU = achieved FLOP/s per GPU
/ 989 TFLOP/s (H100/H200 SXM dense bf16), with the FLOPs per token the worker logs
(6N + 12·L·d·T, N without position embeddings: PaLM's and nanoGPT's convention)."""
import argparse
import io
import json
import re
import statistics

from common import gib, host_date, json_lines, median, read_archive, run_parts

PEAK_TFLOPS = 989.0
# GPT-2's (layers, width) and positions, for FLOPs per token where no log gives them: the PyTorch
# reference (bench/gpu/reference.py, zerobench's shapes) and worker logs written before the start
# record carried `model.train_flops_per_token` (all of 2026-11-22).
GPT2_SHAPES = {"gpt2": (12, 768), "gpt2-xl": (48, 1600)}
POSITIONS = 1024


def flops_per_token(model, params, seq):
    """What the worker's `ModelSpec::train_flops_per_token` gives for GPT-2: 6N + 12·L·d·T, N the
    parameters without position embeddings."""
    layers, d = GPT2_SHAPES[model]
    return 6 * (params - POSITIONS * d) + 12 * layers * d * seq


def load(path):
    host, runs, files = read_archive(path)
    refs, coll = {}, []
    for name, data in files.items():
        if re.search(r"runs/ref_[^/]+\.json$", name) and data.strip():
            refs[name.split("/")[-1][:-5]] = json.loads(data.strip().splitlines()[-1])
        elif name.endswith(".jsonl") and "collectives_" in name:
            coll += json_lines(data)
    return runs, refs, coll, host


def summarize(name, recs):
    start, setup, steps = run_parts(recs)
    med = lambda k: median(steps, k)
    cfg = start["config"]
    world = start["world_size"]
    step_ms = med("step_ms")
    tps = steps[0]["tokens"] / world / (step_ms / 1e3)
    fpt = start["model"].get("train_flops_per_token") or flops_per_token(cfg["model"], start["model"]["params"], cfg["seq_len"])
    ms = setup["model_state"]
    energy = [b["energy_j"] - a["energy_j"] for a, b in zip(steps, steps[1:])] if steps[0].get("energy_j") is not None else None
    return {
        "impl": "zerobench", "run": name, "model": cfg["model"], "stage": cfg["stage"], "gpus": world,
        "micro_batch": cfg["micro_batch"], "seq_len": cfg["seq_len"], "steps": len(steps),
        "step_ms_median": round(step_ms, 2), "tokens_per_s_per_gpu": round(tps),
        "mfu": round(tps * fpt / (PEAK_TFLOPS * 1e12), 4),
        "forward_ms": round(med("forward_ms"), 2), "backward_ms": round(med("backward_ms"), 2),
        "optimizer_ms": round(med("optimizer_ms"), 2), "comm_ms": round(med("comm_ms"), 2),
        "exposed_comm_ms": round(med("exposed_comm_ms"), 2),
        "exposed_comm_share": round(med("exposed_comm_ms") / step_ms, 4),
        "peak_allocated_bytes": max(r["memory"]["peak_allocated_bytes"] for r in steps),
        "peak_reserved_bytes": max(r["memory"]["peak_reserved_bytes"] for r in steps),
        "model_state_bytes": ms["params_bytes"] + ms["grads_bytes"] + ms["optimizer_bytes"],
        "model_state_expected_bytes": sum(setup["model_state_expected"].values()),
        "buffers_bytes": sum(setup["buffers_bytes"].values()),
        "energy_j_per_step": round(statistics.median(energy), 2) if energy is not None else None,
        "final_loss": steps[-1]["loss"], "comm_backend": start["comm_backend"], "optimizer": setup["optimizer"],
        "versions": start["versions"], "gpu": start["device"]["name"],
        "comm_ctas": cfg["engine"].get("comm_ctas"),
    }


def profiles(runs):
    """The `--profile-step` breakdown of each `profile_*` run: per module kind, its time and
    TFLOP/s forward and backward, beside the profiled step's time."""
    out = []
    for name, recs in sorted(runs.items()):
        if not name.startswith("profile_"):
            continue
        start = next(r for r in recs if r["event"] == "start")
        prof = next(r for r in recs if r["event"] == "profile")
        step = next(r for r in recs if r["event"] == "step" and r["step"] == prof["step"])
        cfg = start["config"]
        out.append({"run": name, "model": cfg["model"], "stage": cfg["stage"], "gpus": start["world_size"],
                    "micro_batch": cfg["micro_batch"], "seq_len": cfg["seq_len"], "step": prof["step"],
                    "step_ms": round(step["step_ms"], 2),
                    "modules": [{k: round(m[k], 2) if isinstance(m[k], float) else m[k]
                                 for k in ("kind", "count", "params", "forward_ms", "backward_ms", "forward_tflops", "backward_tflops")}
                                for m in prof["modules"]]})
    return out


def correctness(runs):
    """The `correct_*` runs (one per stage, same data and seed): each stage's losses against
    stage 0's, at every step including warm-up. bf16 reductions may add in other orders, so the
    documented tolerance is 1e-2 relative; equal curves give 0."""
    curves = {}
    for name, recs in sorted(runs.items()):
        if name.startswith("correct_"):
            start = next(r for r in recs if r["event"] == "start")
            curves[name] = (start, [r["loss"] for r in recs if r["event"] == "step"])
    ref = next((losses for start, losses in curves.values() if start["config"]["stage"] == 0), None)
    out = []
    for name, (start, losses) in curves.items():
        cfg = start["config"]
        row = {"run": name, "model": cfg["model"], "stage": cfg["stage"], "gpus": start["world_size"],
               "micro_batch": cfg["micro_batch"], "seq_len": cfg["seq_len"], "steps": len(losses),
               "first_loss": losses[0], "final_loss": losses[-1]}
        if cfg["stage"] != 0 and ref is not None and len(ref) == len(losses):
            dev = max(abs(a - b) / abs(b) for a, b in zip(losses, ref))
            row.update({"max_rel_diff_vs_stage_0": dev, "within_tolerance": dev <= 1e-2})
        out.append(row)
    return out


def ref_row(name, r):
    fpt = flops_per_token(r["model"], r["params"], r["seq_len"])
    return {
        "impl": r["impl"], "run": name, "model": r["model"], "gpus": r["gpus"], "micro_batch": r["micro_batch"],
        "seq_len": r["seq_len"], "steps": r["steps"], "step_ms_median": round(r["step_ms_median"], 2),
        "tokens_per_s_per_gpu": round(r["tokens_per_s_per_gpu"]), "mfu": round(r["tokens_per_s_per_gpu"] * fpt / (PEAK_TFLOPS * 1e12), 4),
        "peak_allocated_bytes": r["peak_allocated_bytes"], "peak_reserved_bytes": r["peak_reserved_bytes"],
        "torch": r["torch"], "nccl": r["nccl"], "gpu": r["gpu"],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("primary")
    ap.add_argument("context", nargs="?")
    ap.add_argument("--json", required=True)
    ap.add_argument("--md", required=True)
    a = ap.parse_args()

    runs, refs, coll, host = load(a.primary)
    rows = [summarize(n, r) for n, r in sorted(runs.items()) if re.match(r"gpt2(-xl)?_z\d", n)]
    refrows = [ref_row(n, r) for n, r in sorted(refs.items())]
    context = None
    if a.context:
        c_runs, c_refs, _, c_host = load(a.context)
        context = {
            "host": c_host,
            "zerobench": [summarize(n, r) for n, r in sorted(c_runs.items()) if re.match(r"gpt2(-xl)?_z\d", n)],
            "references": [ref_row(n, r) for n, r in sorted(c_refs.items())],
        }
    by = {(r["model"], r["stage"], r["gpus"], r["comm_ctas"]): r for r in rows}
    eager = {r["model"]: r for r in refrows if r["impl"] == "pytorch-eager"}
    targets = []
    for model in ("gpt2", "gpt2-xl"):
        base = by[(model, 0, 1, None)]
        targets.append({"target": f"{model}: stage 0 on 1 GPU / PyTorch eager (>= 1.0)",
                        "value": round(base["tokens_per_s_per_gpu"] / eager[model]["tokens_per_s_per_gpu"], 3)})
        for s, need in ((1, 0.95), (2, 0.95), (3, 0.90)):
            r = by[(model, s, 2, None)]
            targets.append({"target": f"{model}: stage {s} on 2 GPUs per GPU / own stage 0 on 1 GPU (>= {need})",
                            "value": round(r["tokens_per_s_per_gpu"] / base["tokens_per_s_per_gpu"], 3)})
    xl = [by[("gpt2-xl", s, 2, None)]["peak_allocated_bytes"] for s in range(4)]
    targets.append({"target": "gpt2-xl on 2 GPUs: peak allocated decreases stage 0 > 1 > 2 > 3",
                    "value": " > ".join(gib(b) for b in xl) + " GiB", "met": all(x > y for x, y in zip(xl, xl[1:]))})
    states = [abs(r["model_state_bytes"] / r["model_state_expected_bytes"] - 1) for r in rows]
    targets.append({"target": "model-state bytes within 5% of the ZeRO formulas (all runs)", "value": f"max deviation {max(states):.4%}"})
    biggest = 164105728
    ours = {c["op"]: c for c in coll if c["impl"] == "zerobench" and c["bytes"] == biggest}
    theirs = {c["op"]: c for c in coll if c["impl"] == "torch.distributed" and c["bytes"] == biggest}
    for op in ours:
        targets.append({"target": f"largest collective ({op}, {biggest} B) bus bandwidth / torch.distributed's (>= 0.85)",
                        "value": round(ours[op]["busbw_gbps"] / theirs[op]["busbw_gbps"], 3)})

    date = host_date(host)
    out = {"benchmark": "bench/gpu", "date": date, "host": host.strip().splitlines(),
           "versions": rows[0]["versions"], "targets": targets, "zerobench": rows, "references": refrows,
           "collectives": coll, "context_run": context, "profile": profiles(runs), "correctness": correctness(runs)}
    with open(a.json, "w") as f:
        json.dump(out, f, indent=1)

    md = io.StringIO()
    md.write(f"Measured {date} on {rows[0]['gpu']} (driver {rows[0]['versions'].get('gpu_driver')}, CUDA driver "
             f"{rows[0]['versions'].get('cuda_driver')}, NCCL {rows[0]['versions'].get('nccl')}, libtorch "
             f"{rows[0]['versions'].get('libtorch')}); raw logs in `bench/results/raw/`.\n\n")
    md.write("| model | system | stage | GPUs | step ms | tokens/s/GPU | MFU | peak alloc GiB | peak reserved GiB | comm ms | exposed ms (share) |\n")
    md.write("|---|---|---|---|---|---|---|---|---|---|---|\n")
    for r in sorted(rows, key=lambda r: (r["model"], r["comm_ctas"] or 0, r["gpus"], r["stage"])):
        sys_ = "zerobench" + (f" (--comm-ctas {r['comm_ctas']})" if r["comm_ctas"] else "")
        md.write(f"| {r['model']} | {sys_} | {r['stage']} | {r['gpus']} | {r['step_ms_median']:.1f} | {r['tokens_per_s_per_gpu']:,} | "
                 f"{r['mfu']:.1%} | {gib(r['peak_allocated_bytes'])} | {gib(r['peak_reserved_bytes'])} | {r['comm_ms']:.1f} | "
                 f"{r['exposed_comm_ms']:.1f} ({r['exposed_comm_share']:.1%}) |\n")
    all_refs = refrows + (context["references"] if context else [])
    seen = set()
    for r in sorted(all_refs, key=lambda r: (r["model"], r["impl"], r["gpus"])):
        key = (r["model"], r["impl"], r["gpus"])
        if key in seen:
            continue
        seen.add(key)
        src = "" if r in refrows else " †"
        md.write(f"| {r['model']} | {r['impl']}{src} | — | {r['gpus']} | {r['step_ms_median']:.1f} | {r['tokens_per_s_per_gpu']:,} | "
                 f"{r['mfu']:.1%} | {gib(r['peak_allocated_bytes'])} | {gib(r['peak_reserved_bytes'])} | — | — |\n")
    md.write("\n† from the earlier run of the same day (its zerobench rows are in the JSON's `context_run`).\n\n")
    md.write("| target | value |\n|---|---|\n")
    for t in targets:
        md.write(f"| {t['target']} | {t['value']} |\n")
    md.write("\n| profiled run | GPUs | stage | step ms | module | count | forward ms | backward ms | forward TFLOP/s | backward TFLOP/s |\n")
    md.write("|---|---|---|---|---|---|---|---|---|---|\n")
    for p in out["profile"]:
        for m in p["modules"]:
            md.write(f"| {p['run']} | {p['gpus']} | {p['stage']} | {p['step_ms']:.1f} | {m['kind']} | {m['count']} | {m['forward_ms']:.1f} | "
                     f"{m['backward_ms']:.1f} | {m['forward_tflops']:.0f} | {m['backward_tflops']:.0f} |\n")
    md.write("\n| correctness run | GPUs | stage | steps | first loss | final loss | largest relative difference from stage 0 |\n")
    md.write("|---|---|---|---|---|---|---|\n")
    for c in out["correctness"]:
        md.write(f"| {c['run']} | {c['gpus']} | {c['stage']} | {c['steps']} | {c['first_loss']:.3f} | {c['final_loss']:.3f} | "
                 f"{c.get('max_rel_diff_vs_stage_0', 'reference')} |\n")
    with open(a.md, "w") as f:
        f.write(md.getvalue())


if __name__ == "__main__":
    main()
