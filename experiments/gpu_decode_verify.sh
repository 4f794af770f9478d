#!/usr/bin/env bash
# One device call: the decode GPU tests and index-safety tests against the reference, both
# sanitizers on the small cases and bad indices, the decode table next to SDPA, and an A/B of
# the decode kernel against an older tree (scripts/decode_ab.sh). Usage: <other tree> [rounds]
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH
OTHER=$1; ROUNDS=${2:-3}
(setsid nohup nice -n 10 bash -c "cmake -S $OTHER -B build-gpu-$(basename "$OTHER") -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DFLARE_GTEST_SOURCE=/usr/src/googletest && \
  cmake --build build-gpu-$(basename "$OTHER") -j6 --target flare_gpu_tests" >/tmp/ab_prebuild.log 2>&1 &)
FLARE_GPU_FILTER='*Decode*:*IndexSafety*' OUT=/tmp/gc scripts/gpu_check.sh decode
for tool in memcheck racecheck; do
  compute-sanitizer --tool $tool --error-exitcode 99 build-gpu/flare_gpu_tests \
    --gtest_filter='BatchDecodeErrors.SanitizerSmallCase:PrefillGpu.EmptyRequestsAndQueriesBeyondTheCache:PrefillGpu.CustomMaskTreeAttention:MergeGpu.PairOddShapes:AppendPagedKVGpu.*:*IndexSafety*' \
    >"$OUT/$tool.log" 2>&1
  echo "$tool: exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$tool.log" | tail -n 1)"
done
grep -m2 -B2 -A14 "Race reported\|hazard detected\|Error:" "$OUT/racecheck.log" | head -60
while pgrep -f "build-gpu-$(basename "$OTHER")" >/dev/null; do sleep 2; done
OUT=/tmp/ab scripts/decode_ab.sh "$OTHER" b1_kv32768,b16_kv4096,b16_kv32768,b64_kv8192 "$ROUNDS"
