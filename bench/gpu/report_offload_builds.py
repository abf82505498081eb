"""Reads the runs of `bench/gpu/run.sh offload-builds` and prints, per build, offload's step time
and where it goes, with each build's median over the first build's (the base).

    python3 bench/gpu/report_offload_builds.py RUNS HOST.txt BUILD-COMMIT... > offload-builds.json

Run folders are `ob_<configuration>_<commit7>_<round>`; the builds take turns within each round.
Per run: the median step, the optimizer phase (the host's AdamW and the copies around it), the
copies to and from the host, and the share of the process's resident memory in transparent huge
pages read mid-run (`<run>.smaps`, from /proc/PID/smaps_rollup). Per build: the median of its runs'
medians, the spread between them and the ratio to the first build's, with the range of the paired
ratios round by round. Then this host's CPU AdamW and memory bandwidth (`cpu_adamw.json`). A run
that failed shows as null."""
import glob
import json
import os
import re
import sys

from common import host_date, median, rank0_records, runs_of_a_setting, steadiness


def huge_share(smaps):
    """AnonHugePages over Rss of a smaps_rollup excerpt; None where it was not read."""
    if not os.path.exists(smaps):
        return None
    kb = dict((k, int(v.split()[0])) for k, v in (line.split(":", 1) for line in open(smaps) if ":" in line))
    return round(kb["AnonHugePages"] / kb["Rss"], 4) if kb.get("Rss") else None


def run_summary(run_dir):
    recs = rank0_records(run_dir)
    steps = [r for r in recs if r["event"] == "step" and not r["warmup"]]
    med = lambda f: round(median(steps, f), 3) if steps else None
    return steadiness(recs) | {
        "optimizer_ms": med(lambda r: r["optimizer_ms"]),
        "d2h_ms": med(lambda r: r["comm"]["d2h"]["ms"]),
        "h2d_ms": med(lambda r: r["comm"]["h2d"]["ms"]),
        "huge_page_share": huge_share(run_dir + ".smaps"),
    }


def main():
    runs, host, commits = sys.argv[1], sys.argv[2], sys.argv[3:]
    short = {c[:7]: c for c in commits}
    by = {}
    for d in sorted(glob.glob(os.path.join(runs, "ob_*"))):
        m = re.fullmatch(r"ob_(.+)_([0-9a-f]{7}|unknown)_(\d+)", os.path.basename(d))
        if m and os.path.isdir(d):
            name, c, rnd = m.groups()
            by.setdefault(name, {}).setdefault(short.get(c, c), {})[int(rnd)] = run_summary(d)
    configurations = []
    for name, builds in sorted(by.items()):
        base = builds.get(commits[0], {})
        rows = []
        for c in commits:
            rs = builds.get(c, {})
            row = {"build": c} | runs_of_a_setting([r["step_ms"] for r in rs.values()],
                                                  {str(k): v for k, v in sorted(rs.items())})
            paired = [rs[k]["step_ms"] / base[k]["step_ms"] for k in sorted(set(rs) & set(base))
                      if rs[k]["step_ms"] and base[k]["step_ms"]]
            b = rows[0]["median_step_ms"] if rows else row["median_step_ms"]  # the first build's
            row["over_first"] = round(row["median_step_ms"] / b, 4) if row["median_step_ms"] and b else None
            row["paired_over_first"] = [round(min(paired), 4), round(max(paired), 4)] if paired else None
            rows.append(row)
        configurations.append({"configuration": name, "builds": rows})
    adamw = os.path.join(runs, "cpu_adamw.json")
    try:
        cpu = json.load(open(adamw))
    except (OSError, ValueError):
        cpu = None
    text = open(host).read()
    print(json.dumps({"benchmark": "bench/gpu/run.sh offload-builds", "date": host_date(text),
                      "host": text.strip().splitlines(), "builds": commits,
                      "configurations": configurations, "cpu_adamw": cpu}, indent=1))


if __name__ == "__main__":
    main()
