"""Reads the run folder of `bench/gpu/run.sh clocks` and writes its JSON: for each run, the GPU's
samples taken while its measured steps ran (the SM and memory clocks, power, temperature and the
throttle reasons nvidia-smi reports), beside its step time.

    python3 bench/gpu/report_clocks.py RUNS HOST.txt COMMIT > clocks.json

The samples (`RUNS/clocks_smi.csv`) are `unix_seconds, sm_mhz, mem_mhz, power_w, temp_c,
throttle_reasons` lines, one per nvidia-smi call. A zerobench run's measured steps span from the
first measured step's start (its record's time less its step and the loop's overhead) to the last
record; a reference's, from `reference.py`'s `measured_unix`.
"""
import json
import os
import statistics
import sys


def samples(path):
    out = []
    with open(path) as f:
        for line in f:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) < 6:
                continue
            try:
                out.append({"t": float(parts[0]), "sm_mhz": float(parts[1]), "mem_mhz": float(parts[2]),
                            "power_w": float(parts[3]), "temp_c": float(parts[4]), "throttle": parts[5]})
            except ValueError:
                continue
    return out


def zerobench_window(log):
    steps = []
    with open(log) as f:
        for line in f:
            r = json.loads(line)
            if r.get("event") == "step" and not r.get("warmup"):
                steps.append(r)
    if not steps:
        return None, None
    first = steps[0]
    start = first["ts"] - (first["step_ms"] + first.get("overhead_ms", 0.0)) / 1e3
    return (start, steps[-1]["ts"]), statistics.median(s["step_ms"] for s in steps)


def summary(window, rows):
    inside = [r for r in rows if window[0] <= r["t"] <= window[1]]
    if not inside:
        return {"samples": 0}
    med = lambda k: round(statistics.median(r[k] for r in inside), 1)
    return {
        "samples": len(inside),
        "seconds": round(window[1] - window[0], 2),
        "sm_mhz_median": med("sm_mhz"), "sm_mhz_min": min(r["sm_mhz"] for r in inside),
        "sm_mhz_max": max(r["sm_mhz"] for r in inside),
        "mem_mhz_median": med("mem_mhz"),
        "power_w_median": med("power_w"), "power_w_max": max(r["power_w"] for r in inside),
        "temp_c_max": max(r["temp_c"] for r in inside),
        "throttle_reasons_seen": sorted({r["throttle"] for r in inside}),
    }


def main():
    runs, host, commit = sys.argv[1], sys.argv[2], sys.argv[3]
    rows = samples(os.path.join(runs, "clocks_smi.csv"))
    out = []
    for name in sorted(os.listdir(runs)):
        path = os.path.join(runs, name)
        if name.startswith("clocks_") and os.path.isdir(path) and os.path.exists(os.path.join(path, "rank0.jsonl")):
            window, step_ms = zerobench_window(os.path.join(path, "rank0.jsonl"))
            if window:
                out.append({"run": name, "step_ms_median": round(step_ms, 3), **summary(window, rows)})
        elif name.startswith("clocks_ref") and name.endswith(".json"):
            try:
                r = json.load(open(path))
            except ValueError:
                out.append({"run": name, "failed": True})
                continue
            if r.get("measured_unix") and None not in r["measured_unix"]:
                out.append({"run": name, "step_ms_median": round(r["step_ms_median"], 3),
                            **summary(tuple(r["measured_unix"]), rows)})
    print(json.dumps({
        "benchmark": "bench/gpu/run.sh clocks", "commit": commit, "host": open(host).read().splitlines(),
        "what": "the GPU's clocks, power and throttle reasons (nvidia-smi, one call after another) over each run's measured steps",
        "samples": len(rows),
        # The GPU before the first run starts (the phase waits 3 s): idle clocks and power.
        "idle": summary((rows[0]["t"], rows[0]["t"] + 2.5), rows) if rows else None,
        "runs": out,
    }, indent=1))


if __name__ == "__main__":
    sys.exit(main())
