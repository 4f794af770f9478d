#!/usr/bin/env bash
# The Hopper prefill family's bulk copies of paged K/V (pages of >= 64 rows) on the GPU.
# `tests`: the Hopper, prefill, user-variant and index-safety GPU tests against the float64
# reference, then memcheck / racecheck / synccheck on the bulk-page index-safety case and a small
# bulk-page prefill. `bench`: the C++ prefill bench at pages of 16 / 64 / 128 on both families
# (causal b16 h16 D 128), and scripts/bench_block_sparse.py at 8192 / 16384.
# Usage (GPU machine, OUT set): experiments/hopper_paged_bulk_check.sh tests | bench
set -uo pipefail
MODE=${1:-tests}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH FLARE_LOG=quiet FLARE_CACHE_DIR=$PWD/build-gpu/jit-cache
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLARE_GTEST_SOURCE=/usr/src/googletest >$OUT/cmake.log 2>&1 &&
  cmake --build build-gpu -j16 --target flare_gpu_tests flare >$OUT/build.log 2>&1 || { tail -40 $OUT/build.log; exit 1; }
if [ "$MODE" = tests ]; then
  timeout 300 build-gpu/flare_gpu_tests \
    --gtest_filter='PrefillHopper.*:PrefillGpu.*:UserVariantPrefill.*:IndexSafety*' >$OUT/tests.log 2>&1
  echo "tests: exit $?"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure" $OUT/tests.log | head -20
  for tool in memcheck racecheck synccheck; do
    timeout 150 compute-sanitizer --tool $tool --error-exitcode 99 build-gpu/flare_gpu_tests \
      --gtest_filter='IndexSafetyPrefillGpu.HopperBulkPagesSkipOutOfRangeIdsAndReportThem' \
      >$OUT/$tool.log 2>&1
    echo "$tool: exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/$tool.log | tail -1)"
  done
else
  g++ -O2 -std=c++20 -Iinclude -I. scripts/bench_prefill.cpp -Lbuild-gpu -lflare \
    -Wl,-rpath,$PWD/build-gpu -o build-gpu/bench_prefill || exit 1
  for page in 16 64 128; do
    for backend in fa3 fa2; do
      echo "== page $page $backend"
      FLARE_BENCH_PAGE=$page FLARE_BENCH_BACKEND=$backend FLARE_BENCH_ONLY="causal b16" \
        timeout 120 build-gpu/bench_prefill 2>&1 | grep -E "causal b16"
    done
  done
  scripts/gpu_check_python.sh $OUT/py -q -k "block_sparse" 2>&1 | tail -1
  (cd scripts && timeout 240 python3 bench_block_sparse.py --lengths 8192,16384 2>&1 |
     grep -v "Warning\|^\[flare\]" | tail -12)
fi
