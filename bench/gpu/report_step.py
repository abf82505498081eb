"""Reads the archive of `bench/gpu/run.sh step-time` (one GPU: zerobench gpt2 and gpt2-xl at stages
0-3, with `STEP_GRAPH=1` also with `--cuda-graph`; the PyTorch references eager,
torch.compile by default and with CUDA graphs (reduce-overhead), and DeepSpeed at stages 0-3 on the
same shapes, in the same call) and writes the JSON of bench/results and the Markdown tables of
docs/results/one-gpu.md and two-gpus.md. Each zerobench run is compared with every reference of
its GPU count, and with DeepSpeed at its own stage (throughput and peak allocated memory); the
JSON's `targets` holds the one-GPU targets, each side at its best mode (`targets`).

    python3 bench/gpu/report_step.py ARCHIVE.tar.gz --json OUT.json --md OUT.md [--logged-step]

Step time is the run's (per step the slowest rank, then the median over measured steps:
common.read_archive): the interval between the ends of two steps, that is the logged step (schema
version 2: from the start of a step's work to the completion of all of it, the device
synchronised) and the loop's own cost before it (`overhead_ms`: reading the last step's timers
and handing its record to the log thread). The references time a step from a synchronisation
before it to the one after `loss.item()` ending it; their loop's own cost between steps (a list
append, a few microseconds) is outside it, so that side is the shorter by that much.
`--logged-step` takes the logged step alone, as the files written before 2026-12-04 did
(0.05-1.0% shorter on one GPU; up to 1.5% in the call at 41cf013).

Checks per zerobench run, over consecutive measured steps:
* interval: the time between two of rank 0's step records over the later one's own
  `step_ms + overhead_ms` (1 when the logged step and the loop's own cost are all the wall time
  there is);
* overhead: `overhead_ms` over `step_ms` (the profiler's own cost);
* phases: forward + backward + exposed communication + optimizer + other against `step_ms`."""
import argparse
import io
import json
import os
import re
import statistics

from common import gib, host_date, median, read_archive, run_parts

PEAK_TFLOPS = 989.0  # H100/H200 SXM dense bf16


def flops_per_token(layers, d, params, seq, positions=1024):
    """zerobench's `train_flops_per_token` for GPT-2: 6N + 12·L·d·T, N without position embeddings."""
    return 6 * (params - positions * d) + 12 * layers * d * seq


SHAPES = {"gpt2": (12, 768), "gpt2-xl": (48, 1600)}


def zerobench_row(name, recs, logged_step=False):
    start, setup, steps = run_parts(recs)
    cfg = start["config"]
    logged_ms = median(steps, "step_ms")
    step_ms = logged_ms if logged_step else median(steps, lambda s: s["step_ms"] + s["overhead_ms"])
    # The checks compare rank 0's records with rank 0's own step time (the run's step time is the
    # slowest rank's: common.read_archive keeps rank 0's as `rank_step_ms`).
    own = lambda s: s.get("rank_step_ms", s["step_ms"])
    pairs = list(zip(steps, steps[1:]))
    ratios = [(b["ts"] - a["ts"]) * 1e3 / (own(b) + b["overhead_ms"]) for a, b in pairs]
    overhead = [s["overhead_ms"] / own(s) for s in steps]
    parts = ("forward_ms", "backward_ms", "exposed_comm_ms", "optimizer_ms", "other_ms")
    phase_gap = [abs(sum(s[p] for p in parts) - own(s)) / own(s) for s in steps]
    tokens = steps[0]["tokens"] / start["world_size"]
    tps = tokens / (step_ms / 1e3)
    return {
        "impl": "zerobench", "cuda_graph": bool(cfg.get("cuda_graph", False)), "run": name, "model": cfg["model"],
        "stage": cfg["stage"], "gpus": start["world_size"],
        "micro_batch": cfg["micro_batch"], "seq_len": cfg["seq_len"], "steps": len(steps),
        "step_ms_median": round(step_ms, 3), "logged_step_ms_median": round(logged_ms, 3),
        "overhead_ms_median": round(median(steps, "overhead_ms"), 4),
        "tokens_per_s_per_gpu": round(tps), "mfu": round(tps * start["model"]["train_flops_per_token"] / (PEAK_TFLOPS * 1e12), 4),
        **{p.replace("_ms", "_ms_median"): round(median(steps, p), 3) for p in parts},
        "interval_over_step_plus_overhead": {"median": round(statistics.median(ratios), 5),
                                             "min": round(min(ratios), 5), "max": round(max(ratios), 5)},
        "overhead_share": {"median": round(statistics.median(overhead), 5), "max": round(max(overhead), 5)},
        "phases_vs_step_max_deviation": round(max(phase_gap), 6),
        "peak_allocated_bytes": max(s["memory"]["peak_allocated_bytes"] for s in steps),
        "peak_reserved_bytes": max(s["memory"]["peak_reserved_bytes"] for s in steps),
        "final_loss": steps[-1]["loss"], "gpu": start["device"]["name"], "versions": start["versions"],
        "schema_version": steps[0]["v"],
    }


