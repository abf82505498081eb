#!/usr/bin/env bash
# The GPU benchmarks, run on a GPU host from the repository root with the binaries built
# here (see docs/results/reproducing.md):
#
#   bench/gpu/run.sh PHASE... [--bin DIR] [--out DIR]
#
# Phases:
#   smoke        1 and 2 GPUs, every stage, a few steps of gpt2: everything starts and logs
#   selfcheck    the worker's device code against CPU references and closed forms
#                (worker/examples/selfcheck.rs: fused AdamW vs CPU AdamW, pinned copies, event clock,
#                step-time definition, NVML) and every collective at odd sizes (nccl_bw); writes
#                selfcheck.json naming the commit (from $BIN/COMMIT)
#   step-time    one GPU: zerobench gpt2 (micro-batch 16) and gpt2-xl (micro-batch 4) at stages 0-3,
#                and the references (PyTorch eager and torch.compile, DeepSpeed at stages 0-3; head
#                padded as zerobench pads it) on the same shapes, in one call (STEP_MODELS and
#                STEP_REFS pick, STEP_REFS=compile-reduce-overhead adds torch.compile's CUDA graphs,
#                MODE+master a mode with bf16 parameters and fp32 masters as zerobench keeps them,
#                MODE+fused the same with one compiled update pass; STEP_EAGER=0 skips eager runs;
#                STEP_GRAPH=1 adds zerobench's --cuda-graph at every stage; bench/gpu/report_step.py
#                reads it)
#   cuda-graph   one GPU, --cuda-graph against eager: t5-large micro-batch 1 (sequence 512) and gpt2
#                micro-batch 4 with the worker in BASE_BIN, this build eager and this build replaying
#                graphs, alternating, twice each; then the losses of graphs against eager (gpt2
#                stages 0-3, accumulation, the shipped text with evaluation, t5-small; a second
#                eager run gives the run-to-run spread); bench/gpu/report_graph.py reads it
#   correctness  2 GPUs, stages 0-3, gpt2 on the shipped text: loss curves to compare
#   gpt2         zerobench stages 0-3 on 1 and 2 GPUs, gpt2, micro-batch 16, sequence 1024
#   gpt2-xl      the same for gpt2-xl, micro-batch 4
#   reference    the PyTorch reference (eager, DDP, FSDP2) on the same shapes
#   collectives  bus bandwidth of zerobench's NCCL collectives and torch.distributed's
#   profile      traced and profiled runs (gpt2 stage 0 on 1 GPU, gpt2-xl stage 3 on 2 GPUs)
#   interference compute slowed by a transfer beside it (NCCL vs copy engines), and NCCL settings
#   knobs        gpt2-xl on 2 GPUs under bucket sizes, prefetch depths, CUDA_DEVICE_MAX_CONNECTIONS=1
#   copy-engines the copy-engine transport (--copy-engines all-gather|all): collectives checked and
#                timed, gpt2 losses against NCCL's
#   copy-engines-xl  gpt2-xl on 2 GPUs with NCCL and each copy-engine setting (stages XL_STAGES,
#                XL_REPS times), and stage 3 with hpZ over the copy engines
#   ctas         2-GPU sweeps with NCCL capped at 8 and 16 thread blocks per collective
#   eager        the one-GPU eager PyTorch reference only (the target's denominator)
#   offload      gpt2-xl stages 2 and 3 on 1 and 2 GPUs with and without CPU offload, hpZ on 2 GPUs,
#                plus the CPU AdamW benchmark and pinned copy bandwidth of this host
#   faults       a rank killed, a rank frozen, a configuration that does not fit
#   offload1     the one-GPU offload runs alone
#   offload-ratio  gpt2-xl stage 2, micro-batch 4, on 1 and 2 GPUs: no offload, and --offload
#                optimizer at ratios 1, `zerobench plan`'s proposal for exact steps and RATIOS
#                (default 0.75 0.5 0.25), and the delayed update at ratios 1 and the plan's proposal
#                for it; then the
#                page-locking microbenchmark (examples/pin_bench)
#   fits         the largest preset each stage and offload setting fits on one GPU (sequence 512)
#   verify       2 GPUs: fp16 (dynamic loss scaling) and tiny-llama on the shipped text, stages 0 and 3
#   t5           the GPU subset of the DeepSpeed profiling study's T5 grid (slurm/examples/t5-grid-gpu.yaml)
#                through `zerobench local`, then `zerobench ingest` over its run folders
#   rendezvous   2 GPUs, ranks started by RANK/WORLD_SIZE/MASTER_ADDR (no MPI): collectives and the
#                copy engines through the TCP store, and gpt2 stage 3's losses against mpirun's
#   first-touch  examples/pin_bench first-touch FT_GIB (default 20): six fresh regions of host
#                memory faulted in by writing zeros, by a write per page and by the kernel
#                (MADV_POPULATE_WRITE), then page-locked, on memory the process never had and again
#                on memory it had back (run it first on a freshly started host: 6 x FT_GIB of it)
#   offload-setup  how long offload takes to set up (host_state_setup_ms, setup_ms): gpt2-xl stage 2
#                and t5-11b stage 3 with everything on the host, one GPU, two steps
#   same-losses  a refactor's check: the same configurations (every stage, accumulation, offload
#                and its ratio and delayed update, fp16, hpZ; 2 GPUs, the shipped text) with the
#                worker in --bin and the one in BASE_BIN, every step's loss compared; writes
#                same-losses.json (a second run of BASE_BIN on two of them gives the run-to-run
#                spread); SL_MATCH (a grep pattern) keeps the cases whose names match
#   gemm-algos   one GPU: every cuBLASLt algorithm for the products of one gpt2-xl and one gpt2 step;
#                GEMM_HOT=MS adds gpt2-xl's cold choices against the fastest at the power limit
#   clocks       one GPU: the SM clock, power and throttle reasons (nvidia-smi, call after call) while
#                zerobench's gpt2-xl (micro-batch 4, stage 0) runs replayed and eager (CLOCK_STEPS steps,
#                default 80) and the reference through torch.compile's CUDA graphs (CLOCK_REFS,
#                default compile-reduce-overhead; empty: none); writes clocks.json (bench/gpu/report_clocks.py)
#   kernels      one GPU: one profiled step (every kernel, by class, and the gaps between them) of
#                zerobench's gpt2-xl (micro-batch 4, stage 0, eager and replayed) and of the PyTorch reference in
#                the modes of KERNEL_REFS (default "compile compile-reduce-overhead"), in one call;
#                writes kernels.json
#   lifecycle    one GPU: the worker's start-up and ending (a normal run, NCCL unable to start, two ranks
#                with --device auto on one GPU, SIGUSR1 and SIGTERM mid-run), each checked against
#                its promised records and exit code; writes lifecycle.json (bench/gpu/report_lifecycle.py)
#   step-ab      one GPU (AB_GPUS: more): the step-time targets' configurations (AB_CASES, MODEL:MICRO_BATCH:STAGE:eager|graph)
#                with this build and the one in BASE_BIN alternating (AB_REPS rounds); AB_PROFILE=1
#                adds a profiled gpt2 and gpt2-xl step of each; writes step-ab.json (bench/gpu/report_ab.py)
#   same-speed   a refactor's check of speed: device-bound runs (gpt2-xl micro-batch 4 at stages 1-3
#                on 2 GPUs, stage 2 with optimizer offload on 1), the worker in --bin and the one in
#                BASE_BIN alternating, twice each; writes same-speed.json
#   costmodel    the cost model's sweep (bench/gpu/costmodel-runs.txt): the runs `zerobench fit`
#                is fitted on (runs/cm-fit) and the held-out runs it is checked against
#                (runs/cm-holdout); one-GPU runs one at a time (CM_PARALLEL=2: two at once on two
#                GPUs; CM_SETS="fit" or "holdout" runs one set, CM_MATCH='gpt2*' the runs so named,
#                CM_LANES=any the one-GPU runs without host work; CM_LIST another list, e.g.
#                bench/gpu/costmodel-runs-4gpu.txt)
#   launch-cpu   one GPU: launch-bound configurations, a device-bound one and an offloaded one
#                (LC_CASES, MODEL:MICRO_BATCH:SEQ:STAGE[:OFFLOAD]) with each --launch-cpu of
#                LC_SETTINGS (default "none auto"; a CPU number too) in turn (LC_REPS rounds,
#                default 3, the order turned each round); writes
#                launch-cpu.json (bench/gpu/report_launch_cpu.py)
#   offload-threads  how many threads the host's AdamW should use beside offload's copies: the
#                host's AdamW rate (examples/cpu_adamw) with each pool size of OT_POOLS (default:
#                all cores but one, half of them, a quarter), then gpt2-xl micro-batch 4, stage 2,
#                one GPU, at offload ratio OT_RATIO (default 0.24) exact and with the delayed update,
#                with each pool size (--threads one more) in OT_REPS rounds (default 2, the order
#                turned each round), and the run without offload; writes offload-threads.json
#                (bench/gpu/report_offload_threads.py)
#   offload-ratios  Twin-Flow's ratio around the plan's proposal: gpt2-xl micro-batch 4, stage 2,
#                on OR_GPUS GPUs (default 1), the optimizer on the host at each ratio of OR_RATIOS
#                (default 0.12 0.16 0.2 0.24 0.3) exact and with the delayed update (OR_MODES), OR_REPS rounds (default 2,
#                the order turned each round), after the run without offload and the host's AdamW
#                rate and pinned copies; writes offload-ratios.json (bench/gpu/report_offload_ratios.py)
#   offload-ab   offload's step time and losses with this build and the one in BASE_BIN
#                alternating: gpt2-xl micro-batch 4, on OA_GPUS GPUs (default 1), each case of OA_CASES
#                (STAGE:OFFLOAD:RATIO[:delayed], default the plan's ratio and all on the host at
#                stage 2, and stage 3 with the optimizer and with parameters too) in OA_REPS rounds
#                (default 2, the order turned each round), after a run without offload per build;
#                then the host's AdamW rate and pinned copies for the bound (carry cpu_adamw and
#                nccl_bw in --bin's examples/); writes offload-ab.json (bench/gpu/report_offload_ab.py)
#   stage-ab     one GPU without offload, this build against the one in BASE_BIN alternating:
#                each case of SA_CASES (MODEL:STAGE:MICRO-BATCH[:graph], default gpt2-xl at
#                micro-batch 4, stages 0-3) in SA_REPS rounds (default 3, the order turned each
#                round); writes stage-ab.json (bench/gpu/report_stage_ab.py)
#   offload-builds  offload's step time across builds: gpt2-xl micro-batch 4, stage 2, optimizer on
#                the host, one GPU, with the worker of each carried build folder in OB_BUILDS (the first
#                the base) in turn, OB_REPS rounds (default 3, the order turned each round); each run's
#                huge-page share of resident memory read mid-run; then this host's CPU AdamW
#                (examples/cpu_adamw of --bin); writes offload-builds.json
#                (bench/gpu/report_offload_builds.py)
#   binding      how steady launch-bound steps are (NOISE_RUNS, one-GPU costmodel runs by name): each
#                run NOISE_REPS times alone, two at once (one per GPU, as costmodel's CM_PARALLEL=2
#                runs them) free on the host, and two at once each bound to its GPU's local CPUs
#                (taskset); writes binding.json (bench/gpu/report_binding.py)
#
# Every worker log and JSON line lands in OUT (default $OUT, else bench-out/); `results.tar.gz`
# packs them for the trip back, with the phases' JSON reports, after each phase (PACK_EVERY_RUN=1:
# after each worker run too).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
BIN=target/release
OUTDIR=${OUT:-bench-out}
phases=()
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) BIN=$2; shift 2 ;;
    --out) OUTDIR=$2; shift 2 ;;
    *) phases+=("$1"); shift ;;
  esac
