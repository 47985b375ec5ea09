# Shared by launch/pretrain_*.sh: resolve settings, build the srun + torchrun command, run it.
# Sourced, not executed. Every setting is an environment variable with a per-script default:
#   CONFIG        YAML run config                 RUN_DIR     where logs/checkpoints go
#   NODES         nodes (default: SLURM_JOB_NUM_NODES, else the script's NODES_DEFAULT)
#   DEVICE        gpu (default) or cpu: no GPU visible (the trainer takes gloo), one process per
#                 CPU of the task, e.g. `DEVICE=cpu sbatch --gpus-per-node=0 --cpus-per-task=2 ...`
#   GPUS_PER_NODE processes per node: 8 (gpu), SLURM_CPUS_PER_TASK or 1 (cpu)
#   OMP_NUM_THREADS  threads per process: the task's CPUs / processes per node (at least 1)
#   TP, PP, MBS, GBS  parallel layout and batch: passed only when set; otherwise the config's count
#   PYTHON        python with the package installed
#   PLAN          refuse (default): stop before srun when biglm-plan predicts the layout does not
#                 fit the GPUs' memory; warn: print its line and run; off: skip the check
#   GPU_KIND      the GPUs biglm-plan plans for (a100-80gb; cpu with DEVICE=cpu)
#   MASTER_PORT   29500                           REQUEUE     1: requeue after a signal-stop
#   EXTRA_ARGS    more key=value overrides        DRY_RUN=1   print the resolved environment and command
#   ENTRY         the module torchrun runs (megatron_biglm.cli.train; launch/finetune.sh: megatron_biglm.cli.finetune)
# Extra key=value arguments given to the script are appended as overrides too.
# The config reads variables of its own (the paper presets: DATA_ROOT, the indexed binaries, and
# BIGLM_TOKENIZER); they reach biglm-plan and torchrun as set, so even DRY_RUN needs them set.
# DRY_RUN prints where each of TP, PP, MBS and GBS came from (the environment or the config).
# Before launching it prints the kernel report (megatron_biglm.cli.kernels) and stops
# if the config names a kernel that is not installed.
# Signals (what SLURM sends, see README "Running on a cluster"): the `--signal=USR1@120` warning
# reaches every process of the job step on every node (torchrun and the trainers); launch/step.sh
# runs torchrun with USR1 ignored (its default action is to die, which would orphan the trainers
# mid-save), the trainers finish the step, save and exit 0, and this script requeues the job. SIGTERM
# (scancel, the time limit, preemption) makes the trainers save too, within SLURM's KillWait.
set -euo pipefail

: "${NODES:=${SLURM_JOB_NUM_NODES:-$NODES_DEFAULT}}"
: "${DEVICE:=gpu}"
case $DEVICE in
  gpu) : "${GPUS_PER_NODE:=8}" ;;
  cpu) : "${GPUS_PER_NODE:=${SLURM_CPUS_PER_TASK:-1}}"
       export CUDA_VISIBLE_DEVICES="" ;;
  *) echo "launch: DEVICE=$DEVICE: use gpu or cpu" >&2; exit 2 ;;
esac
: "${MASTER_PORT:=29500}"
: "${PYTHON:=python}"
: "${REQUEUE:=1}"
: "${EXTRA_ARGS:=}"
: "${ENTRY:=megatron_biglm.cli.train}"
: "${RUN_DIR:=$REPO/runs/$RUN_NAME}"
: "${CONFIG:=$REPO/examples/configs/$CONFIG_NAME}"
: "${PLAN:=refuse}"
case $PLAN in refuse|warn|off) ;; *) echo "launch: PLAN=$PLAN: use refuse, warn or off" >&2; exit 2 ;; esac
if [[ $DEVICE == cpu ]]; then : "${GPU_KIND:=cpu}"; else : "${GPU_KIND:=a100-80gb}"; fi

if ! "$PYTHON" -c "import megatron_biglm.config" 2>/dev/null; then
  echo "launch: PYTHON=$PYTHON cannot import megatron_biglm (set PYTHON to the python the package is installed in)" >&2
  exit 2
