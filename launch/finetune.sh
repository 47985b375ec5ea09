#!/usr/bin/env bash
# Fine-tune a pretrained BiGLM on one task (examples/configs/finetune/TASK.yaml).
#   TASK=mnli BIGLM_INIT=runs/biglm_136m sbatch launch/finetune.sh     # from the repository root
#   DRY_RUN=1 TASK=cb bash launch/finetune.sh                          # print the command only
# Same launcher as pretraining (launch/common.sh: NODES, TP, PP, MBS, GBS, EXTRA_ARGS, ...); the batch
# sizes are the task config's unless MBS/GBS are set;
# a signal-stop requeues the job and the same command resumes the fine-tune.
#SBATCH --job-name=biglm-finetune
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=1
#SBATCH --cpus-per-task=8
#SBATCH --exclusive
#SBATCH --time=24:00:00
#SBATCH --signal=USR1@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=%x-%j.out
REPO=${REPO:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." 2>/dev/null && pwd)}
[[ -f "$REPO/launch/common.sh" ]] || REPO=${SLURM_SUBMIT_DIR:?run sbatch from the repository root}
: "${TASK:=mnli}"
: "${GPUS_PER_NODE:=1}"   # the tasks' batch sizes (e.g. boolq: 16, micro-batch 8) are one GPU's
NODES_DEFAULT=1
RUN_NAME=finetune_$TASK CONFIG_NAME=finetune/$TASK.yaml ENTRY=megatron_biglm.cli.finetune
source "$REPO/launch/common.sh"
