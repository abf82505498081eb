"""Bus bandwidth of torch.distributed's NCCL collectives, measured exactly like
`worker/examples/nccl_bw.rs` measures zerobench's: bf16, 5 warm-up calls, then 20 back-to-back calls
timed on the host around a device synchronisation. One JSON line per (collective, size) on rank 0.

    torchrun --standalone --nproc_per_node=2 collectives.py BYTES...
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist

WARMUP, ITERS = 5, 20


def main():
    dist.init_process_group("nccl")
    rank, n = dist.get_rank(), dist.get_world_size()
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    for nbytes in map(int, sys.argv[1:]):
        elems = -(-(nbytes // 2) // n) * n
        full = torch.ones(elems, dtype=torch.bfloat16, device=dev)
        shard = full[rank * elems // n:(rank + 1) * elems // n]
        ops = {
            "all_reduce": (lambda: dist.all_reduce(full), 2 * (n - 1) / n),
            "reduce_scatter": (lambda: dist.reduce_scatter_tensor(shard, full), (n - 1) / n),
            "all_gather": (lambda: dist.all_gather_into_tensor(full, shard), (n - 1) / n),
        }
        for name, (fn, factor) in ops.items():
            for _ in range(WARMUP):
                fn()
            torch.cuda.synchronize(dev)
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(ITERS):
                fn()
            torch.cuda.synchronize(dev)
            us = (time.perf_counter() - t0) * 1e6 / ITERS
            if rank == 0:
                size = elems * 2
                print(json.dumps({"impl": "torch.distributed", "op": name, "bytes": size, "ranks": n,
                                  "us": round(us, 1), "busbw_gbps": round(size / (us * 1e-6) * factor / 1e9, 2)}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
