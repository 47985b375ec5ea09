#!/usr/bin/env bash
# One node's part of a training job step: launch/common.sh has srun run it once per node as
#   bash launch/step.sh python -m torch.distributed.run ...
# It
#   - names the step in the job's log ("launch: step JOB.STEP on NODE"), for the failure message;
#   - runs torchrun with SIGUSR1 ignored: SLURM's time-limit warning (`--signal=USR1@120`) reaches
#     every process of the step, torchrun included, whose default action on USR1 is to die and
#     orphan the trainers mid-save; the trainers catch it, save and exit 0;
#   - stays until torchrun has ended (SIGTERM, SIGINT and SIGHUP do not end it: torchrun gets
#     them from SLURM too and shuts its trainers down), then ends what the step left behind on
#     this node: a rank killed with SIGKILL leaves its checkpoint writer's multiprocessing server
#     alive, holding the step's output open, so srun and the job would wait until the time limit.
#     proctrack/cgroup ends such orphans itself; proctrack/linuxproc and proctrack/pgid lose them.
# Exits with torchrun's status.
set -u
echo "launch: step ${SLURM_JOB_ID:-}.${SLURM_STEP_ID:-} on ${SLURMD_NODENAME:-$(hostname -s)}"
trap '' USR1
trap ':' TERM INT HUP
"$@" &
child=$!
wait "$child"
rc=$?
while kill -0 "$child" 2>/dev/null; do  # a trapped signal interrupted the wait
  wait "$child"
  rc=$?
done

# The processes of this step on this node that are still alive: their environment names the job,
# the step and the node (several slurmds may share one host).
[[ -n "${SLURM_JOB_ID:-}" && -n "${SLURM_STEP_ID:-}" ]] || exit "$rc"
want=("SLURM_JOB_ID=$SLURM_JOB_ID" "SLURM_STEP_ID=$SLURM_STEP_ID" "SLURMD_NODENAME=${SLURMD_NODENAME:-}")
left=()
for env in /proc/[0-9]*/environ; do
  pid=${env#/proc/}
  pid=${pid%/environ}
  [[ $pid == "$$" ]] && continue
  { mapfile -d "" vars <"$env"; } 2>/dev/null || continue
  found=0
  for var in "${vars[@]}"; do
    for w in "${want[@]}"; do [[ $var == "$w" ]] && found=$((found + 1)); done
  done
  (( found == ${#want[@]} )) && left+=("$pid")
done
if (( ${#left[@]} > 0 )); then
  names=""
  for pid in "${left[@]}"; do
    { mapfile -d "" argv <"/proc/$pid/cmdline"; } 2>/dev/null
    names+=" [$pid ${argv[*]:0:3}]"
  done
  echo "launch: step $SLURM_JOB_ID.$SLURM_STEP_ID on ${SLURMD_NODENAME:-}: ending ${#left[@]} process(es) left behind:$names" >&2
  kill -KILL "${left[@]}" 2>/dev/null
fi
exit "$rc"
