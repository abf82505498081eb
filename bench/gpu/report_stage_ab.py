"""Reads the runs of `bench/gpu/run.sh stage-ab` and prints, per case (model, stage, micro-batch,
with or without `--cuda-graph`, one GPU, no offload), both builds' step times (each run's median
over its measured steps, then the median over the rounds), the new build's over the base's round by
round, the phases and collectives' time, the peak allocated memory and the engine's persistent
buffers, and whether the two builds' losses are identical at every step of every round.

    python3 bench/gpu/report_stage_ab.py RUNS HOST.txt BASE-COMMIT NEW-COMMIT > stage-ab.json

Run folders are `sa_<case>_<base|new>_<round>`; a failed run shows as null and its round is left
out of the ratios."""
import json
import statistics
import sys

from common import ab_runs, build_summary, host_date, median, rank0_records, run_parts


def run(d):
    """A run as build_summary gives it, with its collectives' median time and its buffers."""
    recs = rank0_records(d)
    s = build_summary(recs)
    if s is None:
        return None
    _, setup, steps = run_parts(recs)
    s["comm_ms"] = round(median(steps, "comm_ms"), 3)
    s["exposed_comm_ms"] = round(median(steps, "exposed_comm_ms"), 3)
    s["buffers_gib"] = round(sum(setup["buffers_bytes"].values()) / 2**30, 3)
    return s


def main():
    runs_dir, host, base_commit, new_commit = sys.argv[1], open(sys.argv[2]).read(), sys.argv[3], sys.argv[4]
    found = ab_runs(runs_dir, "sa", run)
    summary, cases = [], {}
    for case in sorted(found):
        by = found[case]
        rounds = sorted(set(by.get("base", {})) | set(by.get("new", {})))
        ok = lambda b, r: by.get(b, {}).get(r)
        paired = [r for r in rounds if ok("base", r) and ok("new", r)]
        row = {"case": case}
        for b in ("base", "new"):
            done = [by[b][r] for r in rounds if ok(b, r)]
            for key in ("step_ms", "backward_ms", "comm_ms", "exposed_comm_ms"):
                row[f"{b}_{key}"] = round(statistics.median(x[key] for x in done), 3) if done else None
            row[f"{b}_peak_allocated_gib"] = max((x["peak_allocated_gib"] for x in done), default=None)
            row[f"{b}_buffers_gib"] = done[0]["buffers_gib"] if done else None
        row["new_over_base_by_round"] = [round(by["new"][r]["step_ms"] / by["base"][r]["step_ms"], 4) for r in paired]
        row["identical_losses"] = all(by["new"][r]["losses"] == by["base"][r]["losses"] for r in paired) if paired else None
        row["failed"] = sum(1 for b in ("base", "new") for r in rounds if not ok(b, r))
        summary.append(row)
        cases[case] = {b: {str(r): v for r, v in sorted(by.get(b, {}).items())} for b in ("base", "new")}
    print(json.dumps({
        "benchmark": "stage-ab: one GPU without offload, two builds alternating round by round, bf16, "
                     "sequence 1024 (bench/gpu/run.sh stage-ab, bench/gpu/report_stage_ab.py)",
        "date": host_date(host), "host": host.strip().splitlines(),
        "builds": {"base": base_commit, "new": new_commit},
        "summary": summary, "runs": cases}, indent=1))


if __name__ == "__main__":
    main()
