#!/usr/bin/env bash
# The thirty-ninth session's device calls (docs/perf.md "Thirty-ninth session").
#   rope: RoPE decode's angle table (decode_mma.cuh SliceAngles): this tree's GPU tests of every
#     RoPE path (decode on both loops and whole-page items, prefill, user rotary variants) and
#     the soft-cap Hopper tests of the last session's unrun commits, then DecodeBenchmark's
#     tensor-core cases with and without RoPE, two rounds (plain decode is the control: its
#     code is unchanged).
#   sanitize: memcheck and racecheck of the tensor-core RoPE decode cases (after `rope`).
#   ab <old tree>: DecodeBenchmark's RoPE and plain tensor-core cases of the old tree (its GPU
#     tests built with this tree's decode_bench_test.cpp) and this one, interleaved, two rounds
#     (scripts/decode_ab.sh; AB_CASES=<cases> instead).
#   python: the package installed, scripts/bench_rope_decode.py next to FlashInfer (carry
#     .anchors-fi).
# Usage (GPU machine, OUT set): bash experiments/session39_check.sh rope|decode|sanitize|ab <tree>|ncu|rope_prefill|rope_prefill_ab <tree>|python
set -uo pipefail
stage=${1:?rope|sanitize|ab|python}
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH FLARE_LOG=quiet
mkdir -p "$OUT"
build=$PWD/build-ab
export FLARE_CACHE_DIR=$build/jit-cache
rope_cases=b1_kv32768_tc,b1_kv32768_tc_rope,b16_kv4096_tc,b16_kv4096_tc_rope
rope_cases=$rope_cases,b64_kv8192_tc,b64_kv8192_tc_rope,b16_kv32768_tc,b16_kv32768_tc_rope
if [ "$stage" = rope ]; then
  source experiments/family_tests.sh
  family_tests "$PWD" fa3 '*rope*:*Rope*:*Rotary*:PrefillHopper.SoftCap*:UserVariantPrefill.SoftCap*'
  for round in 1 2; do
    FLARE_DECODE_BENCH="$OUT/bench_$round.jsonl" FLARE_DECODE_BENCH_CASES=$rope_cases \
      timeout 150 "$build/flare_gpu_tests" --gtest_filter='DecodeBenchmark.*' >"$OUT/bench.log" 2>&1 ||
      tail -n 20 "$OUT/bench.log"
    python3 scripts/print_decode_bench.py "$OUT/bench_$round.jsonl" "round $round"
  done
fi
#   decode: every decode GPU test of this tree (reference cases of both loops and whole-page items,
#     graphs, plans, errors, NVFP4, user variants, index safety).
if [ "$stage" = decode ]; then
  source experiments/family_tests.sh
  family_tests "$PWD" fa3 '*BatchDecode*:*UserVariantDecode*:*IndexSafety*'
fi
if [ "$stage" = sanitize ]; then
  for tool in memcheck racecheck; do
    timeout 200 compute-sanitizer --tool $tool --error-exitcode 99 "$build/flare_gpu_tests" \
      --gtest_filter='*/mma_rope*:*/pages*_mma_rope*:*/rope_llama:*/rope_e4m3_split:BatchDecodeErrors.SanitizerSmallCase' >"$OUT/$tool.log" 2>&1
    echo "$tool exit $? ($(grep -cE '^\[ +OK' "$OUT/$tool.log") tests); $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$tool.log" | tail -n 1)"
  done
fi
if [ "$stage" = ab ]; then
  BUILD=build-ab bash scripts/decode_ab.sh "${2:?the old tree}" "${AB_CASES:-$rope_cases}" 2