def reference_row(name, r):
    layers, d = SHAPES[r["model"]]
    fpt = flops_per_token(layers, d, r["params"], r["seq_len"])
    return {
        "impl": r["impl"], "run": name, "model": r["model"], "gpus": r["gpus"], "micro_batch": r["micro_batch"],
        "seq_len": r["seq_len"], "steps": r["steps"], "vocab": r["vocab"], "head_rows": r["head_rows"],
        "step_ms_median": round(r["step_ms_median"], 3), "tokens_per_s_per_gpu": round(r["tokens_per_s_per_gpu"]),
        "mfu": round(r["tokens_per_s_per_gpu"] * fpt / (PEAK_TFLOPS * 1e12), 4),
        "peak_allocated_bytes": r["peak_allocated_bytes"], "peak_reserved_bytes": r["peak_reserved_bytes"],
        "torch": r["torch"], "gpu": r["gpu"],
        **{k: r[k] for k in ("deepspeed", "optimizer", "zero_optimization", "parameters", "step_ms") if k in r},
    }


# The one-GPU targets: throughput against torch.compile (stage 0, every stage) and peak allocated
# memory against DeepSpeed at the same stage.
TARGETS = {"gpt2": (1.0, 0.95), "gpt2-xl": (1.25, 1.15)}

# torch.compile's modes, with fp32 parameters under autocast and (`-master`) with bf16 parameters
# and fp32 masters as zerobench keeps them (`-master-fused`: updated in one compiled pass, as
# zerobench updates them): the targets compare with the fastest a call ran.
COMPILED = tuple(f"pytorch-compile{m}{p}" for m in ("", "-reduce-overhead", "-max-autotune")
                 for p in ("", "-master", "-master-fused"))


