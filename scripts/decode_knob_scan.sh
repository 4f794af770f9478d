#!/usr/bin/env bash
# Scheduler knobs of the decode benchmark compared in one device call: runs the benchmark cases
# once per setting, settings interleaved over several rounds (same clocks and temperature for
# all), and prints one line per run. A setting is a space-separated list of environment
# assignments (the FLARE_DECODE_BENCH_* knobs of tests/gpu/decode_bench_test.cpp); "-" is the
# defaults.
# Usage: scripts/decode_knob_scan.sh "<setting>|<setting>|..." [cases (comma list)] [rounds]
#   e.g. scripts/decode_knob_scan.sh "-|FLARE_DECODE_BENCH_CTAS_PER_SM=3" b64_kv8192 3
#   Run after scripts/gpu_check.sh (reuses $BUILD, default build-gpu).
set -uo pipefail
cd "$(dirname "$0")/.."
SETTINGS=$1
CASES=${2:-b64_kv8192,b16_kv32768}
ROUNDS=${3:-3}
OUT=${OUT:-$PWD/gpu_check_out}
BUILD=${BUILD:-build-gpu}
mkdir -p "$OUT"
export FLARE_LOG=quiet
IFS='|' read -r -a settings <<<"$SETTINGS"
for round in $(seq "$ROUNDS"); do
  for setting in "${settings[@]}"; do
    result="$OUT/scan.jsonl"
    assignments=()
    [ "$setting" != "-" ] && read -r -a assignments <<<"$setting"
    env "${assignments[@]}" FLARE_CACHE_DIR="$PWD/$BUILD/jit-cache" FLARE_DECODE_BENCH="$result" \
      FLARE_DECODE_BENCH_CASES="$CASES" "$BUILD/flare_gpu_tests" --gtest_filter='DecodeBenchmark.*' \
      >"$OUT/scan_run.log" 2>&1 || { tail -n 20 "$OUT/scan_run.log"; exit 1; }
    python3 scripts/print_decode_bench.py "$result" "r$round $setting"
  done
done
