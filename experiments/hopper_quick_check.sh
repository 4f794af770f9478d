#!/usr/bin/env bash
# A shorter device call than hopper_prefill_check.sh all (for a nearly spent device budget): the
# Hopper family's tests and the prefill suite under backend auto, memcheck and racecheck on a
# small Hopper case, then bench_python.py's prefill rows. Carry .anchors-fi. OUT set.
set -uo pipefail
export PATH=/usr/local/cuda/bin:$PATH FLARE_LOG=quiet FLARE_CACHE_DIR=$PWD/build-gpu/jit-cache
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLARE_GTEST_SOURCE=/usr/src/googletest >$OUT/cmake.log 2>&1 &&
  cmake --build build-gpu -j16 --target flare_gpu_tests >$OUT/build.log 2>&1 || { tail -40 $OUT/build.log; exit 1; }
build-gpu/flare_gpu_tests --gtest_filter='PrefillHopper.*:PrefillGpu.*' >$OUT/tests.log 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure" $OUT/tests.log | head -20
for tool in memcheck racecheck; do
  timeout 100 compute-sanitizer --tool $tool --error-exitcode 99 build-gpu/flare_gpu_tests \
    --gtest_filter='PrefillHopper.RaggedF16Gqa8OddLengths' >$OUT/$tool.log 2>&1
  echo "$tool: exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/$tool.log | tail -1)"
done
scripts/gpu_check_python.sh $OUT/py -q -k "fused_rope_prefill or batch_invariant" 2>&1 | tail -2
python3 .anchors-fi/setup_fi.py /tmp/fi-site >$OUT/fi_setup.log 2>&1
(cd /tmp && PYTHONPATH=/tmp/fi-site timeout 200 python3 $OLDPWD/scripts/bench_python.py --only prefill \
   --run-calls 200 --plan-calls 50 2>&1 | grep -v Warning | sed -n '/^device:/,$p')
