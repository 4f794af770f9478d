#!/usr/bin/env bash
# Issue 19's next steps, prepared without device time (2026-11-26, fourth session), not yet run;
# each patch applies to main on its own:
# - experiments/hopper_v5_pingpong.patch: the producer arrives once per stage on `full` (the
#   suspected cause of v4's 8-13% loss against v2, docs/perf.md "Hopper prefill") and FA3's
#   ping-pong between the two consumer warpgroups (named barriers 4 and 5: one's GEMM while the
#   other's softmax). Prediction (H200, causal b16 D 128, graph): the single arrival brings v2's
#   458 / 480 TFLOP/s at 4096 / 16384 back; ping-pong adds 10-15% (FA3's ablation).
# - experiments/hopper_v6_tma.patch: v5 plus bulk tensor copies (TMA) of ragged K/V without RoPE
#   (one producer thread per stage, maps encoded in run() and cached; cp.async when a base or
#   stride is not 16-byte aligned). Prediction: ragged causal +5-10% over v5 (the producer's
#   address work and its 128-thread landing wait go away).
# Both compile for every shipped configuration with 0 spills and no serialized MMA (C7518).
# This applies the patch to the device's copy of the tree, then runs the Hopper tests, the prefill
# suite under auto, memcheck / racecheck / synccheck on a small case (a hang means the turns
# are unpaired: the tests have a timeout), and bench_python.py's prefill rows. Carry .anchors-fi.
# Usage (GPU machine, OUT set): experiments/hopper_next_check.sh [v5_pingpong | v6_tma]
set -uo pipefail
PATCH=experiments/hopper_${1:-v5_pingpong}.patch
git apply "$PATCH" || { echo "$PATCH does not apply"; exit 1; }
export PATH=/usr/local/cuda/bin:$PATH FLARE_LOG=quiet FLARE_CACHE_DIR=$PWD/build-gpu/jit-cache
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLARE_GTEST_SOURCE=/usr/src/googletest >$OUT/cmake.log 2>&1 &&
  cmake --build build-gpu -j16 --target flare_gpu_tests >$OUT/build.log 2>&1 || { tail -40 $OUT/build.log; exit 1; }
timeout 240 build-gpu/flare_gpu_tests --gtest_filter='PrefillHopper.*:PrefillGpu.*:UserVariant*' >$OUT/tests.log 2>&1
echo "tests: exit $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure" $OUT/tests.log | head -20
for tool in memcheck racecheck synccheck; do
  timeout 100 compute-sanitizer --tool $tool --error-exitcode 99 build-gpu/flare_gpu_tests \
    --gtest_filter='PrefillHopper.RaggedF16Gqa8OddLengths' >$OUT/$tool.log 2>&1
  echo "$tool: exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/$tool.log | tail -1)"
done
scripts/gpu_check_python.sh $OUT/py -q -k "fused_rope_prefill or batch_invariant" 2>&1 | tail -2
python3 .anchors-fi/setup_fi.py /tmp/fi-site >$OUT/fi_setup.log 2>&1
(cd /tmp && PYTHONPATH=/tmp/fi-site timeout 200 python3 $OLDPWD/scripts/bench_python.py --only prefill \
   --run-calls 200 --plan-calls 50 2>&1 | grep -v Warning | sed -n '/^device:/,$p')