done
. bench/gpu/host-env.sh
W=$BIN/zerobench-worker
GPUS=$(nvidia-smi -L | wc -l)
# Raw runs stay outside OUT (which brings back few files); each phase packs them into OUT. A
# RUNS of your own must end in /runs (the reports find the logs under runs/ in the archive). By
# default each invocation gets a folder of its own: on a machine kept warm between calls, one
# shared folder packed the earlier calls' runs into a later call's archive, and a phase run again
# found its runs' logs already there (the worker refuses to write over them).
RUNS=${RUNS:-$(mktemp -d /tmp/zerobench-bench.XXXXXX)/runs}
[ "$(basename "$RUNS")" = runs ] || { echo "RUNS must end in /runs: $RUNS" >&2; exit 2; }
mkdir -p "$RUNS" "$OUTDIR"
log() { printf '[bench %s] %s\n' "$(date +%T)" "$*" | tee -a "$OUTDIR/bench.log" >&2; }

# pack: the runs so far, the host and the log, as OUTDIR/results.tar.gz, written aside and then
# renamed, so that a call cut short leaves the last whole archive, never a truncated one.
pack() {
  cp "$OUTDIR/host.txt" "$OUTDIR/bench.log" "$RUNS/.."
  # The phases' reports (selfcheck.json, step-ab.json, ...) go in the archive too, so that one left
  # behind on the trip back is still there.
  local reports=() f
  for f in "$OUTDIR"/*.json; do
    [ -e "$f" ] || continue
    cp "$f" "$RUNS/.." && reports+=("$(basename "$f")")
  done
  tar -C "$RUNS/.." -czf "$OUTDIR/.results.tar.gz" runs host.txt bench.log "${reports[@]}" &&
    mv "$OUTDIR/.results.tar.gz" "$OUTDIR/results.tar.gz"
}

# DeepSpeed for the references: the hosts have none and no internet, so its wheel and those of its
# pure-Python needs come in $BIN/ds when carried (docs/results/reproducing.md says how to make them).
if [ -d "$BIN/ds" ] && ! python3 -c 'import deepspeed' 2>/dev/null; then
  site=/tmp/zerobench-bench/site
  python3 -m pip install -q --no-index --no-deps --target "$site" "$BIN"/ds/*.whl > /dev/null 2>&1 \
    && export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
fi

{
  echo "date: $(date -u +%FT%TZ)"; echo "host: $(hostname)"
  # Host names of the GPU machines say nothing ("vm" on every one): the GPUs' UUIDs tell calls on
  # one machine from calls on another.
  nvidia-smi --query-gpu=name,driver_version,memory.total,uuid --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", ".".join(map(str, torch.cuda.nccl.version())))'
  python3 -c 'import deepspeed; print("deepspeed", deepspeed.__version__)' 2>/dev/null || echo "deepspeed: not installed"
  nproc; mpirun --version | head -1
} > "$OUTDIR/host.txt" 2>&1
cat "$OUTDIR/host.txt" >&2

# worker NAME NP ARGS...: one zerobench run; failures are logged, not fatal to the sweep.
# WORKER_ENV="NAME=VALUE ..." adds variables to every rank's environment; a run is stopped after
# WORKER_TIMEOUT seconds (default 900); WORKER_WRAP="COMMAND ARGS" runs the worker under it (taskset).
worker() {
  local name=$1 np=$2; shift 2
  local t0=$SECONDS xs=() kv
  for kv in ${WORKER_ENV:-}; do xs+=(-x "${kv%%=*}"); done
  env ${WORKER_ENV:-} timeout "${WORKER_TIMEOUT:-900}" mpirun -np "$np" "${xs[@]}" -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x NVSHMEM_DISABLE_NVLS \
    --bind-to none ${WORKER_WRAP:-} "$W" --device cuda --log-dir "$RUNS/$name" --run-id "$name" "$@" > "$RUNS/$name.out" 2>&1
  local rc=$?
  log "$name: rc=$rc in $((SECONDS - t0)) s: $(tail -n 1 "$RUNS/$name.out")"
  # PACK_EVERY_RUN=1: a call that may be cut short (a device budget ending) brings back every
  # run finished before the cut, not only those of the phases that ended.
  if [ "${PACK_EVERY_RUN:-0}" = 1 ]; then pack; fi
}

# commit_of DIR: the commit a carried build was made at (its COMMIT file), or "unknown".
commit_of() { cat "$1/COMMIT" 2>/dev/null || echo unknown; }

# host_rates: this host's AdamW rate (examples/cpu_adamw, RUNS/cpu_adamw.json; CPU_ADAMW_RANKS, a
# list such as 2,4, adds what each of that many ranks gets at once) and its pinned copy bandwidth
# each way (examples/nccl_bw, RUNS/copies.jsonl), as the offload reports read them.
host_rates() {
  # shellcheck disable=SC2046
  "$BIN/examples/cpu_adamw" 200000000 ${CPU_ADAMW_RANKS:+$(nproc) "$CPU_ADAMW_RANKS"} > "$RUNS/cpu_adamw.json" 2>&1
  log "cpu_adamw: $(cat "$RUNS/cpu_adamw.json")"
  mpirun -np 1 -x LD_LIBRARY_PATH --bind-to none "$BIN/examples/nccl_bw" 1073741824 > "$RUNS/copies.jsonl" 2>&1
  log "copies: $(grep -h '2[dh]' "$RUNS/copies.jsonl" | tr '\n' ' ')"
}

# turned ROUND WORD...: the words in their order on odd rounds and reversed on even ones, so that
# alternating settings each go first as often.
turned() { local r=$1; shift; if [ $((r % 2)) = 1 ]; then echo "$*"; else printf '%s\n' "$@" | tac | xargs; fi; }

# gpt2xl_offload NAME NP MODE RATIO [ARGS...]: gpt2-xl, micro-batch 4, stage 2, the optimizer on
# the host at RATIO, exact or (MODE delayed) with the delayed update from the first measured step.
gpt2xl_offload() {
  local name=$1 np=$2 mode=$3 r=$4 extra=(); shift 4
  [ "$mode" = exact ] || extra=(--delayed-update --delayed-update-after 4)
  worker "$name" "$np" --model gpt2-xl --stage 2 --offload optimizer --offload-ratio "$r" --micro-batch 4 \
    --steps 12 --warmup 4 "${extra[@]}" "$@"
}

# report_summary FILE: logs the "summary" of a report's JSON.
report_summary() {
  log "$(basename "$1" .json): $(python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["summary"]))' "$1")"
}

# build_worker WHICH: the worker a phase comparing two builds runs for WHICH ("base": BASE_BIN's,
# anything else: this build's).
build_worker() { if [ "$1" = base ]; then echo "$BASE_BIN/zerobench-worker"; else echo "$BIN/zerobench-worker"; fi; }

# reference NAME NP ARGS...: one PyTorch reference run: its single-process modes (reference.py
# lists them, asked once) on one GPU as one process, everything else under torchrun.
SINGLE_PROCESS_MODES=
reference() {
  local name=$1 np=$2; shift 2
  local t0=$SECONDS
  [ -n "$SINGLE_PROCESS_MODES" ] || SINGLE_PROCESS_MODES=" $(python3 bench/gpu/reference.py --single-process-modes) "
  if [ "$np" = 1 ] && [ "$1" = "--mode" ] && [[ "$SINGLE_PROCESS_MODES" == *" $2 "* ]]; then
    timeout "${WORKER_TIMEOUT:-900}" python3 bench/gpu/reference.py "$@" > "$RUNS/$name.json" 2> "$RUNS/$name.err"
  else
    timeout "${WORKER_TIMEOUT:-900}" torchrun --standalone --nproc_per_node="$np" bench/gpu/reference.py "$@" > "$RUNS/$name.json" 2> "$RUNS/$name.err"
  fi
  log "$name: rc=$? in $((SECONDS - t0)) s: $(cat "$RUNS/$name.json")"
}

# gpt2-xl stage 0 on one GPU, long enough to overlap a neighbour: the interference phases' reference.
xl1=(--model gpt2-xl --stage 0 --micro-batch 4 --seq-len 1024 --steps 60 --warmup 5)
xl2=(--model gpt2-xl --micro-batch 4 --seq-len 1024 --steps 15 --warmup 3)

sweep() {  # sweep MODEL MICRO_BATCH [GPU COUNTS [SUFFIX EXTRA-ARGS...]]
  local model=$1 mb=$2 counts=${3:-"1 2"} suffix=${4:-}
  shift $(( $# < 4 ? $# : 4 ))
  for g in $counts; do
    [ "$g" -le "$GPUS" ] || continue
    for s in 0 1 2 3; do
      worker "${model}_z${s}_mb${mb}_${g}gpu${suffix}" "$g" --model "$model" --stage "$s" --micro-batch "$mb" \
        --seq-len 1024 --steps 15 --warmup 3 "$@"
    done
  done
}

for phase in "${phases[@]}"; do
  log "phase $phase"
  case "$phase" in
    smoke)
      worker smoke_tiny_1gpu 1 --model tiny --stage 0 --steps 4 --warmup 1 --seq-len 128 --micro-batch 4
      for s in 0 1 2 3; do worker "smoke_gpt2_z${s}_2gpu" 2 --model gpt2 --stage "$s" --micro-batch 4 --steps 4 --warmup 1; done
      for r in "$RUNS"/smoke_*/rank0.jsonl; do log "$r: $(grep -c '"event":"step"' "$r") steps; $(grep -o '"event":"error".*' "$r" | head -c 400)"; done
      grep -h '"event":"setup"' "$RUNS"/smoke_gpt2_z*_2gpu/rank0.jsonl | head -c 3000 >&2; echo >&2
      grep -h '"event":"step"' "$RUNS"/smoke_gpt2_z3_2gpu/rank0.jsonl | tail -n 1 >&2 ;;
    verify)
      # Paths the bf16 GPT-2 runs do not take: fp16's overflow check and loss scale, and the
      # Llama blocks (rotary tables, grouped-query attention) on CUDA. Each pair must agree.
      for s in 0 3; do
        worker "verify_gpt2_fp16_z${s}_2gpu" 2 --model gpt2 --precision fp16 --stage "$s" --micro-batch 8 --seq-len 256 \
          --steps 40 --warmup 2 --lr 3e-4 --data tests/data/declaration-of-independence.txt
        worker "verify_tiny-llama_z${s}_2gpu" 2 --model tiny-llama --stage "$s" --micro-batch 8 --seq-len 256 \
          --steps 40 --warmup 2 --lr 3e-4 --data tests/data/declaration-of-independence.txt
      done ;;
    t5)
      # The rendered jobs start `zerobench-worker` by name, from the run folders: an absolute PATH entry.
      PATH="$(cd "$BIN" && pwd):$PATH" "$BIN/zerobench" local slurm/examples/t5-grid-gpu.yaml --out "$RUNS/t5-grid" > "$RUNS/t5-local.out" 2>&1
      log "t5 local: rc=$? $(tail -n 3 "$RUNS/t5-local.out" | tr '\n' ' ')"
      "$BIN/zerobench" ingest "$RUNS/t5-grid" --out "$RUNS/t5-tables" > "$RUNS/t5-ingest.out" 2>&1
      log "t5 ingest: rc=$?" ;;
    rendezvous)
      # Ranks started by the environment convention, as torchrun or pdsh start them: NCCL's unique
      # id and the copy engines' CUDA IPC handles go through the TCP store rank 0 hosts.
      envrun() {  # envrun NAME PORT PROGRAM ARGS...: 2 ranks, one per GPU
        local name=$1 port=$2; shift 2
        for r in 0 1; do
          RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 300 "$@" \
            > "$RUNS/$name.r$r.out" 2>&1 &
        done
        wait
        log "$name: $(tail -n 2 "$RUNS/$name.r0.out" | tr '\n' ' ' | cut -c1-400)"
      }
      envrun env_nccl_bw 29510 "$BIN/examples/nccl_bw" 1048576 67108864
      envrun env_nccl_bw_copy_engines 29511 "$BIN/examples/nccl_bw" --copy-engines 1048576 67108864
      gpt2z3=(--device cuda --model gpt2 --stage 3 --micro-batch 8 --seq-len 512 --steps 20 --warmup 2 \
        --data tests/data/declaration-of-independence.txt)
      envrun env_gpt2_z3_2gpu 29512 "$W" "${gpt2z3[@]}" --log-dir "$RUNS/env_gpt2_z3_2gpu" --run-id env_gpt2_z3_2gpu
      worker mpi_gpt2_z3_2gpu 2 "${gpt2z3[@]:2}"
      python3 - "$RUNS" <<'PY' | tee -a "$OUTDIR/bench.log" >&2
