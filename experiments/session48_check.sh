#!/usr/bin/env bash
# Forty-eighth session's device checks (GPU machine, OUT set):
#   sink: the attention-sink GPU tests (C++ PrefillSinkGpu under auto and fa2, with the prefill
#     suite around the changed epilogues), compute-sanitizer memcheck on the empty-row and split
#     sink cases, the Python sink / graph-buffer tests, then scripts/bench_host.py next to
#     FlashInfer (.anchors-fi carried).
#   costs: experiments/single_call_costs.py (the single_* calls' host time by step).
#   final: the GPU tests around what changed beyond the prefill epilogue (cascades and
#     block-sparse through the merge kernel, variants and library variants under fa3, decode
#     graph and plan, NVFP4 prefill), the whole Python suite, bench_host.py next to FlashInfer,
#     experiments/sink_kernel_time.py, and where the cascade and variable block-sparse plan()
#     spend their host time (experiments/host_profile.py --plan).
#   sinktime: experiments/sink_kernel_time.py alone.
set -uo pipefail
stage=${1:?sink|costs|final|sinktime}
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH FLARE_LOG=quiet
mkdir -p "$OUT"
source experiments/family_tests.sh
if [ "$stage" = sink ]; then
  family_tests "$PWD" auto "${FILTER:-PrefillSinkGpu.*:PrefillSinglePlanGpu.*:PrefillGpu.*:PrefillHopper*}"
  family_tests "$PWD" fa2 "PrefillSinkGpu.*:PrefillGpu.*"
  FLARE_CACHE_DIR="$PWD/build-ab/jit-cache" timeout 200 compute-sanitizer --tool memcheck \
    --error-exitcode 9 build-ab/flare_gpu_tests \
    --gtest_filter='PrefillSinkGpu.RowsThatSeeNoKeyAreTheSink:PrefillSinkGpu.SplitRowsTakeTheSinkInTheMerge' \
    >"$OUT/memcheck.log" 2>&1
  echo "memcheck rc $? ($(grep -c 'Invalid' "$OUT/memcheck.log") invalid accesses)"
  scripts/gpu_check_python.sh "$OUT/py" -q -k "${PY_TESTS:-sink or refilled or graph_mode_plan or single}" \
    2>&1 | tail -n 4
  site=$(fi_site)
  (tree=$PWD && cd /tmp && PYTHONPATH=$tree/scripts${site:+:$site} PYTHONUNBUFFERED=1 \
    timeout 200 python3 "$tree/scripts/bench_host.py" --json "$OUT/bench_host.json" 2>&1 |
    tee "$OUT/bench_host.log" | grep -E "^\||rror" | tail -n 30)
fi
if [ "$stage" = costs ]; then
  (cd /tmp && python3 -c 'import flare' 2>/dev/null) ||
    scripts/gpu_check_python.sh "$OUT/py" -q -k no_test_has_this_name >/dev/null 2>&1
  (tree=$PWD && cd /tmp && timeout 200 python3 "$tree/experiments/single_call_costs.py" 2>&1 |
    tail -n 30)
fi
if [ "$stage" = final ]; then
  family_tests "$PWD" auto "Cascade*:Bsr*:UserVariantPrefill*:IndexSafetyPrefill*:PrefillRopeStaging*:BatchPrefillNvfp4*:BatchDecodeGraph*:BatchDecodePlan*:PrecompileGpu*:MergeState*"
  family_tests "$PWD" fa3 "UserVariantPrefill.Library*:PrefillSinkGpu*:Cascade*:PrefillSinglePlanGpu*"
  scripts/gpu_check_python.sh "$OUT/py" -q 2>&1 | tail -n 4
  site=$(fi_site)
  (tree=$PWD && cd /tmp && PYTHONPATH=$tree/scripts${site:+:$site} PYTHONUNBUFFERED=1 \
    timeout 200 python3 "$tree/scripts/bench_host.py" --json "$OUT/bench_host.json" 2>&1 |
    tee "$OUT/bench_host.log" | grep -E "^\||rror" | tail -n 30)
  (tree=$PWD && cd /tmp && timeout 120 python3 "$tree/experiments/sink_kernel_time.py" 2>&1 |
    tail -n 12)
  (tree=$PWD && cd /tmp && PYTHONPATH=$tree/scripts timeout 100 python3 \
    "$tree/experiments/host_profile.py" --plan Cascade Variable 2>&1 | tail -n 24)
fi
if [ "$stage" = sinktime ]; then
  (cd /tmp && python3 -c 'import flare' 2>/dev/null) ||
    scripts/gpu_check_python.sh "$OUT/py" -q -k no_test_has_this_name >/dev/null 2>&1
  (tree=$PWD && cd /tmp && timeout 150 python3 "$tree/experiments/sink_kernel_time.py" 2>&1 |
    tail -n 12)
fi
