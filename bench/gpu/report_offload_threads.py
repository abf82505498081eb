"""Reads the runs of `bench/gpu/run.sh offload-threads` and prints, per size of the host AdamW's
thread pool, offload's step time, how fast its copies ran beside the host's update, and the step
over its bound.

    python3 bench/gpu/report_offload_threads.py RUNS HOST.txt COMMIT > offload-threads.json

Run folders are `ot_<exact|delayed>_p<pool>_<round>` and `ot_none_1` (no offload). Per run: the
median step, backward, exposed communication and optimizer phases, and the median rate of the
gradients' copies to the host (`comm.d2h`) and the parameters' back (`comm.h2d`) as the step
records give them (beside the step's other work). The bound is bench/gpu/report_ratio.py's:

    bound = max(GPU compute + the GPU's share of the update, the host's share of the update, transfers)

with the host's update at the fastest pool's measured AdamW rate (`cpu_adamw_p<pool>.json`), so a
pool that updates slower is held to the same bound, and transfers over the pinned copy bandwidth
measured alone (`copies.jsonl`). Per (mode, pool): the median over rounds. A failed run shows as
null."""
import glob
import json
import os
import re
import statistics
import sys

from common import host_date, host_rates, last_json, offload_rows, offload_run as run


def main():
    runs_dir, host = sys.argv[1], open(sys.argv[2]).read()
    commit = sys.argv[3]
    adamw = {}
    for f in glob.glob(os.path.join(runs_dir, "cpu_adamw_p*.json")):
        pool = int(re.search(r"_p(\d+)\.json$", f).group(1))
        adamw[pool] = last_json(f)
    _, bw = host_rates(runs_dir)
    base = run(os.path.join(runs_dir, "ot_none_1"))
    rate = max((a["adamw_params_per_s"] for a in adamw.values() if a), default=None)
    rows = offload_rows(runs_dir, r"ot_(?P<mode>\w+?)_p(?P<pool>\d+)_(?P<round>\d+)",
                        {"mode": str, "pool": int, "round": int}, base, rate, bw)
    summary = []
    for mode, pool in sorted({(r["mode"], r["pool"]) for r in rows}):
        ok = [r for r in rows if (r["mode"], r["pool"]) == (mode, pool) and r["result"]]
        m = lambda f: round(statistics.median(f(r) for r in ok), 3) if ok else None
        a = adamw.get(pool)
        summary.append({"mode": mode, "pool": pool, "runs": len(ok),
                        "failed": sum(1 for r in rows if (r["mode"], r["pool"]) == (mode, pool) and not r["result"]),
                        "host_adamw_gparams_per_s": round(a["adamw_params_per_s"] / 1e9, 3) if a else None,
                        "step_ms": m(lambda r: r["result"]["step_ms"]),
                        "exposed_comm_ms": m(lambda r: r["result"]["exposed_comm_ms"]),
                        "d2h_gbps": m(lambda r: r["result"]["d2h_gbps"]),
                        "h2d_gbps": m(lambda r: r["result"]["h2d_gbps"]),
                        "step_over_bound": m(lambda r: r["bound"]["step_over_bound"]) if ok and all("bound" in r for r in ok) else None,
                        "step_ms_by_round": [r["result"]["step_ms"] for r in ok]})
    print(json.dumps({
        "benchmark": "offload-threads: the host AdamW's pool size beside offload's copies; gpt2-xl, micro-batch 4, "
                     "sequence 1024, stage 2, bf16, one GPU (bench/gpu/report_offload_threads.py)",
        "date": host_date(host), "host": host.strip().splitlines(), "commit": commit,
        "copy_gbps_alone": bw, "cpu_adamw": {str(k): v for k, v in sorted(adamw.items())},
        "no_offload": base, "summary": summary, "runs": rows,
    }, indent=1))


if __name__ == "__main__":
    main()