import json, sys
runs = sys.argv[1]
def losses(name):
    recs = [json.loads(l) for l in open(f"{runs}/{name}/rank0.jsonl")]
    start = next(r for r in recs if r["event"] == "start")
    return start["rank_source"], start["comm_backend"], [r["loss"] for r in recs if r["event"] == "step"]
e, m = losses("env_gpt2_z3_2gpu"), losses("mpi_gpt2_z3_2gpu")
diff = max(abs(a - b) for a, b in zip(e[2], m[2]))
print(json.dumps({"rendezvous_check": "gpt2 stage 3, 2 GPUs", "env": e[:2], "mpi": m[:2], "steps": [len(e[2]), len(m[2])],
                  "max_loss_difference": diff, "identical": e[2] == m[2]}))
PY
      # A GPU rank without LOCAL_RANK cannot know its device: it must stop naming the variable.
      for r in 0 1; do
        RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29513 timeout 120 "$W" --device cuda --model tiny \
          --stage 0 --steps 4 --rendezvous-timeout-s 20 --log-dir "$RUNS/env_no_local_rank" > "$RUNS/env_no_local_rank.r$r.out" 2>&1 &
      done
      wait
      log "env_no_local_rank: $(tail -n 1 "$RUNS/env_no_local_rank.r1.out" | cut -c1-300)" ;;
    first-touch)
      "$BIN/examples/pin_bench" first-touch "${FT_GIB:-20}" > "$RUNS/first_touch.jsonl" 2> "$RUNS/first_touch.err"
      log "first-touch: $(tr '\n' ' ' < "$RUNS/first_touch.jsonl") $(tail -c 500 "$RUNS/first_touch.err")" ;;
    offload-setup)
      worker setup_gpt2-xl_z2_optimizer_1gpu 1 --model gpt2-xl --stage 2 --offload optimizer --micro-batch 4 \
        --seq-len 1024 --steps 3 --warmup 1
      WORKER_TIMEOUT=300 worker setup_t5-11b_z3_optimizer+params_1gpu 1 --model t5-11b --stage 3 \
        --offload optimizer+params --micro-batch 1 --seq-len 512 --steps 2 --warmup 1
      for r in setup_gpt2-xl_z2_optimizer_1gpu setup_t5-11b_z3_optimizer+params_1gpu; do
        log "$r: $(grep -o '"host_state_bytes":[0-9]*\|"host_state_setup_ms":[0-9.]*\|"setup_ms":[0-9.]*' "$RUNS/$r/rank0.jsonl" | tr '\n' ' ')"
      done ;;
    same-losses)
      : "${BASE_BIN:?same-losses compares with the worker in BASE_BIN}"
      text=(--micro-batch 8 --seq-len 256 --steps 12 --warmup 2 --data tests/data/declaration-of-independence.txt)
      np=$(( GPUS < 2 ? GPUS : 2 ))
      cases=(
        "z0|--stage 0" "z1|--stage 1" "z2|--stage 2" "z3|--stage 3"
        "z2-accum|--stage 2 --grad-accum 2" "z3-accum|--stage 3 --grad-accum 2"
        "z1-offload|--stage 1 --offload optimizer" "z2-offload|--stage 2 --offload optimizer"
        "z3-offload|--stage 3 --offload optimizer" "z3-offload-params|--stage 3 --offload optimizer+params"
        "z2-offload-ratio|--stage 2 --offload optimizer --offload-ratio 0.5"
        "z2-offload-delayed|--stage 2 --offload optimizer --delayed-update --delayed-update-after 3"
        "z3-fp16|--stage 3 --precision fp16" "z3-hpz|--stage 3 --hpz $np"
      )
      sl_picked() { grep -q -- "${SL_MATCH:-.}" <<< "$1"; }  # SL_MATCH (a grep pattern): the cases it names
      for c in "${cases[@]}"; do
        name=${c%%|*}
        sl_picked "$name" || continue
        # shellcheck disable=SC2086
        worker "same_${name}_new" "$np" --model gpt2 "${text[@]}" ${c#*|}
        # shellcheck disable=SC2086
        W=$BASE_BIN/zerobench-worker worker "same_${name}_base" "$np" --model gpt2 "${text[@]}" ${c#*|}
      done
      for name in z0 z2-offload; do
        sl_picked "$name" || continue
        c=$(printf '%s\n' "${cases[@]}" | grep "^$name|")
        # shellcheck disable=SC2086
        W=$BASE_BIN/zerobench-worker worker "same_${name}_base2" "$np" --model gpt2 "${text[@]}" ${c#*|}
      done
      python3 - "$RUNS" "$OUTDIR/host.txt" "$(commit_of "$BIN")" \
        "$(commit_of "$BASE_BIN")" > "$OUTDIR/same-losses.json" <<'PY'
import glob, json, os, sys
runs, host, commit, base = sys.argv[1:5]
def losses(d):
    f = f"{runs}/{d}/rank0.jsonl"
    if not os.path.exists(f):
        return None
    return [r["loss"] for r in map(json.loads, open(f)) if r.get("event") == "step"]
out = []
for d in sorted(glob.glob(f"{runs}/same_*_new")):
    name = os.path.basename(d)[len("same_"):-len("_new")]
    new, old = losses(f"same_{name}_new"), losses(f"same_{name}_base")
    row = {"case": name, "steps": len(new or []), "identical": bool(new) and new == old,
           "max_abs_diff": max((abs(a - b) for a, b in zip(new, old)), default=None) if new and old else None}
    again = losses(f"same_{name}_base2")
    if again is not None:
        row["base_repeat_identical"] = again == old
    out.append(row)
print(json.dumps({"benchmark": "bench/gpu/run.sh same-losses", "commit": commit, "base_commit": base,
                  "host": open(host).read().strip().splitlines(), "cases": out,
                  "all_identical": all(r["identical"] for r in out)}, indent=1))
PY
      log "same-losses: $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["all_identical"], [(c["case"], c["identical"], c["max_abs_diff"]) for c in d["cases"]])' "$OUTDIR/same-losses.json")" ;;
    cuda-graph)
      : "${BASE_BIN:?cuda-graph compares with the worker in BASE_BIN}"
      replayed() { [ "$1" != graph ] || echo --cuda-graph; }  # replayed WHICH: its flag, if any
      t5=(--model t5-large --stage 0 --micro-batch 1 --seq-len 512 --steps 25 --warmup 5)
      g4=(--model gpt2 --stage 0 --micro-batch 4 --seq-len 1024 --steps 25 --warmup 5)
      for rep in 1 2; do
        for which in base eager graph; do
          # shellcheck disable=SC2046
          W=$(build_worker "$which") worker "graph_t5-large_${which}_${rep}" 1 "${t5[@]}" $(replayed "$which")
          # shellcheck disable=SC2046
          W=$(build_worker "$which") worker "graph_gpt2-mb4_${which}_${rep}" 1 "${g4[@]}" $(replayed "$which")
        done
      done
      # Losses: every step of a replayed run against an eager one, and two eager runs against each
      # other (kernels that add with atomics differ run to run).
      gpt2="--model gpt2 --micro-batch 4 --seq-len 1024 --steps 12 --warmup 3"
      for c in "gpt2-z0|$gpt2 --stage 0" "gpt2-z1|$gpt2 --stage 1" "gpt2-z2|$gpt2 --stage 2" "gpt2-z3|$gpt2 --stage 3" \
        "gpt2-z1-ga2|$gpt2 --stage 1 --grad-accum 2" "gpt2-z3-ga2|$gpt2 --stage 3 --grad-accum 2" \
        "gpt2-z0-text-eval|$gpt2 --stage 0 --eval-every 4 --data tests/data/declaration-of-independence.txt" \
        "t5-small-z0|--model t5-small --stage 0 --micro-batch 4 --seq-len 512 --steps 12 --warmup 3"; do
        IFS='|' read -r name args <<< "$c"
        for which in eager eager2 graph; do
          # shellcheck disable=SC2046,SC2086
          worker "losses_${name}_${which}" 1 $args $(replayed "$which")
        done
      done
      python3 bench/gpu/report_graph.py "$RUNS" "$OUTDIR/host.txt" "$(commit_of "$BIN")" \
        "$(commit_of "$BASE_BIN")" > "$OUTDIR/cuda-graph.json"
      log "cuda-graph: $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print([(s["case"], s["graph_over_base"]) for s in d["speed"]])' "$OUTDIR/cuda-graph.json")" ;;
    step-ab)
      : "${BASE_BIN:?step-ab compares with the worker in BASE_BIN}"
      # One GPU, this build and BASE_BIN alternating (AB_REPS rounds, default 2, the order turned
      # each round): the step-time
      # targets' configurations, eager and replaying graphs; AB_PROFILE=1 adds one profiled step
      # of gpt2 and gpt2-xl at stage 0 with each (--torch-profile). AB_ARGS adds worker arguments
      # (--data FILE: losses on text), AB_STEPS sets the steps (default 20), AB_GPUS the ranks (default
      # 1; a case then names its GPU count). bench/gpu/report_ab.py reads it.
      abg=${AB_GPUS:-1}; abn=""; [ "$abg" = 1 ] || abn="-${abg}gpu"
      for rep in $(seq "${AB_REPS:-2}"); do
        for c in ${AB_CASES:-gpt2:16:0:eager gpt2:16:0:graph gpt2:16:3:eager gpt2-xl:4:0:graph gpt2-xl:4:3:eager}; do
          IFS=: read -r m mb s mode <<< "$c"
          flag=(); [ "$mode" = graph ] && flag=(--cuda-graph)
          for which in $(turned "$rep" new base); do
            # shellcheck disable=SC2086
            W=$(build_worker "$which") worker "ab_${m}-mb${mb}-z${s}-${mode}${abn}_${which}_${rep}" "$abg" --model "$m" --stage "$s" \
              --micro-batch "$mb" --seq-len 1024 --steps "${AB_STEPS:-20}" --warmup 4 "${flag[@]}" ${AB_ARGS:-}
          done
        done
      done
      if [ "${AB_PROFILE:-0}" = 1 ]; then
        for m in gpt2:16 gpt2-xl:4; do
          for which in new base; do
            W=$(build_worker "$which") worker "abprof_${m%:*}-mb${m#*:}-z0_${which}" 1 --model "${m%:*}" --stage 0 \
              --micro-batch "${m#*:}" --seq-len 1024 --steps 10 --warmup 5 --profile-step 8 --torch-profile
          done
        done
      fi
      python3 bench/gpu/report_ab.py "$RUNS" "$OUTDIR/host.txt" "$(commit_of "$BIN")" \
        "$(commit_of "$BASE_BIN")" > "$OUTDIR/step-ab.json"
      log "step-ab: $(python3 -c 'import json,sys; print([(c["case"], c["new_over_base"]) for c in json.load(open(sys.argv[1]))["cases"]])' "$OUTDIR/step-ab.json")" ;;
    same-speed)
      : "${BASE_BIN:?same-speed compares with the worker in BASE_BIN}"
      np=$(( GPUS < 2 ? GPUS : 2 ))
      cases=("z1|$np|--stage 1" "z2|$np|--stage 2" "z3|$np|--stage 3" "z2-offload|1|--stage 2 --offload optimizer")
      for rep in 1 2; do
        for c in "${cases[@]}"; do
          IFS='|' read -r name g args <<< "$c"
          for which in new base; do
            # shellcheck disable=SC2086
            W=$(build_worker "$which") worker "speed_${name}_${which}_${rep}" "$g" --model gpt2-xl --micro-batch 4 \
              --seq-len 1024 --steps 15 --warmup 3 $args
          done
        done
      done
      python3 - "$RUNS" "$OUTDIR/host.txt" "$(commit_of "$BIN")" \
        "$(commit_of "$BASE_BIN")" > "$OUTDIR/same-speed.json" <<'PY'
