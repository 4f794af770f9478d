#!/usr/bin/env bash
# Issue 18's ALiBi (distances converted on the FMA pipe) and prefix-LM (visible_end hint) on the
# GPU: the GPU tests of every family that runs them against the float64 reference, memcheck on
# a small ALiBi and prefix-LM case, the Python variant tests, then scripts/bench_variants.py
# (flare's Hopper and FA2 families vs FlexAttention in the same process).
# Usage (GPU machine, OUT set): experiments/variant_hint_check.sh [tests | bench | all]
set -uo pipefail
MODE=${1:-all}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH FLARE_LOG=quiet FLARE_CACHE_DIR=$PWD/build-gpu/jit-cache
if [ "$MODE" != bench ]; then
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLARE_GTEST_SOURCE=/usr/src/googletest >$OUT/cmake.log 2>&1 &&
    cmake --build build-gpu -j16 --target flare_gpu_tests >$OUT/build.log 2>&1 || { tail -40 $OUT/build.log; exit 1; }
  timeout 280 build-gpu/flare_gpu_tests \
    --gtest_filter='PrefillHopper.*:PrefillGpu.*:UserVariant*:*BatchDecodeVsReference*' >$OUT/tests.log 2>&1
  echo "tests: exit $?"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure" $OUT/tests.log | head -20
  FLARE_TEST_PREFILL_BACKEND=fa2 timeout 120 build-gpu/flare_gpu_tests \
    --gtest_filter='PrefillGpu.SlidingWindowSoftCapAlibiCausal*:UserVariantPrefill.*' >$OUT/tests_fa2.log 2>&1
  echo "tests under fa2: exit $?"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure" $OUT/tests_fa2.log | head -10
  timeout 200 compute-sanitizer --tool memcheck --error-exitcode 99 build-gpu/flare_gpu_tests \
    --gtest_filter='PrefillGpu.SlidingWindowSoftCapAlibiCausal*:UserVariantPrefill.LibraryPrefixLm*' \
    >$OUT/memcheck.log 2>&1
  echo "memcheck: exit $? $(grep -E 'ERROR SUMMARY' $OUT/memcheck.log | tail -1)"
fi
scripts/gpu_check_python.sh $OUT/py -q -k "alibi or prefix_lm or variant" 2>&1 | tail -1
if [ "$MODE" != tests ]; then
  (cd scripts && timeout 300 python3 bench_variants.py --lengths 4096,8192,16384 \
     --variants causal,alibi,prefix_lm,soft_cap 2>&1 | grep -v Warning | tail -30)
fi
