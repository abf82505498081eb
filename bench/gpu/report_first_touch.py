#!/usr/bin/env python3
"""Faulting in and page-locking fresh host memory, and offload's set-up time, by build and call.

  python3 bench/gpu/report_first_touch.py RAW.tar.gz > bench/results/gpu-DATE-first-touch.json

RAW.tar.gz holds, under one top folder, one folder per device call (CALL/), each with notes.txt
(what ran, in order), free.txt (the machine's memory and uptime when the call began) and one folder
per run of a phase in the order they ran
(CALL/SEQ-WHAT/): `0-first-touch/` holds run.sh first-touch's bench.log, host.txt and
first_touch.jsonl; `N-COMMIT/` holds an offload-setup phase's bench.log (and host.txt) for the build
at COMMIT. Run 1 is the first offload run of the call: where nothing ran before it on the freshly
started machine, its t5-11b set-up pays the machine's first touch of every byte; later runs reuse
memory that earlier ones had.
"""
import json, re, statistics, sys

from common import call_folders

LINE = re.compile(r'\] (setup_\S+): "host_state_bytes":(\d+) "host_state_setup_ms":([\d.]+) "setup_ms":([\d.]+)')

calls = {}
for cname, folder in call_folders(sys.argv[1]).items():
    call = calls[cname] = {"notes": folder["notes"], "host": folder["host"], "uptime": None,
                           "first_touch": [], "setup": []}
    for rel, text in folder["files"].items():
        parts = rel.split("/")
        if rel == "free.txt":
            call["uptime"] = next((l.strip() for l in text.splitlines() if " up " in l), None)
        elif parts[-1] == "first_touch.jsonl":
            call["first_touch"] = [json.loads(l) for l in text.splitlines()
                                   if l.startswith("{") and '"mode":"first-touch"' in l]
        elif parts[-1] == "bench.log" and len(parts) == 2 and parts[0][0].isdigit() and "first-touch" not in parts[0]:
            seq, commit = parts[0].split("-", 1)
            seen = set()
            for m in LINE.finditer(text):
                if m.group(1) in seen:  # the phase prints its summary once more at the end
                    continue
                seen.add(m.group(1))
                b, ms = int(m.group(2)), float(m.group(3))
                call["setup"].append({"seq": int(seq), "commit": commit, "run": m.group(1),
                                      "memory": "first offload run" if seq == "1" else "reused",
                                      "host_state_bytes": b, "host_state_setup_ms": round(ms, 1),
                                      "setup_ms": round(float(m.group(4)), 1),
                                      "lock_gb_per_s": round(b / ms / 1e6, 2)})

summary = {}
for cname, call in calls.items():
    s = {}
    for memory in ("never-had", "had-back"):
        for touch in ("zero", "touch", "populate"):
            rows = [r for r in call["first_touch"] if r["memory"] == memory and r["touch"] == touch]
            if rows:
                s[f"{memory} {touch}: touch_s, register_s, lock GB/s"] = [
                    [r["touch_s"] for r in rows], [r["register_s"] for r in rows], [r["lock_gbps"] for r in rows]]
    for commit in sorted({r["commit"] for r in call["setup"]}):
        reused = [r["host_state_setup_ms"] / 1e3 for r in call["setup"]
                  if r["commit"] == commit and r["memory"] == "reused" and r["run"].startswith("setup_t5-11b")]
        if reused:
            s[f"t5-11b host state set-up s, reused memory, {commit}"] = {"runs": reused,
                                                                          "median": round(statistics.median(reused), 1)}
    first = [r for r in call["setup"] if r["memory"] != "reused" and r["run"].startswith("setup_t5-11b")]
    if first:
        s["t5-11b host state set-up s, first offload run (see notes)"] = {
            r["commit"]: round(r["host_state_setup_ms"] / 1e3, 1) for r in first}
    summary[cname] = s

json.dump({"benchmark": "bench/gpu/run.sh first-touch (worker/examples/pin_bench first-touch) and offload-setup, "
                        "builds alternating in one call on freshly started machines",
           "builds": {"5a3944b": "fault-in by writing zeros (before)",
                      "2a9f8fc": "fault-in by MADV_POPULATE_WRITE on fresh zero mappings (shipped)",
                      "bc74690": "2a9f8fc with each tensor registered beside the others' fault-in (not kept)"},
           "summary": summary, "calls": calls}, sys.stdout, indent=1)
print()
