#!/usr/bin/env bash
# local-cluster.sh: a throw-away Slurm cluster on this host, for zerobench's tests and for trying
# rendered jobs without a real cluster.
#
#   slurm/local-cluster.sh up       write the config, start munged (if none answers), slurmctld and
#                                   one slurmd per fake node; wait until every node is idle
#   slurm/local-cluster.sh down     cancel its jobs, stop exactly the daemons `up` started (pid files)
#   slurm/local-cluster.sh status   which of its daemons run, and sinfo
#   slurm/local-cluster.sh env      the export line that points Slurm's commands at this cluster:
#                                   eval "$(slurm/local-cluster.sh env)"
#   slurm/local-cluster.sh ports-free   exit 0 if the ports `up` would use are free, else 1
#
# Settings (environment):
#   ZB_SLURM_DIR         config, state, logs, pid files      (default /tmp/zerobench-slurm)
#   ZB_SLURM_NODES       fake nodes node01..nodeNN            (default 2)
#   ZB_SLURM_CPUS        CPUs each node advertises            (default 64; may exceed the host's)
#   ZB_SLURM_GPUS        fake GPUs per node (GRES)            (default 4; 0 for none)
#   ZB_SLURM_PARTITIONS  partitions over all nodes, the first is the default (default "debug gpu",
#                        the names slurm/examples/ render)
#   ZB_SLURM_PORT        slurmctld's port; the slurmd ports follow it (default 6817)
#
# How it stays contained: everything it writes is under ZB_SLURM_DIR (SLURM_CONF points there; it
# never reads or writes /etc/slurm); the daemons are addressed as 127.0.0.1; `down` signals only
# the pids recorded by `up`. munged is shared with any munged already running, and stopped by
# `down` only if `up` started it. Needs root (slurmd runs as root; mknod for the fake GPUs), and
# the Debian packages slurm-wlm, munge, openmpi-bin (libpmix2 for srun --mpi=pmix).
#
# The fake nodes all run on this host, so they share /tmp and /dev/shm: TmpFS gives each node its
# own tmp (PMIx's per-job directories collide otherwise), and jobs that span fake nodes should
# export OMPI_MCA_btl=self,tcp so Open MPI stays off shared memory.
set -euo pipefail

DIR=${ZB_SLURM_DIR:-/tmp/zerobench-slurm}
NODES=${ZB_SLURM_NODES:-2}
CPUS=${ZB_SLURM_CPUS:-64}
GPUS=${ZB_SLURM_GPUS:-4}
PARTITIONS=${ZB_SLURM_PARTITIONS:-debug gpu}
PORT=${ZB_SLURM_PORT:-6817}
CONF=$DIR/etc/slurm.conf
RUN=$DIR/run
WAIT_IDLE_S=60

