"""Compares two builds of the worker run on the same configurations in one call: the archive of a
phase run with `--bin NEW` and the archive of the same phase with `--bin BASE` (run.sh's
`RUNS`/`--out` kept apart). Per run: step time, forward and backward time, peak allocated memory
and the first losses, new over base.

    python3 bench/gpu/compare_builds.py NEW1.tar.gz BASE1.tar.gz [NEW2 BASE2 ...] \
        --new-build X --base-build Y [--json OUT.json]

Each pair is one call; ratios are never taken across pairs.

Step time as every report reads it (common.read_archive: per step the slowest rank, the median
over measured steps). Both archives must come from one call: their host lines must name the same
GPUs (and, where they list them, the same GPU UUIDs) and dates at most an hour apart, or the pair is
refused; the output keeps both. A run in one archive and not the other is listed, not compared."""
import argparse
import datetime
import json
import sys

from common import build_summary, host_date, read_archive


def compare(new, base):
    first_equal = new["losses"][:1] == base["losses"][:1]
    worst = max(abs(a - b) for a, b in zip(new["losses"], base["losses"]))
    return {
        "step_ratio": round(new["step_ms"] / base["step_ms"], 4),
        "backward_ms_delta": round(new["backward_ms"] - base["backward_ms"], 3),
        "forward_ms_delta": round(new["forward_ms"] - base["forward_ms"], 3),
        "peak_allocated_gib_delta": round(new["peak_allocated_gib"] - base["peak_allocated_gib"], 3),
        "peak_allocated_ratio": round(new["peak_allocated_gib"] / base["peak_allocated_gib"], 4),
        "first_loss_identical": first_equal,
        "largest_loss_difference": worst,
    }


# The longest time between the two archives' host lines that still reads as one call.
ONE_CALL_SECONDS = 3600


def not_one_call(new_path, new_host, base_path, base_host):
    """Why two archives cannot be of one call (None if they can): other GPUs, or dates apart."""
    gpus = lambda host: [line for line in host.splitlines() if line.startswith("NVIDIA")]
    if gpus(new_host) != gpus(base_host):
        return f"{new_path} ran on {gpus(new_host)}, {base_path} on {gpus(base_host)}"
    dated = [host_date(host) for host in (new_host, base_host)]
    for path, d in zip((new_path, base_path), dated):
        if d is None:
            return f"{path} has no date in its host.txt"
    when = lambda d: datetime.datetime.fromisoformat(d.replace("Z", "+00:00"))
    apart = abs((when(dated[0]) - when(dated[1])).total_seconds())
    if apart > ONE_CALL_SECONDS:
        return f"{new_path} and {base_path} were measured {apart / 3600:.1f} hours apart"
    return None


def one_call(new_path, base_path, new_build, base_build):
    (new_host, new_logs, _), (base_host, base_logs, _) = read_archive(new_path), read_archive(base_path)
    if why := not_one_call(new_path, new_host, base_path, base_host):
        sys.exit(f"compare_builds.py: not one call: {why}")
    rows, unmatched = [], sorted(set(new_logs) ^ set(base_logs))
    for run in sorted(set(new_logs) & set(base_logs)):
        n, b = build_summary(new_logs[run]), build_summary(base_logs[run])
        if n is None or b is None:
            unmatched.append(run)
            continue
        row = {"run": run, "new": n, "base": b, **compare(n, b)}
        for s in (n, b):
            del s["losses"][4:]  # the first steps show where the two part
        rows.append(row)
    side = lambda path, build, host: {"archive": path.rsplit("/", 1)[-1], "build": build, "date": host_date(host),
                                      "host": host.strip().splitlines()}
    return {"new": side(new_path, new_build, new_host), "base": side(base_path, base_build, base_host),
            "runs": rows, "not_compared": unmatched}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("archives", nargs="+", help="NEW BASE, one pair per call")
    ap.add_argument("--new-build", required=True, help="what the new worker was built from")
    ap.add_argument("--base-build", required=True, help="what the base worker was built from")
    ap.add_argument("--json")
    a = ap.parse_args()
    if len(a.archives) % 2:
        ap.error("archives come in pairs: NEW BASE")
    pairs = zip(a.archives[::2], a.archives[1::2])
    calls = [one_call(n, b, a.new_build, a.base_build) for n, b in pairs]
    out = {"benchmark": "bench/gpu/compare_builds.py", "calls": calls}
    if a.json:
        with open(a.json, "w") as f:
            f.write(json.dumps(out, indent=1) + "\n")
    for r in (r for c in calls for r in c["runs"]):
        print(f"{r['run']:24s} step {r['base']['step_ms']:8.2f} -> {r['new']['step_ms']:8.2f} ms ({r['step_ratio']:.3f}x), "
              f"peak {r['base']['peak_allocated_gib']:6.2f} -> {r['new']['peak_allocated_gib']:6.2f} GiB, "
              f"first loss identical: {r['first_loss_identical']}, largest loss difference {r['largest_loss_difference']:.2e}")


if __name__ == "__main__":
    main()
