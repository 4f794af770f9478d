#!/usr/bin/env bash
# One device call for a Hopper-family kernel change: builds the GPU tests, runs the Hopper
# family's tests, the prefill suite under auto (with user variants, IndexSafety, NVFP4 and graph
# cases), compute-sanitizer memcheck / racecheck / synccheck on a small case and on the case where
# two CTAs take every work item in turn, then experiments/prefill_ab.sh against a base tree (e.g.
# `git archive main | tar -x -C .scratch/base`, carried) on the causal rows of bench_prefill.
# Usage (GPU machine, OUT set): experiments/hopper_ab_check.sh <base tree> [rounds]
set -uo pipefail
export PATH=/usr/local/cuda/bin:$PATH FLARE_LOG=quiet
BASE=$1
ROUNDS=${2:-2}
t0=$(date +%s)
echo "== build $(date +%T)"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLARE_GTEST_SOURCE=/usr/src/googletest >"$OUT/cmake.log" 2>&1 &&
  cmake --build build-gpu -j"$(nproc)" --target flare_gpu_tests >"$OUT/build.log" 2>&1 ||
  { tail -40 "$OUT/build.log"; exit 1; }
export FLARE_CACHE_DIR=$PWD/build-gpu/jit-cache
summary() { grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|Which is|max_abs" "$1" | head -30; }
echo "== PrefillHopper $(date +%T)"
build-gpu/flare_gpu_tests --gtest_filter='PrefillHopper.*' >"$OUT/hopper.log" 2>&1; summary "$OUT/hopper.log"
echo "== A/B against $BASE $(date +%T)"
FLARE_BENCH_ONLY="causal" bash experiments/prefill_ab.sh "$BASE" "$PWD" "$ROUNDS" 2>&1
echo "== prefill suite, backend auto $(date +%T)"
build-gpu/flare_gpu_tests \
  --gtest_filter='PrefillGpu.*:UserVariant*:*IndexSafetyPrefill*:*BatchPrefillNvfp4*:*PrefillGraph*' \
  >"$OUT/auto.log" 2>&1
summary "$OUT/auto.log"
echo "== sanitizers $(date +%T)"
for tool in memcheck racecheck synccheck; do
  timeout 150 compute-sanitizer --tool $tool --error-exitcode 99 build-gpu/flare_gpu_tests \
    --gtest_filter='PrefillHopper.FewCtasTakeManyItemsInTurn:PrefillHopper.RaggedF16Gqa8OddLengths' \
    >"$OUT/$tool.log" 2>&1
  echo "$tool: exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$tool.log" | tail -1)"
done
echo "total $(( $(date +%s) - t0 )) s"
