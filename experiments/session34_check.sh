#!/usr/bin/env bash
# The thirty-fourth session's verification calls (docs/perf.md "Thirty-fourth session"):
# Algorithm 1 of one-queue plans over groups of KV heads (src/plan/plan.cpp queue_head_group).
#   ab: the paged prefill's GPU time on each tree's plans, both trees alternately (16-bit and
#     NVFP4 on bench_prefill_nvfp4's shapes, the NVFP4 ones on 396 CTAs now with 4-head items)
#     and BatchPrefill::plan()'s host time (experiments/plan_queue_ab.sh), then plan()'s host
#     time through Python from both installs in turn (experiments/plan_py_one.py).
#   tests: scripts/gpu_check.sh tests. python: the Python GPU tests of the prefill, cascade,
#     block-sparse and NVFP4 wrappers. t5: the Python variant GPU tests and bench_variants' T5
#     bias, ALiBi and causal rows next to FlexAttention (T5's far tiles as affine logits).
#     verify: the variant GPU tests, then scripts/gpu_check.sh tests (one call).
# Usage (GPU machine, OUT set; the base tree made here with
#   mkdir -p .scratch/base && git archive <base> | tar -x -C .scratch/base, carried):
#   bash experiments/session34_check.sh ab .scratch/base | tests | python | t5 | verify
set -uo pipefail
stage=${1:?ab|tests|python|t5|verify}
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH FLARE_LOG=quiet
mkdir -p "$OUT"
if [ "$stage" = ab ]; then
  base=${2:?base tree}
  timeout 330 bash experiments/plan_queue_ab.sh "$base" . 2 2>&1 | grep -v "^\[flare\]"
  FLARE_AB_SCRIPT=experiments/plan_py_one.py timeout 240 \
    bash experiments/split_sweep_ab.sh "$base" . 3 2>&1 | tail -n 12
fi
if [ "$stage" = tests ]; then
  OUT=$OUT/gpu_check timeout 480 scripts/gpu_check.sh tests 2>&1 | tail -n 40
fi
if [ "$stage" = t5 ]; then  # T5's far tiles on the affine-logits path (kLogitsAffineOnSomeKeys)
  timeout 300 scripts/gpu_check_python.sh "$OUT/py_t5" -q -k "variant" 2>&1 | tail -n 3
  (cd /tmp && PYTHONPATH=$OLDPWD/scripts timeout 240 python3 "$OLDPWD/scripts/bench_variants.py" \
    --libraries flare,flex --lengths 2048,4096,8192,16384 \
    --variants causal,alibi,relative_bias --calls 10 2>&1 | grep -E "^\|")
fi
if [ "$stage" = verify ]; then  # the t5-affine branch: variant tests, then every GPU test
  timeout 200 scripts/gpu_check_python.sh "$OUT/py_variant" -q -k "variant" 2>&1 | tail -n 3
  OUT=$OUT/gpu_check timeout 380 scripts/gpu_check.sh tests 2>&1 | grep -E "passed|exit|SUMMARY|status"
fi
if [ "$stage" = python ]; then
  timeout 400 scripts/gpu_check_python.sh "$OUT/py_tests" -q \
    -k "prefill or cascade or sparse or nvfp4" 2>&1 | tail -n 3
fi
