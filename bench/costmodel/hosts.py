"""How much the same configurations' step times move between two cost-model sweeps (two hosts, or
two builds): the one-GPU runs without host work that both sweeps completed, each sweep's median
step time over the other's, apart for runs that kept the GPU busy (>= 90% in both: device-bound)
and the rest (launch-bound).

    python3 bench/costmodel/hosts.py ZEROBENCH --a ARCHIVE... --b ARCHIVE... [--label-a A --label-b B]

Each side is one or more `bench/gpu/run.sh costmodel` archives; where two archives of one side hold
a run of the same name, the later one's stands (a sweep measured again after a change). Step time
and GPU use are `zerobench ingest`'s. Prints one JSON document: per class the number of runs, the
median, smallest and largest ratio b/a, the mean |ln(b/a)| (symmetric: 0.10 is about 10% either
way), the runs at either end, and each side's CPU models where its logs record them."""
import argparse
import csv
import json
import math
import os
import statistics
import subprocess
import tarfile
import tempfile

from results import DEVICE_BOUND_UTIL_PCT


def one_gpu_without_host_work(row):
    return row["gpus"] == "1" and row["offload"] == "none"


def side(zb, archives, work, tag, keep=one_gpu_without_host_work):
    """Run name -> ingest row, for one side's archives (later archives' runs stand): the completed
    runs `keep` takes, each row's `dir` made a path under `work` (its logs, while `work` lasts)."""
    runs = {}
    for i, archive in enumerate(archives):
        d = os.path.join(work, f"{tag}{i}")
        os.makedirs(d)
        try:
            with tarfile.open(archive) as t:
                t.extractall(d, filter="data")
        except (OSError, tarfile.TarError) as e:
            raise SystemExit(f"hosts.py: {archive}: not a readable archive: {e}")
        sets = [s for s in ("runs/cm-fit", "runs/cm-holdout") if os.path.isdir(os.path.join(d, s))]
        if not sets:
            raise SystemExit(f"hosts.py: {archive}: no runs/cm-fit or runs/cm-holdout (not a costmodel sweep)")
        # Exit 1: runs that did not complete (out of memory) are listed, not measured.
        p = subprocess.run([zb, "ingest", *sets, "--out", "ingest", "--format", "csv", "-q"], cwd=d,
                           capture_output=True, text=True)
        if p.returncode not in (0, 1):
            raise SystemExit(f"{archive}: zerobench ingest failed ({p.returncode}): {p.stderr.strip()}")
        for r in csv.DictReader(open(os.path.join(d, "ingest", "runs.csv"))):
            if r["step_ms_median"] and keep(r):
                r["dir"] = os.path.join(d, r["dir"])
                runs[r["run_id"]] = r
    return runs


def cpu_models(runs):
    return sorted({r["host_cpu"] for r in runs.values() if r.get("host_cpu")})


def summary(pairs):
    if not pairs:
        return {"runs": 0}
    ratios = sorted(pairs)
    r = [x for x, _ in ratios]
    return {"runs": len(r), "median": round(statistics.median(r), 3), "min": round(r[0], 3),
            "max": round(r[-1], 3), "mean_abs_log": round(statistics.mean(abs(math.log(x)) for x in r), 3),
            "lowest": [{"run": k, "ratio": round(x, 3)} for x, k in ratios[:3]],
            "highest": [{"run": k, "ratio": round(x, 3)} for x, k in ratios[-3:]]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("zerobench")
    ap.add_argument("--a", nargs="+", required=True)
    ap.add_argument("--b", nargs="+", required=True)
    ap.add_argument("--label-a", default="a")
    ap.add_argument("--label-b", default="b")
    args = ap.parse_args()
    zb = os.path.abspath(args.zerobench)
    with tempfile.TemporaryDirectory() as work:
        a, b = side(zb, args.a, work, "a"), side(zb, args.b, work, "b")
    device, launch = [], []
    for k in sorted(set(a) & set(b)):
        ratio = float(b[k]["step_ms_median"]) / float(a[k]["step_ms_median"])
        busy = min(float(a[k]["gpu_util_pct_mean"] or 0), float(b[k]["gpu_util_pct_mean"] or 0)) >= DEVICE_BOUND_UTIL_PCT
        (device if busy else launch).append((ratio, k))
    print(json.dumps({
        "benchmark": "bench/costmodel/hosts.py: one-GPU runs without host work, sweep b's median step over sweep a's",
        # The hosts' CPU models, where the logs record them (`start.machine`, newer builds).
        "a": {"label": args.label_a, "archives": args.a, "cpu_models": cpu_models(a)},
        "b": {"label": args.label_b, "archives": args.b, "cpu_models": cpu_models(b)},
        "only_in_a": sorted(set(a) - set(b)), "only_in_b": sorted(set(b) - set(a)),
        "device_bound": summary(device), "launch_bound": summary(launch)}, indent=1))


if __name__ == "__main__":
    main()
