#!/usr/bin/env bash
# A SLURM cluster on this host for the launch tests (and for trying launch/ by hand):
#   bash tests/slurm/cluster.sh up      # install (root), configure, start; prints `export SLURM_CONF=...`
#   bash tests/slurm/cluster.sh down    # cancel its jobs, stop its daemons, remove its state
#   bash tests/slurm/cluster.sh status  # exit 0 when it answers
# Everything lives under BIGLM_SLURM_DIR (default /tmp/biglm-slurm): slurm.conf, a munge key and
# socket of its own (a system munged or slurm, if any, is left alone), logs, spool and state.
# Ports: BIGLM_SLURM_PORT (slurmctld, default 6917) and the next two (the slurmds).
# Without systemd: munged, slurmctld and slurmd run as daemons with pid files in that folder.
# Nodes: two slurmds on this host, nodes biglm-a and biglm-b (NodeAddr 127.0.0.1), when the
# installed SLURM is built with multiple-slurmd support (`scontrol show config` says
# MULTIPLE_SLURMD = Yes; Debian 12's slurm-wlm 22.05 is). Each node declares all of the host's
# CPUs (what its slurmd detects), so a 2-CPU job fits on one node and a 2-node job runs one
# task per node: jobs here run one at a time, or they share the cores. Otherwise (or with
# BIGLM_SLURM_NODES=1) one node named after this host.
# Settings chosen for tests: proctrack/linuxproc and task/none (no cgroups: this works in a
# container), KillWait 10 s (SIGTERM -> SIGKILL), MinJobAge 30 s, a job-credential lifetime of
# 5 s (a requeued job restarts on the same node only after its old credential expires: the
# default 120 s would idle the test for two minutes), a scheduler pass every 2 s (a requeued job
# becomes eligible by the clock, which only the periodic pass notices: 60 s by default), and jobcomp/filetxt: every job's end
# state (COMPLETED, FAILED, CANCELLED, TIMEOUT, ...) is appended to jobcomp.log after
# MinJobAge has dropped it from squeue/scontrol.
set -euo pipefail

DIR=${BIGLM_SLURM_DIR:-/tmp/biglm-slurm}
PORT=${BIGLM_SLURM_PORT:-6917}
CONF=$DIR/slurm.conf
KILL_WAIT=${BIGLM_SLURM_KILL_WAIT:-10}
PACKAGES=(slurm-wlm munge)

say() { echo "cluster: $*" >&2; }
die() { say "$*"; exit 1; }

