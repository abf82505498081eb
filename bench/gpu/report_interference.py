"""Turns archives of the `interference` phase of bench/gpu/run.sh into one JSON result and the
Markdown tables of docs/results/collectives.md (why gpt2-xl loses throughput per GPU on 2 GPUs).

    python3 bench/gpu/report_interference.py ARCHIVE.tar.gz [...] [--extra CALL.jsonl ...] \
        --json OUT.json --md OUT.md

Each archive is one device call. `--extra` adds the output of a call that ran
bench/gpu/interference.py alone. Per call: the one-GPU stage-0 run, the same run on both GPUs at
once without communication, and stages 1-3 on 2 GPUs under each setting (NCCL and CUDA
environment variables, bucket size, prefetch depth: the `knobs` phase), each as per-GPU
throughput over the one-GPU run of the same call (the targets: 0.95 for stages 1 and 2, 0.90 for
stage 3). The interference rows pool every repetition of every call per transfer mode."""
import argparse
import json
import re
import statistics

from common import host_date, json_lines, median, read_archive, run_parts

TARGET = {1: 0.95, 2: 0.95, 3: 0.90}  # stage 0 on 2 GPUs has none


def read_call(path):
    """The rank-0 logs, host.txt and interference.py's measurements of one device call."""
    host, logs, files = read_archive(path)
    interference = [r for name, text in files.items() if name.endswith("runs/interference.jsonl")
                    for r in json_lines(text)]
    return logs, host, interference


def setting_label(suffix):
    """A run name's suffix as the setting it stands for: `NCCL_PROTO-Simple` is the environment
    variable NCCL_PROTO=Simple, `bucket-mb-128` the flag --bucket-mb 128, and
    `copy-engines=all-gather` the flag --copy-engines all-gather."""
    if not suffix:
        return "default"
    name, value = suffix.split("=", 1) if "=" in suffix else suffix.rsplit("-", 1)
    return f"{name}={value}" if name.isupper() else f"--{name} {value}"


def setting_order(label):
    """The default first, then by name, values in numeric order."""
    name, _, value = label.rpartition(" ") if label.startswith("--") else label.rpartition("=")
    return (label != "default", name, float(value) if value.replace(".", "").isdigit() else 0, value)


def step_ms(recs):
    _, _, steps = run_parts(recs)
    return median(steps, "step_ms")


def call_rows(path):
    logs, host, interference = read_call(path)
    one = step_ms(logs["gpt2-xl_z0_mb4_1gpu_int"])
    call = {"archive": path.split("/")[-1], "date": host_date(host), "host": host.strip().splitlines(),
            "one_gpu_stage0_ms": round(one, 2), "pair": {}, "runs": [], "interference": interference}
    for d in (0, 1):
        name = f"gpt2-xl_z0_mb4_1gpu_pair{d}"
        if name in logs:
            call["pair"][f"gpu{d}_ms"] = round(step_ms(logs[name]), 2)
    for name, recs in sorted(logs.items()):
        m = re.match(r"gpt2-xl_z(\d)_mb4_2gpu(?:_rep\d+)?_env(?:_(.*))?$", name)
        if not m:
            continue
        stage, setting = int(m.group(1)), setting_label(m.group(2))
        ms = step_ms(recs)
        ratio = one / ms  # per-GPU tokens/s on 2 GPUs over one GPU's, same tokens per GPU per step
        call["runs"].append({"stage": stage, "setting": setting, "step_ms": round(ms, 2), "per_gpu_ratio": round(ratio, 3),
                             "target": TARGET.get(stage), "met": ratio >= TARGET[stage] if stage in TARGET else None})
    return call


def pooled(calls, extras):
    by_mode = {}
    for rows in [c["interference"] for c in calls] + extras:
        for r in rows:
            by_mode.setdefault(r["mode"], {"slowdowns": [], "side_gbps": []})
            by_mode[r["mode"]]["slowdowns"] += r["slowdowns"]
            by_mode[r["mode"]]["side_gbps"].append(r["side_gbps"])
    out = {}
    for mode, v in by_mode.items():
        s = sorted(v["slowdowns"])
        q = statistics.quantiles(s, n=4)
        out[mode] = {"reps": len(s), "slowdown_median": round(statistics.median(s), 3), "slowdown_q1": round(q[0], 3),
                     "slowdown_q3": round(q[2], 3), "side_gbps_median": round(statistics.median(v["side_gbps"]), 1)}
    return out


def markdown(calls, pool):
    out = ["| call | setting | stage 0 | stage 1 | stage 2 | stage 3 |", "|---|---|---|---|---|---|"]
    for c in calls:
        settings = sorted({r["setting"] for r in c["runs"]}, key=setting_order)
        for s in settings:
            cell = {}
            for r in c["runs"]:  # repetitions of a setting side by side, in run order
                if r["setting"] == s:
                    one = f'{r["step_ms"]:.1f} ms ({r["per_gpu_ratio"]:.3f})'
                    cell[r["stage"]] = f'{cell[r["stage"]]}; {one}' if r["stage"] in cell else one
            out.append(f'| {c["date"]} | {s} | ' + " | ".join(cell.get(st, "—") for st in range(4)) + " |")
    out += ["", "| call | one GPU alone | the same on GPU 0 and GPU 1 at once |", "|---|---|---|"]
    for c in calls:
        if c["pair"]:
            out.append(f'| {c["date"]} | {c["one_gpu_stage0_ms"]:.1f} ms | {c["pair"]["gpu0_ms"]:.1f} / {c["pair"]["gpu1_ms"]:.1f} ms |')
    out += ["", "| transfer beside compute | repetitions | compute slowdown, median (quartiles) | side stream GB/s per GPU |",
            "|---|---|---|---|"]
    for mode, p in pool.items():
        out.append(f'| {mode} | {p["reps"]} | {p["slowdown_median"]:.3f} ({p["slowdown_q1"]:.3f}-{p["slowdown_q3"]:.3f}) '
                   f'| {p["side_gbps_median"]} |')
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("archives", nargs="+")
    ap.add_argument("--extra", nargs="*", default=[], help="interference.py output of calls without an archive")
    ap.add_argument("--json", required=True)
    ap.add_argument("--md", required=True)
    a = ap.parse_args()
    calls = [call_rows(p) for p in a.archives]
    extras = [json_lines(open(p).read()) for p in a.extra]
    pool = pooled(calls, extras)
    result = {"benchmark": "gpu-interference", "date": calls[-1]["date"], "gpu": "NVIDIA H200",
              "model": "gpt2-xl", "micro_batch": 4, "seq_len": 1024, "calls": calls, "interference_pooled": pool,
              "extra_interference_calls": [p.split("/")[-1] for p in a.extra]}
    with open(a.json, "w") as f:
        json.dump(result, f, indent=1)
    with open(a.md, "w") as f:
        f.write(markdown(calls, pool))


if __name__ == "__main__":
    main()