fi
#   ncu: b1 kv32768 and b1 kv4096 on the tensor-core loop with and without RoPE (after `rope` or
#     `decode`): the bench's times, then one launch each under Nsight Compute (speed of light,
#     warp states, scheduler).
if [ "$stage" = ncu ]; then
  cases=b1_kv32768_tc,b1_kv32768_tc_rope,b1_kv4096_tc,b1_kv4096_tc_rope
  FLARE_DECODE_BENCH="$OUT/bench_ncu.jsonl" FLARE_DECODE_BENCH_CASES=$cases \
    timeout 150 "$build/flare_gpu_tests" --gtest_filter='DecodeBenchmark.*' >"$OUT/bench.log" 2>&1 ||
    tail -n 20 "$OUT/bench.log"
  python3 scripts/print_decode_bench.py "$OUT/bench_ncu.jsonl" "bench"
  for case in b1_kv32768_tc b1_kv32768_tc_rope; do
    FLARE_DECODE_BENCH="$OUT/ncu_bench.jsonl" FLARE_DECODE_BENCH_CASES=$case timeout 200 \
      ncu --clock-control none -k regex:flare_decode --launch-skip 10 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
      --section Occupancy --section LaunchStats \
      "$build/flare_gpu_tests" --gtest_filter='DecodeBenchmark.*' >"$OUT/ncu_$case.txt" 2>&1
    echo "== $case (ncu exit $?)"
    grep -E "Duration|DRAM Throughput|Issue Slots Busy|Issued Warp|No Eligible|Active Warps Per|Eligible Warps|Stall|Warp Cycles Per Issued|Registers Per|Achieved Occ" "$OUT/ncu_$case.txt" | head -24
  done
fi
#   rope_prefill: bench_prefill with fused RoPE on each family (FLARE_BENCH_ROPE=1, backend fa2
#     then fa3; RoPE prefill runs on fa2 under auto) and causal without it on fa3 as the
#     reference, two rounds.
if [ "$stage" = rope_prefill ]; then
  bash experiments/build_ab.sh "$PWD" scripts/bench_prefill.cpp >/dev/null 2>&1 || echo "build failed"
  for round in 1 2; do
    for run in "fa2 1" "fa3 1" "fa3 0"; do
      set -- $run
      echo "== round $round: backend $1 rope $2"
      FLARE_CACHE_DIR="$PWD/build-ab/jit-cache" FLARE_BENCH_BACKEND=$1 FLARE_BENCH_ROPE=$2 \
        timeout 150 build-ab/bench_prefill 2>&1 | grep -vE "^case|^$|zipf lengths|append vs" | head -8
    done
  done
fi
#   rope_prefill_ab <old tree>: the same with FLARE_BENCH_ROPE=1 on both families, the old tree
#     against this one, interleaved, two rounds.
if [ "$stage" = rope_prefill_ab ]; then
  old=${2:?the old tree}
  for t in "$old" "$PWD"; do
    bash experiments/build_ab.sh "$t" scripts/bench_prefill.cpp >/dev/null 2>&1 || echo "build of $t failed"
  done
  for round in 1 2; do
    for backend in fa2 fa3; do
      for t in "$old" "$PWD"; do
        echo "== round $round: $backend rope, $(basename "$t")"
        FLARE_CACHE_DIR="$t/build-ab/jit-cache" FLARE_BENCH_BACKEND=$backend FLARE_BENCH_ROPE=1 \
          timeout 150 "$t/build-ab/bench_prefill" 2>&1 | grep -vE "^case|^$|zipf lengths" | head -8
      done
    done
  done
fi
if [ "$stage" = python ]; then
  python3 -c 'import flare' 2>/dev/null ||
    scripts/gpu_check_python.sh "$OUT/py" -q -k "rope" 2>&1 | tail -n 3
  python3 .anchors-fi/setup_fi.py /tmp/fi-site >/dev/null 2>&1
  tree=$PWD
  cd /tmp
  PYTHONPATH=/tmp/fi-site timeout 300 python3 "$tree/scripts/bench_rope_decode.py" \
    --json "$OUT/rope_decode.json" 2>&1 | grep -vE "Warning|warn" | tail -n 14
fi
