#!/usr/bin/env python3
"""Where offload's host-state set-up goes, per run, from the worker's debug records.

  python3 bench/gpu/report_setup_parts.py RAW.tar.gz > bench/results/gpu-DATE-setup-parts.json

RAW.tar.gz holds, under one top folder, one folder per device call (CALL/) with notes.txt (what
ran, in order) and, per run of `bench/gpu/run.sh offload-setup` with
WORKER_ENV="RUST_LOG=zerobench_worker=debug", the phase's folder N-BUILD/ (bench.log, host.txt) and
N-BUILD.debug: the gpt2-xl run's `page-locked` records (bytes, fault_in_ms, register_ms per unit)
and `host state filled` records (master_ms, param_ms per unit). Each row sums them over the units
beside the run's logged host_state_setup_ms.
"""
import json, re, statistics, sys

from common import call_folders

SETUP = re.compile(r'\] (setup_gpt2-xl\S+): "host_state_bytes":(\d+) "host_state_setup_ms":([\d.]+) "setup_ms":([\d.]+)')
FIELD = re.compile(r"(\w+)=([\d.]+)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")

calls = {}
for cname, folder in call_folders(sys.argv[1]).items():
    call = calls[cname] = {"notes": folder["notes"], "host": folder["host"], "runs": {}}
    for rel, text in folder["files"].items():
        parts = rel.split("/")
        if len(parts) == 1 and rel.endswith(".debug"):
            run = call["runs"].setdefault(rel[:-len(".debug")], {})
            sums = dict.fromkeys(["units", "bytes", "fault_in_ms", "register_ms", "master_ms", "param_ms"], 0)
            for line in ANSI.sub("", text).splitlines():
                d = dict(FIELD.findall(line))
                if "page-locked" in line:
                    sums["units"] += 1
                    sums["bytes"] += int(d["bytes"])
                    sums["fault_in_ms"] += float(d["fault_in_ms"])
                    sums["register_ms"] += float(d["register_ms"])
                elif "host state filled" in line:
                    sums["master_ms"] += float(d["master_ms"])
                    sums["param_ms"] += float(d["param_ms"])
            run.update({k: round(v, 1) for k, v in sums.items()})
            run["fault_in_gb_per_s"] = round(sums["bytes"] / sums["fault_in_ms"] / 1e6, 1)
            run["register_gb_per_s"] = round(sums["bytes"] / sums["register_ms"] / 1e6, 1)
        elif len(parts) == 2 and parts[1] == "bench.log" and (m := SETUP.search(text)):
            run = call["runs"].setdefault(parts[0], {})
            run.update({"build": parts[0].split("-", 1)[1], "host_state_setup_ms": round(float(m.group(3)), 1),
                        "setup_ms": round(float(m.group(4)), 1),
                        "lock_gb_per_s": round(int(m.group(2)) / float(m.group(3)) / 1e6, 2)})

summary = {}
for cname, call in calls.items():
    later = [r for k, r in sorted(call["runs"].items()) if not k.startswith("1-")]
    for build in sorted({r["build"] for r in later}):
        rows = [r for r in later if r["build"] == build]
        summary[f"{cname} {build}, runs after the first"] = {
            k: statistics.median(r[k] for r in rows) for k in ("host_state_setup_ms", "fault_in_ms", "register_ms")}

json.dump({"benchmark": "bench/gpu/run.sh offload-setup, gpt2-xl stage 2 optimizer offload, micro-batch 4, one GPU, "
                        "with the worker's debug records of each unit's set-up",
           "summary": summary, "calls": calls}, sys.stdout, indent=1)
print()