log() { printf '[local-cluster] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

check_settings() {
  [[ $NODES =~ ^[1-9][0-9]?$ ]] || die "ZB_SLURM_NODES must be 1..99, not '$NODES'"
  [[ $CPUS =~ ^[1-9][0-9]*$ ]] || die "ZB_SLURM_CPUS must be a positive number, not '$CPUS'"
  [[ $GPUS =~ ^[0-9]+$ ]] || die "ZB_SLURM_GPUS must be a number, not '$GPUS'"
  [[ $PORT =~ ^[1-9][0-9]*$ ]] && [ "$PORT" -lt 65000 ] || die "ZB_SLURM_PORT must be a port number, not '$PORT'"
  local p
  for p in $PARTITIONS; do [[ $p =~ ^[A-Za-z0-9_.-]+$ ]] || die "bad partition name '$p'"; done
}

nodes() { local i; for ((i = 1; i <= NODES; i++)); do printf 'node%02d\n' "$i"; done; }

# A pid file's process is alive.
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munge() {
  if munge_ok; then
    log "munged already answers; using it"
    return
  fi
  if [ ! -s /etc/munge/munge.key ]; then
    log "creating /etc/munge/munge.key"
    if command -v mungekey >/dev/null; then mungekey --create --keyfile=/etc/munge/munge.key
    else head -c 1024 /dev/urandom >/etc/munge/munge.key; fi
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
  fi
  install -d -o munge -g munge -m 0755 /run/munge
  install -d -o munge -g munge -m 0700 /var/log/munge /var/lib/munge
  runuser -u munge -- /usr/sbin/munged
  local _
  for _ in $(seq 50); do munge_ok && break; sleep 0.1; done
  munge_ok || die "munged did not come up (see /var/log/munge/munged.log)"
  cp /run/munge/munged.pid "$RUN/munged.pid"
  log "started munged (pid $(cat "$RUN/munged.pid"))"
}

write_conf() {
  mkdir -p "$DIR"/{etc,state,log,run,spool,tmp,dev}
  local host mem n first=1 p
  host=$(hostname -s)
  mem=$(awk -v n="$NODES" '/MemTotal/ { print int($2 / 1024 / n / 2) }' /proc/meminfo)
  {
    echo "# Written by zerobench's slurm/local-cluster.sh; rewritten on every 'up'."
    echo "ClusterName=zerobench"
    echo "SlurmctldHost=${host}(127.0.0.1)"
    echo "SlurmctldPort=$PORT"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "AuthType=auth/munge"
    echo "CredType=cred/munge"
    echo "MpiDefault=none"
    # Process groups, not linuxproc: with linuxproc a cancelled step's task outlived its step
    # here and the node drained with "Kill task failed".
    echo "ProctrackType=proctrack/pgid"
    echo "TaskPlugin=task/none"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_Core"
    echo "SchedulerType=sched/backfill"
    echo "# Trust the CPUs and GPUs declared below over what the hardware has."
    echo "SlurmdParameters=config_overrides"
    echo "ReturnToService=2"
    echo "StateSaveLocation=$DIR/state"
    echo "SlurmdSpoolDir=$DIR/spool/%n"
    echo "TmpFS=$DIR/tmp/%n"
    echo "SlurmctldPidFile=$RUN/slurmctld.pid"
    echo "SlurmdPidFile=$RUN/slurmd-%n.pid"
    echo "SlurmctldLogFile=$DIR/log/slurmctld.log"
    echo "SlurmdLogFile=$DIR/log/slurmd-%n.log"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "# No accounting database: sacct fails here, as on many small clusters."
    echo "AccountingStorageType=accounting_storage/none"
    echo "JobCompType=jobcomp/none"
    echo "KillWait=5"
    [ "$GPUS" -gt 0 ] && echo "GresTypes=gpu"
    n="NodeName=node[01-$(printf '%02d' "$NODES")] NodeHostname=$host NodeAddr=127.0.0.1"
    n="$n Port=[$((PORT + 1))-$((PORT + NODES))] CPUs=$CPUS RealMemory=$mem"
    [ "$GPUS" -gt 0 ] && n="$n Gres=gpu:$GPUS"
    echo "$n State=UNKNOWN"
    for p in $PARTITIONS; do
      if [ $first = 1 ]; then echo "PartitionName=$p Nodes=ALL Default=YES MaxTime=INFINITE State=UP"; first=0
      else echo "PartitionName=$p Nodes=ALL Default=NO MaxTime=INFINITE State=UP"; fi
    done
  } >"$CONF"
  : >"$DIR/etc/gres.conf"
  for n in $(nodes); do
    mkdir -p "$DIR/spool/$n" "$DIR/tmp/$n"
    if [ "$GPUS" -gt 0 ]; then
      mkdir -p "$DIR/dev/$n"
      for ((g = 0; g < GPUS; g++)); do
        # A character device like /dev/null: Slurm only needs a device file per GPU index.
        [ -e "$DIR/dev/$n/nvidia$g" ] || mknod "$DIR/dev/$n/nvidia$g" c 1 3
      done
      echo "NodeName=$n Name=gpu File=$DIR/dev/$n/nvidia[0-$((GPUS - 1))]" >>"$DIR/etc/gres.conf"
    fi
  done
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Prints the first of slurmctld's and the slurmds' ports that something on 127.0.0.1 listens on;
# fails when all are free.
taken_port() {
  local p
  for ((p = PORT; p <= PORT + NODES; p++)); do
    port_free "$p" || { echo "$p"; return 0; }
  done
  return 1
}

cmd_up() {
  [ "$(id -u)" = 0 ] || die "run as root (slurmd must be root)"
  check_settings
  mkdir -p "$RUN"
  alive "$RUN/slurmctld.pid" && die "already up (slurmctld pid $(cat "$RUN/slurmctld.pid")); run '$0 down' first"
  local p
  if p=$(taken_port); then die "port $p on 127.0.0.1 is taken; choose another ZB_SLURM_PORT"; fi
  start_munge
  write_conf
  export SLURM_CONF=$CONF
  /usr/sbin/slurmctld -f "$CONF" -c   # -c: a clean state, nothing from an earlier run
  local n
  for n in $(nodes); do /usr/sbin/slurmd -f "$CONF" -N "$n"; done
  local st="" _
  for _ in $(seq $((WAIT_IDLE_S * 5))); do
    st=$(timeout 5 sinfo -h -o '%T' 2>/dev/null | sort -u | paste -sd, -) || true
    [ "$st" = idle ] && break
    sleep 0.2
  done
  [ "$st" = idle ] || { cmd_down; die "nodes not idle after ${WAIT_IDLE_S}s (state: ${st:-none}); logs in $DIR/log"; }
  timeout 5 sinfo -o '%P %a %D %T %N %c %G' >&2
  log "up: $NODES node(s), $CPUS CPUs and $GPUS fake GPUs each, partitions: $PARTITIONS"
  log "use it with: eval \"\$($0 env)\""
}

stop_pid_file() {
  local f=$1 p _
  [ -s "$f" ] || return 0
  p=$(cat "$f")
  if kill -0 "$p" 2>/dev/null; then
    kill "$p" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$p" 2>/dev/null; then kill -9 "$p" 2>/dev/null || true; fi
    log "stopped $(basename "$f" .pid) (pid $p)"
  fi
  rm -f "$f"
}

cmd_down() {
  export SLURM_CONF=$CONF
  if alive "$RUN/slurmctld.pid"; then
    # Jobs first, so no slurmstepd of ours outlives the daemons.
    local jobs _
    jobs=$(timeout 10 squeue -h -o %i 2>/dev/null | paste -sd' ' -) || true
    if [ -n "$jobs" ]; then
      # shellcheck disable=SC2086
      timeout 10 scancel $jobs 2>/dev/null || true
      for _ in $(seq 50); do [ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.2; done
    fi
  fi
  local f
  for f in "$RUN"/slurmd-*.pid; do stop_pid_file "$f"; done
  stop_pid_file "$RUN/slurmctld.pid"
  stop_pid_file "$RUN/munged.pid"
}

cmd_status() {
  local f up=0
  for f in "$RUN"/*.pid; do
    [ -e "$f" ] || continue
    if alive "$f"; then echo "$(basename "$f" .pid): running (pid $(cat "$f"))"; up=1
    else echo "$(basename "$f" .pid): not running (stale pid file)"; fi
  done
  if [ $up = 1 ] && alive "$RUN/slurmctld.pid"; then SLURM_CONF=$CONF timeout 5 sinfo; else echo "down"; return 1; fi
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  env) echo "export SLURM_CONF=$CONF" ;;
  ports-free) check_settings; ! taken_port >/dev/null ;;
  *) echo "usage: $0 up|down|status|env|ports-free" >&2; exit 2 ;;
esac
