"""Keeps, of one extracted cost-model sweep, the runs that bench/costmodel/fit-shipped.sh lends
the fit from a sweep of an earlier build, and removes every other run's folder:

* `launch-only`: the one-GPU runs without offload whose host set their step (GPU busy under
  DEVICE_BOUND_UTIL_PCT). Such runs measure the host that issues the kernels, which sets a
  launch-bound step and differs between hosts by 0.5-1.6x; a busy run measures the engine's
  device work, which a later build changes. A run that logged no utilisation is removed: it
  cannot be told launch-bound.
* `superseded`: the runs that no sweep listed before it ran: a later build's sweep of part of
  the list (the families whose GPU work it changed) replaces those runs and lends the rest,
  those on more GPUs than its host had among them. A run is the same run by its set folder and
  name (`cm-fit/gpt2_z0_mb4_s1024_1gpu`).

    python3 bench/costmodel/keep_runs.py MODE RUNS.csv ROOT [NEWER_ROOT...]

NEWER_ROOT (with `superseded`): the extracted sweeps listed before this one.

RUNS.csv is `zerobench ingest --format csv`'s run table of the sweep, read from ROOT (its `dir`
column is relative to ROOT). Prints how many runs were kept and removed.
"""
import csv
import os
import shutil
import sys

from results import DEVICE_BOUND_UTIL_PCT


def launch_bound_one_gpu(r):
    util = r["gpu_util_pct_mean"]
    launch_bound = util != "" and float(util) < DEVICE_BOUND_UTIL_PCT
    return launch_bound and r["gpus"] == "1" and r["offload"] == "none"


def run_names(roots):
    """Every run folder under `roots`, as SET/NAME."""
    names = set()
    for newer in roots:
        for folder, dirs, _ in os.walk(newer):
            if os.path.basename(folder).startswith("cm-"):
                names.update(f"{os.path.basename(folder)}/{d}" for d in dirs)
                dirs.clear()
    return names


def not_run_by(names):
    return lambda r: "/".join(r["dir"].split("/")[-2:]) not in names


if len(sys.argv) < 4 or sys.argv[1] not in ("launch-only", "superseded"):
    sys.exit("usage: keep_runs.py {launch-only,superseded} RUNS.csv ROOT [NEWER_ROOT...]")
mode, runs_csv, root = sys.argv[1:4]
keep = launch_bound_one_gpu if mode == "launch-only" else not_run_by(run_names(sys.argv[4:]))
kept = removed = 0
for r in csv.DictReader(open(runs_csv)):
    if keep(r):
        kept += 1
        continue
    folder = os.path.join(root, r["dir"])
    if not os.path.isdir(folder):
        sys.exit(f"keep_runs.py: {runs_csv}: run {r['run_id']}: no folder {folder}")
    shutil.rmtree(folder)
    # The worker's own output beside the folder (bench/gpu/run.sh writes NAME.out).
    if os.path.isfile(folder + ".out"):
        os.remove(folder + ".out")
    removed += 1
print(f"keep_runs.py {mode}: kept {kept} runs, removed {removed}", file=sys.stderr)
