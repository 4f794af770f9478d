#!/usr/bin/env bash
# compute-sanitizer synccheck on each test of gpu_check.sh's sanitizer set, one process a test,
# the JIT kernels compiled with line info (FLARE_JIT_LINEINFO=1, a cache of their own), so that
# every report names a line of kernels/*.cuh. Prints a test's report count and its distinct
# (kind, location, barrier) triples; full logs in $OUT/synccheck/.
# Usage (GPU machine, OUT set): bash experiments/synccheck_probe.sh ['<gtest filter>']
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH FLARE_LOG=quiet
filter=${1:-$(sed -n "s/^  sanitize '\(BatchDecodeErrors[^']*\)'.*/\1/p" scripts/gpu_check.sh | tail -n 1)}
BUILD=${BUILD:-build-gpu}
mkdir -p "$OUT/synccheck"
gtest_source=
[ ! -f /usr/lib/x86_64-linux-gnu/libgtest.a ] && [ -d /usr/src/googletest ] && gtest_source=/usr/src/googletest
{ cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    ${gtest_source:+-DFLARE_GTEST_SOURCE="$gtest_source"} &&
  cmake --build "$BUILD" -j"$(nproc)" --target flare_gpu_tests; } >"$OUT/build.log" 2>&1 ||
  { tail -n 30 "$OUT/build.log"; exit 1; }
export FLARE_JIT_LINEINFO=1 FLARE_CACHE_DIR=$PWD/$BUILD/jit-cache-lineinfo
tests=$("$BUILD/flare_gpu_tests" --gtest_list_tests --gtest_filter="$filter" |
  awk '/^[^ ]/ { suite = $1 } /^  / { print suite $1 }')
echo "filter: $filter"
echo "$(echo "$tests" | wc -l) tests"
one() {
  local log=$OUT/synccheck/${1//\//_}.log
  compute-sanitizer --tool synccheck --print-limit 100000 --error-exitcode 99 \
    "$BUILD/flare_gpu_tests" --gtest_filter="$1" >"$log" 2>&1
  echo "$1: exit $? errors $(grep -c 'Barrier error\|divergent\|Invalid' "$log")"
}
export -f one; export OUT BUILD
echo "$tests" | xargs -P 6 -I{} bash -c 'one {}' | sort
for log in "$OUT"/synccheck/*.log; do
  grep -q "ERROR SUMMARY: 0 errors" "$log" && { rm -f "$log"; continue; }
  echo "== $(basename "$log" .log)"
  awk '/^=========  *(Barrier|Invalid|Divergent)/ { kind = $0 } /^=========     at / { at = $0 }
       /Barrier is located/ { print kind " | " at " | " $0 }' "$log" |
    sed 's/=========  *//g' | sort | uniq -c | sort -rn | head -n 12
done