import glob, json, os, statistics, sys
runs, host, commit, base = sys.argv[1:5]
def step_ms(d):
    f = f"{runs}/{d}/rank0.jsonl"
    ends = [r for r in map(json.loads, open(f)) if r.get("event") == "end"] if os.path.exists(f) else []
    return ends[0]["summary"]["step_ms_median"] if ends and ends[0].get("summary") else None
cases = sorted({os.path.basename(d).split("_")[1] for d in glob.glob(f"{runs}/speed_*")})
out = []
for c in cases:
    new = [step_ms(f"speed_{c}_new_{r}") for r in (1, 2)]
    old = [step_ms(f"speed_{c}_base_{r}") for r in (1, 2)]
    ok = all(v is not None for v in new + old)
    out.append({"case": c, "new_step_ms": new, "base_step_ms": old,
                "ratio_new_over_base": round(statistics.median(new) / statistics.median(old), 4) if ok else None})
print(json.dumps({"benchmark": "bench/gpu/run.sh same-speed", "commit": commit, "base_commit": base,
                  "host": open(host).read().strip().splitlines(), "model": "gpt2-xl, micro-batch 4, sequence 1024, 15 steps (3 warm-up)",
                  "cases": out}, indent=1))
PY
      log "same-speed: $(python3 -c 'import json,sys; print([(c["case"], c["ratio_new_over_base"]) for c in json.load(open(sys.argv[1]))["cases"]])' "$OUTDIR/same-speed.json")" ;;
    offload-builds)
      : "${OB_BUILDS:?offload-builds runs the worker of each build folder in OB_BUILDS}"
      commits=()
      for b in $OB_BUILDS; do commits+=("$(commit_of "$b")"); done
      for rep in $(seq "${OB_REPS:-3}"); do
        order=$(turned "$rep" $OB_BUILDS)
        for b in $order; do
          c=$(commit_of "$b"); name="ob_gpt2-xl_z2_mb4_offload-optimizer_${c:0:7}_${rep}"
          # The huge-page share of the worker's resident memory, read once its steps run.
          ( sleep "${OB_SAMPLE_S:-11}"; pid=$(pgrep -n -f "zerobench-worker .*--run-id $name( |$)") \
              && grep -E '^(Rss|AnonHugePages):' "/proc/$pid/smaps_rollup" > "$RUNS/$name.smaps" ) &
          W=$b/zerobench-worker worker "$name" 1 --model gpt2-xl --stage 2 --offload optimizer --micro-batch 4 \
            --seq-len 1024 --steps 20 --warmup 5
          wait
        done
      done
      "$BIN/examples/cpu_adamw" 200000000 > "$RUNS/cpu_adamw.json" 2>&1; log "cpu_adamw: $(cat "$RUNS/cpu_adamw.json")"
      python3 bench/gpu/report_offload_builds.py "$RUNS" "$OUTDIR/host.txt" "${commits[@]}" > "$OUTDIR/offload-builds.json"
      log "offload-builds: $(python3 -c 'import json,sys; print([(b["build"][:7], b["median_step_ms"], b["over_first"]) for c in json.load(open(sys.argv[1]))["configurations"] for b in c["builds"]])' "$OUTDIR/offload-builds.json")" ;;
    offload-ab)
      : "${BASE_BIN:?offload-ab compares this build with the one in BASE_BIN}"
      oag=${OA_GPUS:-1}
      for b in base new; do
        W=$(build_worker "$b") worker "oa_none_${b}_1" "$oag" --model gpt2-xl --stage 2 --micro-batch 4 --steps 12 --warmup 4
      done
      for rep in $(seq "${OA_REPS:-2}"); do
        builds=$(turned "$rep" base new)
        for c in ${OA_CASES:-2:optimizer:0.24 2:optimizer:1 3:optimizer:1 3:optimizer+params:1}; do
          IFS=: read -r z off r mode <<< "$c"
          extra=(); [ "$mode" != delayed ] || extra=(--delayed-update --delayed-update-after 4)
          for b in $builds; do
            W=$(build_worker "$b") worker "oa_z${z}_${off}_r${r}${mode:+_$mode}_${b}_${rep}" "$oag" --model gpt2-xl --stage "$z" \
              --offload "$off" --offload-ratio "$r" --micro-batch 4 --steps 12 --warmup 4 "${extra[@]}"
          done
        done
      done
      host_rates
      python3 bench/gpu/report_offload_ab.py "$RUNS" "$OUTDIR/host.txt" "$(commit_of "$BASE_BIN")" "$(commit_of "$BIN")" \
        > "$OUTDIR/offload-ab.json"
      report_summary "$OUTDIR/offload-ab.json" ;;
    stage-ab)
      # This build against BASE_BIN on one GPU without offload, the builds alternating round by
      # round: SA_CASES as MODEL:STAGE:MICRO-BATCH[:graph] (sequence 1024), SA_REPS rounds.
      : "${BASE_BIN:?stage-ab compares this build with the one in BASE_BIN}"
      for rep in $(seq "${SA_REPS:-3}"); do
        builds=$(turned "$rep" base new)
        for c in ${SA_CASES:-gpt2-xl:0:4 gpt2-xl:1:4 gpt2-xl:2:4 gpt2-xl:3:4}; do
          IFS=: read -r m z mb mode <<< "$c"
          extra=(); [ "$mode" != graph ] || extra=(--cuda-graph)
          for b in $builds; do
            W=$(build_worker "$b") worker "sa_${m}_z${z}_mb${mb}${mode:+_$mode}_${b}_${rep}" 1 --model "$m" --stage "$z" \
              --micro-batch "$mb" --seq-len 1024 --steps 20 --warmup 4 "${extra[@]}"
          done
        done
      done
      python3 bench/gpu/report_stage_ab.py "$RUNS" "$OUTDIR/host.txt" "$(commit_of "$BASE_BIN")" "$(commit_of "$BIN")" \
        > "$OUTDIR/stage-ab.json"
      report_summary "$OUTDIR/stage-ab.json" ;;
    offload-threads)
      # The worker's AdamW pool is --threads minus one (the launching thread keeps a core).
      pools=${OT_POOLS:-"$(( $(nproc) - 1 )) $(( $(nproc) / 2 )) $(( $(nproc) / 4 ))"}
      for p in $pools; do "$BIN/examples/cpu_adamw" 200000000 "$p" > "$RUNS/cpu_adamw_p$p.json" 2>&1; done
      log "cpu_adamw: $(cat "$RUNS"/cpu_adamw_p*.json | tr '\n' ' ')"
      mpirun -np 1 -x LD_LIBRARY_PATH --bind-to none "$BIN/examples/nccl_bw" 1073741824 > "$RUNS/copies.jsonl" 2>&1
      log "copies: $(grep -h '2[dh]' "$RUNS/copies.jsonl" | tr '\n' ' ')"
      worker ot_none_1 1 --model gpt2-xl --stage 2 --micro-batch 4 --steps 12 --warmup 4
      for rep in $(seq "${OT_REPS:-2}"); do
        order=$(turned "$rep" $pools)
        for p in $order; do
          for mode in exact delayed; do
            gpt2xl_offload "ot_${mode}_p${p}_${rep}" 1 "$mode" "${OT_RATIO:-0.24}" --threads $((p + 1))
          done
        done
      done
      python3 bench/gpu/report_offload_threads.py "$RUNS" "$OUTDIR/host.txt" "$(commit_of "$BIN")" > "$OUTDIR/offload-threads.json"
      report_summary "$OUTDIR/offload-threads.json" ;;
    offload-ratios)
      host_rates
      worker or_none_1 "${OR_GPUS:-1}" --model gpt2-xl --stage 2 --micro-batch 4 --steps 12 --warmup 4
      ratios=${OR_RATIOS:-0.12 0.16 0.2 0.24 0.3}
      for rep in $(seq "${OR_REPS:-2}"); do
        order=$(turned "$rep" $ratios)
        for r in $order; do
          for mode in ${OR_MODES:-exact delayed}; do
            gpt2xl_offload "or_${mode}_r${r}_${rep}" "${OR_GPUS:-1}" "$mode" "$r"
          done
        done
      done
      python3 bench/gpu/report_offload_ratios.py "$RUNS" "$OUTDIR/host.txt" "$(commit_of "$BIN")" > "$OUTDIR/offload-ratios.json"
      report_summary "$OUTDIR/offload-ratios.json" ;;
    launch-cpu)
      mkdir -p "$RUNS/lc"
      for rep in $(seq "${LC_REPS:-3}"); do
        for c in ${LC_CASES:-gpt2:1:256:0 gpt2:16:1024:0 gpt2:4:1024:3 t5-small:1:256:0 t5-large:1:1024:0 tiny-llama:4:1024:0 gpt2-medium:16:1024:0 gpt2-medium:4:1024:2:optimizer}; do
          IFS=: read -r m mb s z off <<< "$c"
          extra=(); [ -z "$off" ] || extra=(--offload "$off")
          order=$(turned "$rep" ${LC_SETTINGS:-none auto})
          for lc in $order; do
            WORKER_TIMEOUT=180 worker "lc/${m}_z${z}_mb${mb}_s${s}${off:+_offload-$off}_${lc}_${rep}" 1 --model "$m" \
              --stage "$z" --micro-batch "$mb" --seq-len "$s" --steps "${LC_STEPS:-60}" --warmup 10 --launch-cpu "$lc" "${extra[@]}"
          done
        done
      done
      python3 bench/gpu/report_launch_cpu.py "$RUNS" "$OUTDIR/host.txt" "$(commit_of "$BIN")" > "$OUTDIR/launch-cpu.json"
      log "launch-cpu: $(python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["summary"]))' "$OUTDIR/launch-cpu.json")" ;;
    binding)
      # gpu_cpus I: the CPUs local to GPU I (its PCI device's local_cpulist), or all of them.
      gpu_cpus() {
        local bus
        bus=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader -i "$1" | tr 'A-F' 'a-f')
        cat "/sys/bus/pci/devices/${bus#0000}/local_cpulist" 2>/dev/null || echo "0-$(( $(nproc) - 1 ))"
      }
      { lscpu | grep -E '^(Model name|CPU\(s\)|NUMA)'; nvidia-smi topo -m; for g in $(seq 0 $((GPUS - 1))); do echo "gpu$g local: $(gpu_cpus "$g")"; done; } \
        > "$RUNS/topology.txt" 2>&1
      noise_lane() {  # noise_lane GPU MODE REP: every NOISE_RUNS run on GPU; MODE alone or free (no
        # binding; the caller runs one lane or two at once) or bound (to the GPU's local CPUs)
        local name np rest wrap=""
        [ "$2" = bound ] && wrap="taskset -c $(gpu_cpus "$1")"
        for want in ${NOISE_RUNS:-gpt2_z0_mb4_s1024_1gpu gpt2_z0_mb1_s256_1gpu gpt2-medium_z0_mb1_s1024_1gpu t5-small_z0_mb4_s256_1gpu}; do
          while read -r _ _ name np rest; do
            [ "$name" = "$want" ] || continue
            # shellcheck disable=SC2086
            WORKER_WRAP=$wrap WORKER_ENV="CUDA_VISIBLE_DEVICES=$1" WORKER_TIMEOUT=180 worker "bind-$2/${name}_gpu$1_$3" "$np" $rest \
              --steps 30 --warmup 10 < /dev/null
          done < <(grep -v '^#' bench/gpu/costmodel-runs.txt)
        done
      }
      mkdir -p "$RUNS/bind-alone" "$RUNS/bind-free" "$RUNS/bind-bound"
      for rep in $(seq "${NOISE_REPS:-3}"); do
        noise_lane 0 alone "$rep"
        if [ "$GPUS" -ge 2 ]; then
          for mode in free bound; do noise_lane 0 "$mode" "$rep" & noise_lane 1 "$mode" "$rep" & wait; done
        fi
      done
      python3 bench/gpu/report_binding.py "$RUNS" "$OUTDIR/host.txt" "$(commit_of "$BIN")" > "$OUTDIR/binding.json"
      log "binding: $(python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["summary"]))' "$OUTDIR/binding.json")" ;;
    costmodel)
      # Each line of the list: SET LANE NAME NP WORKER-ARGS... (bench/gpu/costmodel-runs.txt, or the
      # list CM_LIST names: bench/gpu/costmodel-runs-4gpu.txt, the 2-GPU runs on 4 GPUs); CM_SETS
      # picks the sets (default "fit holdout"), so that one GPU can run them in two calls; CM_MATCH
      # (a shell pattern, default *) picks runs by name, e.g. 'gpt2*' for one family, and CM_LANES
      # the lanes (default "any serial"). Lane "any" runs are one-GPU runs without host work; they
      # run one at a time, or two at once, one per GPU, with CM_PARALLEL=2 on two GPUs: faster,
      # but launch-bound steps then differ by 36% between runs of one configuration on a 32-core
      # 2×H100 host, against 7.5% alone (`binding` phase). "serial" runs (offload: host-bound;
      # several GPUs) run alone afterwards.
      mkdir -p "$RUNS/cm-fit" "$RUNS/cm-holdout"
      picked() {  # picked SET NAME LANE: whether CM_SETS, CM_MATCH and CM_LANES take the run
        case " ${CM_SETS:-fit holdout} " in *" $1 "*) ;; *) return 1 ;; esac
        case " ${CM_LANES:-any serial} " in *" $3 "*) ;; *) return 1 ;; esac
        # shellcheck disable=SC2254
        case $2 in ${CM_MATCH:-*}) return 0 ;; *) return 1 ;; esac
      }
      lane() {  # lane GPU N K: every K-th "any" run from the N-th, on GPU
        local i=0 set ln name np
        while read -r set ln name np rest; do
          picked "$set" "$name" "$ln" && [ "$ln" = any ] || continue
          i=$((i + 1)); [ $(( (i - 1) % $3 )) -eq "$2" ] || continue
          # shellcheck disable=SC2086
          WORKER_ENV="CUDA_VISIBLE_DEVICES=$1" WORKER_TIMEOUT=180 worker "cm-$set/$name" "$np" $rest --steps "${CM_STEPS:-30}" --warmup "${CM_WARMUP:-10}" < /dev/null
        done < "${CM_LIST:-bench/gpu/costmodel-runs.txt}"
      }
      if [ "$GPUS" -ge 2 ] && [ "${CM_PARALLEL:-1}" = 2 ]; then lane 0 0 2 & lane 1 1 2 & wait; else lane 0 0 1; fi
      while read -r set ln name np rest; do
        picked "$set" "$name" "$ln" && [ "$ln" = serial ] && [ "$np" -le "$GPUS" ] || continue
        # shellcheck disable=SC2086
        WORKER_TIMEOUT=240 worker "cm-$set/$name" "$np" $rest --steps "${CM_STEPS:-30}" --warmup "${CM_WARMUP:-10}" < /dev/null
      done < "${CM_LIST:-bench/gpu/costmodel-runs.txt}" ;;
    correctness)
      for s in 0 1 2 3; do
        worker "correct_gpt2_z${s}_2gpu" 2 --model gpt2 --stage "$s" --micro-batch 8 --seq-len 256 --steps 40 --warmup 2 \
          --lr 3e-4 --data tests/data/declaration-of-independence.txt
      done ;;
    grad-accum)
      # The production-like setting: 8 micro-steps of gpt2-xl micro-batch 4 per optimizer step
      # (32k tokens per GPU per step), every stage, on 1 GPU and on all of them (2 at most here);
      # then stage 3 on 2 GPUs with NCCL's peer-to-peer and shared-memory paths off, so that all
      # traffic takes the network transport, as between nodes.
      np=$(( GPUS < 2 ? GPUS : 2 ))
      for s in 0 1 2 3; do
        for g in 1 "$np"; do
          [ "$g" = 1 ] && [ "$np" = 1 ] && [ -d "$RUNS/ga8_gpt2-xl_z${s}_1gpu" ] && continue
          worker "ga8_gpt2-xl_z${s}_${g}gpu" "$g" --model gpt2-xl --stage "$s" --micro-batch 4 --grad-accum 8 \
            --seq-len 1024 --steps 8 --warmup 2
        done
      done
      if [ "$np" = 2 ]; then
        WORKER_ENV="NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1" worker ga8_gpt2-xl_z3_2gpu_net 2 --model gpt2-xl --stage 3 \
          --micro-batch 4 --grad-accum 8 --seq-len 1024 --steps 8 --warmup 2
      fi ;;
    gpt2) sweep gpt2 16 ;;
    profile)
      worker profile_gpt2_z0_mb16_1gpu 1 --model gpt2 --stage 0 --micro-batch 16 --steps 8 --warmup 3 --trace --profile-step 5
      worker profile_gpt2-xl_z3_mb4_2gpu 2 --model gpt2-xl --stage 3 --micro-batch 4 --steps 8 --warmup 3 --trace --profile-step 5
      grep -h '"event":"profile"' "$RUNS"/profile_*/rank0.jsonl >&2 ;;
    gpt2-xl) sweep gpt2-xl 4 ;;
    interference)
      # How much a transfer beside compute slows compute, by engine (NCCL's SMs or the copy
      # engines), then NCCL settings that change its SM footprint on the gpt2-xl 2-GPU runs.
      python3 bench/gpu/interference.py --reps "${INTERFERENCE_REPS:-7}" > "$RUNS/interference.jsonl" 2> "$RUNS/interference.err"
      log "interference.py rc=$?: $(tr '\n' ' ' < "$RUNS/interference.jsonl")"
      worker gpt2-xl_z0_mb4_1gpu_int 1 "${xl1[@]}"
      # The same one-GPU run on both GPUs at once, independently: what sharing the host costs
      # without any communication.
      for d in 0 1; do WORKER_ENV=CUDA_VISIBLE_DEVICES=$d worker "gpt2-xl_z0_mb4_1gpu_pair$d" 1 "${xl1[@]}" & done
      wait
      # (NCCL_P2P_USE_CUDA_MEMCPY=1, copy engines inside NCCL, hung the first collective on
      # 2026-11-22: the worker's stall watchdog ended it after 300 s.)
      for e in "" NCCL_CTA_POLICY=1 NCCL_PROTO=Simple NCCL_NTHREADS=256; do
        for s in 1 2 3; do
          WORKER_ENV=$e worker "gpt2-xl_z${s}_mb4_2gpu_env${e:+_${e//=/-}}" 2 "${xl2[@]}" --stage "$s"
        done
      done
      for f in "$RUNS"/gpt2-xl_z*_int/rank0.jsonl "$RUNS"/gpt2-xl_z*_env*/rank0.jsonl; do
        log "$f: $(grep -o '"summary":.*' "$f" | cut -c1-200)"
      done ;;
    knobs)
      # Settings that change how communication overlaps computation, on the gpt2-xl 2-GPU runs:
      # gradient bucket size, stage 3's prefetch depth, one hardware work queue per GPU.
      worker gpt2-xl_z0_mb4_1gpu_int 1 "${xl1[@]}"
      for s in 1 2 3; do
        worker "gpt2-xl_z${s}_mb4_2gpu_env" 2 "${xl2[@]}" --stage "$s"
        for b in 8 128 512; do worker "gpt2-xl_z${s}_mb4_2gpu_env_bucket-mb-$b" 2 "${xl2[@]}" --stage "$s" --bucket-mb "$b"; done
        WORKER_ENV=CUDA_DEVICE_MAX_CONNECTIONS=1 worker "gpt2-xl_z${s}_mb4_2gpu_env_CUDA_DEVICE_MAX_CONNECTIONS-1" 2 "${xl2[@]}" --stage "$s"
      done
      for p in 2 3; do worker "gpt2-xl_z3_mb4_2gpu_env_prefetch-$p" 2 "${xl2[@]}" --stage 3 --prefetch "$p"; done ;;
    copy-engines)
      # The copy-engine transport (`--copy-engines`): its collectives checked against closed forms
      # and timed beside NCCL's; gpt2 on the shipped text with each transport (the losses must
      # agree); the gpt2-xl 2-GPU runs with each, against the one-GPU run of the same call.
      sizes="16777216 67108864 268435456 164105728"
      timeout 90 mpirun -np 2 -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE --bind-to none "$BIN/examples/nccl_bw" $sizes > "$RUNS/collectives_nccl.jsonl" 2>&1
      log "nccl_bw rc=$?: $(grep -h '^{' "$RUNS/collectives_nccl.jsonl" | tr '\n' ' ')"
      timeout 90 mpirun -np 2 -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE --bind-to none "$BIN/examples/nccl_bw" --copy-engines $sizes \
        > "$RUNS/collectives_ce.jsonl" 2> "$RUNS/collectives_ce.err"
      rc=$?
      log "nccl_bw --copy-engines rc=$rc: $(tr '\n' ' ' < "$RUNS/collectives_ce.jsonl") $(tail -c 600 "$RUNS/collectives_ce.err")"
      [ "$rc" = 0 ] || { log "copy engines failed: the rest of the phase is skipped"; sizes=; }
      if [ -n "$sizes" ]; then
        for s in 0 1 2 3; do
          for t in nccl ce; do
            extra=(); [ "$t" = ce ] && extra=(--copy-engines all)
            worker "correct_gpt2_z${s}_2gpu_$t" 2 --model gpt2 --stage "$s" --micro-batch 8 --seq-len 256 --steps 40 --warmup 2 \
              --lr 3e-4 --data tests/data/declaration-of-independence.txt "${extra[@]}"
          done
          log "stage $s losses, copy engines vs NCCL: $(python3 - "$RUNS/correct_gpt2_z${s}_2gpu" <<'PY'
