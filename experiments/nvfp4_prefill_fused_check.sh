#!/usr/bin/env bash
# One device call for branch nvfp4-fused-prefill (issue 21's last item: NVFP4 prefill faster than
# 16-bit KV where it is memory-bound): the NVFP4 prefill GPU tests under backends auto and fa2
# (the FA2 family's NVFP4 kernels read codes and scales and convert them in shared memory), every
# prefill case again (the load path and the main loop gained the NVFP4 branches; NVFP4_FILTER
# narrows this, e.g. '*Nvfp4*:*IndexSafety*'), the index
# safety tests, compute-sanitizer memcheck and racecheck on the NVFP4 cases, the Python NVFP4
# tests, experiments/bench_prefill_nvfp4.py (NVFP4 / 16-bit time under auto, fa2 and fa3; the
# sixteenth session's staged figures: 1.04 / 1.10 / 2.52 / 2.62), then FlashInfer's NVFP4 prefill cases (alias shim) when
# .fitests was carried. Logs in $OUT.
# Usage: bash experiments/nvfp4_prefill_fused_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH
B=build-gpu
OUT=${OUT:-$PWD/nvfp4_prefill_out}
mkdir -p "$OUT"
export FLARE_CACHE_DIR=$PWD/$B/jit-cache FLARE_LOG=quiet
t0=$(date +%s)
gs=""; [ -f /usr/lib/x86_64-linux-gnu/libgtest.a ] || gs="-DFLARE_GTEST_SOURCE=/usr/src/googletest"
{ cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release $gs &&
  cmake --build $B -j16 --target flare_gpu_tests; } > "$OUT/build.log" 2>&1 ||
  { grep -E "error" -A3 "$OUT/build.log" | head -40; exit 1; }
for i in 0 1 2 3 4 5 6 7; do
  GTEST_TOTAL_SHARDS=8 GTEST_SHARD_INDEX=$i timeout 240 $B/flare_gpu_tests \
    --gtest_filter="${NVFP4_FILTER:-*Prefill*:*IndexSafety*}" > "$OUT/t_$i.log" 2>&1 &
done
wait
cat "$OUT"/t_*.log > "$OUT/tests.log"
echo "tests: $(grep -hE '^\[  PASSED  \]' "$OUT"/t_*.log | awk '{n+=$4} END {print n+0}') passed"
grep -hE "^\[  FAILED  \]|Failure|Expected|Which is|exception" "$OUT/tests.log" | sort -u | head -20
echo "t $(( $(date +%s) - t0 )) s"
for tool in memcheck racecheck; do
  timeout 150 compute-sanitizer --tool $tool --error-exitcode 99 $B/flare_gpu_tests \
    --gtest_filter='*BatchPrefillNvfp4*page5*:*BatchPrefillNvfp4Errors*:*BatchPrefillNvfp4Layouts*' > "$OUT/$tool.log" 2>&1
  echo "$tool rc $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$tool.log" | tail -1)"
done
timeout 150 bash scripts/gpu_check_python.sh "$OUT/py" -q -k "nvfp4" 2>&1 | tail -3
(cd /tmp && timeout 90 python3 "$OLDPWD/experiments/bench_prefill_nvfp4.py") 2>&1 |
  grep -v "^\[flare\]" | tail -8
if [ -d .fitests ]; then
  OUT=$OUT/fi FI_K=300 FI_FILES="tests/attention/test_batch_prefill_kernels.py" \
    timeout 240 bash experiments/fi_alias_shim.sh > "$OUT/fi_run.txt" 2>&1
  grep -E "passed|failed" "$OUT/fi_run.txt" | tail -2
  grep -E "^(FAILED|ERROR)" "$OUT/fi/pytest.log" | cut -c1-200 | head
fi
echo "total $(( $(date +%s) - t0 )) s"
