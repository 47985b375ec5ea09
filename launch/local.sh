#!/usr/bin/env bash
# One machine, no SLURM: CPU (gloo) or all local GPUs (NCCL).
#   bash launch/local.sh                                   # tiny preset on CPU, 1 process
#   NPROC=2 bash launch/local.sh parallelism.tensor_model_parallel_size=2
#   CONFIG=examples/configs/biglm_136m.yaml bash launch/local.sh training.micro_batch_size=4
#   DRY_RUN=1 bash launch/local.sh                         # print the command only
# NPROC defaults to the number of visible GPUs, or 1 on CPU. Extra args are key=value overrides.
set -euo pipefail
REPO=${REPO:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
: "${PYTHON:=python}"
: "${CONFIG:=$REPO/examples/configs/tiny_cpu.yaml}"
if [[ -z "${NPROC:-}" ]]; then
  NPROC=$("$PYTHON" -c "import torch; print(max(torch.cuda.device_count(), 1))" 2>/dev/null || echo 1)
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / NPROC > 0 ? $(nproc) / NPROC : 1 ))}
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}
CMD=("$PYTHON" -m torch.distributed.run --standalone --nproc-per-node="$NPROC"
     -m megatron_biglm.cli.train --config "$CONFIG" "$@")
if [[ "${DRY_RUN:-0}" == "1" ]]; then
  echo "# nproc=$NPROC"
  printf '%q ' "${CMD[@]}"
  echo
  exit 0
fi
exec "${CMD[@]}"
