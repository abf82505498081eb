"""Ranks sharing a host's AdamW: what one call on a 2×H100 host measured (the archive of
bench/results/raw/gpu-2026-11-27-offload-two-ranks-h100x2.tar.gz), as one JSON document.

The call ran, from the repository root with the binaries in .carry/ (bench/gpu/host-env.sh
sourced), B=/tmp/zb/mr and A=.carry/examples/cpu_adamw:

    $A 200000000 > $B/adamw/one_32.json
    for rep in 1 2; do $A 200000000 16 > $B/adamw/two_16_a$rep.json & \\
                       $A 200000000 16 > $B/adamw/two_16_b$rep.json & wait; done
    $A 200000000 16 > $B/adamw/one_16.json
    $A 200000000 > $B/adamw/one_32_again.json
    RUNS=$B/g2/runs OR_GPUS=2 OR_RATIOS="1 0.5" OR_MODES=exact OR_REPS=2 \\
      bench/gpu/run.sh offload-ratios --bin .carry --out $B/g2
    RUNS=$B/g1/runs OR_GPUS=1 OR_RATIOS="1 0.5" OR_MODES=exact OR_REPS=2 \\
      bench/gpu/run.sh offload-ratios --bin .carry --out $B/g1

`examples/cpu_adamw` takes the best of seven passes, so two copies started together report what
each got while the other ran for most of its passes (the aggregate is an upper bound).

usage: report_host_share.py EXTRACTED_ARCHIVE_DIR
"""
import glob
import json
import os
import sys

from common import last_json

root = sys.argv[1]


def rate(name):
    r = last_json(os.path.join(root, "adamw", name))
    return {"threads": r["threads"], "adamw_gparams_per_s": round(r["adamw_params_per_s"] / 1e9, 3),
            "fraction_of_bandwidth": r["fraction_of_bandwidth"],
            "triad_gbps_with_write_allocate": r["triad_gbps_with_write_allocate"]}


adamw = {os.path.basename(f)[:-5]: rate(os.path.basename(f)) for f in sorted(glob.glob(os.path.join(root, "adamw", "*.json")))}
together = [[adamw[f"two_16_a{i}"]["adamw_gparams_per_s"], adamw[f"two_16_b{i}"]["adamw_gparams_per_s"]] for i in (1, 2)]
ratios = {g: json.load(open(os.path.join(root, g, "offload-ratios.json"))) for g in ("g1", "g2")}
steps = {g: {f"{r['ratio']:g}": sorted(round(x["result"]["step_ms"], 1) for x in d["runs"] if x["ratio"] == r["ratio"])
             for r in d["summary"]} for g, d in ratios.items()}
print(json.dumps({
    "benchmark": "ranks sharing a host's AdamW: examples/cpu_adamw as one process and as two at once, "
                 "and gpt2-xl's offloaded step (stage 2, micro-batch 4, exact) on 2 GPUs and on 1 of one host "
                 "(bench/gpu/report_host_share.py)",
    "host": ratios["g2"]["host"],
    "commit": ratios["g2"]["commit"],
    "cpu_adamw": adamw,
    "cpu_adamw_two_at_once": {"pairs": together, "sums": [round(sum(p), 2) for p in together]},
    "no_offload_step_ms": {"2 GPUs": ratios["g2"]["no_offload"]["step_ms"], "1 GPU": ratios["g1"]["no_offload"]["step_ms"]},
    "offloaded_step_ms_by_ratio": {"2 GPUs (two ranks on the host)": steps["g2"], "1 GPU (one rank)": steps["g1"]},
    "summary": {
        "two_over_one_rank_step": {r: round(sum(steps["g2"][r]) / sum(steps["g1"][r]), 3) for r in steps["g1"]},
        "cpu_adamw_one_process_gparams_per_s": [adamw["one_32"]["adamw_gparams_per_s"], adamw["one_32_again"]["adamw_gparams_per_s"]],
    },
}, indent=1))
