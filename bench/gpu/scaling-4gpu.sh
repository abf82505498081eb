#!/usr/bin/env bash
# gpt2-xl (micro-batch 4, sequence 1024) at stages 1-3 on 1 and 4 GPUs, without and with gradient
# accumulation 8, and gpt2 on the shipped text at stages 0-3 on 4 GPUs (losses and model states):
# the 4-GPU subset of the scaling study that fits one short call. Binaries in .carry/ (see
# bench/gpu/host-env.sh); writes $OUT/x4.tar.gz, updated after every run.
. bench/gpu/host-env.sh; W=.carry/zerobench-worker; R=$OUT/x4; mkdir -p $R; T=tests/data/declaration-of-independence.txt
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; cat .carry/COMMIT; } > $R/host.txt
run() { n=$1; np=$2; shift 2; timeout 90 mpirun -np $np --bind-to none -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE $W --device cuda --log-dir $R/$n --run-id $n "$@" > $R/$n.out 2>&1; echo "$n rc=$? $(tail -1 $R/$n.out)"; tar czf $OUT/x4.tar.gz -C $OUT x4; }
for s in 1 2 3; do for np in 1 4; do run xl_z${s}_n${np} $np --model gpt2-xl --stage $s --micro-batch 4 --seq-len 1024 --steps 20 --warmup 4; done; done
for s in 1 2 3; do for np in 1 4; do run xl_z${s}_n${np}_ga8 $np --model gpt2-xl --stage $s --micro-batch 4 --seq-len 1024 --grad-accum 8 --steps 8 --warmup 2; done; done
for s in 0 1 2 3; do run text_z${s}_n4 4 --model gpt2 --stage $s --micro-batch 2 --seq-len 256 --steps 12 --warmup 2 --data $T; done
