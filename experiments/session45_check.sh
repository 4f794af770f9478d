#!/usr/bin/env bash
# Forty-fifth session's device checks (GPU machine, OUT set):
#   t5table (b05c356's script; the stage and experiments/t5_distance_table.py are deleted
#     since, flare.variants.distance_bias is its variant): causal, flare.variants' T5 and a user
#     variant reading a bias-by-distance table at 2048-16384, eager, two rounds.
#   distance: flare.variants.distance_bias() (the library form of that table): the user-variant
#     GPU tests under auto and fa2, memcheck of the distance-bias tests, the Python variant
#     tests, then bench_variants.py (flare, eager, 10 calls) for causal, T5's buckets and the
#     distance bias at 2048-16384, under auto and under fa2.
#   verify: the same tests and memcheck, then the Python variant tests; no benchmark.
#   cascade: the Python cascade tests on CUDA (the one launch's partial states in memory of its
#     own outside graphs), then FlashInfer's test_shared_prefix_kernels.py over flare (carry
#     .fitests: ../shared/flashinfer-tests/README.md), whose head-dim-256 cases needed more
#     partial slots than their 32 MB workspace holds.
#   biased: the user-variant GPU tests under auto, then bench_variants.py (auto) for causal and
#     the distance bias at 2048-16384, two rounds (the bias in the S accumulators, kBiasInScores).
set -uo pipefail
stage=${1:?distance|verify|biased|cascade}
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH FLARE_LOG=quiet
mkdir -p "$OUT"
if [ "$stage" = distance ] || [ "$stage" = verify ]; then
  source experiments/family_tests.sh
  family_tests "$PWD" auto '*UserVariant*'
  rm -f "$OUT"/tests_auto_*.log
  family_tests "$PWD" fa2 '*UserVariant*'
  rm -f "$OUT"/tests_fa2_*.log
  FLARE_CACHE_DIR=$PWD/build-ab/jit-cache compute-sanitizer --tool memcheck --error-exitcode 99 \
    build-ab/flare_gpu_tests --gtest_filter='*DistanceBias*:*DistanceTables*' >"$OUT/memcheck.log" 2>&1
  echo "memcheck: exit $? $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -n 1) $(grep -E 'tests? ran' "$OUT/memcheck.log")"
  scripts/gpu_check_python.sh "$OUT/py" -q -k "variant or relative or distance" 2>&1 | tail -n 3
fi
if [ "$stage" = distance ]; then
  for backend in auto fa2; do
    lengths=2048,4096,8192,16384
    [ $backend = fa2 ] && lengths=2048,8192
    (tree=$PWD && cd /tmp && PYTHONPATH=$tree/scripts timeout 200 python3 \
      "$tree/scripts/bench_variants.py" --lengths $lengths --calls 10 \
      --flare-backend $backend \
      --libraries flare --variants causal,relative_bias,distance_bias \
      --json "$OUT/variants_$backend.json" 2>&1 | grep -vE "Warning|warn|INFO" | grep -E "time|^\| (causal|rel|dist)")
  done
fi
if [ "$stage" = biased ]; then
  source experiments/family_tests.sh
  family_tests "$PWD" auto '*UserVariant*:*Relative*'
  scripts/gpu_check_python.sh "$OUT/py" -q -k "distance or relative" 2>&1 | tail -n 2
  for round in 1 2; do
    (tree=$PWD && cd /tmp && PYTHONPATH=$tree/scripts timeout 200 python3 \
      "$tree/scripts/bench_variants.py" --lengths 2048,4096,8192,16384 --calls 10 \
      --libraries flare --variants causal,distance_bias \
      --json "$OUT/variants_$round.json" 2>&1 | grep -vE "Warning|warn|INFO" | grep -E "time")
  done
fi
if [ "$stage" = cascade ]; then
  scripts/gpu_check_python.sh "$OUT/py" -q -k "cascade or shared_prefix" 2>&1 | tail -n 3
  FI_FILES=tests/attention/test_shared_prefix_kernels.py bash experiments/fi_alias_shim.sh 2>&1 |
    grep -E "passed|failed|FAILED" | tail -n 8
fi
