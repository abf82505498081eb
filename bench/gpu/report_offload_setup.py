#!/usr/bin/env python3
"""Offload set-up times of several builds, from bench/gpu/run.sh's `offload-setup` logs.

  python3 bench/gpu/report_offload_setup.py RAW.tar.gz > bench/results/gpu-DATE-offload-setup.json

RAW.tar.gz holds one folder per commit with the phase's bench.log and host.txt (and, where it ran,
selfcheck.json and the same-losses summary), and pin_bench-*.jsonl files from
worker/examples/pin_bench. Each row is one run of the phase: the host state's bytes, the time to
allocate and page-lock it, and the GB/s that is.
"""
import json, re, sys, tarfile

LINE = re.compile(r'\] (setup_\S+): "host_state_bytes":(\d+) "host_state_setup_ms":([\d.]+) "setup_ms":([\d.]+)')

tar = tarfile.open(sys.argv[1])
files = {m.name: m for m in tar.getmembers() if m.isfile()}
read = lambda name: tar.extractfile(files[name]).read().decode()
rows, selfchecks, pin_bench, hosts = [], {}, [], {}
for name in sorted(files):
    parts = name.split("/")
    if name.endswith(".jsonl") and "pin_bench" in name:
        # Its JSON lines; the release times it prints to stderr came along in the same file.
        pin_bench = [json.loads(l) for l in read(name).splitlines() if l.startswith("{")]
    elif parts[-1] == "bench.log":
        commit = parts[-2]
        seen = set()
        for m in LINE.finditer(read(name)):
            run, b, ms, setup = m.group(1), int(m.group(2)), float(m.group(3)), float(m.group(4))
            if run in seen:  # the phase prints its summary once more at the end
                continue
            seen.add(run)
            rows.append({"commit": commit, "run": run, "host_state_bytes": b, "host_state_setup_ms": ms,
                         "setup_ms": setup, "lock_gb_per_s": round(b / ms / 1e6, 2)})
    elif parts[-1] == "selfcheck.json":
        d = json.loads(read(name))
        selfchecks[parts[-2]] = {"passed": d["passed"], "summary": d["summary"],
                                 "failed": [c["check"] for c in d["checks"] if not c.get("ok", True)]}
    elif parts[-1] == "host.txt":
        hosts[parts[-2]] = read(name).strip().splitlines()
json.dump({"benchmark": "bench/gpu/run.sh offload-setup (and selfcheck), one call per commit; worker/examples/pin_bench 4 16",
           "hosts": hosts, "rows": rows, "selfcheck": selfchecks, "pin_bench": pin_bench}, sys.stdout, indent=1)
print()
