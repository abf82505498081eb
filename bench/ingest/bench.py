"""The ingest benchmark: zerobench ingest end to end (parse, aggregate, write every table and
plot) against polars (read_ndjson, and scan_ndjson as its best) and DuckDB (read_json + GROUP BY)
on the same logs and the same number of threads. Run through run.sh, which builds, installs the
references and generates the logs first.

Every measurement is a fresh process under /usr/bin/time (for its peak RSS); the tools run
interleaved, repetition by repetition, so that load from other users of the host spreads evenly.
zerobench's time is the whole process (start to exit, tables written); the references' time is
their read and query only, timed inside the process after imports: that favours the references.
"""

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def timed(cmd, env=None):
    """Runs cmd under /usr/bin/time; returns (wall seconds, peak RSS in MB, stdout, exit code)."""
    p = subprocess.run(["/usr/bin/time", "-f", "@@ %e %M", *cmd], capture_output=True, text=True, env=env)
    line = [l for l in p.stderr.splitlines() if l.startswith("@@ ")][-1].split()
    return float(line[1]), int(line[2]) / 1024, p.stdout, p.returncode


def loadavg():
    return [round(x, 2) for x in os.getloadavg()]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--zerobench", required=True)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    files = sorted(
        os.path.join(d, f) for d, _, fs in os.walk(args.data) for f in fs if f.startswith("rank") and f.endswith(".jsonl")
    )
    total = sum(os.path.getsize(f) for f in files)
    for f in files:  # warm the page cache: every tool reads from memory
        with open(f, "rb") as fh:
            while fh.read(1 << 24):
                pass

    env = dict(os.environ, BENCH_THREADS=str(args.threads), POLARS_MAX_THREADS=str(args.threads))
    py = sys.executable
    compare = os.path.join(HERE, "compare.py")
    tmp = tempfile.mkdtemp(prefix="zb-bench-")
    out_dir = os.path.join(tmp, "tables")
    tools = {
        "zerobench": [args.zerobench, "ingest", args.data, "--out", out_dir, "--quiet", "--threads", str(args.threads)],
        "duckdb": [py, compare, "duckdb", args.data],
        "polars_scan_ndjson": [py, compare, "polars-scan", args.data],
        "polars_read_ndjson": [py, compare, "polars-read", args.data],
    }
    results = {k: {"seconds": [], "process_seconds": [], "peak_rss_mb": [], "load_before": []} for k in tools}
    versions = {}
    medians = {}
    load_start = loadavg()
    for _ in range(args.reps):
        for name, cmd in tools.items():
            results[name]["load_before"].append(loadavg())
            wall, rss, stdout, code = timed(cmd, env)
            if name == "zerobench":
                if code not in (0, 1):
                    raise SystemExit(f"zerobench failed with exit code {code}")
                secs = wall
            else:
                if code != 0:
                    raise SystemExit(f"{name} failed with exit code {code}")
                d = json.loads(stdout)
                secs = d["seconds"]
                versions[name.split("_")[0]] = d["version"]
                medians[name] = d["medians"]
            results[name]["seconds"].append(round(secs, 4))
            results[name]["process_seconds"].append(round(wall, 4))
            results[name]["peak_rss_mb"].append(round(rss, 1))
    load_end = loadavg()

    summary = {}
    for name, r in results.items():
        mbps = [total / 1e6 / s for s in r["seconds"]]
        summary[name] = {
            "timed": "whole process: discover, parse, aggregate, write csv+md+json+svg"
            if name == "zerobench"
            else "read + query inside the process, after imports",
            "seconds": r["seconds"],
            "mb_per_s": [round(x, 1) for x in mbps],
            "whole_process_seconds": r["process_seconds"],
            "whole_process_median_mb_per_s": round(statistics.median(total / 1e6 / s for s in r["process_seconds"]), 1),
            "median_mb_per_s": round(statistics.median(mbps), 1),
            "best_mb_per_s": round(max(mbps), 1),
            "peak_rss_mb": max(r["peak_rss_mb"]),
            "load_before": r["load_before"],
        }
    zb = summary["zerobench"]["median_mb_per_s"]

    # Memory against input size: zerobench on a quarter of the runs, then on all.
    quarter = os.path.join(tmp, "quarter")
    os.makedirs(quarter)
    runs = sorted(os.listdir(args.data))
    for r in runs[::4]:
        os.symlink(os.path.join(os.path.abspath(args.data), r), os.path.join(quarter, r))
    q_bytes = sum(os.path.getsize(f) for f in files if os.path.relpath(f, args.data).split(os.sep)[0] in runs[::4])
    _, q_rss, _, _ = timed([args.zerobench, "ingest", quarter, "--out", os.path.join(tmp, "q"), "--quiet"], env)

    # DuckDB as an oracle: the same per-run median step times as zerobench's runs table.
    with open(os.path.join(out_dir, "runs.json")) as fh:
        rows = json.load(fh)["rows"]
    ours = {r["dir"]: r["step_ms_median"] for r in rows if r["step_ms_median"] is not None}
    theirs = medians["duckdb"]
    common = sorted(set(ours) & set(theirs))
    worst = max(abs(ours[k] - theirs[k]) / abs(theirs[k]) for k in common)

    with open(os.path.join(out_dir, "summary.json")) as fh:
        read = json.load(fh)["read"]
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
    rustc = subprocess.run(["rustc", "--version"], capture_output=True, text=True).stdout.strip()
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE).stdout.strip()
    doc = {
        "benchmark": "bench/ingest (bench/ingest/run.sh)",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": {
            "hostname": platform.node(),
            "cpu": cpu,
            "cores": os.cpu_count(),
            "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "os": platform.platform(),
            "load_avg_start": load_start,
            "load_avg_end": load_end,
            "note": "shared 2-core host: other users' builds ran at the same time (see load_before per measurement)",
        },
        "versions": {"rustc": rustc, "zerobench_commit": git, "python": platform.python_version(), **versions},
        "threads": args.threads,
        "repetitions": args.reps,
        "input": {"bytes": total, "files": len(files), "runs": len(runs), "lines": read["lines"], "from": "page cache"},
        "results": summary,
        "ratios": {
            "zerobench_vs_polars_read_ndjson": round(zb / summary["polars_read_ndjson"]["median_mb_per_s"], 2),
            "zerobench_vs_polars_scan_ndjson": round(zb / summary["polars_scan_ndjson"]["median_mb_per_s"], 2),
            "zerobench_vs_duckdb": round(zb / summary["duckdb"]["median_mb_per_s"], 2),
            "whole_process_zerobench_vs_polars_read_ndjson": round(
                zb / summary["polars_read_ndjson"]["whole_process_median_mb_per_s"], 2
            ),
            "whole_process_zerobench_vs_duckdb": round(zb / summary["duckdb"]["whole_process_median_mb_per_s"], 2),
        },
        "zerobench_rss_by_input": [
            {"input_mb": round(q_bytes / 1e6, 1), "peak_rss_mb": round(q_rss, 1)},
            {"input_mb": round(total / 1e6, 1), "peak_rss_mb": summary["zerobench"]["peak_rss_mb"]},
        ],
        "oracle": {
            "check": "per-run median step time (max over ranks, steps >= 2): zerobench runs.json vs DuckDB",
            "runs_compared": len(common),
            "max_relative_difference": worst,
        },
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(doc, fh, indent=2)
        fh.write("\n")
    shutil.rmtree(tmp)
    print(json.dumps({k: v["median_mb_per_s"] for k, v in summary.items()}), file=sys.stderr)
    print(json.dumps(doc["ratios"]), file=sys.stderr)


if __name__ == "__main__":
    main()
