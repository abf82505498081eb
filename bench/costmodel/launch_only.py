"""Keeps, of one extracted cost-model sweep, only its one-GPU runs without offload whose host set
their step (GPU busy under DEVICE_BOUND_UTIL_PCT), and removes every other run's folder: what
bench/costmodel/fit-shipped.sh's `launch-only` sweeps contribute. Such runs measure the host that
issues the kernels, which sets a launch-bound step and differs between hosts by 0.5-1.6x; a busy
run measures the engine's device work, which a later build changes, so a sweep of an earlier
build lends the fit its launch-bound runs only. A run that logged no utilisation is removed: it
cannot be told launch-bound.

    python3 bench/costmodel/launch_only.py RUNS.csv ROOT

RUNS.csv is `zerobench ingest --format csv`'s run table of the sweep, read from ROOT (its `dir`
column is relative to ROOT). Prints how many runs were kept and removed.
"""
import csv
import os
import shutil
import sys

from results import DEVICE_BOUND_UTIL_PCT

runs_csv, root = sys.argv[1:3]
kept = removed = 0
for r in csv.DictReader(open(runs_csv)):
    util = r["gpu_util_pct_mean"]
    launch_bound = util != "" and float(util) < DEVICE_BOUND_UTIL_PCT
    if launch_bound and r["gpus"] == "1" and r["offload"] == "none":
        kept += 1
        continue
    folder = os.path.join(root, r["dir"])
    if not os.path.isdir(folder):
        sys.exit(f"launch_only.py: {runs_csv}: run {r['run_id']}: no folder {folder}")
    shutil.rmtree(folder)
    # The worker's own output beside the folder (bench/gpu/run.sh writes NAME.out).
    if os.path.isfile(folder + ".out"):
        os.remove(folder + ".out")
    removed += 1
print(f"launch_only.py: kept {kept} launch-bound one-GPU runs, removed {removed}", file=sys.stderr)
