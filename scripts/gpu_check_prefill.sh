#!/usr/bin/env bash
# GPU verification of the batch-prefill path (issue 5) in one run on a CUDA machine: builds
# flare, runs the prefill GPU tests against the CPU float64 reference, compute-sanitizer
# memcheck and racecheck on a small case, then the prefill benchmark next to PyTorch SDPA
# (flash, cuDNN) on the same shapes. Full logs go to $OUT (default ./gpu_check_out).
# Usage: scripts/gpu_check_prefill.sh   (FLARE_GTEST_SOURCE=<googletest tree> if needed;
#   FLARE_GPU_CHECK_SKIP_BENCH=1 skips the benchmark; FLARE_GPU_CHECK_TILES="128x32 64x64"
#   repeats the flare benchmark with those tiles forced, after the heuristic's)
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
OUT=${OUT:-$PWD/gpu_check_out}
BUILD=${BUILD:-build-gpu}
mkdir -p "$OUT"
export FLARE_CACHE_DIR="$PWD/$BUILD/jit-cache"
status=0
step() { echo "== $* ($(date +%T))"; }

step "build (log: $OUT/prefill_build.log)"
if ! { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
         ${FLARE_GTEST_SOURCE:+-DFLARE_GTEST_SOURCE="$FLARE_GTEST_SOURCE"} &&
       cmake --build "$BUILD" -j"$(nproc)" --target flare_gpu_tests flare &&
       g++ -O2 -std=c++20 -Iinclude -I. scripts/bench_prefill.cpp -L"$BUILD" -lflare \
         -Wl,-rpath,"$PWD/$BUILD" -o "$BUILD/bench_prefill"; } >"$OUT/prefill_build.log" 2>&1; then
  tail -n 40 "$OUT/prefill_build.log"
  exit 1
fi

step "prefill GPU tests vs the float64 reference (log: $OUT/prefill_tests.log)"
"$BUILD/flare_gpu_tests" --gtest_filter='PrefillGpu.*' >"$OUT/prefill_tests.log" 2>&1 || status=1
grep -E "^\[ +(OK|FAILED|SKIPPED) |tests? ran|Failure|Which is|max_abs" "$OUT/prefill_tests.log" |
  tail -n 60

step "compute-sanitizer memcheck + racecheck, small cases (logs: $OUT/prefill_*check.log)"
for tool in memcheck racecheck; do
  compute-sanitizer --tool "$tool" --error-exitcode 99 "$BUILD/flare_gpu_tests" \
    --gtest_filter='PrefillGpu.EmptyRequestsAndQueriesBeyondTheCache:PrefillGpu.CustomMaskTreeAttention' \
    >"$OUT/prefill_$tool.log" 2>&1
  rc=$?
  echo "$tool: exit $rc; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/prefill_$tool.log" | tail -n 1)"
  [ "$rc" -eq 0 ] || status=1
done

if [ "${FLARE_GPU_CHECK_SKIP_BENCH:-0}" != 1 ]; then
  step "benchmark (log: $OUT/prefill_bench.log)"
  "$BUILD/bench_prefill" 2>&1 | tee "$OUT/prefill_bench.log" || status=1
  PYTHONUNBUFFERED=1 python3 scripts/bench_prefill_torch.py 2>&1 | tee -a "$OUT/prefill_bench.log" ||
    status=1
  for tiles in ${FLARE_GPU_CHECK_TILES:-}; do
    step "benchmark with tiles $tiles forced"
    FLARE_BENCH_QUERY_TILE=${tiles%x*} FLARE_BENCH_KV_TILE=${tiles#*x} "$BUILD/bench_prefill" 2>&1 |
      tee -a "$OUT/prefill_bench.log" || status=1
  done
fi
exit $status
