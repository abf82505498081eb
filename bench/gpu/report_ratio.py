"""Turns the archive of bench/gpu/run.sh's `offload-ratio` phase into one JSON result: per run its
step time, throughput, memory, offload set-up time, and the bound it is held to, computed from the
host's AdamW rate and pinned copy bandwidth measured in the same call:

    bound = max(GPU compute + the GPU's share of the update, the host's share of the update, transfers)
    GPU compute = forward + backward of the same call's run without offload
    GPU update = that run's optimizer phase x the device's share of the parameters
    host update = parameters on the host / the host's AdamW rate (cpu_adamw.json)
    transfers = 2 bytes per host parameter each way (gradients down, parameters up) / copy GB/s,
                the two directions on their own copy engines

Target (step <= 1.1 x bound). DeepSpeed's ZeRO-Offload row is taken from the same call's
`ref_*deepspeed-offload*` output when it ran there, and is otherwise reported as missing.

    python3 bench/gpu/report_ratio.py ARCHIVE.tar.gz > OUT.json
"""
import json
import re
import sys

from common import copy_rates, host_date, median, offload_bound, offload_split, read_archive, run_parts

path = sys.argv[1]
host, logs, files = read_archive(path)
adamw = json.loads(next(t for n, t in files.items() if n.endswith("cpu_adamw.json")).strip().splitlines()[-1])
copies = {}
for n, t in files.items():
    if n.endswith("copies.jsonl"):
        copies.update(copy_rates(t))
pin = [json.loads(l) for n, t in files.items() if n.endswith("pin_bench.jsonl") for l in t.splitlines() if l.startswith("{")]
ds = {}
for n, t in files.items():
    if re.search(r"deepspeed-offload[^/]*\.json$", n) and t.strip():
        ds = json.loads(t.strip().splitlines()[-1])
# The reference's own error (e.g. ModuleNotFoundError), not torchrun's banner.
ds_err = next((l.strip() for n, t in files.items() if "deepspeed-offload" in n and n.endswith(".err")
               for l in t.splitlines() if re.search(r"\w+Error: ", l)), "")

rows = {}
for name, recs in sorted(logs.items()):
    start, setup, steps = run_parts(recs)
    cfg = start["config"]
    on_device, on_host = offload_split(start, setup)
    rows[name] = {
        "run": name, "offload": cfg["offload"], "offload_ratio": cfg.get("offload_ratio", 1.0 if cfg["offload"] != "none" else None),
        "delayed_update_after": cfg.get("delayed_update_after"), "gpus": start["world_size"],
        "host_params": on_host, "device_params": on_device,
        "step_ms": median(steps, "step_ms"), "forward_ms": median(steps, "forward_ms"),
        "backward_ms": median(steps, "backward_ms"), "optimizer_ms": median(steps, "optimizer_ms"),
        "tokens_per_s_per_gpu": median(steps, lambda r: r["tokens"] / (r["step_ms"] / 1e3)) / start["world_size"],
        "peak_allocated_bytes": max(r["memory"]["peak_allocated_bytes"] for r in steps),
        "host_state_bytes": setup.get("host_state_bytes"), "host_state_setup_ms": setup.get("host_state_setup_ms"),
        "final_loss": steps[-1]["loss"], "optimizer": setup.get("optimizer"),
    }
# Each GPU count against its own run without offload.
bases = {r["gpus"]: r for r in rows.values() if r["offload"] == "none"}
rate = adamw["adamw_params_per_s"]
bw = min(copies.get("h2d", 0), copies.get("d2h", 0)) or None
for r in rows.values():
    if r["offload"] == "none":
        continue
    b = offload_bound(r["device_params"], r["host_params"], bases[r["gpus"]], rate, bw, r["gpus"])
    r["bound"] = {**b, "step_over_bound": r["step_ms"] / b["bound_ms"], "target": 1.1}
    r["host_state_lock_gbps"] = r["host_state_bytes"] / (r["host_state_setup_ms"] / 1e3) / 1e9 if r.get("host_state_setup_ms") else None
print(json.dumps({
    "benchmark": "offload ratio (Twin-Flow) and delayed update: gpt2-xl, micro-batch 4, sequence 1024, stage 2, bf16",
    "date": host_date(host), "host": host.strip().splitlines(), "archive": path,
    "host_rates": {"adamw_params_per_s": rate, "adamw": adamw, "copy_gbps": copies},
    "runs": list(rows.values()),
    "deepspeed_offload": ds or {"missing": "DeepSpeed did not run in this call", "error": ds_err},
    "pin_bench": pin,
}, indent=1))
