"""Reads the runs of `bench/gpu/run.sh offload-ab` and prints, per offload case, both builds' step
times (median of each run's measured steps, then over the rounds), the new build's over the base's
round by round, where the step's time went, and whether the two builds' losses are the same at every
step of every round (and their largest difference). gpt2-xl's losses differ between runs of one
build on the GPU, so the row without offload gives the runs' own difference; `same-losses` checks
bit-identity on a model and text that repeat exactly.

    python3 bench/gpu/report_offload_ab.py RUNS HOST.txt BASE-COMMIT NEW-COMMIT > offload-ab.json

Run folders are `oa_<case>_<base|new>_<round>` and `oa_none_<build>_1` (no offload). A failed run
shows as null, and its round is left out of the ratios.

Every run is on the same number of GPUs (its `ranks`); the bound counts each rank of the host
against its AdamW (`ranks_on_host`).

Per case also the GPU's part of bench/gpu/report_ratio.py's bound: the run without offload's
forward and backward plus its optimizer phase times the share of the parameters the device updates
(the build's own run without offload). Where RUNS holds the host's `cpu_adamw.json` and
`copies.jsonl` from the same call (the phase measures them after the runs; earlier calls did
not), the host's update (parameters on the host over its AdamW rate)
and the transfers (2 bytes per host parameter each way over the slower copy direction) join it,
and the bound is the largest of the three."""
import json
import statistics
import sys

from common import ab_runs, host_date, host_rates, offload_bound, offload_run


def bound(run, none, rates):
    """The step's bound for `run` against the same build's run without offload (see above)."""
    b = offload_bound(run["device_params"], run["host_params"], none, *(rates or (None, None)),
                      ranks_on_host=run["ranks_on_host"])
    return {k: round(v, 3) for k, v in b.items()}


def main():
    runs_dir, host, base_commit, new_commit = sys.argv[1], open(sys.argv[2]).read(), sys.argv[3], sys.argv[4]
    adamw, copies = host_rates(runs_dir)
    rates = (adamw["adamw_params_per_s"], min(copies.values())) if adamw and copies else None
    found = ab_runs(runs_dir, "oa", offload_run)
    summary, cases = [], {}
    for case in sorted(found):
        by = found[case]
        rounds = sorted(set(by.get("base", {})) | set(by.get("new", {})))
        paired = [r for r in rounds if by.get("base", {}).get(r) and by.get("new", {}).get(r)]
        ratios = [round(by["new"][r]["step_ms"] / by["base"][r]["step_ms"], 4) for r in paired]
        same = all(by["new"][r]["losses"] == by["base"][r]["losses"] for r in paired) if paired else None
        diff = max((abs(a - b) for r in paired for a, b in zip(by["new"][r]["losses"], by["base"][r]["losses"])),
                   default=None)
        med = lambda b: round(statistics.median(by[b][r]["step_ms"] for r in rounds if by.get(b, {}).get(r)), 3) \
            if any(by.get(b, {}).get(r) for r in rounds) else None
        row = {"case": case, "base_step_ms": med("base"), "new_step_ms": med("new"),
               "new_over_base_by_round": ratios, "identical_losses": same, "largest_loss_difference": diff,
               "failed": sum(1 for b in ("base", "new") for r in rounds if not by.get(b, {}).get(r))}
        for b in ("base", "new"):
            none = found.get("none", {}).get(b, {}).get(1)
            first = next((by[b][r] for r in rounds if by.get(b, {}).get(r)), None)
            if case != "none" and none and first and row[f"{b}_step_ms"]:
                bd = row[f"{b}_bound"] = bound(first, none, rates)
                # Without the host's rates only the GPU's part is known: the step over it is an
                # upper limit of the step over the bound, and exactly that where the GPU's part is
                # the largest.
                key = "step_over_bound" if "bound_ms" in bd else "step_over_gpu_part"
                row[f"{b}_{key}"] = round(row[f"{b}_step_ms"] / bd.get("bound_ms", bd["gpu_ms"]), 4)
        summary.append(row)
        cases[case] = {b: {str(r): v for r, v in sorted(by.get(b, {}).items())} for b in ("base", "new")}
    print(json.dumps({
        "benchmark": "offload-ab: offload's step time with two builds alternating; gpt2-xl, micro-batch 4, "
                     "sequence 1024, bf16, on OA_GPUS GPUs (each run's `ranks`; bench/gpu/report_offload_ab.py)",
        "date": host_date(host), "host": host.strip().splitlines(),
        "builds": {"base": base_commit, "new": new_commit},
        "host_rates": {"adamw_params_per_s": rates[0], "copy_gbps_slower": rates[1]} if rates else None,
        "summary": summary, "cases": cases,
    }, indent=1))


if __name__ == "__main__":
    main()
