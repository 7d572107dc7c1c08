#!/usr/bin/env bash
# One device call that checks and times everything: the GPU test suite, then both benchmarks.
# Usage (repository root, on the GPU machine): bash bench/gpu_session.sh [tests|bench|ab|first|all] [extra bench args]
# (ab: bench/ab_prefix.py, the prefix-prefill switch A/B over shapes, pages and layouts, into $OUT/ab.log;
#  first: bench/first_call.py, cold/warm first-call times per kernel, dtype and head size)
# Pass BENCH_COMMIT=<sha> in the command: the device copy of .git may be older than the tree it runs.
# Writes under $OUT (or ./gpu-out): tests.log, junit.xml, bench.log, results.tgz (csv/md/png).
set -uo pipefail
what=${1:-all}; shift || true
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
export PYTHONPATH="$(ls -d "$PWD"/packages/*/src | paste -sd:):$PWD/.peers"
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
{
  date -u; echo "commit ${BENCH_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} 2>&1 | tee "$OUT/env.txt"
rc=0
if [[ $what == tests || $what == all ]]; then
  timeout ${TEST_TIMEOUT:-330} python3 -m pytest ${TEST_PATHS:-tests} -n ${XDIST:-16} --durations=15 -v -rfE -p no:cacheprovider --maxfail=30 \
    --junitxml "$OUT/junit.xml" ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/tests.log" | grep -E "FAILED|ERROR|passed|failed" | tail -40
  rc=${PIPESTATUS[0]}
fi
if [[ $what == ab ]]; then
  timeout ${BENCH_TIMEOUT:-400} python3 bench/ab_prefix.py --out "$OUT" "$@" 2>&1 | tee "$OUT/ab.log" | grep -E "SPREAD|bitwise"
fi
if [[ $what == first ]]; then
  timeout ${BENCH_TIMEOUT:-400} python3 bench/first_call.py --out "$OUT" "$@" 2>&1 | tee "$OUT/first_call.log"
fi
if [[ $what == bench || $what == all ]]; then
  res=$OUT/res; mkdir -p "$res"
  for s in ${BENCHES:-window_prefill prefix_prefill}; do
    timeout ${BENCH_TIMEOUT:-280} python3 bench/$s.py --out "$res" "$@" 2>&1 | tee -a "$OUT/bench.log"
  done
  tar czf "$OUT/results.tgz" -C "$res" . && rm -rf "$res"
fi
exit $rc