install_packages() {
  local missing=()
  for bin in slurmctld slurmd sbatch munged; do
    command -v "$bin" >/dev/null 2>&1 || [[ -x /usr/sbin/$bin ]] || missing+=("$bin")
  done
  (( ${#missing[@]} == 0 )) && return 0
  if [[ $(id -u) != 0 ]]; then
    die "missing ${missing[*]}; install them as root (Debian/Ubuntu: sudo apt-get install -y ${PACKAGES[*]}), then re-run 'bash $0 up' as root (the daemons run as root)"
  fi
  command -v apt-get >/dev/null 2>&1 || die "missing ${missing[*]} and no apt-get here: install SLURM (slurmctld, slurmd) and munge with this system's package manager"
  say "installing ${PACKAGES[*]} (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" >"$DIR/apt.log" 2>&1 \
    || { apt-get update -q >>"$DIR/apt.log" 2>&1 && apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" >>"$DIR/apt.log" 2>&1; } \
    || die "apt-get install ${PACKAGES[*]} failed: see $DIR/apt.log"
}

multiple_slurmd() {
  # a build with --enable-multiple-slurmd says so in the controller's config dump
  local config=""
  for _ in $(seq 120); do
    config=$(SLURM_CONF=$CONF scontrol show config 2>/dev/null) && [[ -n $config ]] && break
    sleep 0.5
  done
  [[ -n $config ]] || die "slurmctld does not answer: see $DIR/slurmctld.log"
  grep -q '^MULTIPLE_SLURMD *= *Yes' <<<"$config"
}

node_names() {
  if [[ -f $DIR/nodes ]]; then cat "$DIR/nodes"; else hostname -s; fi
}

host_cpus() {
  # what slurmd detects (nproc would follow OMP_NUM_THREADS, e.g. a test runner's 1)
  local slurmd
  slurmd=$(command -v slurmd || echo /usr/sbin/slurmd)
  "$slurmd" -C 2>/dev/null | grep -o 'CPUs=[0-9]*' | head -n 1 | cut -d= -f2
}

write_conf() {
  local two=$1 cpus mem host
  cpus=$(host_cpus)
  mem=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
  host=$(hostname -s)
  cat >"$CONF" <<CONF
# Written by tests/slurm/cluster.sh: a test cluster on $host.
ClusterName=biglm
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket.2,cred_expire=5
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/jobcomp.log
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MinJobAge=30
KillWait=$KILL_WAIT
InactiveLimit=0
Waittime=0
SlurmctldTimeout=30
SlurmdTimeout=30
CONF
  if [[ $two == 1 ]]; then
    printf 'biglm-a\nbiglm-b\n' >"$DIR/nodes"
    echo "NodeName=biglm-a NodeHostname=$host NodeAddr=127.0.0.1 Port=$((PORT + 1)) CPUs=$cpus RealMemory=$mem State=UNKNOWN" >>"$CONF"
    echo "NodeName=biglm-b NodeHostname=$host NodeAddr=127.0.0.1 Port=$((PORT + 2)) CPUs=$cpus RealMemory=$mem State=UNKNOWN" >>"$CONF"
  else
    echo "$host" >"$DIR/nodes"
    echo "NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN" >>"$CONF"
  fi
  echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO" >>"$CONF"
}

start_munge() {
  mkdir -p "$DIR/munge"
  chmod 700 "$DIR/munge"
  [[ -f $DIR/munge/munge.key ]] || { dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none; chmod 400 "$DIR/munge/munge.key"; }
  local munged
  munged=$(command -v munged || echo /usr/sbin/munged)
  "$munged" --force --socket="$DIR/munge/munge.socket.2" --key-file="$DIR/munge/munge.key" \
    --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/munge/munged.log" --seed-file="$DIR/munge/munged.seed" \
    || die "munged did not start: see $DIR/munge/munged.log"
}

wait_idle() {
  local want node state
  want=$(wc -l <"$DIR/nodes")
  for _ in $(seq 60); do
    state=$(SLURM_CONF=$CONF sinfo -h -N -o '%N %t' 2>/dev/null | awk '$2 == "idle"' | wc -l)
    (( state >= want )) && return 0
    sleep 1
  done
  SLURM_CONF=$CONF sinfo -N -l >&2 || true
  die "the nodes did not become idle in 60 s: see $DIR/slurmctld.log and $DIR/slurmd-*.log"
}

up() {
  if [[ -f $CONF ]] && SLURM_CONF=$CONF scontrol ping 2>/dev/null | grep -q UP; then
    say "already up ($CONF)"
    echo "export SLURM_CONF=$CONF"
    return 0
  fi
  mkdir -p "$DIR" 2>/dev/null || die "cannot create $DIR (set BIGLM_SLURM_DIR to a folder of your own)"
  install_packages
  [[ $(id -u) == 0 ]] || die "the test cluster's daemons run as root: run 'sudo bash $0 up'"
  # a cleared controller numbers jobs from 1 again: an earlier cluster's jobcomp records would
  # carry the new jobs' ids, so they go with its state
  rm -rf "$DIR/ctld" "$DIR/spool" "$DIR/nodes" "$DIR/jobcomp.log"
  mkdir -p "$DIR/ctld" "$DIR/spool"
  write_conf 0
  start_munge
  local slurmctld slurmd
  slurmctld=$(command -v slurmctld || echo /usr/sbin/slurmctld)
  slurmd=$(command -v slurmd || echo /usr/sbin/slurmd)
  "$slurmctld" -f "$CONF" -c -i || die "slurmctld did not start: see $DIR/slurmctld.log"
  if [[ ${BIGLM_SLURM_NODES:-2} == 2 ]] && multiple_slurmd; then
    # the build answers only through a running slurmctld: restart it on the two-node config
    stop_pid "$DIR/slurmctld.pid"
    rm -rf "$DIR/ctld"/*
    write_conf 1
    "$slurmctld" -f "$CONF" -c -i || die "slurmctld did not start: see $DIR/slurmctld.log"
  fi
  while read -r node; do
    mkdir -p "$DIR/spool/$node"
    "$slurmd" -f "$CONF" -N "$node" || die "slurmd $node did not start: see $DIR/slurmd-$node.log"
  done <"$DIR/nodes"
  wait_idle
  say "up: $(wc -l <"$DIR/nodes") node(s) $(paste -sd, "$DIR/nodes"), $(host_cpus) CPUs each"
  echo "export SLURM_CONF=$CONF"
}

stop_pid() {
  local file=$1 pid
  [[ -f $file ]] || return 0
  pid=$(cat "$file")
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.2; done
  kill -9 "$pid" 2>/dev/null || true
}

down() {
  [[ -d $DIR ]] || { say "nothing to stop ($DIR absent)"; return 0; }
  if [[ -f $CONF ]]; then
    SLURM_CONF=$CONF scancel --full --quiet $(SLURM_CONF=$CONF squeue -h -o %i 2>/dev/null) 2>/dev/null || true
    for _ in $(seq $((KILL_WAIT + 5))); do
      [[ -z $(SLURM_CONF=$CONF squeue -h -t R,CG 2>/dev/null) ]] && break
      sleep 1
    done
  fi
  for f in "$DIR"/slurmd-*.pid; do stop_pid "$f"; done
  stop_pid "$DIR/slurmctld.pid"
  stop_pid "$DIR/munge/munged.pid"
  rm -rf "$DIR"
  say "down"
}

status() {
  [[ -f $CONF ]] && SLURM_CONF=$CONF scontrol ping 2>/dev/null | grep -q UP && SLURM_CONF=$CONF sinfo -N
}

case ${1:-} in
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
