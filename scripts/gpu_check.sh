#!/usr/bin/env bash
# GPU verification of the batch-decode path (issue 4) in one run on a CUDA machine: builds
# flare, runs the GPU tests against the CPU float64 reference, compute-sanitizer memcheck and
# racecheck on a small case, then the decode benchmark next to PyTorch SDPA (cuDNN, flash) on
# the same shapes, and prints a short table last. Full logs go to $OUT (default ./gpu_check_out).
# Usage: scripts/gpu_check.sh [gtest filter of the GPU tests]
#   FLARE_GTEST_SOURCE=<googletest tree> when the machine has no installed GoogleTest
#   (default: .deps/googletest when present); FLARE_GPU_CHECK_SKIP_BENCH=1 skips the benchmark;
#   FLARE_GPU_CHECK_PYTHON=1 also runs scripts/gpu_check_python.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
OUT=${OUT:-$PWD/gpu_check_out}
BUILD=${BUILD:-build-gpu}
FILTER=${1:-'*Decode*:*BatchDecode*'}
mkdir -p "$OUT"
export FLARE_CACHE_DIR="$PWD/$BUILD/jit-cache"
status=0
step() { echo "== $* ($(date +%T))"; }

step "device"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,utilization.gpu \
  --format=csv | tee "$OUT/device.txt"

step "build (log: $OUT/build.log)"
gtest_source=${FLARE_GTEST_SOURCE:-}
[ -z "$gtest_source" ] && [ -d .deps/googletest ] && gtest_source="$PWD/.deps/googletest"
if ! { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
         ${gtest_source:+-DFLARE_GTEST_SOURCE="$gtest_source"} &&
       cmake --build "$BUILD" -j"$(nproc)" --target flare_gpu_tests; } >"$OUT/build.log" 2>&1; then
  tail -n 40 "$OUT/build.log"
  exit 1
fi

step "GPU tests vs the float64 reference (log: $OUT/gpu_tests.log)"
"$BUILD/flare_gpu_tests" --gtest_filter="$FILTER" --gtest_output="json:$OUT/gpu_tests.json" \
  >"$OUT/gpu_tests.log" 2>&1 || status=1
grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests? ran|^\[  FAILED  \]" "$OUT/gpu_tests.log" | tail -n 30

step "compute-sanitizer memcheck + racecheck, small case (logs: $OUT/*check.log)"
for tool in memcheck racecheck; do
  compute-sanitizer --tool "$tool" --error-exitcode 99 \
    "$BUILD/flare_gpu_tests" --gtest_filter='BatchDecodeErrors.SanitizerSmallCase' \
    >"$OUT/$tool.log" 2>&1
  rc=$?
  echo "$tool: exit $rc; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$tool.log" | tail -n 1)"
  [ "$rc" -eq 0 ] || status=1
done

if [ "${FLARE_GPU_CHECK_PYTHON:-0}" = 1 ] && [ -x scripts/gpu_check_python.sh ]; then
  step "python package"
  scripts/gpu_check_python.sh "$OUT/python" || status=1
fi

if [ "${FLARE_GPU_CHECK_SKIP_BENCH:-0}" != 1 ]; then
  step "benchmark (logs: $OUT/bench.log, $OUT/flare_bench.jsonl, $OUT/anchors.json)"
  FLARE_DECODE_BENCH="$OUT/flare_bench.jsonl" "$BUILD/flare_gpu_tests" \
    --gtest_filter='DecodeBenchmark.*' >"$OUT/bench.log" 2>&1 || { status=1; tail -n 20 "$OUT/bench.log"; }
  PYTHONUNBUFFERED=1 python3 scripts/anchor_decode.py --flare "$OUT/flare_bench.jsonl" \
    --out "$OUT/anchors.json" 2>&1 | tee "$OUT/table.txt" || status=1
fi
step "done: status $status"
exit "$status"
