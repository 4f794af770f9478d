#!/usr/bin/env bash
# Issue 19, first device call of the Hopper prefill family (kernels/wgmma.cuh): builds the GPU
# tests, runs the Hopper family's tests, the whole prefill suite under backend auto (the Hopper
# family for query tiles >= 64) and under fa2, the user variants, compute-sanitizer on a small
# Hopper case, then the prefill rows of bench_python.py (flare auto and fa2, FlashInfer fa3 and
# fa2, SDPA cuDNN and flash in one process). Carry .anchors-fi.
# Usage (GPU machine, OUT set): experiments/hopper_prefill_check.sh tests|python|all
set -uo pipefail
export PATH=/usr/local/cuda/bin:$PATH FLARE_LOG=quiet FLARE_CACHE_DIR=$PWD/build-gpu/jit-cache
STAGE=${1:-tests}
if [ "$STAGE" = all ]; then
  bash "$0" tests
  exec bash "$0" python
fi
if [ "$STAGE" = python ]; then
  echo "== python prefill / variant / sparse tests $(date +%T)"
  scripts/gpu_check_python.sh $OUT/py -q -k "prefill or variant or sparse or cascade or attention" 2>&1 | tail -12
  echo "== bench_python prefill $(date +%T)"
  python3 .anchors-fi/setup_fi.py /tmp/fi-site >$OUT/fi_setup.log 2>&1
  (cd /tmp && PYTHONPATH=/tmp/fi-site timeout 300 python3 $OLDPWD/scripts/bench_python.py --only prefill \
     --run-calls 200 --plan-calls 50 2>&1 | grep -v Warning | sed -n '/^device:/,$p')
  echo "== done $(date +%T)"
  exit 0
fi
echo "== build $(date +%T)"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLARE_GTEST_SOURCE=/usr/src/googletest >$OUT/cmake.log 2>&1 &&
  cmake --build build-gpu -j16 --target flare_gpu_tests >$OUT/build.log 2>&1 || { tail -40 $OUT/build.log; exit 1; }
summary() { grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|error|Which is|max_abs|l2" "$1" | head -${2:-30}; }
echo "== PrefillHopper $(date +%T)"
build-gpu/flare_gpu_tests --gtest_filter='PrefillHopper.*' >$OUT/hopper.log 2>&1; summary $OUT/hopper.log 40
echo "== PrefillGpu + UserVariant*, backend auto $(date +%T)"
build-gpu/flare_gpu_tests --gtest_filter='PrefillGpu.*:UserVariant*' >$OUT/auto.log 2>&1; summary $OUT/auto.log
echo "== PrefillGpu, backend fa2 $(date +%T)"
FLARE_TEST_PREFILL_BACKEND=fa2 build-gpu/flare_gpu_tests --gtest_filter='PrefillGpu.*' >$OUT/fa2.log 2>&1; summary $OUT/fa2.log
echo "== sanitizers $(date +%T)"
for tool in memcheck racecheck synccheck; do
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 99 build-gpu/flare_gpu_tests \
    --gtest_filter='PrefillHopper.RaggedF16Gqa8OddLengths' >$OUT/$tool.log 2>&1
  echo "$tool: exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/$tool.log | tail -1)"
done
echo "== done $(date +%T)"
