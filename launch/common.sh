# Shared by launch/pretrain_*.sh: resolve settings, build the srun + torchrun command, run it.
# Sourced, not executed. Every setting is an environment variable with a per-script default:
#   CONFIG        YAML run config                 RUN_DIR     where logs/checkpoints go
#   NODES         nodes (default: SLURM_JOB_NUM_NODES, else the script's NODES_DEFAULT)
#   GPUS_PER_NODE 8                               TP, PP, MBS, GBS  parallel layout and batch
#   MASTER_PORT   29500                           PYTHON      python with the package installed
#   EXTRA_ARGS    more key=value overrides        REQUEUE     1: requeue after a signal-stop
#   DRY_RUN=1     print the resolved environment and command; run nothing
#   ENTRY         the module torchrun runs (megatron_biglm.cli.train; launch/finetune.sh: megatron_biglm.cli.finetune)
# Extra key=value arguments given to the script are appended as overrides too.
# Before launching it prints the kernel report (megatron_biglm.cli.kernels) and stops
# if the config names a kernel that is not installed.
set -euo pipefail

: "${NODES:=${SLURM_JOB_NUM_NODES:-$NODES_DEFAULT}}"
: "${GPUS_PER_NODE:=8}"
: "${TP:=$TP_DEFAULT}"
: "${PP:=$PP_DEFAULT}"
: "${MBS:=$MBS_DEFAULT}"
: "${GBS:=1024}"
: "${MASTER_PORT:=29500}"
: "${PYTHON:=python}"
: "${REQUEUE:=1}"
: "${EXTRA_ARGS:=}"
: "${ENTRY:=megatron_biglm.cli.train}"
: "${RUN_DIR:=$REPO/runs/$RUN_NAME}"
: "${CONFIG:=$REPO/examples/configs/$CONFIG_NAME}"

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
if [[ ! -f "$CONFIG" ]]; then
  echo "launch: config $CONFIG not found (set CONFIG=path/to/run.yaml)" >&2
  exit 2
fi

if [[ -n "${SLURM_JOB_NODELIST:-}" ]]; then
  MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
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
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}
export PYTHONUNBUFFERED=1

OVERRIDES=(
  "run_dir=$RUN_DIR"
  "parallelism.tensor_model_parallel_size=$TP"
  "parallelism.pipeline_model_parallel_size=$PP"
  "training.micro_batch_size=$MBS"
  "training.global_batch_size=$GBS"
)
# shellcheck disable=SC2206
OVERRIDES+=($EXTRA_ARGS "$@")

TORCHRUN=("$PYTHON" -m torch.distributed.run
  --nnodes="$NODES" --nproc-per-node="$GPUS_PER_NODE"
  --rdzv-id="$JOB_ID" --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT"
  -m "$ENTRY" --config "$CONFIG" "${OVERRIDES[@]}")
LAUNCH=(srun --ntasks-per-node=1 --kill-on-bad-exit=1 --cpu-bind=none "${TORCHRUN[@]}")

if [[ "${DRY_RUN:-0}" == "1" ]]; then
  echo "# nodes=$NODES gpus_per_node=$GPUS_PER_NODE world=$WORLD tp=$TP pp=$PP dp=$DP mbs=$MBS gbs=$GBS"
  for v in CUDA_DEVICE_MAX_CONNECTIONS TORCH_NCCL_ASYNC_ERROR_HANDLING NCCL_DEBUG NCCL_IB_TIMEOUT \
           NCCL_SOCKET_IFNAME OMP_NUM_THREADS HF_HUB_OFFLINE; do
    echo "export $v=${!v}"
  done
  printf '%q ' "${LAUNCH[@]}"
  echo
  exit 0
fi

# The kernels and versions this node runs with (attention backend as resolved, megatron's Adam,
# flash-attn / Transformer Engine / Apex, python, torch, megatron-core, transformers). A config
# naming a kernel that is not installed stops here, before srun, saying what to pip install.
# A fine-tune takes its model from the checkpoint it starts from: its ranks print the report.
if [[ "$ENTRY" == "megatron_biglm.cli.train" ]]; then
  "$PYTHON" -m megatron_biglm.cli.kernels --config "$CONFIG" "${OVERRIDES[@]}" || exit 2
fi

mkdir -p "$RUN_DIR"
echo "launch: job $JOB_ID, $NODES nodes, TP=$TP PP=$PP DP=$DP, run dir $RUN_DIR"
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
exit $rc
