#!/usr/bin/env python3
"""The mutation-testing summary: for each package, every result of scripts/mutants.sh in
bench/results/ with its recheck (scripts/mutants-recheck.sh) where there is one.

    scripts/mutants-summary.py > bench/results/mutants-summary.json   (a Markdown table on stderr)

Per result: the viable mutants (caught, missed or timed out), those caught when it ran, its
survivors now accepted as equivalent (bench/mutants-accepted.txt), those caught when rechecked on a
later tree, and those left: not caught, not accepted, or not rechecked (a mutant that timed out
counts as left, the tests having neither passed nor failed). A recheck finds a survivor by its
file, column, change and function, wherever its line is now; the survivor counts as caught since
only if every mutant so found was caught. One the recheck no longer found (its code changed or
moved since) counts as left, and is listed apart ("not found now").
"caught now" is caught when it ran plus caught since; its share is over the viable mutants less
the accepted ones.
"""
import datetime
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mutants_common import accepted, caught_placeless, placeless  # noqa: E402

RESULTS = "bench/results"


def main():
    accepted_now = accepted()
    rows = []
    for path in sorted(glob.glob(f"{RESULTS}/mutants-zerobench-*.json")):
        if path.endswith("-recheck.json") or path.endswith("mutants-summary.json"):
            continue
        d = json.load(open(path))
        c = d["counts"]
        viable = c.get("CaughtMutant", 0) + c.get("MissedMutant", 0) + c.get("Timeout", 0)
        # Timeouts are survivors too (the tests did not fail); the result lists the missed ones.
        survivors = [m["mutant"] for m in d["missed"]]
        timeouts = c.get("Timeout", 0)
        recheck_path = path[: -len(".json")] + "-recheck.json"
        since, found = set(), None
        if os.path.exists(recheck_path):
            r = json.load(open(recheck_path))
            since = caught_placeless(r["outcomes"])
            found = {placeless(o["mutant"]) for o in r["outcomes"]}
        acc = [m for m in survivors if m in accepted_now]
        caught_since = [m for m in survivors if m not in accepted_now and placeless(m) in since]
        left = [m for m in survivors if m not in accepted_now and placeless(m) not in since]
        # Left because the recheck found no such mutant: its code was changed or moved since.
        gone = [m for m in left if found is not None and placeless(m) not in found]
        caught_now = c.get("CaughtMutant", 0) + len(caught_since)
        rows.append({
            "result": os.path.basename(path),
            "package": d["package"],
            "shard": d.get("shard"),
            "partial": bool(d.get("partial")),
            "date": d.get("date"),
            "viable": viable,
            "caught_when_run": c.get("CaughtMutant", 0),
            "timeouts": timeouts,
            "accepted": len(acc),
            "caught_since": len(caught_since),
            "recheck": os.path.basename(recheck_path) if os.path.exists(recheck_path) else None,
            "left": len(left) + timeouts,
            "left_missed": [m for m in left if m not in gone],
            "left_not_found": gone,
            "caught_now": caught_now,
            "caught_now_share": round(caught_now / (viable - len(acc)), 4) if viable > len(acc) else None,
        })
    packages = {}
    for r in rows:
        p = packages.setdefault(r["package"], {"viable": 0, "accepted": 0, "caught_when_run": 0, "caught_now": 0,
                                               "timeouts": 0, "left": 0, "not_found": 0, "results": 0})
        p["results"] += 1
        for k in ("viable", "accepted", "caught_when_run", "caught_now", "timeouts"):
            p[k] += r[k]
        p["left"] += r["left"]
        p["not_found"] += len(r["left_not_found"])
    for p in packages.values():
        p["caught_when_run_share"] = round(p["caught_when_run"] / p["viable"], 4) if p["viable"] else None
        p["caught_now_share"] = round(p["caught_now"] / (p["viable"] - p["accepted"]), 4) if p["viable"] else None
    json.dump({"benchmark": "scripts/mutants-summary.py",
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "packages": packages, "results": rows}, sys.stdout, indent=1)
    print(file=sys.stdout)
    print("| result | viable | caught when run | accepted | caught since | left (not found now) | caught now |",
          file=sys.stderr)
    print("|---|---|---|---|---|---|---|", file=sys.stderr)
    # Shares from the counts, not from the JSON's 4-digit figures: rounding twice shows 0.99546 as
    # 0.996.
    def share(caught, viable, accepted):
        return f"{caught / (viable - accepted):.3f}" if viable > accepted else "-"

    for r in rows:
        r_share = share(r["caught_now"], r["viable"], r["accepted"])
        print(f"| {r['result']} | {r['viable']} | {r['caught_when_run']} | {r['accepted']} | {r['caught_since']} | "
              f"{r['left']} ({len(r['left_not_found'])}) | {r['caught_now']} ({r_share}) |", file=sys.stderr)
    for name, p in packages.items():
        print(f"| **{name}** ({p['results']} results) | {p['viable']} | {p['caught_when_run']} | {p['accepted']} | "
              f"{p['caught_now'] - p['caught_when_run']} | {p['left']} ({p['not_found']}) | {p['caught_now']} "
              f"({share(p['caught_now'], p['viable'], p['accepted'])}) |",
              file=sys.stderr)


if __name__ == "__main__":
    main()
