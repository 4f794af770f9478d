#!/usr/bin/env bash
# Branch fa2-three-stages (the mma.sync family's 16-row tiles with three 16-bit stages, two tiles
# in flight) against main in one call: C++ bench_cascade (prefix 0 / 1024, b16 / b64) and
# experiments/bench_small_q_prefill.cpp in both trees, then the branch's prefill / cascade GPU
# tests under the fa2 backend and auto, and memcheck of its cascade structure tests.
# Usage (GPU machine, OUT set; the branch's tree made here with
#   mkdir -p .scratch/b && git archive fa2-three-stages | tar -x -C .scratch/b):
#   [FAMILIES="fa2"] bash experiments/three_stages_check.sh .scratch/b   (any branch of the
#   mma.sync family's pipeline: fa2-three-stages, fa2-item-prefetch)
set -uo pipefail
branch=${1:?branch tree}
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH FLARE_LOG=quiet
mkdir -p "$OUT"
build() {  # tree, targets...: the library and benches in <tree>/build-gpu
  local tree=$1; shift
  (cd "$tree" && cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null &&
    cmake --build build-gpu -j"$(nproc)" --target flare "$@" >/dev/null &&
    for b in scripts/bench_cascade experiments/bench_small_q_prefill; do
      g++ -O2 -std=c++20 -Iinclude -I. $b.cpp -Lbuild-gpu -lflare -Wl,-rpath,"$PWD/build-gpu" \
        -o build-gpu/$(basename $b) || exit 1
    done)
}
build . || exit 1
build "$branch" flare_gpu_tests || exit 1
for round in 1 2; do
  for tree in . "$branch"; do
    echo "== round $round: $tree"
    (cd "$tree" && export FLARE_CACHE_DIR=$PWD/build-gpu/jit-cache &&
      timeout 100 build-gpu/bench_cascade 16,64 0,1024 | tail -n 4 &&
      timeout 100 build-gpu/bench_small_q_prefill | tail -n 9)
  done
done
cd "$branch" && export FLARE_CACHE_DIR=$PWD/build-gpu/jit-cache
for family in ${FAMILIES:-fa2 auto}; do
  FLARE_TEST_PREFILL_BACKEND=$family timeout 200 build-gpu/flare_gpu_tests \
    --gtest_filter='*Cascade*:*PrefillGpu*:*UserVariantPrefill*:*BatchPrefillNvfp4*' \
    2>&1 | grep -E "^\[  (PASSED|FAILED) " | sed "s/^/$family: /"
done
timeout 120 compute-sanitizer --tool memcheck build-gpu/flare_gpu_tests \
  --gtest_filter='CascadeGpuStructure.*:PrefillGpu.EmptyRequestsAndQueriesBeyondTheCache' 2>&1 |
  grep -E "ERROR SUMMARY|PASSED|FAILED" | tail -3
