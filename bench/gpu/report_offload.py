"""Turns the archives of the `offload`, `offload1`, `faults` and `fits` phases of bench/gpu/run.sh
into one JSON result and the Markdown tables of docs/results/offload-and-hpz.md and largest-model.md and
docs/reliability.md.

    python3 bench/gpu/report_offload.py ARCHIVE.tar.gz [ARCHIVE.tar.gz ...] --json OUT.json --md OUT.md

Each archive is one device call; its host.txt, cpu_adamw*.json and copies.jsonl describe the host
its runs ran on, so every offload bound is computed from measurements of the same host and call:

    bound = max(transfer, CPU AdamW)
    transfer = bytes rank 0 copied between host and device in the step / measured copy bandwidth
    CPU AdamW = parameters updated on the host (all ranks of the node) / measured host AdamW rate

Ranks on one node share the host's memory bandwidth, so the AdamW time of a node is its total
parameter count over the host's rate, whatever the number of ranks. Target: step <= 1.3 x bound."""
import argparse
import io
import json
import re
import statistics

from common import gib, host_date, median, read_archive, run_parts

# DeepSpeed 0.19.8, CPU offload, gpt2-xl micro-batch 4, sequence 1024: tokens/s per run.
DEEPSPEED_OFFLOAD = {1: 4726, 2: 2984 * 2}
# Until the commit after these measurements ("optimizer label for offload runs"), the worker logged
# the device's AdamW as `setup.optimizer` even when offload ran the update on the host's CPU.
OFFLOAD_OPTIMIZER_NOTE = ("logged 'cuda-fused' by a labelling bug fixed after this measurement: with offload the "
                          "update ran on the host (the Rust CPU AdamW), as every offload run does")


def read_call(path):
    """Every rank-0 log, the host description and the host measurements of one archive."""
    host, logs, files = read_archive(path)
    outs, adamw, copies, bench_log = {}, None, {}, ""
    for name, text in files.items():
        if name.endswith("bench.log"):
            bench_log = text
        elif re.search(r"runs/[^/]+\.out$", name):
            outs[name.split("/")[-1][:-4]] = text
        elif re.search(r"runs/cpu_adamw[^/]*\.json$", name):
            adamw = json.loads(text.strip().splitlines()[-1])
        elif re.search(r"runs/copies[^/]*\.jsonl$", name):
            for line in text.splitlines():
                if line.startswith("{") and ('"op":"d2h"' in line or '"op":"h2d"' in line):
                    c = json.loads(line)
                    copies[c["op"]] = c
    return {"path": path, "logs": logs, "outs": outs, "host": host, "adamw": adamw, "copies": copies,
            "bench_log": bench_log}


def host_info(a):
    lines = a["host"].strip().splitlines()
    cores = next((int(l) for l in lines if l.strip().isdigit()), None)
    gpus = sum(1 for l in lines if l.startswith("NVIDIA "))
    return {"date": host_date(a["host"]), "cores": cores, "gpus": gpus, "description": lines}


def summarize(name, recs):
    start, setup, steps = run_parts(recs)
    cfg = start["config"]
    med = lambda f: median(steps, f)
    step_ms = med("step_ms")
    world = start["world_size"]
    copied = med(lambda r: sum(r["comm"].get(op, {}).get("bytes", 0) for op in ("d2h", "h2d")))
    row = {
        "run": name, "model": cfg["model"], "stage": cfg["stage"], "offload": cfg["offload"],
        "hpz": cfg["engine"].get("hpz"), "gpus": world, "micro_batch": cfg["micro_batch"],
        "seq_len": cfg["seq_len"], "steps": len(steps), "step_ms_median": round(step_ms, 1),
        "tokens_per_s": round(steps[0]["tokens"] / (step_ms / 1e3)),
        "tokens_per_s_per_gpu": round(steps[0]["tokens"] / world / (step_ms / 1e3)),
        "forward_ms": round(med("forward_ms"), 1),
        "backward_ms": round(med("backward_ms"), 1),
        "optimizer_ms": round(med("optimizer_ms"), 1),
        "host_device_bytes_per_step": int(copied),
        "peak_allocated_bytes": max(r["memory"]["peak_allocated_bytes"] for r in steps),
        "model_state_bytes": sum(setup["model_state"].values()),
        "model_state_expected_bytes": sum(setup["model_state_expected"].values()),
        "buffers_bytes": setup["buffers_bytes"],
        "host_state_bytes": setup.get("host_state_bytes", 0),
        "host_state_expected_bytes": setup.get("host_state_expected_bytes", 0),
        "rss_bytes": max(r["memory"].get("rss_bytes", 0) for r in steps),
        "params": start["model"]["params"], "optimizer": setup.get("optimizer"),
        "versions": start["versions"], "gpu": start["device"]["name"],
        "threads": start["device"].get("threads"), "final_loss": steps[-1]["loss"],
        "losses": [r["loss"] for r in recs if r["event"] == "step"],
    }
    # The log's value stays as written; the note says what it should have been.
    if cfg["offload"] != "none" and row["optimizer"] == "cuda-fused":
        row["optimizer_note"] = OFFLOAD_OPTIMIZER_NOTE
    return row


