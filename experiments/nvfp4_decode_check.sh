#!/usr/bin/env bash
# One device call for branch nvfp4-decode (issue 21: FlashInfer's ~120 NVFP4 decode cases): the
# NVFP4 decode GPU tests, every decode case again (the CUDA-core loop's loads were refactored),
# the NVFP4 append tests (the kernel now shares kernels/nvfp4_codes.cuh), compute-sanitizer
# memcheck on two NVFP4 decode cases, the Python NVFP4 / decode tests, then FlashInfer's suite
# with the alias shim when .fitests was carried. Logs in $OUT.
# Usage: bash experiments/nvfp4_decode_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH
B=build-gpu
OUT=${OUT:-$PWD/nvfp4_decode_out}
mkdir -p "$OUT"
export FLARE_CACHE_DIR=$PWD/$B/jit-cache FLARE_LOG=quiet
t0=$(date +%s)
gs=""; [ -f /usr/lib/x86_64-linux-gnu/libgtest.a ] || gs="-DFLARE_GTEST_SOURCE=/usr/src/googletest"
{ cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release $gs &&
  cmake --build $B -j16 --target flare_gpu_tests; } > "$OUT/build.log" 2>&1 ||
  { grep -E "error" -A3 "$OUT/build.log" | head -40; exit 1; }
for i in 0 1 2 3 4 5 6 7; do
  GTEST_TOTAL_SHARDS=8 GTEST_SHARD_INDEX=$i timeout 240 $B/flare_gpu_tests \
    --gtest_filter='*BatchDecodeNvfp4*:*BatchDecodeVsReference*:*Nvfp4AppendGpu*' > "$OUT/t_$i.log" 2>&1 &
done
wait
cat "$OUT"/t_*.log > "$OUT/tests.log"
echo "tests: $(grep -hE '^\[  PASSED  \]' "$OUT"/t_*.log | awk '{n+=$4} END {print n+0}') passed"
grep -hE "^\[  FAILED  \]|Failure|Expected|Which is|exception" "$OUT/tests.log" | sort -u | head -20
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 99 $B/flare_gpu_tests \
  --gtest_filter='*BatchDecodeNvfp4*d64*:*BatchDecodeNvfp4*d512*' > "$OUT/memcheck.log" 2>&1
echo "memcheck rc $?"; grep -E "ERROR SUMMARY" "$OUT/memcheck.log" | head -2
timeout 200 bash scripts/gpu_check_python.sh "$OUT/py" -q -k "nvfp4 or decode" 2>&1 | tail -3
if [ -d .fitests ]; then
  OUT=$OUT/fi timeout 300 bash experiments/fi_alias_shim.sh > "$OUT/fi_run.txt" 2>&1
  grep -E "passed|failed" "$OUT/fi_run.txt" | tail -2
fi
echo "total $(( $(date +%s) - t0 )) s"
