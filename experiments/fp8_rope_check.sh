#!/usr/bin/env bash
# One device call for branch fp8-rope-decode (issue 21: FlashInfer's 78 decode tests of fused
# RoPE with fp8 KV): the decode GPU tests (every case on both loops and whole-page items; the
# new rope_*e4m3 / e5m2 cases), compute-sanitizer memcheck on one fp8 RoPE case of each loop,
# the Python decode tests, then FlashInfer's suite when .fitests was carried. Logs in $OUT.
# Usage: bash experiments/fp8_rope_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH
B=build-gpu
OUT=${OUT:-$PWD/fp8_rope_out}
mkdir -p "$OUT"
export FLARE_CACHE_DIR=$PWD/$B/jit-cache FLARE_LOG=quiet
t0=$(date +%s)
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release > "$OUT/cfg.log" 2>&1 || { tail -20 "$OUT/cfg.log"; exit 1; }
cmake --build $B -j16 --target flare flare_gpu_tests > "$OUT/build.log" 2>&1 ||
  { grep -E "error" -A3 "$OUT/build.log" | head -40; exit 1; }
timeout 300 $B/flare_gpu_tests --gtest_filter='*BatchDecodeVsReference*' > "$OUT/decode.log" 2>&1
echo "decode tests rc $?"; grep -E "PASSED|FAILED|Failure" "$OUT/decode.log" | head -20
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 99 $B/flare_gpu_tests \
  --gtest_filter='*BatchDecodeVsReference*/*rope_e4m3_split*' > "$OUT/memcheck.log" 2>&1
echo "memcheck rc $?"; grep -E "ERROR SUMMARY" "$OUT/memcheck.log" | head -2
timeout 200 bash scripts/gpu_check_python.sh "$OUT/py" -q -k "decode" 2>&1 | tail -2
if [ -d .fitests ]; then
  OUT=$OUT/fi timeout 300 bash .fitests/run_fi_suite.sh > "$OUT/fi_run.txt" 2>&1
  grep -E "passed|failed" "$OUT/fi_run.txt" | tail -2
fi
echo "total $(( $(date +%s) - t0 )) s"
