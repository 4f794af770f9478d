#!/usr/bin/env bash
# One device call for a change to the FA2 family's NVFP4 prefill kernels (issue 21: NVFP4 prefill
# faster than 16-bit KV where it is memory-bound): scripts/bench_prefill_nvfp4.cpp (NVFP4 / 16-bit
# time, C++) of this tree and of each tree named after it, alternately for `ROUNDS` rounds (an
# A/B: e.g. `git archive main | tar -x -C .scratch/base`, carried), then the NVFP4 prefill GPU
# tests and every prefill case (NVFP4_FILTER narrows them, e.g. '*Nvfp4*:*IndexSafety*'),
# compute-sanitizer memcheck, racecheck and synccheck on the NVFP4 cases, then the Python NVFP4
# tests and experiments/bench_prefill_nvfp4.py through the package (pip-installed from this tree).
# Logs in $OUT. AB_ONLY=1 stops after the A/B.
# Usage (GPU machine): bash experiments/nvfp4_prefill_check.sh [other tree ...]
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH FLARE_LOG=quiet
B=build-gpu
OUT=${OUT:-$PWD/nvfp4_prefill_out}
ROUNDS=${ROUNDS:-2}
mkdir -p "$OUT"
export FLARE_CACHE_DIR=$PWD/$B/jit-cache
t0=$(date +%s)
gs=""; [ -f /usr/lib/x86_64-linux-gnu/libgtest.a ] || gs="-DFLARE_GTEST_SOURCE=/usr/src/googletest"
{ cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release $gs &&
  cmake --build $B -j16 --target flare_gpu_tests; } > "$OUT/build.log" 2>&1 ||
  { grep -E "error" -A3 "$OUT/build.log" | head -40; exit 1; }
trees=("$PWD" "$@")
for tree in "${trees[@]}"; do
  (cd "$tree" && cmake -S . -B build-ab -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLARE_BUILD_TESTS=OFF \
     >/dev/null && cmake --build build-ab -j16 --target flare >/dev/null &&
   g++ -O2 -std=c++20 -Iinclude -I. scripts/bench_prefill_nvfp4.cpp -Lbuild-ab -lflare \
     -Wl,-rpath,"$PWD/build-ab" -o build-ab/bench_prefill_nvfp4) || { echo "build of $tree failed"; exit 1; }
done
for round in $(seq "$ROUNDS"); do
  for tree in "${trees[@]}"; do
    echo "== round $round: $tree"
    FLARE_CACHE_DIR="$tree/build-ab/jit-cache" "$tree/build-ab/bench_prefill_nvfp4"
  done
done
echo "t $(( $(date +%s) - t0 )) s"
[ "${AB_ONLY:-0}" = 1 ] && exit 0  # AB_ONLY=1: the A/B alone
for i in 0 1 2 3 4 5 6 7; do
  GTEST_TOTAL_SHARDS=8 GTEST_SHARD_INDEX=$i timeout 240 $B/flare_gpu_tests \
    --gtest_filter="${NVFP4_FILTER:-*Prefill*:*IndexSafety*}" > "$OUT/t_$i.log" 2>&1 &
done
wait
cat "$OUT"/t_*.log > "$OUT/tests.log"
echo "tests: $(grep -hE '^\[  PASSED  \]' "$OUT"/t_*.log | awk '{n+=$4} END {print n+0}') passed"
grep -hE "^\[  FAILED  \]|Failure|Expected|Which is|exception" "$OUT/tests.log" | sort -u | head -20
echo "t $(( $(date +%s) - t0 )) s"
for tool in memcheck racecheck synccheck; do
  timeout 150 compute-sanitizer --tool $tool --error-exitcode 99 $B/flare_gpu_tests \
    --gtest_filter='*BatchPrefillNvfp4*page5*:*BatchPrefillNvfp4*page7*:*BatchPrefillNvfp4Errors*:*BatchPrefillNvfp4Layouts*' \
    > "$OUT/$tool.log" 2>&1
  echo "$tool rc $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$tool.log" | tail -1)"
done
echo "t $(( $(date +%s) - t0 )) s"
timeout 200 bash scripts/gpu_check_python.sh "$OUT/py" -q -k "nvfp4" 2>&1 | tail -3
(cd /tmp && timeout 90 python3 "$OLDPWD/experiments/bench_prefill_nvfp4.py") 2>&1 |
  grep -v "^\[flare\]" | tail -8
echo "total $(( $(date +%s) - t0 )) s"