fi
if [[ ! -f "$CONFIG" ]]; then
  echo "launch: config $CONFIG not found (set CONFIG=path/to/run.yaml)" >&2
  exit 2
fi

# The layout has one source: the config, unless the user sets TP, PP, MBS or GBS.
OVERRIDES=("run_dir=$RUN_DIR")
declare -A SOURCE=()
for v in TP PP MBS GBS; do
  if [[ -n "${!v:-}" ]]; then
    case $v in
      TP) OVERRIDES+=("parallelism.tensor_model_parallel_size=$TP") ;;
      PP) OVERRIDES+=("parallelism.pipeline_model_parallel_size=$PP") ;;
      MBS) OVERRIDES+=("training.micro_batch_size=$MBS") ;;
      GBS) OVERRIDES+=("training.global_batch_size=$GBS") ;;
    esac
    SOURCE[$v]="environment $v"
  else
    SOURCE[$v]="config"
  fi
done
# shellcheck disable=SC2206
OVERRIDES+=($EXTRA_ARGS "$@")
read -r TP PP MBS GBS < <("$PYTHON" -m megatron_biglm.cli.plan --config "$CONFIG" --print-layout "${OVERRIDES[@]}" 2>/dev/null) || true
if [[ -z "${GBS:-}" ]]; then
  "$PYTHON" -m megatron_biglm.cli.plan --config "$CONFIG" --print-layout "${OVERRIDES[@]}" >/dev/null || true
  echo "launch: cannot read the layout from $CONFIG (the error above)" >&2
  exit 2
fi

WORLD=$((NODES * GPUS_PER_NODE))
if (( WORLD % (TP * PP) != 0 )); then
  echo "launch: $NODES nodes x $GPUS_PER_NODE GPUs = $WORLD is not divisible by TP*PP = $TP*$PP" >&2
  exit 2
fi
DP=$((WORLD / (TP * PP)))
if (( GBS % (MBS * DP) != 0 )); then
  echo "launch: global batch $GBS is not divisible by micro-batch $MBS x DP $DP = $((MBS * DP))" >&2
  exit 2
fi

if [[ -n "${SLURM_JOB_NODELIST:-}" ]]; then
  # the first node's address as SLURM reaches it (NodeAddr; the node name where none is set)
  MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
  addr=$(scontrol show node -o "$MASTER_ADDR" 2>/dev/null | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2 || true)
  MASTER_ADDR=${addr:-$MASTER_ADDR}
else
  MASTER_ADDR=${MASTER_ADDR:-localhost}
fi
JOB_ID=${SLURM_JOB_ID:-local}

# NCCL / CUDA settings for A100 InfiniBand clusters; each can be overridden from outside.
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}   # megatron TP overlap ordering
export TORCH_NCCL_ASYNC_ERROR_HANDLING=${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}  # fail instead of hanging
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
export NCCL_IB_TIMEOUT=${NCCL_IB_TIMEOUT:-22}
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-^lo,docker}
# the CPUs SLURM gave each task, shared by its processes (64 CPUs / 8 GPUs = 8 threads each)
CPUS=${SLURM_CPUS_PER_TASK:-$(nproc)}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( CPUS / GPUS_PER_NODE > 0 ? CPUS / GPUS_PER_NODE : 1 ))}
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}
export PYTHONUNBUFFERED=1


TORCHRUN=("$PYTHON" -m torch.distributed.run
  --nnodes="$NODES" --nproc-per-node="$GPUS_PER_NODE"
  --rdzv-id="$JOB_ID" --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT"
  -m "$ENTRY" --config "$CONFIG" "${OVERRIDES[@]}")
# srun of SLURM 22.05 no longer reads SLURM_CPUS_PER_TASK: the step gets the job's CPUs only when
# told. On each node launch/step.sh runs torchrun (USR1 ignored; see "Signals" above) and ends
# what a killed rank left behind.
LAUNCH=(srun --ntasks-per-node=1 ${SLURM_CPUS_PER_TASK:+--cpus-per-task=$SLURM_CPUS_PER_TASK}
        --kill-on-bad-exit=1 --cpu-bind=none bash "$REPO/launch/step.sh" "${TORCHRUN[@]}")