def targets(rows, refs, call, failed_refs=()):
    """Each target a call's runs measure, with its value and whether it is met. Each side at its
    best: zerobench eager or replaying CUDA graphs, torch.compile by default, with CUDA graphs
    (mode reduce-overhead) or autotuned (mode max-autotune), whichever is fastest; memory the
    larger of zerobench's modes. A target met against the compiled references that ran is not
    decided where one of that model's compiled references failed (the fastest may be the one that
    failed); a miss stays a miss."""
    out = []
    for model, (stage0, every) in TARGETS.items():
        one = [r for r in rows if r["model"] == model and r["gpus"] == 1]
        compiled = [(r["tokens_per_s_per_gpu"], r["impl"]) for r in refs if r["model"] == model and r["gpus"] == 1
                    and r["impl"] in COMPILED]
        stages = sorted({r["stage"] for r in one})
        best = {s: max(r["tokens_per_s_per_gpu"] for r in one if r["stage"] == s) for s in stages}
        if compiled and stages:
            c, against = max(compiled)
            # The verdicts on the ratios as measured; the values shown rounded.
            ratio = {s: best[s] / c for s in stages}
            ran = sorted(r["impl"] for r in refs if r["model"] == model and r["gpus"] == 1 and r["impl"] in COMPILED)
            lost = sorted(f for f in failed_refs if f.startswith(f"ref_{model}_compile"))
            side = {"against": against, "compiled_modes_run": ran, "stages": stages,
                    **({"compiled_modes_failed": lost} if lost else {})}
            # A met target is undecided while a compiled reference is missing.
            judge = lambda met: None if met and lost else met
            out.append({"call": call, "model": model, "target": f"stage 0 >= {stage0}x torch.compile",
                        "value": round(ratio[0], 3) if 0 in ratio else None,
                        "met": judge(ratio[0] >= stage0) if 0 in ratio else None, **side})
            # Decided only where the call ran all four stages.
            out.append({"call": call, "model": model, "target": f"every stage >= {every}x torch.compile",
                        "value": round(min(ratio.values()), 3),
                        "met": judge(min(ratio.values()) >= every) if len(ratio) == 4 else None, **side})
        ds = {}
        for s in stages:
            ref = next((r for r in refs if r["model"] == model and r["gpus"] == 1 and r["impl"] == f"deepspeed-z{s}"), None)
            if ref:
                ds[s] = max(r["peak_allocated_bytes"] for r in one if r["stage"] == s) / ref["peak_allocated_bytes"]
        if ds:
            # Decided only where the call ran DeepSpeed at all four stages (a call cut short may not).
            met = max(ds.values()) <= 1.0 if len(ds) == 4 else None
            out.append({"call": call, "model": model, "target": "peak allocated <= DeepSpeed's at every stage",
                        "value": round(max(ds.values()), 3), "met": met, "stages": sorted(ds)})
    return out


def one_call(path, logged_step=False):
    """The rows, references and ratios of one archive: every ratio is between runs of one call."""
    host, logs, files = read_archive(path)
    named = [(n, r) for n, r in sorted(logs.items()) if re.match(r"gpt2(-xl)?_z\d_mb\d+_\d+gpu(_graph)?$", n)]
    # A run that measured no step (it failed or was cut short) is named, not read.
    def measured(recs):
        try:
            return bool(run_parts(recs)[2])
        except StopIteration:  # no start or setup record
            return False

    rows = [zerobench_row(n, r, logged_step) for n, r in named if measured(r)]
    failed_runs = [n for n, r in named if not measured(r)]
    refs = []
    # A reference that printed nothing (it failed: its .err says why) is named, not left out unseen.
    failed_refs = []
    for name, text in files.items():
        if m := re.search(r"runs/(ref_[^/]+)\.json$", name):
            if text.strip():
                refs.append(reference_row(m.group(1), json.loads(text.strip().splitlines()[-1])))
            else:
                failed_refs.append(m.group(1))
    refs.sort(key=lambda r: (r["model"], r["impl"]))
    by_ref = {(r["model"], r["impl"], r["gpus"]): r for r in refs}
    ratios = []
    one_gpu = {r["model"]: r for r in rows if r["gpus"] == 1 and r["stage"] == 0 and not r["cuda_graph"]}
    scaling = [{"model": r["model"], "stage": r["stage"], "gpus": r["gpus"],
                "per_gpu_over_own_stage_0_on_1_gpu": round(r["tokens_per_s_per_gpu"] / one_gpu[r["model"]]["tokens_per_s_per_gpu"], 3)}
               for r in rows if r["gpus"] > 1 and r["model"] in one_gpu]
    for r in rows:
        for impl in ("pytorch-eager", "pytorch-eager-master", "pytorch-eager-master-fused", *COMPILED, "pytorch-ddp",
                     "pytorch-fsdp2", f"deepspeed-z{r['stage']}"):
            ref = by_ref.get((r["model"], impl, r["gpus"]))
            if ref:
                ratios.append({"model": r["model"], "stage": r["stage"], "gpus": r["gpus"], "cuda_graph": r["cuda_graph"],
                               "versus": impl,
                               "tokens_per_s_ratio": round(r["tokens_per_s_per_gpu"] / ref["tokens_per_s_per_gpu"], 3),
                               "peak_allocated_ratio": round(r["peak_allocated_bytes"] / ref["peak_allocated_bytes"], 3)})
    checks = {
        "interval_within_1pct": all(abs(r["interval_over_step_plus_overhead"][k] - 1) <= 0.01 for r in rows for k in ("min", "max")),
        "overhead_median_at_most_1pct": all(r["overhead_share"]["median"] <= 0.01 for r in rows),
        "phases_sum_within_1pct": all(r["phases_vs_step_max_deviation"] <= 0.01 for r in rows),
    }
    call = os.path.basename(path)
    return {"archive": call, "date": host_date(host), "host": host.strip().splitlines(), "checks": checks,
            "failed_references": sorted(failed_refs), "failed_runs": failed_runs,
            "targets": targets(rows, refs, call, failed_refs), "zerobench": rows, "references": refs, "ratios": ratios, "scaling": scaling}


