"""Does the host's AdamW rate explain why offloaded steps differ between hosts of one GPU kind?

Reads sweeps of the offloaded cost-model runs (`bench/gpu/run.sh costmodel` with
CM_LANES=serial, the same 16 configurations on each host), each archive holding the host's
`examples/cpu_adamw` output (runs/cpu_adamw.json: one JSON line per size measured, the last
taken) and, in the builds that logged it, each run's `host_adamw_gparams_per_s` from its setup
record (that build's measurement at setup). Step times are `zerobench ingest`'s (as
bench/costmodel/hosts.py reads them). For every configuration the step times and rates are taken
as deviations from the configuration's mean over hosts (in logs), and the step's deviation is
regressed on the host's slowness (minus the log rate): a slope of 1 would be a step that scales
with the host's update, 0 one that does not. The same for the rate of each run's copies to the
host and back, as its step records give them (under load, beside the step's other work). Prints
JSON.

    python3 bench/costmodel/host_rate.py ZEROBENCH ARCHIVE.tar.gz...
"""
import json
import math
import os
import statistics
import sys
import tarfile
import tempfile

from hosts import side


def cpu_adamw(archive):
    """The host's AdamW rate from the archive's runs/cpu_adamw.json, G parameters/s."""
    with tarfile.open(archive) as tar:
        m = next(m for m in tar.getmembers() if m.name.endswith("runs/cpu_adamw.json"))
        lines = [json.loads(l) for l in tar.extractfile(m).read().decode().splitlines() if l.startswith("{")]
    return lines[-1]["adamw_params_per_s"] / 1e9


def setup_rate(row):
    """The rate rank 0's setup record measured, where its build logged one."""
    with open(os.path.join(row["dir"], "rank0.jsonl")) as f:
        setup = next(r for r in map(json.loads, f) if r.get("event") == "setup")
    return setup.get("host_adamw_gparams_per_s")


def copy_rates(row):
    """The medians over rank 0's measured steps of its gradient copies' rate to the host and its
    parameter copies' rate back (`comm.d2h` / `comm.h2d` bus GB/s): the copies as they ran beside
    the step's other work, which is what a host's copy speed can cost a step."""
    with open(os.path.join(row["dir"], "rank0.jsonl")) as f:
        steps = [r for r in map(json.loads, f) if r.get("event") == "step" and not r.get("warmup")]
    rate = lambda way: statistics.median(r["comm"][way]["bus_gbps"] for r in steps)
    return rate("d2h"), rate("h2d")


def read(zb, archive, work, tag):
    """Configuration -> (median step ms, setup rate, (d2h, h2d) GB/s), and the host's cpu_adamw
    rate."""
    rows = side(zb, [archive], work, tag, keep=lambda r: r["offload"] != "none")
    runs = {os.path.basename(name): (float(r["step_ms_median"]), setup_rate(r), copy_rates(r))
            for name, r in rows.items()}
    return runs, cpu_adamw(archive)


def fit(xs, ys):
    """Correlation, least-squares slope through the origin of deviations, and the rms (%) left."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxy = sum((a - mx) * (b - my) for a, b in zip(xs, ys))
    sxx, syy = sum((a - mx) ** 2 for a in xs), sum((b - my) ** 2 for b in ys)
    slope = sxy / sxx
    rms = lambda s: round(100 * math.sqrt(statistics.fmean([(y - s * x) ** 2 for x, y in zip(xs, ys)])), 2)
    return {"correlation": round(sxy / math.sqrt(sxx * syy), 3), "slope": round(slope, 3),
            "rms_left_pct": rms(slope), "rms_left_pct_at_slope_1": rms(1.0)}


def deviations(values):
    """Each value less their mean: one configuration's spread over the hosts."""
    m = statistics.fmean(values)
    return [v - m for v in values]


def main():
    zb, archives = os.path.abspath(sys.argv[1]), sys.argv[2:]
    with tempfile.TemporaryDirectory() as work:
        hosts = {p.rsplit("/", 1)[-1]: read(zb, p, work, f"h{i}") for i, p in enumerate(archives)}
    names = sorted(set.intersection(*(set(r) for r, _ in hosts.values())))
    ys, by_cpu, by_setup, by_copy, rows = [], [], [], {"d2h": [], "h2d": []}, []
    for n in names:
        steps = [math.log(hosts[h][0][n][0]) for h in hosts]
        cpus = [-math.log(hosts[h][1]) for h in hosts]
        setups = [hosts[h][0][n][1] for h in hosts]
        ys += deviations(steps)
        by_cpu += deviations(cpus)
        for i, way in enumerate(by_copy):
            by_copy[way] += deviations([-math.log(hosts[h][0][n][2][i]) for h in hosts])
        if all(setups):
            by_setup += list(zip(deviations([-math.log(s) for s in setups]), ys[-len(hosts):]))
        rows.append({"configuration": n, "step_ms": {h: round(hosts[h][0][n][0], 1) for h in hosts},
                     "setup_rate": {h: hosts[h][0][n][1] for h in hosts},
                     "copy_gbps_d2h_h2d": {h: [round(x, 1) for x in hosts[h][0][n][2]] for h in hosts}})
    out = {
        "benchmark": "offloaded steps across hosts against the host's AdamW rate and its copies' "
                     "(bench/costmodel/host_rate.py)",
        "hosts": {h: {"cpu_adamw_gparams_per_s": round(c, 3),
                      "copy_gbps_d2h_h2d_median": [round(statistics.median(r[2][i] for r in runs.values()), 1)
                                                   for i in range(2)]}
                  for h, (runs, c) in hosts.items()},
        "configurations": len(names),
        "step_deviation_rms_pct": round(100 * math.sqrt(statistics.fmean([y * y for y in ys])), 2),
        "by_cpu_adamw": fit(by_cpu, ys),
        "by_setup_rate": fit([x for x, _ in by_setup], [y for _, y in by_setup]) if by_setup else None,
        "by_d2h_rate": fit(by_copy["d2h"], ys),
        "by_h2d_rate": fit(by_copy["h2d"], ys),
        "rows": rows,
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
