#!/usr/bin/env bash
# Issue 19's kernel iterations on the GPU, on the tree as it is (apply or reverse a patch from
# experiments/ first): `tests` runs the Hopper tests, the prefill and user-variant suites under
# auto, memcheck / racecheck / synccheck on a small ragged and a paged case (a hang means the turns are
# unpaired: the tests have a timeout), then what `bench` runs: the package installed from this
# tree and bench_python.py's prefill rows next to cuDNN and FlashInfer fa3. Carry .anchors-fi.
# Usage (GPU machine, OUT set): experiments/hopper_next_check.sh [tests | bench]
# The C++ bench on the same build: g++ -O2 -std=c++20 -Iinclude -I. scripts/bench_prefill.cpp
#   -Lbuild-gpu -lflare -Wl,-rpath,$PWD/build-gpu -o build-gpu/bench_prefill, then
#   FLARE_BENCH_BACKEND=fa3 (or fa2) build-gpu/bench_prefill. (The sixth session's v10 patch, the
#   gathers arriving on `full` by themselves, ran here and was not kept: docs/perf.md.)
set -uo pipefail
MODE=${1:-tests}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH FLARE_LOG=quiet FLARE_CACHE_DIR=$PWD/build-gpu/jit-cache
if [ "$MODE" = tests ]; then
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLARE_GTEST_SOURCE=/usr/src/googletest >$OUT/cmake.log 2>&1 &&
    cmake --build build-gpu -j16 --target flare_gpu_tests >$OUT/build.log 2>&1 || { tail -40 $OUT/build.log; exit 1; }
  timeout 240 build-gpu/flare_gpu_tests --gtest_filter='PrefillHopper.*:PrefillGpu.*:UserVariant*' >$OUT/tests.log 2>&1
  echo "tests: exit $?"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure" $OUT/tests.log | head -20
  # The prefill suite on the Hopper family alone (auto sends paged K/V and RoPE to FA2), less the
  # tests that pin FA2's 16-row tiles.
  FLARE_TEST_PREFILL_BACKEND=fa3 timeout 240 build-gpu/flare_gpu_tests \
    --gtest_filter='PrefillGpu.*:UserVariantPrefill.*:-PrefillGpu.EveryQueryTile:UserVariantPrefill.LibraryPrefixLm*:UserVariantPrefill.LibraryDocumentMask*:UserVariantPrefill.AMaskThatIsNotAWindow*' \
    >$OUT/tests_fa3.log 2>&1
  echo "tests under fa3: exit $?"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure" $OUT/tests_fa3.log | head -20
  for tool in memcheck racecheck synccheck; do
    timeout 200 compute-sanitizer --tool $tool --error-exitcode 99 build-gpu/flare_gpu_tests \
      --gtest_filter='PrefillHopper.RaggedF16Gqa8OddLengths:PrefillHopper.PagedPageSizes1And5AppendGqa7Hnd' \
      >$OUT/$tool.log 2>&1
    echo "$tool: exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/$tool.log | tail -1)"
  done
fi
scripts/gpu_check_python.sh $OUT/py -q -k "fused_rope_prefill or batch_invariant" 2>&1 | tail -1
[ -d /tmp/fi-site/flashinfer ] || python3 .anchors-fi/setup_fi.py /tmp/fi-site >$OUT/fi_setup.log 2>&1
(cd /tmp && PYTHONPATH=/tmp/fi-site timeout 200 python3 $OLDPWD/scripts/bench_python.py --only prefill \
   --run-calls 200 --plan-calls 50 2>&1 | grep -v Warning | sed -n '/^device:/,$p' | grep -E "device|L[0-9]+ \| (flare|flashinfer fa3|cudnn)")
