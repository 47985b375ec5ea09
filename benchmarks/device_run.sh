#!/usr/bin/env bash
# The prepared device run, one call of a lent GPU (one H100/H200, Python 3.12, torch 2.11,
# no megatron-core, no internet, 10 minutes a command): planned to end within 420 s of wall
# time, so a second call can resume what is missing.
#
#   bash benchmarks/device_run.sh [benchmark flags...]            # on the device ($OUT set)
#   bash benchmarks/device_run.sh --dry-run [benchmark flags...]  # on CPU: the benchmark's dry run only
#   bash benchmarks/device_run.sh --resume                        # a second call: the sections the JSON lacks
#
# $OUT starts empty on every call: for --resume, put the first call's gpu_acceptance.json in
# .gpu_resume/ (git-ignored) and carry it with .whl.
#
# 1. install   the carried wheels (.whl/, benchmarks/device_wheels.txt) offline      ~30 s
# 2. tests     the `-m gpu` tests of the GPU-only paths, capped                       <= 90 s
# 3. benchmark `python -m benchmarks gpu` with a total budget of what is left,
#              at most 300 s, flags passed on; JSON rewritten after every row         <= 300 s
# Everything lands under $OUT (a fresh temporary folder when unset): device.txt,
# gpu_tests.log, bench.log and gpu/ (gpu_acceptance.json and .md).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-$(mktemp -d)}
PLAN_S=420 TESTS_S=90 BENCH_S=300
dry=0 resume=0
for arg in "$@"; do
  case $arg in --dry-run) dry=1;; --resume) resume=1;; esac
done
start=$SECONDS
mkdir -p "$OUT/gpu"
if [ $resume -eq 1 ] && [ ! -f "$OUT/gpu/gpu_acceptance.json" ] && [ -f .gpu_resume/gpu_acceptance.json ]; then
  cp .gpu_resume/gpu_acceptance.json "$OUT/gpu/"
fi
export PYTHONUNBUFFERED=1

if [ $dry -eq 0 ]; then
  if [ $resume -eq 0 ] || [ ! -d /tmp/site ]; then
    ls .whl/*.whl >/dev/null 2>&1 || { echo "device_run: no wheels in .whl/ (here: python benchmarks/device_wheels.py download; then carry .whl)" >&2; exit 3; }
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      || { echo "device_run: the offline install of .whl/ failed" >&2; exit 3; }
  fi
  export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
  { nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; git rev-parse --short HEAD; $PY -V; } \
    > "$OUT/device.txt" 2>&1
  echo "device_run: installed in $((SECONDS - start)) s"
  if [ $resume -eq 0 ]; then
    timeout $TESTS_S $PY -m pytest -q -p no:cacheprovider -m gpu -rs \
      tests/inference/test_static_cache.py tests/model/test_split_kernel.py tests/model/test_model.py \
      tests/training/test_prefetch.py tests/training/test_train_host_reads.py 2>&1 | tee "$OUT/gpu_tests.log"
    echo "device_run: tests exit ${PIPESTATUS[0]} at $((SECONDS - start)) s"
  fi
  left=$((PLAN_S - (SECONDS - start) - 10))
  bench=$((left < BENCH_S ? left : BENCH_S))
  # the sections share what is left after start-up (imports, the peak matmul: ~25 s)
  timeout "$bench" $PY -m benchmarks gpu --out "$OUT/gpu" --budget-s $((bench - 25)) "$@" 2>&1 | tee "$OUT/bench.log"
  rc=${PIPESTATUS[0]}
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
  $PY -m benchmarks gpu --out "$OUT/gpu" "$@" 2>&1 | tee "$OUT/bench.log"
  rc=${PIPESTATUS[0]}
fi
echo "device_run: benchmark exit $rc; whole run $((SECONDS - start)) s (planned <= $PLAN_S s); results in $OUT"
exit "$rc"
