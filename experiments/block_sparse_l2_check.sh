#!/usr/bin/env bash
# The block-sparse drop at 16384 tokens since v15 (docs/perf.md, thirty-second session D / G:
# the planners give identical plans, so the kernel or its queue's timing). Guess: 64-row tiles
# read 128 flop a KV byte, under the H200's ~206, and lean on L2 reuse among the CTAs reading one
# head's K/V; the 264 entries in flight span all 32 heads (256 MB of K/V at 16384, 128 MB at
# 8192, against 50 MB of L2). Test, one call: flare alone at 16384 / 0.9 with 32, 16 and 8 heads
# (working sets 256 / 128 / 64 MB; if the guess holds, TFLOP/s rise towards 8192's ~475 as heads
# fall), on main and on 52033ee (v15, 464 TFLOP/s at 32 heads), whose Python package is built
# from its tree. Carry the v15 tree: mkdir -p .scratch/v15 && git archive 52033ee | tar -x -C
# .scratch/v15 (its bench script lacks --heads: main's script runs against its package).
# Usage (GPU machine, OUT set): bash experiments/block_sparse_l2_check.sh .scratch/v15  (~300 s)
set -uo pipefail
v15=${1:?v15 tree}
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH FLARE_LOG=quiet
mkdir -p "$OUT"
bench() {  # label: main's bench script over whichever flare package is installed
  echo "== $1"
  (cd /tmp && PYTHONPATH=$OLDPWD/scripts timeout 150 python3 "$OLDPWD/scripts/bench_block_sparse.py" \
    --lengths 16384 --densities 0.9 --calls 20 --libraries flare --heads "$2" 2>&1 |
    grep -E "^\| 16384")
}
scripts/gpu_check_python.sh "$OUT/py" -q -k no_such_test >/dev/null 2>&1
for heads in 32 16 8; do bench "main, $heads heads" $heads; done
(cd "$v15" && scripts/gpu_check_python.sh "$OUT/py_v15" -q -k no_such_test >/dev/null 2>&1)
for heads in 32 8; do bench "52033ee, $heads heads" $heads; done
