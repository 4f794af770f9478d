#!/usr/bin/env bash
# The first device calls after the thirtieth session (docs/perf.md there), in order of value:
#   1 (tests): racecheck of PrefillHopper.FewCtasTakeManyItemsInTurn (is the hand-off slot's
#     report, seen on the cascade, the Hopper kernel's own?); the branch cascade-merge-heads'
#     GPU tests (merge items covering every KV head: merge kernel changed) on both families and
#     under memcheck;
#   2 (bench): C++ bench_cascade of main and of the branch (plan_cascade host time: predicted
#     89-184 -> ~30-60 us at b64; GPU time unchanged), Python bench_cascade.py (the one-launch path
#     after the merge-loop fix, never measured through Python), bench_quest.py (its Flex anchor's
#     first run), experiments/split_vs_queue_sweep.py q1 shapes (the merge-loop fix on ordinary
#     split prefill plans: is the planner's 8 us merge price now too high?).
# Usage (GPU machine, OUT set, carry .anchors-fi and the branch's tree, made here with
#   mkdir -p .scratch/b && git archive cascade-merge-heads | tar -x -C .scratch/b):
#   bash experiments/cascade_next_check.sh tests .scratch/b    (~250 s)
#   bash experiments/cascade_next_check.sh bench .scratch/b    (~300 s)
set -uo pipefail
stage=${1:?tests|bench}
branch=${2:?branch tree}
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH FLARE_LOG=quiet
mkdir -p "$OUT"
build_tests() {  # tree: its flare_gpu_tests in <tree>/build-gpu
  (cd "$1" && cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null &&
    cmake --build build-gpu -j"$(nproc)" --target flare_gpu_tests flare >/dev/null)
}
if [ "$stage" = tests ]; then
  build_tests . && FLARE_CACHE_DIR=$PWD/build-gpu/jit-cache compute-sanitizer --tool racecheck \
    --print-limit 2 build-gpu/flare_gpu_tests --gtest_filter='PrefillHopper.FewCtasTakeManyItemsInTurn' \
    2>&1 | grep -E "Race reported|and Write|hazards\]|SUMMARY|OK|FAILED" | head
  build_tests "$branch" || exit 1
  for family in auto fa2 fa3; do
    (cd "$branch" && FLARE_TEST_PREFILL_BACKEND=$family FLARE_CACHE_DIR=$PWD/build-gpu/jit-cache \
      build-gpu/flare_gpu_tests --gtest_filter='*Cascade*:PrefillGpu.*:PrefillHopper.*' 2>&1 |
      grep -E "^\[  (PASSED|FAILED) " | sed "s/^/$family: /")
  done
  (cd "$branch" && FLARE_CACHE_DIR=$PWD/build-gpu/jit-cache compute-sanitizer --tool memcheck \
    build-gpu/flare_gpu_tests --gtest_filter='CascadeGpuStructure.*:PrefillGpu.EmptyRequestsAndQueriesBeyondTheCache' \
    2>&1 | grep -E "ERROR SUMMARY|PASSED|FAILED" | tail -3)
fi
if [ "$stage" = bench ]; then
  for tree in . "$branch"; do
    (cd "$tree" && cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLARE_BUILD_TESTS=OFF \
      >/dev/null && cmake --build build-gpu -j"$(nproc)" --target flare >/dev/null &&
      g++ -O2 -std=c++20 -Iinclude -I. scripts/bench_cascade.cpp -Lbuild-gpu -lflare \
        -Wl,-rpath,"$PWD/build-gpu" -o build-gpu/bench_cascade &&
      echo "== C++ bench_cascade: $tree" &&
      FLARE_CACHE_DIR=$PWD/build-gpu/jit-cache build-gpu/bench_cascade)
  done
  scripts/gpu_check_python.sh "$OUT/py" -q -k no_such_test >/dev/null 2>&1
  python3 .anchors-fi/setup_fi.py /tmp/fi-site >/dev/null 2>&1
  (cd /tmp && PYTHONPATH=/tmp/fi-site:$OLDPWD/scripts:$OLDPWD/experiments timeout 200 \
    python3 "$OLDPWD/scripts/bench_cascade.py" 2>&1 | grep -v "Ninja\|Warning" | tail -12 &&
    timeout 120 python3 "$OLDPWD/scripts/bench_quest.py" 2>&1 | tail -10 &&
    timeout 150 python3 "$OLDPWD/experiments/split_vs_queue_sweep.py" 2>&1 | tail -25)
fi