import json, sys
loss = lambda t: [r["loss"] for r in map(json.loads, open(f"{sys.argv[1]}_{t}/rank0.jsonl")) if r["event"] == "step"]
a, b = loss("nccl"), loss("ce")
print(f"{len(a)} and {len(b)} steps, largest difference {max(abs(x - y) for x, y in zip(a, b)):.3g}, final {a[-1]:.4f} / {b[-1]:.4f}")
PY
)"
        done
      fi ;;
    copy-engines-xl)
      # gpt2-xl on 2 GPUs with NCCL and with each copy-engine setting, XL_REPS times in turn
      # (run-to-run spread on these hosts is about 1.5 ms), against the one-GPU run of this call;
      # then stage 3 with hpZ over the copy engines.
      worker gpt2-xl_z0_mb4_1gpu_int 1 "${xl1[@]}"
      for rep in $(seq 1 "${XL_REPS:-1}"); do
        for s in ${XL_STAGES:-0 1 2 3}; do
          worker "gpt2-xl_z${s}_mb4_2gpu_rep${rep}_env" 2 "${xl2[@]}" --stage "$s"
          for c in all-gather all; do
            worker "gpt2-xl_z${s}_mb4_2gpu_rep${rep}_env_copy-engines=$c" 2 "${xl2[@]}" --stage "$s" --copy-engines "$c"
          done
        done
      done
      worker "hpz_gpt2-xl_z3_hpz2_2gpu_copy-engines" 2 "${xl2[@]}" --stage 3 --hpz 2 --copy-engines all-gather ;;
    ctas)
      # NCCL thread blocks per collective: fewer leave more SMs to the overlapped computation.
      for c in 8 16; do sweep gpt2 16 2 "_ctas$c" --comm-ctas "$c"; sweep gpt2-xl 4 2 "_ctas$c" --comm-ctas "$c"; done ;;
    offload)
      for g in 1 2; do
        [ "$g" -le "$GPUS" ] || continue
        for s in 2 3; do
          for off in none optimizer; do
            worker "offload_gpt2-xl_z${s}_${off}_${g}gpu" "$g" --model gpt2-xl --stage "$s" --offload "$off" --micro-batch 4 --steps 8 --warmup 3
          done
        done
        worker "offload_gpt2-xl_z3_optimizer+params_${g}gpu" "$g" --model gpt2-xl --stage 3 --offload optimizer+params --micro-batch 4 --steps 8 --warmup 3
      done
      # hpZ beside plain stage 3 (bf16): groups of 2 (the whole host here) and of 1 (every rank
      # keeps the full secondary copy: backward gathers become local copies).
      for h in 2 1; do
        [ "$GPUS" -ge 2 ] || continue
        worker "hpz_gpt2-xl_z3_hpz${h}_2gpu" 2 --model gpt2-xl --stage 3 --hpz "$h" --micro-batch 4 --steps 8 --warmup 3
      done
      host_rates ;;
    offload-ratio)
      # Twin-Flow: the host keeps a share of each rank's optimizer, the GPU updates the rest.
      # RATIO_GPUS limits the GPU counts (default 1 and 2); the host's AdamW rate, its pinned copy
      # bandwidth and DeepSpeed's ZeRO-Offload on the same model are measured in the same call.
      host_rates
      for g in ${RATIO_GPUS:-1 2}; do
        [ "$g" -le "$GPUS" ] || continue
        mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
        printf 'cluster: {gpus_per_node: %s, gpu_memory: %sMiB}\nsweep:\n  models: gpt2-xl\n  stages: 2\n  offload: optimizer\n  micro_batches: 4\n  gpus_per_node: %s\n' \
          "$g" "$mem" "$g" > "$RUNS/ratio-plan-${g}gpu.yaml"
        # The plan proposes less for exact steps than for the delayed update (launcher/src/plan.rs).
        propose() {
          "$BIN/zerobench" plan --json "$1" | python3 -c 'import json, sys; print(json.load(sys.stdin)[0].get("proposed_offload_ratio", ""))'
        }
        proposed=$(propose "$RUNS/ratio-plan-${g}gpu.yaml")
        { echo "worker: {delayed_update_after: 3}"; cat "$RUNS/ratio-plan-${g}gpu.yaml"; } > "$RUNS/ratio-plan-delayed-${g}gpu.yaml"
        proposed_delayed=$(propose "$RUNS/ratio-plan-delayed-${g}gpu.yaml")
        log "offload-ratio: plan proposes ${proposed:-nothing} exact, ${proposed_delayed:-nothing} delayed on $g GPU(s)"
        worker "ratio_gpt2-xl_z2_none_${g}gpu" "$g" --model gpt2-xl --stage 2 --micro-batch 4 --steps 8 --warmup 3
        for r in 1 $proposed ${RATIOS:-0.75 0.5 0.25}; do
          worker "ratio_gpt2-xl_z2_optimizer_r${r}_${g}gpu" "$g" --model gpt2-xl --stage 2 --offload optimizer \
            --offload-ratio "$r" --micro-batch 4 --steps 8 --warmup 3
        done
        # The delayed update from the first measured step on, all on the host and at its proposal.
        for r in 1 $proposed_delayed; do
          worker "ratio_gpt2-xl_z2_optimizer_r${r}_delayed_${g}gpu" "$g" --model gpt2-xl --stage 2 --offload optimizer \
            --offload-ratio "$r" --delayed-update --delayed-update-after 3 --micro-batch 4 --steps 8 --warmup 3
        done
      done
      "$BIN/examples/pin_bench" 4 16 > "$RUNS/pin_bench.jsonl" 2>&1; log "pin_bench: $(tr '\n' ' ' < "$RUNS/pin_bench.jsonl")"
      # DeepSpeed's ZeRO-Offload (stage 2, CPU AdamW; its CPU Adam JIT-builds here) on zerobench's
      # model, gpt2-xl micro-batch 4, one GPU.
      WORKER_TIMEOUT=300 reference ref_gpt2-xl_deepspeed-offload_1gpu 1 --mode deepspeed-offload --model gpt2-xl \
        --micro-batch 4 --steps 10 --warmup 3 ;;
    lifecycle)
      # The worker's start-up and ending on this host, each case's records and exit code checked
      # by bench/gpu/report_lifecycle.py: a run that ends normally; NCCL that cannot start (no
      # socket interface by the name NCCL_SOCKET_IFNAME gives); two ranks with --device auto on a
      # host of one GPU (the second would compute on the CPU); SIGUSR1 and SIGTERM to a running rank,
      # and SIGUSR1 to its mpirun (as `sbatch --signal` sends it to a job step), which forwards it.
      lc_run() {  # lc_run CASE NP [VAR=VALUE...] -- WORKER-ARGS...: mpirun's exit code and ms in lc_CASE.rc
        local name=lc_$1 np=$2 t0 envs=() xs=(); shift 2
        while [ "$1" != -- ]; do envs+=("$1"); xs+=(-x "${1%%=*}"); shift; done; shift
        t0=$(date +%s%N)
        env "${envs[@]}" timeout 120 mpirun -np "$np" "${xs[@]}" -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE --bind-to none \
          "$W" --log-dir "$RUNS/$name" --run-id "$name" "$@" > "$RUNS/$name.out" 2>&1
        echo "$? $(( ($(date +%s%N) - t0) / 1000000 ))" > "$RUNS/$name.rc"
        log "$name: $(cat "$RUNS/$name.rc") (mpirun's exit code, ms)"
      }
      lc_signal() {  # lc_signal CASE SIGNAL [mpirun]: a one-rank gpt2 run sent SIGNAL after 5 steps (to mpirun: forwarded)
        local name=lc_$1 sig=$2 to=${3:-worker} t0 pid mp; t0=$(date +%s%N)
        # mpirun itself in the background (no `timeout` between), so that $! is mpirun's pid.
        mpirun -np 1 -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE --bind-to none "$W" --device cuda --model gpt2 \
          --stage 0 --micro-batch 4 --steps 100000 --log-dir "$RUNS/$name" --run-id "$name" > "$RUNS/$name.out" 2>&1 &
        mp=$!
        for _ in $(seq 1 900); do [ "$(grep -c '"event":"step"' "$RUNS/$name/rank0.jsonl" 2>/dev/null)" -ge 5 ] 2>/dev/null && break; sleep 0.1; done
        local rank; rank=$(grep -o '"pid":[0-9]*' "$RUNS/$name/rank0.jsonl" | head -1 | cut -d: -f2)
        pid=$rank; [ "$to" = mpirun ] && pid=$mp
        [ -n "$pid" ] && kill "-$sig" "$pid"
        # A signal not passed on leaves the rank training: SIGTERM after 30 s (the case then
        # fails), SIGKILL to what is left 10 s later.
        for _ in $(seq 1 300); do kill -0 "$mp" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$mp" 2>/dev/null && [ -n "$rank" ] && kill -TERM "$rank"
        for _ in $(seq 1 100); do kill -0 "$mp" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$mp" 2>/dev/null && kill -KILL "$mp" ${rank:+"$rank"}
        wait "$mp"; echo "$? $(( ($(date +%s%N) - t0) / 1000000 ))" > "$RUNS/$name.rc"
        log "$name: $(cat "$RUNS/$name.rc") (mpirun's exit code, ms); $(tail -n 2 "$RUNS/$name/rank0.jsonl" | cut -c1-200 | tr '\n' ' ')"
      }
      lc_run normal 1 -- --device cuda --model gpt2 --stage 3 --micro-batch 4 --steps 6 --warmup 2
      lc_run nccl_init 1 NCCL_SOCKET_IFNAME=zerobench_no_such_interface -- --device cuda --model gpt2 --stage 0 --steps 4 --warmup 1
      lc_run auto_two 2 -- --device auto --model gpt2 --stage 0 --steps 4 --warmup 1
      lc_signal usr1 USR1
      lc_signal usr1_mpirun USR1 mpirun
      lc_signal term TERM
      python3 bench/gpu/report_lifecycle.py "$RUNS" "$OUTDIR/host.txt" "$(commit_of "$BIN")" > "$OUTDIR/lifecycle.json"
      log "lifecycle: $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["ok"], [(c["case"], c["ok"]) for c in d["cases"]])' "$OUTDIR/lifecycle.json")" ;;
    faults)
      # A rank killed outright: mpirun stops the others, which log why (SIGTERM) and end.
      fault_run() {  # fault_run NAME SIGNAL EXTRA...
        local name=$1 sig=$2; shift 2
        mpirun -np 2 -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE --bind-to none "$W" --device cuda --model gpt2 --stage 2 \
          --micro-batch 4 --steps 100000 --log-dir "$RUNS/$name" --run-id "$name" "$@" > "$RUNS/$name.out" 2>&1 &
        local mp=$!
        for _ in $(seq 1 300); do [ "$(grep -c '"event":"step"' "$RUNS/$name/rank1.jsonl" 2>/dev/null || echo 0)" -ge 5 ] && break; sleep 0.1; done
        local pid; pid=$(grep -o '"pid":[0-9]*' "$RUNS/$name/rank1.jsonl" | head -1 | cut -d: -f2)
        local t0; t0=$(date +%s%N)
        kill "-$sig" "$pid"
        for _ in $(seq 1 900); do kill -0 "$mp" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$mp" "$pid" 2>/dev/null
        wait "$mp"; local rc=$?
        log "$name: kill -$sig rank 1 after $(grep -c '"event":"step"' "$RUNS/$name/rank1.jsonl") steps; mpirun rc=$rc after $(( ($(date +%s%N) - t0) / 1000000 )) ms; rank 0: $(tail -n 2 "$RUNS/$name/rank0.jsonl" | cut -c1-220 | tr '\n' ' ')"
      }
      fault_run fault_killed KILL
      fault_run fault_frozen STOP --stall-timeout-s 10
      worker fault_oom 1 --model gpt2-xl --stage 0 --micro-batch 256 --steps 3 --warmup 1
      log "fault_oom: $(tail -n 2 "$RUNS/fault_oom/rank0.jsonl" | cut -c1-400 | tr '\n' ' ')" ;;
    offload1)
      # The one-GPU offload cases again (after giving the launching thread a core of its own).
      for s in 2 3; do
        worker "offload1_gpt2-xl_z${s}_optimizer_1gpu" 1 --model gpt2-xl --stage "$s" --offload optimizer --micro-batch 4 --steps 8 --warmup 3
      done
      "$BIN/examples/cpu_adamw" 200000000 > "$RUNS/cpu_adamw_1gpu.json" 2>&1; log "cpu_adamw: $(cat "$RUNS/cpu_adamw_1gpu.json")"
      mpirun -np 1 -x LD_LIBRARY_PATH --bind-to none "$BIN/examples/nccl_bw" 1073741824 > "$RUNS/copies_1gpu.jsonl" 2>&1
      log "copies: $(grep -h '2[dh]' "$RUNS/copies_1gpu.jsonl" | tr '\n' ' ')" ;;
    fits)
      # The largest preset that trains (2 steps, micro-batch 1, sequence 512) on one GPU, per
      # stage and offload setting, largest first; stops at the first that fits. Stages 0-3 hold
      # the same states on one GPU, so 0 and 3 stand for them. Each probe is packed at once.
      # FITS_CONFIGS="3 optimizer+params" probes one setting alone.
      start=$SECONDS
      IFS=, read -ra cfgs <<< "${FITS_CONFIGS:-0 none,3 none,2 optimizer,3 optimizer+params}"
      for cfg in "${cfgs[@]}"; do
        set -- $cfg
        for m in t5-11b mistral-7b t5-3b; do
          [ $(( SECONDS - start )) -lt "${FITS_SECONDS:-200}" ] || { log "fits: out of time before z$1 $2 $m"; break 2; }
          rm -rf "$RUNS/fits_${m}_z$1_$2"   # a probe cut short by an earlier call on this host
          timeout "${FITS_PROBE_SECONDS:-90}" mpirun -np 1 -x LD_LIBRARY_PATH --bind-to none "$W" --device cuda --model "$m" --stage "$1" --offload "$2" \
            --micro-batch 1 --seq-len 512 --steps 2 --warmup 1 --log-dir "$RUNS/fits_${m}_z$1_$2" --run-id "fits_${m}_z$1_$2" \
            > "$RUNS/fits_${m}_z$1_$2.out" 2>&1
          log "fits z$1 $2 $m: rc=$? $(tail -n 1 "$RUNS/fits_${m}_z$1_$2/rank0.jsonl" 2>/dev/null | cut -c1-160)"
          pack
          grep -q '"status":"ok"' "$RUNS/fits_${m}_z$1_$2/rank0.jsonl" 2>/dev/null && break
        done
      done ;;
    selfcheck)
      mpirun -np 1 -x LD_LIBRARY_PATH --bind-to none "$BIN/examples/selfcheck" > "$RUNS/selfcheck.jsonl" 2> "$RUNS/selfcheck.err"
      src=$?
      log "selfcheck rc=$src: $(tail -n 1 "$RUNS/selfcheck.jsonl")"
      # Odd element counts that every rank count here divides (2 x an odd number of bf16 elements).
      np=$(( GPUS < 2 ? GPUS : 2 ))
      if [ -x "$BIN/examples/nccl_bw" ]; then
        timeout 120 mpirun -np "$np" -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE --bind-to none "$BIN/examples/nccl_bw" 2000004 33554436 \
          > "$RUNS/selfcheck_collectives.jsonl" 2> "$RUNS/selfcheck_collectives.err"
        crc=$?
      else
        # Not carried: the collectives are not checked, and the self-check says so (not passed).
        : > "$RUNS/selfcheck_collectives.jsonl"
        crc=127
      fi
      log "nccl_bw at odd sizes on $np GPU(s) rc=$crc"
      python3 - "$RUNS" "$OUTDIR/host.txt" "$(commit_of "$BIN")" "$crc" "$np" "$src" > "$OUTDIR/selfcheck.json" <<'PY'
