#!/usr/bin/env bash
# The KV-head-major queue order (plan/plan.h Plan::head_major_queue, thirty-third session)
# against the tree before it, one call: block-sparse through Python (bench_block_sparse.py,
# 8192 / 16384, densities 0.1-0.9: flare in both trees, FlexAttention next to the new one),
# causal prefill from C++ (scripts/bench_prefill.cpp, both trees alternately, two rounds) and
# the short-item shapes (experiments/bench_small_q_prefill.cpp), then this tree's Python GPU
# tests of the block-sparse, prefill and cascade wrappers.
# Usage (GPU machine, OUT set; the base tree made here with
#   mkdir -p .scratch/base && git archive HEAD | tar -x -C .scratch/base, carried):
#   bash experiments/head_major_check.sh .scratch/base   (~450 s)
set -uo pipefail
base=${1:?base tree}
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH FLARE_LOG=quiet
mkdir -p "$OUT"
sparse() {  # label, libraries: main's bench script over whichever flare package is installed
  echo "== block-sparse: $1"
  (cd /tmp && PYTHONPATH=$OLDPWD/scripts timeout 200 python3 "$OLDPWD/scripts/bench_block_sparse.py" \
    --lengths 8192,16384 --calls 20 --libraries "$2" 2>&1 | grep -E "^\| (8192|16384|length)")
}
(cd "$base" && scripts/gpu_check_python.sh "$OUT/py_base" -q -k no_such_test >/dev/null 2>&1)
sparse "base" flare
scripts/gpu_check_python.sh "$OUT/py" -q -k no_such_test >/dev/null 2>&1
sparse "head major" flare,flex
for tree in "$base" .; do
  bash experiments/build_ab.sh "$tree" scripts/bench_prefill.cpp experiments/bench_small_q_prefill.cpp ||
    exit 1
done
for round in 1 2; do
  for tree in "$base" .; do
    echo "== round $round: $tree"
    (export FLARE_CACHE_DIR=$tree/build-ab/jit-cache
      timeout 150 "$tree/build-ab/bench_prefill" | grep -E "^causal|^uniform|^zipf|^append"
      [ "$round" = 1 ] && timeout 100 "$tree/build-ab/bench_small_q_prefill" | tail -n 9)
  done
done
echo "== Python GPU tests (this tree)"
timeout 300 scripts/gpu_check_python.sh "$OUT/py_tests" -q -k "sparse or prefill or cascade" 2>&1 |
  tail -n 3