def markdown(c):
    md = io.StringIO()
    rows, refs, ratios, scaling = c["zerobench"], c["references"], c["ratios"], c["scaling"]
    v = rows[0]["versions"] if rows else {}
    md.write(f"`{c['archive']}`: measured {c['date']} on one {rows[0]['gpu'] if rows else '?'} (driver {v.get('gpu_driver')}, "
             f"libtorch {v.get('libtorch')}; references torch {refs[0]['torch'] if refs else '?'}), sequence 1024, bf16, "
             "in one call.\n\n")
    for what, names in (("references", c.get("failed_references")), ("zerobench runs", c.get("failed_runs"))):
        if names:
            md.write(f"Failed {what} (no measured step): {', '.join(names)}.\n\n")
    md.write("| model | system | stage | GPUs | step ms | tokens/s/GPU | MFU | peak alloc GiB | vs the references of its GPU count |\n")
    md.write("|---|---|---|---|---|---|---|---|---|\n")
    for model in ("gpt2", "gpt2-xl"):
        for r in sorted((x for x in rows if x["model"] == model), key=lambda x: (x["gpus"], x["stage"], x["cuda_graph"])):
            vs = ", ".join(f"{x['tokens_per_s_ratio']}× {x['versus'].removeprefix('pytorch-')}"
                           + (f" (memory {x['peak_allocated_ratio']}×)" if x["versus"].startswith("deepspeed-") else "")
                           for x in ratios
                           if (x["model"], x["stage"], x["gpus"], x["cuda_graph"]) == (model, r["stage"], r["gpus"], r["cuda_graph"]))
            system = "zerobench --cuda-graph" if r["cuda_graph"] else "zerobench"
            md.write(f"| {model} (mb {r['micro_batch']}) | {system} | {r['stage']} | {r['gpus']} | {r['step_ms_median']:.1f} | "
                     f"{r['tokens_per_s_per_gpu']:,} | {r['mfu']:.1%} | {gib(r['peak_allocated_bytes'])} | {vs or '—'} |\n")
        for r in sorted((x for x in refs if x["model"] == model), key=lambda x: (x["gpus"], x["impl"])):
            what = f"{r['impl']} ({r['optimizer']})" if "optimizer" in r else r["impl"]
            md.write(f"| {model} (mb {r['micro_batch']}) | {what}, head {r['head_rows']} rows | — | {r['gpus']} | "
                     f"{r['step_ms_median']:.1f} | {r['tokens_per_s_per_gpu']:,} | {r['mfu']:.1%} | {gib(r['peak_allocated_bytes'])} | |\n")
    if scaling:
        md.write("\n| model | stage | GPUs | per-GPU throughput / own stage 0 on 1 GPU |\n|---|---|---|---|\n")
        for x in scaling:
            md.write(f"| {x['model']} | {x['stage']} | {x['gpus']} | {x['per_gpu_over_own_stage_0_on_1_gpu']} |\n")
    if c["targets"]:
        md.write("\n| model | target | value | met |\n|---|---|---|---|\n")
        for t in c["targets"]:
            why = (f"{', '.join(t['compiled_modes_failed'])} failed" if t.get("compiled_modes_failed")
                   else f"stages {t.get('stages')} only")
            verdict = {True: "yes", False: "**no**"}.get(t["met"], f"not decided ({why})")
            against = f" (against {t['against'].removeprefix('pytorch-')})" if "against" in t else ""
            value = "—" if t["value"] is None else t["value"]
            md.write(f"| {t['model']} | {t['target']} | {value}{against} | {verdict} |\n")
    md.write("\n| zerobench run | logged step ms | overhead ms (share) | record interval / (step + overhead): median [min, max] | "
             "phases vs step, largest deviation | forward | backward | exposed comm | optimizer | other |\n")
    md.write("|---|---|---|---|---|---|---|---|---|---|\n")
    for r in rows:
        iv = r["interval_over_step_plus_overhead"]
        md.write(f"| {r['run']} | {r.get('logged_step_ms_median', r['step_ms_median']):.2f} | {r['overhead_ms_median']:.3f} ({r['overhead_share']['median']:.2%}) | "
                 f"{iv['median']:.4f} [{iv['min']:.4f}, {iv['max']:.4f}] | {r['phases_vs_step_max_deviation']:.2%} | "
                 f"{r['forward_ms_median']:.2f} | {r['backward_ms_median']:.2f} | {r['exposed_comm_ms_median']:.2f} | "
                 f"{r['optimizer_ms_median']:.2f} | {r['other_ms_median']:.2f} |\n")
    return md.getvalue()