def offload_rows(a):
    """Offload and hpZ runs of one archive, each with its bound where it offloads."""
    rows = [summarize(n, r) for n, r in sorted(a["logs"].items()) if n.startswith(("offload", "hpz"))]
    copy_gbps = statistics.mean(c["gbps"] for c in a["copies"].values()) if a["copies"] else None
    rate = a["adamw"]["adamw_params_per_s"] if a["adamw"] else None
    for r in rows:
        if r["offload"] == "none" or not (copy_gbps and rate):
            continue
        transfer_ms = r["host_device_bytes_per_step"] / (copy_gbps * 1e9) * 1e3
        adamw_ms = r["params"] / rate * 1e3
        bound = max(transfer_ms, adamw_ms)
        r.update({"transfer_ms": round(transfer_ms, 1), "cpu_adamw_ms": round(adamw_ms, 1),
                  "bound_ms": round(bound, 1), "step_over_bound": round(r["step_ms_median"] / bound, 3),
                  "target_met": r["step_ms_median"] <= 1.3 * bound})
        ds = DEEPSPEED_OFFLOAD.get(r["gpus"]) if r["model"] == "gpt2-xl" and r["micro_batch"] == 4 else None
        if ds:
            r["over_deepspeed_0_19_8"] = round(r["tokens_per_s"] / ds, 2)
    return rows


def check_losses(rows):
    """Offload and hpZ change where things run, not what is computed: each such run's losses must
    follow the plain run of the same stage and GPU count (bf16: within 1e-2 relative).
    A run that does not is marked invalid and left out of the targets."""
    plain = {(r["stage"], r["gpus"]): r["losses"] for r in rows if r["offload"] == "none" and not r["hpz"]}
    for r in rows:
        ref = plain.get((r["stage"], r["gpus"]))
        if (r["offload"] == "none" and not r["hpz"]) or ref is None:
            continue
        dev = max(abs(a - b) / abs(b) for a, b in zip(r["losses"], ref))
        r["loss_deviation_from_plain"] = round(dev, 6)
        r["valid"] = dev <= 1e-2
        if not r["valid"] and "target_met" in r:
            r["target_met"] = None


def faults(a):
    """The fault lines bench/gpu/run.sh logged, with the records rank 0 left."""
    texts = {}
    for line in a["bench_log"].splitlines():
        m = re.search(r"\] (fault_\w+): (.*)", line)
        if m:
            texts.setdefault(m.group(1), []).append(m.group(2))
    out = []
    for name, lines in texts.items():
        text = " ".join(lines)
        recs = a["logs"].get(name, [])
        err = next((r for r in recs if r["event"] == "error"), None)
        end = next((r for r in recs if r["event"] == "end"), None)
        ms = re.search(r"after (\d+) ms", text)
        secs = re.search(r"rc=\d+ in (\d+) s", text)
        rc = re.search(r"rc=(\d+)", text)
        how = lines[0].split(";")[0] if ms else "gpt2-xl micro-batch 256 on one GPU (does not fit)"
        out.append({"fault": name, "how": how, "launcher_rc": int(rc.group(1)) if rc else None,
                    "time_to_exit_ms": int(ms.group(1)) if ms else (int(secs.group(1)) * 1000 if secs else None),
                    "rank0_error_class": err and err["class"], "rank0_error": err and err["message"][:200],
                    "rank0_exit_code": end and end["exit_code"], "rank0_status": end and end["status"],
                    "rank0_steps_completed": end and end["steps_completed"], "rank0_lines": len(recs)})
    return out


