#!/usr/bin/env bash
# The thirty-sixth session's device calls (docs/perf.md "Thirty-sixth session").
#   verify: the GPU tests that failed on main at the session's start (NVFP4 prefill: a stale q
#     view in the test support; PrefillHopper's strided-q tests) and every other NVFP4 and
#     Hopper prefill test, then scripts/gpu_check.sh's sanitizer step (which now prints a
#     failing tool's first report: main's first run reported one racecheck hazard, unprinted).
#   python: the package installed, bench_python.py --only prefill (FlashInfer from the carried
#     .anchors-fi) and bench_variants.py (flare, Flex) at 2048 / 4096 (VARIANT_LENGTHS), with
#     BLOCK_SPARSE=1 bench_block_sparse.py at 8192, densities 0.1 / 0.5 / 0.9, next to Flex.
#   race: racecheck of gpu_check.sh's sanitizer cases three times (hazard reports printed),
#     then experiments/item_boundary_profile.sh ncu on this tree.
#   quad <main tree>: the epilogue's quad-transposed 16-byte stores (this tree) against main, C++
#     causal b16 and a 256-key window, one round each, then the prefill / cascade / NVFP4 GPU
#     tests of this tree on the Hopper family (the FA2 family's epilogue is unchanged).
#   partial <main tree> <patched tree>: a patch (the Hopper family's float32 partial slots by
#     16-byte stores; refuted and deleted in the thirty-seventh session, docs/perf.md) against
#     main: q1 / q16 paged prefill (bench_small_q_prefill) and cascade b16 / b64 prefix 1024, two
#     rounds, then the patched tree's Hopper tests.
# Usage (GPU machine, OUT set): bash experiments/session36_check.sh verify
set -uo pipefail
stage=${1:?verify|python|race|quad|partial}
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH FLARE_LOG=quiet
mkdir -p "$OUT"
# The Hopper family's prefill, cascade and NVFP4 GPU tests of a tree under fa3 (the FA2-only
# query-tile-16 tests fail there by design: gpu_check.sh's fa3 pass leaves them out).
source experiments/family_tests.sh
hopper_tests() { family_tests "$1" fa3 '*Prefill*:*Cascade*:*Nvfp4*'; }
if [ "$stage" = verify ]; then
  OUT=$OUT/gpu_check FLARE_GPU_FILTER='*Nvfp4*:PrefillHopper.*' timeout 480 \
    scripts/gpu_check.sh tests 2>&1 | tail -n 30
fi
if [ "$stage" = python ]; then  # carry .anchors-fi
  scripts/gpu_check_python.sh "$OUT/py" -q -k no_such_test >/dev/null 2>&1
  python3 .anchors-fi/setup_fi.py /tmp/fi-site >/dev/null 2>&1
  (cd /tmp && PYTHONPATH=/tmp/fi-site:$OLDPWD/scripts timeout 220 python3 \
    "$OLDPWD/scripts/bench_python.py" --only prefill 2>&1 | grep -v "Warning" | tail -24 &&
    PYTHONPATH=$OLDPWD/scripts timeout 150 python3 "$OLDPWD/scripts/bench_variants.py" \
      --libraries flare,flex --lengths "${VARIANT_LENGTHS:-2048,4096}" \
      --variants causal,window,document --calls 10 2>&1 | grep -E "^\|"
    [ -n "${BLOCK_SPARSE:-}" ] && PYTHONPATH=$OLDPWD/scripts timeout 150 python3 \
      "$OLDPWD/scripts/bench_block_sparse.py" --libraries flare,flex --lengths 8192 \
      --densities 0.1,0.5,0.9 2>&1 | grep -E "^\|")
fi
if [ "$stage" = race ]; then  # racecheck of gpu_check.sh's sanitizer cases, three times, then
  # the ncu profile of the item boundary (experiments/item_boundary_profile.sh ncu)
  { cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release \
      ${family_tests_gtest:+-DFLARE_GTEST_SOURCE=$family_tests_gtest} &&
    cmake --build build-gpu -j"$(nproc)" --target flare_gpu_tests; } >"$OUT/build.log" 2>&1 ||
    { tail -n 20 "$OUT/build.log"; exit 1; }
  filter=$(grep -o "sanitize 'BatchDecodeErrors.SanitizerSmallCase:PrefillGpu[^']*'" scripts/gpu_check.sh |
    sed "s/^sanitize '//; s/'$//")
  exclude=$(grep -A1 "sanitize 'BatchDecodeErrors.SanitizerSmallCase:PrefillGpu" scripts/gpu_check.sh |
    tail -n 1 | sed "s/^ *'//; s/'.*$//")
  export FLARE_CACHE_DIR=$PWD/build-gpu/jit-cache
  for round in 1 2 3; do
    timeout 100 compute-sanitizer --tool racecheck --error-exitcode 99 build-gpu/flare_gpu_tests \
      --gtest_filter="$filter:-$exclude" >"$OUT/racecheck_$round.log" 2>&1
    echo "racecheck round $round: exit $? $(grep -E 'RACECHECK SUMMARY' "$OUT/racecheck_$round.log")"
    awk '/^\[ RUN/ { test = $0 } /^========= / && !/COMPUTE-SANITIZER|SUMMARY/ && n < 24 {
           if (n++ == 0) print test; print }' "$OUT/racecheck_$round.log"
  done
  timeout 250 bash experiments/item_boundary_profile.sh ncu
fi
if [ "$stage" = quad ]; then  # the quad-transposed 16-byte output stores against main
  main=${2:?the tree of main}
  FLARE_BENCH_ONLY="causal b16" timeout 120 bash experiments/prefill_ab.sh "$main" . 1 2>&1 |
    grep -E "^== round|^causal"
  FLARE_BENCH_ONLY="causal b16 seq" FLARE_BENCH_WINDOW_LEFT=256 timeout 60 \
    bash experiments/prefill_ab.sh "$main" . 1 2>&1 | grep -E "^== round|^causal"
  hopper_tests .
fi
if [ "$stage" = partial ]; then  # experiments/patches/partial-slot-16-byte-stores.patch
  main=${2:?the tree of main}
  patched=${3:?the tree with the patch}
  for tree in "$main" "$patched"; do
    bash experiments/build_ab.sh "$tree" experiments/bench_small_q_prefill.cpp \
      scripts/bench_cascade.cpp >/dev/null 2>&1 || echo "build of $tree failed"
  done
  for round in 1 2; do
    for tree in "$main" "$patched"; do
      echo "== round $round: $tree"
      FLARE_CACHE_DIR="$tree/build-ab/jit-cache" timeout 60 "$tree/build-ab/bench_small_q_prefill" |
        grep -E "^\| [0-9]"
      FLARE_CACHE_DIR="$tree/build-ab/jit-cache" timeout 60 "$tree/build-ab/bench_cascade" 16,64 \
        1024 2>&1 | grep -E "^\| [0-9]"
    done
  done
  hopper_tests "$patched"
fi
