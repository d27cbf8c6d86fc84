#!/usr/bin/env bash
# A SLURM cluster on this one machine, for trying hydra/launcher=slurm and for the slow tests: Debian's slurm-wlm
# (22.05) and munge, run as root, everything (config, keys, state, logs) under one directory.
#
#   tests/local_slurm.sh start   # writes $ATTNLAB_SLURM_DIR/slurm.conf, starts munged, slurmctld and one slurmd per
#                                  # node, waits until sinfo shows every node idle, prints what to export
#   eval "$(tests/local_slurm.sh start)"   # ... and exports it (SLURM_CONF, MASTER_ADDR)
#   tests/local_slurm.sh stop    # cancels the jobs left, stops the daemons (the directory stays: its logs)
#
# Two nodes (ATTNLAB_SLURM_NODES) on one host: each is a NodeName with its own slurmd port, started as
# `slurmd -N <node>` (no cgroups needed: proctrack/linuxproc, task/none), so a 2-node job really runs 2 slurmd steps.
# No accounting (sacct answers "accounting storage is disabled"); a requeued job waits cred_expire=10 s, not 120 s.
set -euo pipefail

DIR=${ATTNLAB_SLURM_DIR:-/tmp/attnlab-slurm}
PORT=${ATTNLAB_SLURM_PORT:-17100}  # slurmctld's; the nodes' slurmd take the next ones
NODES=${ATTNLAB_SLURM_NODES:-2}
CPUS=${ATTNLAB_SLURM_CPUS:-1}  # CPUs per node: what a job may ask for on it

fail() { echo "error: local_slurm: $*" >&2; exit 1; }

write_config() {
  local host names="" n
  host=$(hostname)
  mkdir -p "$DIR/state" "$DIR/spool" "$DIR/munge"
  chmod 755 "$DIR" "$DIR/munge"
  [ -s "$DIR/munge.key" ] || (umask 077 && dd if=/dev/urandom of="$DIR/munge.key" bs=1024 count=1 status=none)
  {
    echo "ClusterName=attnlab-local"
    echo "SlurmctldHost=$host(127.0.0.1)"
    echo "SlurmctldPort=$PORT"
    echo "SlurmUser=root"
    echo "AuthType=auth/munge"
    echo "CredType=cred/munge"
    echo "AuthInfo=socket=$DIR/munge/munge.socket,cred_expire=10"
    echo "StateSaveLocation=$DIR/state"
    echo "SlurmdSpoolDir=$DIR/spool/%n"
    echo "SlurmctldPidFile=$DIR/slurmctld.pid"
    echo "SlurmdPidFile=$DIR/slurmd-%n.pid"
    echo "SlurmctldLogFile=$DIR/slurmctld.log"
    echo "SlurmdLogFile=$DIR/slurmd-%n.log"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "AccountingStorageType=accounting_storage/none"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_CPU"
    echo "ReturnToService=2"
    echo "JobRequeue=1"
    echo "MinJobAge=300"
    echo "KillWait=30"
    for n in $(seq 1 "$NODES"); do
      echo "NodeName=node$n NodeHostname=$host NodeAddr=127.0.0.1 Port=$((PORT + n)) CPUs=$CPUS State=UNKNOWN"
      names+="${names:+,}node$n"
    done
    echo "PartitionName=local Nodes=$names Default=YES MaxTime=INFINITE State=UP"
  } >"$DIR/slurm.conf"
}

start() {
  command -v slurmctld >/dev/null && command -v munged >/dev/null \
    || fail "slurm-wlm and munge are not installed (apt-get install -y slurm-wlm munge)"
  [ "$(id -u)" = 0 ] || fail "run as root (slurmd starts jobs as their users)"
  stop >/dev/null 2>&1 || true
  write_config
  export SLURM_CONF=$DIR/slurm.conf
  munged --force --socket="$DIR/munge/munge.socket" --key-file="$DIR/munge.key" --pid-file="$DIR/munged.pid" \
    --log-file="$DIR/munged.log" --seed-file="$DIR/munged.seed"
  slurmctld -f "$SLURM_CONF"
  for n in $(seq 1 "$NODES"); do slurmd -f "$SLURM_CONF" -N "node$n"; done
  for _ in $(seq 1 60); do
    if [ "$(sinfo -h -o '%t %D' 2>/dev/null)" = "idle $NODES" ]; then
      # the nodes are names on this host, which no resolver knows: rank 0's address for DDP is the loopback
      echo "export SLURM_CONF=$SLURM_CONF MASTER_ADDR=127.0.0.1"
      return
    fi
    sleep 1
  done
  sinfo >&2 || true
  fail "the nodes did not become idle in 60 s (logs: $DIR/slurmctld.log, $DIR/slurmd-node1.log)"
}

stop() {
  local pidfile pid
  if [ -s "$DIR/slurmctld.pid" ] && kill -0 "$(cat "$DIR/slurmctld.pid")" 2>/dev/null; then
    export SLURM_CONF=$DIR/slurm.conf  # cancel what still runs, or its steps would outlive their slurmd
    squeue -h -o %A | xargs -r scancel --full
    for _ in $(seq 1 60); do [ -z "$(squeue -h -o %A)" ] && break; sleep 1; done
  fi
  for pidfile in "$DIR"/slurmd-*.pid "$DIR/slurmctld.pid" "$DIR/munged.pid"; do
    [ -s "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    rm -f "$pidfile"
  done
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) fail "usage: $0 start|stop (settings: ATTNLAB_SLURM_DIR, ATTNLAB_SLURM_PORT, ATTNLAB_SLURM_NODES)" ;;
esac
