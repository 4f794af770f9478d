#!/usr/bin/env bash
# The first device call of the session after the twenty-ninth (docs/perf.md there): does
# branch producer-one-warp (only the copying producer warp waits on the consumers' releases;
# q_scale once per item) help, and were the producer's waits the ones that spin?
# 1. on this tree: which try_wait loops of flare's soft-capped Hopper prefill spin (ncu SASS
#    page, experiments/sass_wait_counts.py), and the per-opcode counts next to fa3;
# 2. C++ A/B of this tree against the branch's (prefill_ab.sh): causal and soft-cap 30, ragged
#    and paged, b16 h16 D 128, two rounds each.
# Usage (GPU machine, OUT set; carry .anchors-fi and the branch's tree, made here with
#   mkdir -p .scratch/b && git archive producer-one-warp | tar -x -C .scratch/b):
#   bash experiments/producer_one_warp_check.sh .scratch/b
set -uo pipefail
branch=${1:?usage: producer_one_warp_check.sh <branch tree>}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
NCU_SECTION_LIBS="" NCU_SASS=1 NCU_OPCODES=1 NCU_SOFT_CAP=30 NCU_LEN=8192 \
  bash experiments/ncu_hopper_vs_fa3.sh 2>&1 | tail -n 12
[ -f "$OUT/flare_sass.csv" ] && python3 experiments/sass_wait_counts.py "$OUT/flare_sass.csv" 20
echo "== causal"
FLARE_BENCH_ONLY="causal b16 seq" bash experiments/prefill_ab.sh . "$branch" 2
echo "== soft-cap 30"
FLARE_BENCH_ONLY="causal b16 seq" FLARE_BENCH_SOFT_CAP=30 bash experiments/prefill_ab.sh . "$branch" 2
