#!/usr/bin/env bash
# What evaluation (--eval-every 5) costs the steps: gpt2 (micro-batch 8, sequence 512; 3 repeats)
# and gpt2-xl (micro-batch 4, sequence 1024; 2 repeats) at stage 3 on 2 GPUs, 40 steps on the
# shipped text, with and without evaluation, alternating. Binaries in .carry/ (see
# bench/gpu/host-env.sh); writes $OUT/ev.tar.gz. The runs of gpu-2026-11-26-eval-and-refactor.json
# are these commands, made in two calls (gpt2-xl's in the second).
. bench/gpu/host-env.sh; T=tests/data/declaration-of-independence.txt; W=.carry/zerobench-worker; mkdir -p $OUT/ev
nvidia-smi -L > $OUT/ev/gpus.txt; cat .carry/COMMIT > $OUT/ev/commit.txt
run() { n=$1; shift
  timeout 100 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE $W --device cuda --stage 3 --steps 40 --warmup 5 \
    --data $T "$@" --log-dir $OUT/ev/$n --run-id $n > $OUT/ev/$n.out 2>&1; echo "$n $(tail -1 $OUT/ev/$n.out)"; }
for rep in 1 2 3; do for e in eval noeval; do a=(); [ $e = eval ] && a=(--eval-every 5)
  run gpt2_z3_${e}_r$rep --model gpt2 --micro-batch 8 --seq-len 512 "${a[@]}"; done; done
for rep in 1 2; do for e in eval noeval; do a=(); [ $e = eval ] && a=(--eval-every 5)
  run gpt2-xl_z3_${e}_r$rep --model gpt2-xl --micro-batch 4 --seq-len 1024 "${a[@]}"; done; done
tar czf $OUT/ev.tar.gz -C $OUT ev; rm -rf $OUT/ev