# A failure inside a job names the job, the step and the log (the job's StdOut).
failed() {
  local what=$1 rc=$2 log="" step=""
  if [[ -n "${SLURM_JOB_ID:-}" ]]; then
    log=$(scontrol show job -o "$SLURM_JOB_ID" 2>/dev/null | grep -o 'StdOut=[^ ]*' | cut -d= -f2 || true)
    [[ -n "$log" && -r "$log" ]] && step=$(grep -o '^launch: step [0-9.]*' "$log" | tail -n 1 | cut -d' ' -f3 || true)
  fi
  echo "launch: job $JOB_ID failed: $what${step:+ (step $step)} exited with status $rc; log: ${log:-this output}" >&2
}

if [[ "${DRY_RUN:-0}" == "1" ]]; then
  echo "# nodes=$NODES gpus_per_node=$GPUS_PER_NODE world=$WORLD tp=$TP pp=$PP dp=$DP mbs=$MBS gbs=$GBS"
  echo "# tp from ${SOURCE[TP]}, pp from ${SOURCE[PP]}, mbs from ${SOURCE[MBS]}, gbs from ${SOURCE[GBS]}"
  for v in CUDA_DEVICE_MAX_CONNECTIONS TORCH_NCCL_ASYNC_ERROR_HANDLING NCCL_DEBUG NCCL_IB_TIMEOUT \
           NCCL_SOCKET_IFNAME OMP_NUM_THREADS HF_HUB_OFFLINE; do
    echo "export $v=${!v}"
  done
  printf '%q ' "${LAUNCH[@]}"
  echo
  exit 0
fi

# The planner on the resolved layout and this allocation: a layout predicted not to fit the GPUs'
# memory stops here, before srun, with the breakdown and the nearest layout that fits.
if [[ "$ENTRY" == "megatron_biglm.cli.train" && "$PLAN" != off ]]; then
  if ! "$PYTHON" -m megatron_biglm.cli.plan --config "$CONFIG" --nodes "$NODES" --gpus-per-node "$GPUS_PER_NODE" \
       --gpu "$GPU_KIND" "${OVERRIDES[@]}"; then
    if [[ "$PLAN" == refuse ]]; then
      failed "the plan before srun (biglm-plan: the layout does not fit; PLAN=warn runs it anyway)" 2
      exit 2
    fi
    echo "launch: PLAN=warn: running a layout biglm-plan predicts does not fit" >&2
  fi
fi

# The kernels and versions this node runs with (attention backend as resolved, megatron's Adam,
# flash-attn / Transformer Engine / Apex, python, torch, megatron-core, transformers). A config
# naming a kernel that is not installed stops here, before srun, saying what to pip install.
# A fine-tune takes its model from the checkpoint it starts from: its ranks print the report.
if [[ "$ENTRY" == "megatron_biglm.cli.train" ]]; then
  "$PYTHON" -m megatron_biglm.cli.kernels --config "$CONFIG" "${OVERRIDES[@]}" \
    || { failed "the kernel check before srun" 2; exit 2; }
fi

mkdir -p "$RUN_DIR"
echo "launch: job $JOB_ID, $NODES nodes x $GPUS_PER_NODE processes x $OMP_NUM_THREADS threads, TP=$TP PP=$PP DP=$DP, run dir $RUN_DIR"
set +e
"${LAUNCH[@]}"
rc=$?
set -e
# The trainer exits 0 both when done and after a signal-triggered save; only the first
# writes train_done.json. A signal-stop (time limit / preemption) requeues the job, which
# resumes from the checkpoint it just wrote.
if [[ $rc -eq 0 && ! -f "$RUN_DIR/train_done.json" && "$REQUEUE" == "1" && -n "${SLURM_JOB_ID:-}" ]]; then
  echo "launch: stopped before the end; requeueing job $SLURM_JOB_ID"
  scontrol requeue "$SLURM_JOB_ID"
fi
(( rc == 0 )) || failed "srun $ENTRY on $NODES node(s)" "$rc"
exit $rc