import json, sys
runs, host, commit, crc, np, src = sys.argv[1], open(sys.argv[2]).read(), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
lines = [json.loads(l) for l in open(f"{runs}/selfcheck.jsonl") if l.startswith("{")]
checks = [l for l in lines if "check" in l]
summary = next((l["summary"] for l in lines if "summary" in l), None)
coll = [json.loads(l) for l in open(f"{runs}/selfcheck_collectives.jsonl") if l.startswith("{")]
ok = summary is not None and summary["failed"] == 0 and src == 0 and crc == 0
# What did not run, so that a self-check that is not passed says why where no check failed.
not_run = ["collectives at odd sizes: examples/nccl_bw is not in the build directory"] if crc == 127 else []
print(json.dumps({"benchmark": "bench/gpu/run.sh selfcheck", "commit": commit, "host": host.strip().splitlines(),
                  "passed": ok, "not_run": not_run, "exit_code": src, "summary": summary, "checks": checks,
                  "collectives": {"ranks": np, "exit_code": crc, "checked_against_closed_forms": crc == 0, "rows": coll}}, indent=1))
PY
      log "selfcheck passed: $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["passed"])' "$OUTDIR/selfcheck.json")" ;;
    step-time)
      # STEP_MODELS picks the models (default both), STEP_REFS the references (default all: eager,
      # torch.compile, DeepSpeed at stages 0-3), so that one model's rows fit one call.
      for m in ${STEP_MODELS:-gpt2 gpt2-xl}; do
        case $m in gpt2) mb=16 ;; gpt2-xl) mb=4 ;; *) log "step-time: no micro-batch for $m"; continue ;; esac
        # STEP_EAGER=0 leaves out the eager runs (with STEP_GRAPH=1, to fit a call).
        if [ "${STEP_EAGER:-1}" = 1 ]; then
          for s in 0 1 2 3; do
            worker "${m}_z${s}_mb${mb}_1gpu" 1 --model "$m" --stage "$s" --micro-batch "$mb" --seq-len 1024 --steps 20 --warmup 4
          done
        fi
        # STEP_GRAPH=1: every stage again with --cuda-graph (on one GPU stage 3 gathers nothing).
        if [ "${STEP_GRAPH:-0}" = 1 ]; then
          for s in 0 1 2 3; do
            worker "${m}_z${s}_mb${mb}_1gpu_graph" 1 --model "$m" --stage "$s" --micro-batch "$mb" --seq-len 1024 \
              --steps 20 --warmup 4 --cuda-graph
          done
        fi
        for ref in ${STEP_REFS:-eager compile deepspeed}; do
          case $ref in
            deepspeed)
              for s in 0 1 2 3; do
                reference "ref_${m}_deepspeed-z${s}_1gpu" 1 --mode deepspeed --stage "$s" --model "$m" --micro-batch "$mb" \
                  --steps 20 --warmup 4
              done ;;
            # MODE+master: the mode with bf16 parameters and fp32 masters, as zerobench keeps them;
            # MODE+fused: the same with their update in one compiled pass, as zerobench's.
            *+master) reference "ref_${m}_${ref%+master}-master_1gpu" 1 --mode "${ref%+master}" --master-weights \
              --model "$m" --micro-batch "$mb" --steps 20 --warmup 4 ;;
            *+fused) reference "ref_${m}_${ref%+fused}-master-fused_1gpu" 1 --mode "${ref%+fused}" --master-weights \
              --fused-update --model "$m" --micro-batch "$mb" --steps 20 --warmup 4 ;;
            *) reference "ref_${m}_${ref}_1gpu" 1 --mode "$ref" --model "$m" --micro-batch "$mb" --steps 20 --warmup 4 ;;
          esac
        done
      done ;;
    gemm-algos)
      # Every algorithm cuBLASLt's heuristic offers for the products of one step of gpt2-xl
      # (micro-batch 4) and gpt2 (16), sequence 1024, against its first choice and libtorch's call
      # (examples/gemm_algos); bench/gpu/report_gemm_algos.py reads it.
      for m in "gpt2-xl 4096" "gpt2 16384"; do
        set -- $m
        "$BIN/examples/gemm_algos" "$1" "$2" > "$RUNS/gemm_algos_$1.jsonl" 2> "$RUNS/gemm_algos_$1.err"
        log "gemm_algos $1: rc=$? $(tail -n 1 "$RUNS/gemm_algos_$1.jsonl")"
      done
      # GEMM_HOT=MS: also gpt2-xl's cold choices against the fastest at the power limit (--hot).
      if [ -n "${GEMM_HOT:-}" ]; then
        "$BIN/examples/gemm_algos" gpt2-xl 4096 --hot "$GEMM_HOT" > "$RUNS/gemm_algos_hot.jsonl" 2> "$RUNS/gemm_algos_hot.err"
        log "gemm_algos --hot $GEMM_HOT: rc=$? $(tail -n 1 "$RUNS/gemm_algos_hot.jsonl")"
      fi ;;
    clocks)
      # Whether a step's kernels run at the clock they were profiled at: the GPU sampled beside
      # each run, each run's samples taken over its measured steps.
      ( while :; do
          printf '%s, ' "$(date +%s.%N)"
          nvidia-smi -i 0 --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
            --format=csv,noheader,nounits || break
        done ) > "$RUNS/clocks_smi.csv" 2>/dev/null &
      sampler=$!
      sleep 3
      for mode in graph eager; do
        flag=(); [ "$mode" = graph ] && flag=(--cuda-graph)
        worker "clocks_gpt2-xl_$mode" 1 --model gpt2-xl --stage 0 --micro-batch 4 --seq-len 1024 \
          --steps "${CLOCK_STEPS:-80}" --warmup 4 "${flag[@]}"
      done
      for m in ${CLOCK_REFS-compile-reduce-overhead}; do
        reference "clocks_ref_$m" 1 --mode "$m" --model gpt2-xl --micro-batch 4 --steps "${CLOCK_STEPS:-80}" --warmup 5
      done
      kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
      python3 bench/gpu/report_clocks.py "$RUNS" "$OUTDIR/host.txt" "$(commit_of "$BIN")" > "$OUTDIR/clocks.json"
      log "clocks: $(python3 -c 'import json,sys; print([(r["run"], r.get("step_ms_median"), r.get("sm_mhz_median"), r.get("sm_mhz_min"), r.get("power_w_median")) for r in json.load(open(sys.argv[1]))["runs"]])' "$OUTDIR/clocks.json")" ;;
    kernels)
      # Where a step's device time goes, zerobench's against the references' on the same shapes:
      # each trace summed up by bench/gpu/torch_profile_summary.py (kernels by class, the largest).
      worker kernels_gpt2-xl 1 --model gpt2-xl --stage 0 --micro-batch 4 --seq-len 1024 --steps 10 --warmup 5 \
        --profile-step 8 --torch-profile
      # The same step replayed from its CUDA graphs (the profiler records the first measured step).
      worker kernels_gpt2-xl-graph 1 --model gpt2-xl --stage 0 --micro-batch 4 --seq-len 1024 --steps 10 --warmup 5 \
        --cuda-graph --torch-profile
      traces=("$RUNS/kernels_gpt2-xl/torch-profile-rank0.json" "$RUNS/kernels_gpt2-xl-graph/torch-profile-rank0.json")
      for m in ${KERNEL_REFS:-compile compile-reduce-overhead}; do
        reference "kernels_ref_$m" 1 --mode "$m" --model gpt2-xl --micro-batch 4 --steps 10 --warmup 5 \
          --torch-profile "$RUNS/kernels_ref_$m.trace.json"
        traces+=("$RUNS/kernels_ref_$m.trace.json")
      done
      python3 - "$OUTDIR/host.txt" "$(commit_of "$BIN")" "$RUNS/.." "${traces[@]}" > "$OUTDIR/kernels.json" <<'PY'
