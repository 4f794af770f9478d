#!/usr/bin/env bash
# Forty-fourth session's device checks (GPU machine, OUT set; carry .anchors-fi and
# .anchors-fi-extra):
#   verify: the merge and append GPU tests (the pair merge kernel's two row groups a warp), the
#     prefill RoPE staging tests (the review mend: the staging flag in the plan in progress) under
#     auto / fa2 / fa3, memcheck of the merge tests; the Python merge / append / NVFP4-append /
#     staging / capture tests on CUDA; then scripts/bench_state_ops.py next to FlashInfer.
#   ncu: experiments/ncu_merge.sh (flare's merge kernels next to FlashInfer's).
#   t5merge: the merge GPU tests (merge_states of two states now runs the pair kernel) and the
#     variant GPU tests (T5: the far tiles' bias folded into the exp2 offset, the near tiles
#     without the conversion unit), memcheck of the merge tests, the Python merge and variant
#     tests, bench_state_ops next to FlashInfer, then bench_variants' causal and T5 rows (flare,
#     eager, 10 calls) at 2048-16384.
#   variants: the Python variant tests, then bench_variants (flare, eager, 10 calls) at
#     2048-16384 for causal, the built-in and the user soft-cap, T5, prefix-LM and the document
#     mask (user variants' row states built once an item: kRowStatesPerItem).
#   pair: the merge GPU tests and memcheck (the pair kernel: two vectors of a row a lane), the
#     Python merge tests, then bench_state_ops next to FlashInfer.
#   rope_ctas: the tensor-core RoPE decode at 3 CTAs an SM (FLARE_PROBE_ROPE_CTAS=3, a probe
#     then in src/api/decode_config.cpp, removed after the run: 168 registers, 2 stages) against
#     the default 2: the Python RoPE tests under the probe, then bench_rope_decode.py
#     alternating, two rounds (docs/perf.md, forty-fourth D).
#   old_states: the session start's tree (.scratch/main, carried: git archive of 4413b8b) built
#     and installed, then this tree's bench_state_ops.py (its merge_states (4) row) over it, no
#     FlashInfer: the states loop before its two vectors a lane.
set -uo pipefail
stage=${1:?verify|ncu|t5merge|variants|pair|rope_ctas|old_states}
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH FLARE_LOG=quiet
mkdir -p "$OUT"
# memcheck <gtest filter>: compute-sanitizer memcheck of those GPU tests (family_tests' build).
memcheck() {
  FLARE_CACHE_DIR=$PWD/build-ab/jit-cache compute-sanitizer --tool memcheck --error-exitcode 99 \
    build-ab/flare_gpu_tests --gtest_filter="$1" >"$OUT/memcheck.log" 2>&1
  echo "memcheck: exit $? $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -n 1) $(grep -E 'tests? ran' "$OUT/memcheck.log")"
}
# state_ops_bench: scripts/bench_state_ops.py next to FlashInfer (its merge sources installed),
# the merge rows.
state_ops_bench() {
  python3 .anchors-fi/setup_fi.py /tmp/fi-site >/dev/null 2>&1
  scripts/flashinfer_sources.sh install /tmp/fi-site >/dev/null 2>&1
  (tree=$PWD && cd /tmp && PYTHONPATH=/tmp/fi-site:$tree/scripts MAX_JOBS=16 timeout 200 python3 \
    "$tree/scripts/bench_state_ops.py" --json "$OUT/state_ops.json" 2>&1 |
    grep -vE "Warning|warn|INFO" | grep -E "merge|^\| op")
}
if [ "$stage" = verify ]; then
  source experiments/family_tests.sh
  family_tests "$PWD" auto '*Merge*:AppendPagedKV*:*Nvfp4*Append*:*Cascade*'
  rm -f "$OUT"/tests_auto_*.log
  filter='PrefillGpu.StagedRope*:PrefillGpu.FusedRope*:PrefillRopeStagingGpu.*'
  for backend in fa2 fa3; do
    family_tests "$PWD" $backend "$filter"
    rm -f "$OUT"/tests_${backend}_*.log
  done
  memcheck 'MergeGpu.*:PrefillRopeStagingGpu.*'
  scripts/gpu_check_python.sh "$OUT/py" -q -k \
    "merge or append or nvfp4 or rope_staging or rope_staged or custom_mask_buffers or dlpack or cascade" 2>&1 | tail -n 3
  state_ops_bench
fi
if [ "$stage" = ncu ]; then
  bash experiments/ncu_merge.sh
fi
if [ "$stage" = t5merge ]; then
  source experiments/family_tests.sh
  family_tests "$PWD" auto '*Merge*:*Variant*:*Cascade*'
  rm -f "$OUT"/tests_auto_*.log
  family_tests "$PWD" fa3 '*Variant*'
  rm -f "$OUT"/tests_fa3_*.log
  memcheck 'MergeGpu.*:MergeStates*'
  scripts/gpu_check_python.sh "$OUT/py" -q -k "merge or variant or relative or cascade" 2>&1 | tail -n 3
  state_ops_bench
  (tree=$PWD && cd /tmp && timeout 200 python3 "$tree/scripts/bench_variants.py" \
    --lengths 2048,4096,8192,16384 --calls 10 --variants causal,relative_bias --libraries flare \
    --json "$OUT/variants.json" 2>&1 | grep -vE "Warning|warn|INFO" | tail -n 14)
fi
if [ "$stage" = variants ]; then
  scripts/gpu_check_python.sh "$OUT/py" -q -k "variant or relative" 2>&1 | tail -n 3
  (tree=$PWD && cd /tmp && PYTHONPATH=$tree/scripts timeout 400 python3 \
    "$tree/scripts/bench_variants.py" --lengths 2048,4096,8192,16384 --calls 10 --libraries flare \
    --variants causal,soft_cap,user:soft_cap,relative_bias,prefix_lm,document \
    --json "$OUT/variants.json" 2>&1 | grep -vE "Warning|warn|INFO" | tail -n 34)
fi
if [ "$stage" = pair ]; then
  source experiments/family_tests.sh
  family_tests "$PWD" auto '*Merge*:*Cascade*'
  memcheck 'MergeGpu.*:MergeState*'
  scripts/gpu_check_python.sh "$OUT/py" -q -k "merge or cascade" 2>&1 | tail -n 2
  state_ops_bench
fi
if [ "$stage" = rope_ctas ]; then
  FLARE_PROBE_ROPE_CTAS=3 scripts/gpu_check_python.sh "$OUT/py" -q -k "rope" 2>&1 | tail -n 2
  tree=$PWD
  cd /tmp
  for round in 1 2; do
    for ctas in 2 3; do
      echo "== round $round, RoPE decode at $ctas CTAs an SM"
      FLARE_PROBE_ROPE_CTAS=$ctas PYTHONPATH=$tree/scripts timeout 100 python3 \
        "$tree/scripts/bench_rope_decode.py" --calls 30 2>&1 | grep -E "tensor cores"
    done
  done
fi
if [ "$stage" = old_states ]; then
  (cd .scratch/main && scripts/gpu_check_python.sh "$OUT/py_old" -q -k no_such_test >/dev/null 2>&1)
  (tree=$PWD && cd /tmp && PYTHONPATH=$tree/scripts timeout 100 python3 \
    "$tree/scripts/bench_state_ops.py" 2>&1 | grep -E "merge_states|^\| op")
fi
