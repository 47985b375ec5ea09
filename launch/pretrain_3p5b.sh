#!/usr/bin/env bash
# BiGLM-3.5B pretraining (paper Table 7: seq 2048, global batch 1024, 300k steps, WSD 20 %).
#   sbatch launch/pretrain_3p5b.sh                 # from the repository root
#   DRY_RUN=1 bash launch/pretrain_3p5b.sh         # print the resolved command only
# Layout: the config's (TP=1 PP=1, micro-batch 4: biglm-plan's fastest that fits A100-80GB); see launch/common.sh.
#SBATCH --job-name=biglm-3p5b
#SBATCH --nodes=32
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=64
#SBATCH --exclusive
#SBATCH --time=48:00:00
#SBATCH --signal=USR1@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=%x-%j.out
REPO=${REPO:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." 2>/dev/null && pwd)}
[[ -f "$REPO/launch/common.sh" ]] || REPO=${SLURM_SUBMIT_DIR:?run sbatch from the repository root}
NODES_DEFAULT=32
RUN_NAME=biglm_3p5b CONFIG_NAME=biglm_3p5b.yaml
source "$REPO/launch/common.sh"
