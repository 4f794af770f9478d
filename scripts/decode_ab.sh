#!/usr/bin/env bash
# A/B of the decode kernel in one device call: builds the GPU tests of other source trees (older
# versions or variants: `git archive <rev> | tar -x -C build-ab-src`, carried to the device) next
# to this tree's build, then runs the decode benchmark cases of all builds interleaved, several
# rounds, so every version sees the same clocks and temperature. Prints one line per run,
# labelled with the tree's directory name ("this" for this tree).
# Usage: scripts/decode_ab.sh <other-source-dir>[,<dir>...] [cases (comma list)] [rounds]
#   Run after scripts/gpu_check.sh (reuses $BUILD, default build-gpu).
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
OTHER=$1
CASES=${2:-b1_kv32768,b1_kv4096,b16_kv4096,b64_kv8192}
ROUNDS=${3:-3}
OUT=${OUT:-$PWD/gpu_check_out}
BUILD=${BUILD:-build-gpu}
mkdir -p "$OUT"
gtest_source=${FLARE_GTEST_SOURCE:-}
[ -z "$gtest_source" ] && [ ! -f /usr/lib/x86_64-linux-gnu/libgtest.a ] && [ -d /usr/src/googletest ] &&
  gtest_source=/usr/src/googletest
trees=()
IFS=',' read -r -a others <<<"$OTHER"
for other in "${others[@]}"; do trees+=("$other:$BUILD-$(basename "$other")"); done
trees+=(".:$BUILD")
for tree in "${trees[@]}"; do
  src=${tree%%:*}; dir=${tree#*:}
  if ! { cmake -S "$src" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
           ${gtest_source:+-DFLARE_GTEST_SOURCE="$gtest_source"} &&
         cmake --build "$dir" -j"$(nproc)" --target flare_gpu_tests; } >"$OUT/ab_build_${dir//\//_}.log" 2>&1; then
    tail -n 30 "$OUT/ab_build_${dir//\//_}.log"
    exit 1
  fi
done
export FLARE_LOG=quiet
for round in $(seq "$ROUNDS"); do
  for tree in "${trees[@]}"; do
    dir=${tree#*:}; label=$(basename "${tree%%:*}"); [ "$label" = . ] && label=this
    result="$OUT/ab_${round}_$label.jsonl"
    FLARE_CACHE_DIR="$PWD/$dir/jit-cache" FLARE_DECODE_BENCH="$result" \
      FLARE_DECODE_BENCH_CASES="$CASES" "$dir/flare_gpu_tests" --gtest_filter='DecodeBenchmark.*' \
      >"$OUT/ab_run.log" 2>&1 || { tail -n 20 "$OUT/ab_run.log"; exit 1; }
    python3 scripts/print_decode_bench.py "$result" "round $round $label"
  done
done