import json, os, subprocess, sys
# Each trace named by its path in the call's archive (under its root, `runs/...`).
host, commit, root, traces = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
rows = []
for t in traces:
    if not os.path.exists(t):
        rows.append({"trace": os.path.relpath(t, root), "missing": True})
        continue
    out = subprocess.run([sys.executable, "bench/gpu/torch_profile_summary.py", "--json", "--top", "25", t],
                         capture_output=True, text=True, check=True).stdout
    s = json.loads(out)
    for k in ("threads", "top_ops", "runtime"):
        s.pop(k)
    s["trace"] = os.path.relpath(t, root)
    rows.append(s)
print(json.dumps({"benchmark": "bench/gpu/run.sh kernels", "commit": commit,
                  "host": open(host).read().splitlines(), "profiles": rows}, indent=1))
PY
      log "kernels: $(python3 -c 'import json,sys; print([(p["trace"], p.get("kernel_ms")) for p in json.load(open(sys.argv[1]))["profiles"]])' "$OUTDIR/kernels.json")" ;;
    eager)
      reference ref_gpt2_eager_1gpu 1 --mode eager --model gpt2 --micro-batch 16
      reference ref_gpt2-xl_eager_1gpu 1 --mode eager --model gpt2-xl --micro-batch 4 ;;
    reference)
      for m in "gpt2 16" "gpt2-xl 4"; do
        set -- $m
        reference "ref_$1_eager_1gpu" 1 --mode eager --model "$1" --micro-batch "$2"
        for g in 1 2; do
          [ "$g" -le "$GPUS" ] || continue
          reference "ref_$1_ddp_${g}gpu" "$g" --mode ddp --model "$1" --micro-batch "$2"
          reference "ref_$1_fsdp2_${g}gpu" "$g" --mode fsdp2 --model "$1" --micro-batch "$2"
        done
      done ;;
    collectives)
      # 16 MiB to 1 GiB, plus the largest collective zerobench issues for gpt2-xl on 2 GPUs:
      # the embedding unit (wte + wpe + ln_f) in bf16, padded for 2 ranks.
      sizes="16777216 67108864 268435456 1073741824 164105728"
      np=$(( GPUS < 2 ? GPUS : 2 ))
      mpirun -np "$np" -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE --bind-to none "$BIN/examples/nccl_bw" $sizes > "$RUNS/collectives_zerobench.jsonl" 2> "$RUNS/collectives_zerobench.err"
      log "nccl_bw rc=$?"
      torchrun --standalone --nproc_per_node="$np" bench/gpu/collectives.py $sizes > "$RUNS/collectives_torch.jsonl" 2> "$RUNS/collectives_torch.err"
      log "collectives.py rc=$?"
      cat "$RUNS"/collectives_*.jsonl >&2 ;;
    *) log "unknown phase $phase"; exit 2 ;;
  esac
  pack
  log "packed $(du -h "$OUTDIR/results.tar.gz" | cut -f1) after $phase"
done