def decided(ts):
    """A target over calls: met where every call that decides it meets it; None where none decides."""
    d = [x["met"] for x in ts if x["met"] is not None]
    return all(d) if d else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("archive", nargs="+", help="one archive per call; ratios are taken within a call only")
    ap.add_argument("--json", required=True)
    ap.add_argument("--md", required=True)
    ap.add_argument("--logged-step", action="store_true",
                    help="zerobench's logged step alone, without the loop's own cost (the files before 2026-12-04)")
    a = ap.parse_args()

    calls = [one_call(p, a.logged_step) for p in a.archive]
    # A target is met only where every call that measures it meets it.
    verdicts = {}
    for t in (t for c in calls for t in c["targets"]):
        verdicts.setdefault((t["model"], t["target"]), []).append(t)
    out = {"benchmark": "bench/gpu/run.sh step-time",
           "step_time_definition": ("schema version 2: start of the step's work to completion of all of it (device synchronised); per step the slowest rank, median over measured steps"
                                    if a.logged_step else
                                    "the interval between step ends: schema version 2's step (start of its work to completion of all of it, device synchronised) and the loop's own cost before it (overhead_ms); per step the slowest rank, median over measured steps"),
           "targets": [{"model": m, "target": t, "met": decided(ts), "values": [x["value"] for x in ts],
                        "calls": [x["call"] for x in ts],
                        **({"against": [x["against"] for x in ts]} if all("against" in x for x in ts) else {})}
                       for (m, t), ts in verdicts.items()],
           "calls": calls}
    if len(calls) == 1:
        # One call: its fields at the top, as the results of a single call have always been laid out.
        out = {**{k: v for k, v in calls[0].items() if k != "targets"}, **out}
        del out["calls"]
    with open(a.json, "w") as f:
        json.dump(out, f, indent=1)
    text = "\n\n".join(markdown(c) for c in calls)
    with open(a.md, "w") as f:
        f.write(text)
    print(text)
    print(json.dumps([(t["model"], t["target"], t["met"]) for t in out["targets"]]))


if __name__ == "__main__":
    main()
