#!/usr/bin/env bash
# One device call: the prefill and user-variant GPU tests (the prefill helpers moved), memcheck
# on the variant-tensor cases, and the cost of batch-invariant plans (fixed_split_size) against
# the default plans, decode (tensor cores) and prefill, interleaved twice.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH FLARE_LOG=quiet
B=build-gpu
export FLARE_CACHE_DIR=$PWD/$B/jit-cache
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLARE_GTEST_SOURCE=/usr/src/googletest >/dev/null &&
  cmake --build $B -j16 --target flare_gpu_tests flare >"$OUT/build.log" 2>&1 &&
  g++ -O2 -std=c++20 -Iinclude -I. scripts/bench_prefill.cpp -L$B -lflare -Wl,-rpath,$PWD/$B \
    -o $B/bench_prefill || { tail -30 "$OUT/build.log"; exit 1; }
$B/flare_gpu_tests --gtest_filter='UserVariant*:PrefillGpu*' >"$OUT/gpu_tests.log" 2>&1
echo "gpu tests: exit $?"; grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$OUT/gpu_tests.log"
compute-sanitizer --tool memcheck --error-exitcode 99 $B/flare_gpu_tests \
  --gtest_filter='UserVariantDecode.Slopes*:UserVariantDecode.VariantTensors*:UserVariantPrefill.Slopes*' \
  >"$OUT/memcheck.log" 2>&1
echo "memcheck: exit $? $(grep 'ERROR SUMMARY' "$OUT/memcheck.log")"
cases=b1_kv32768_tc,b16_kv4096_tc,b16_kv32768_tc,b64_kv8192_tc
for round in 1 2; do
  for split in 0 1024; do
    FLARE_DECODE_BENCH=/tmp/split_$split.jsonl FLARE_DECODE_BENCH_CASES=$cases \
      FLARE_DECODE_BENCH_SPLIT=$split $B/flare_gpu_tests --gtest_filter='DecodeBenchmark.*' \
      >/tmp/split.log 2>&1 || { tail -5 /tmp/split.log; }
    python3 scripts/print_decode_bench.py /tmp/split_$split.jsonl "round $round split $split"
  done
  for split in "" 1024; do
    echo "-- prefill round $round fixed_split ${split:-default}"
    FLARE_BENCH_FIXED_SPLIT=$split FLARE_BENCH_ONLY="causal b16" $B/bench_prefill | tail -5
  done
done