def fits(a):
    """One row per fits probe: the model, the stage and offload, and what happened."""
    rows = []
    for name, out in sorted(a["outs"].items()):
        m = re.match(r"fits_(.+)_z(\d)_(.+)$", name)
        if not m:
            continue
        recs = a["logs"].get(name, [])
        end = next((r for r in recs if r["event"] == "end"), None)
        err = next((r for r in recs if r["event"] == "error"), None)
        steps = [r for r in recs if r["event"] == "step"]
        result = end["status"] if end else "did not finish in the probe's time limit (FITS_PROBE_SECONDS)"
        rows.append({"model": m.group(1), "stage": int(m.group(2)), "offload": m.group(3), "result": result,
                     "peak_allocated_bytes": max((r["memory"]["peak_allocated_bytes"] for r in steps), default=None),
                     "step_ms": steps[-1]["step_ms"] if steps else None,
                     "setup_ms": next((r["setup_ms"] for r in recs if r["event"] == "setup"), None),
                     "host_state_bytes": next((r["host_state_bytes"] for r in recs if r["event"] == "setup"), None),
                     "error": err and err["message"][:160]})
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("archives", nargs="+")
    ap.add_argument("--json", required=True)
    ap.add_argument("--md", required=True)
    a = ap.parse_args()

    calls = []
    for path in a.archives:
        arc = read_call(path)
        calls.append({"archive": path.split("/")[-1], "host": host_info(arc), "cpu_adamw": arc["adamw"],
                      "copies": list(arc["copies"].values()), "runs": offload_rows(arc),
                      "faults": faults(arc), "fits": fits(arc)})
    check_losses([r for c in calls for r in c["runs"]])
    first = next(r for c in calls for r in c["runs"])
    out = {"benchmark": "bench/gpu offload, hpz, faults, fits", "date": calls[0]["host"]["date"],
           "versions": first["versions"], "gpu": first["gpu"], "calls": calls}
    with open(a.json, "w") as f:
        json.dump(out, f, indent=1)

    md = io.StringIO()
    md.write("| host | model | stage | offload | hpZ | GPUs | step ms | tokens/s (all GPUs) | peak GPU alloc GiB | host state GiB "
             "| transfer ms | CPU AdamW ms | step / bound |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    for c in calls:
        h = f"{c['host']['gpus']}×H200, {c['host']['cores']} cores"
        for r in sorted(c["runs"], key=lambda r: (r["hpz"] or 0, r["gpus"], r["stage"], r["offload"])):
            if r.get("valid") is False:
                bound = f"invalid: losses left the plain run's by {r['loss_deviation_from_plain']:.0%}"
            elif "bound_ms" in r:
                bound = f"{r['step_over_bound']:.2f}{'' if r['target_met'] else ' (missed)'}"
            else:
                bound = "—"
            md.write(f"| {h} | {r['model']} | {r['stage']} | {r['offload']} | {r['hpz'] or '—'} | {r['gpus']} | "
                     f"{r['step_ms_median']:.1f} | {r['tokens_per_s']:,} | {gib(r['peak_allocated_bytes'])} | "
                     f"{gib(r['host_state_bytes'])} | {r.get('transfer_ms', '—')} | {r.get('cpu_adamw_ms', '—')} | {bound} |\n")
    md.write("\n| host | threads | AdamW params/s | AdamW GB/s | triad GB/s (with write-allocate) | fraction | D2H GB/s | H2D GB/s |\n")
    md.write("|---|---|---|---|---|---|---|---|\n")
    for c in calls:
        w, cp = c["cpu_adamw"], {x["op"]: x for x in c["copies"]}
        if w:
            md.write(f"| {c['host']['gpus']}×H200, {c['host']['cores']} cores | {w['threads']} | {w['adamw_params_per_s']:.3g} | "
                     f"{w['adamw_gbps']} | {w['triad_gbps_with_write_allocate']} | {w['fraction_of_bandwidth']} | "
                     f"{cp['d2h']['gbps'] if 'd2h' in cp else '—'} | {cp['h2d']['gbps'] if 'h2d' in cp else '—'} |\n")
    fit_rows = [f for c in calls for f in c["fits"]]
    if fit_rows:
        md.write("\n| model | stage | offload | result on 1 H200 (seq 512, micro-batch 1) | peak alloc GiB | host state GiB "
                 "| set-up s | step s |\n|---|---|---|---|---|---|---|---|\n")
        for f in fit_rows:
            peak = gib(f["peak_allocated_bytes"]) if f["peak_allocated_bytes"] else "—"
            host = gib(f["host_state_bytes"]) if f["host_state_bytes"] else "—"
            setup = f"{f['setup_ms'] / 1e3:.1f}" if f["setup_ms"] else "—"
            step = f"{f['step_ms'] / 1e3:.2f}" if f["step_ms"] else "—"
            md.write(f"| {f['model']} | {f['stage']} | {f['offload']} | {f['result']} | {peak} | {host} | {setup} | {step} |\n")
    fault_rows = [f for c in calls for f in c["faults"]]
    if fault_rows:
        md.write("\n| fault (2 GPUs, NCCL) | launcher exit | time to exit | rank 0 record | rank 0 exit |\n|---|---|---|---|---|\n")
        for f in fault_rows:
            t = f"{f['time_to_exit_ms'] / 1e3:.1f} s" if f["time_to_exit_ms"] else "—"
            msg = (f["rank0_error"] or "").replace("|", "/")[:110]
            md.write(f"| {f['how']} | {f['launcher_rc'] if f['launcher_rc'] is not None else '—'} | {t} | "
                     f"{f['rank0_error_class']}: {msg} | {f['rank0_exit_code']} |\n")
    with open(a.md, "w") as f:
        f.write(md.getvalue())


if __name__ == "__main__":
    main()
