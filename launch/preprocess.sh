#!/usr/bin/env bash
# Preprocess a corpus too large for one node as a SLURM job array: task k of SHARDS tokenizes
# a contiguous, byte-balanced run of the sorted input files into OUT/shard_KKKKK_{key}_document
# .{bin,idx} (k zero-padded to 5 digits) and writes OUT/shard_KKKKK.manifest.json last.
#   SHARDS=64 INPUT='corpus/*.jsonl.zst' TOKENIZER=tok/ OUT=data/shards \
#     sbatch --array=0-63 launch/preprocess.sh            # from the repository root
#   DRY_RUN=1 SHARDS=64 INPUT=... bash launch/preprocess.sh       # print the plan only
#   LOCAL=1 SHARDS=4 INPUT=... TOKENIZER=... OUT=... bash launch/preprocess.sh   # no SLURM
#   python -m megatron_biglm.cli.merge_datasets --shards data/shards --output-prefix data/web   # afterwards
# The array range goes on the sbatch command line (--array=0-(SHARDS-1), optionally %M to run
# at most M tasks at once) rather than as an #SBATCH --array line, so it always matches SHARDS.
# Re-submitting the same array redoes only the missing or stale shards (a shard is current
# when its manifest matches its inputs' sizes/mtimes, the tokenizer, the options and its
# outputs' checksums); `--array=3,5` (with SHARDS still set) re-runs just those tasks.
# Settings (environment variables):
#   INPUT      globs, files or directories (space-separated), or @LIST: a file naming one input per line
#   TOKENIZER  tokenizer directory               OUT        shard directory
#   SHARDS     shards in the plan (default: SLURM_ARRAY_TASK_COUNT); --array must be 0-(SHARDS-1)
#   JSON_KEYS  text                              APPEND_EOD 1 (0: no EOS after each document)
#   WORKERS    tokenizer processes per task (default: SLURM_CPUS_PER_TASK, else 1)
#   TEXT_MODE  block|file (plain text)           INPUT_FORMAT auto|jsonl|text|parquet
#   STRICT=1   bad input is fatal                FORCE=1    redo shards even when current
#   DRY_RUN=1  print the plan                    LOCAL=1    run all SHARDS tasks here, in turn
#   PYTHON     python with the package installed
#SBATCH --job-name=biglm-preprocess
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=32
#SBATCH --time=12:00:00
#SBATCH --open-mode=append
#SBATCH --output=%x-%A_%a.out
set -euo pipefail
REPO=${REPO:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." 2>/dev/null && pwd)}
[[ -f "$REPO/launch/common.sh" ]] || REPO=${SLURM_SUBMIT_DIR:?run sbatch from the repository root}
: "${PYTHON:=python}"
: "${SHARDS:=${SLURM_ARRAY_TASK_COUNT:-}}"
: "${JSON_KEYS:=text}"
: "${APPEND_EOD:=1}"
: "${WORKERS:=${SLURM_CPUS_PER_TASK:-1}}"
: "${TEXT_MODE:=block}"
: "${INPUT_FORMAT:=auto}"
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}
export PYTHONUNBUFFERED=1

for v in INPUT SHARDS; do
  if [[ -z "${!v:-}" ]]; then
    echo "preprocess: set $v (see the header of launch/preprocess.sh)" >&2
    exit 2
  fi
done
if ! WHY=$("$PYTHON" -c "import megatron_biglm.data.shards" 2>&1); then
  echo "preprocess: PYTHON=$PYTHON cannot import megatron_biglm (${WHY##*$'\n'}); set PYTHON to the python" \
       "that has the package installed (e.g. PYTHON=/path/to/venv/bin/python)" >&2
  exit 2
fi
read -r -a INPUTS <<< "$INPUT"        # split on spaces; globs stay unexpanded for Python
read -r -a KEYS <<< "$JSON_KEYS"
ARGS=(--input "${INPUTS[@]}" --shards "$SHARDS")

if [[ "${DRY_RUN:-0}" == "1" ]]; then
  exec "$PYTHON" -m megatron_biglm.cli.preprocess_shards "${ARGS[@]}" --dry-run
fi
for v in TOKENIZER OUT; do
  if [[ -z "${!v:-}" ]]; then
    echo "preprocess: set $v (see the header of launch/preprocess.sh)" >&2
    exit 2
  fi
done
if [[ "${LOCAL:-0}" == "1" ]]; then
  TASK=all
elif [[ -n "${SLURM_ARRAY_TASK_ID:-}" ]]; then
  TASK=$SLURM_ARRAY_TASK_ID
else
  echo "preprocess: not a SLURM array task; submit with sbatch --array=0-$((SHARDS - 1)), or set LOCAL=1" >&2
  exit 2
fi
ARGS+=(--tokenizer "$TOKENIZER" --out "$OUT" --task "$TASK" --json-keys "${KEYS[@]}"
       --workers "$WORKERS" --text-mode "$TEXT_MODE" --input-format "$INPUT_FORMAT")
[[ "$APPEND_EOD" == "1" ]] && ARGS+=(--append-eod) || ARGS+=(--no-append-eod)
[[ "${STRICT:-0}" == "1" ]] && ARGS+=(--strict)
[[ "${FORCE:-0}" == "1" ]] && ARGS+=(--force)
echo "preprocess: job ${SLURM_ARRAY_JOB_ID:-local}, task $TASK of $SHARDS shards -> $OUT"
exec "$PYTHON" -m megatron_biglm.cli.preprocess_shards "${ARGS[@]}"
