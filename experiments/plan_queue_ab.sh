#!/usr/bin/env bash
# A/B of a planner change on the Algorithm-1 shapes (issue 17): builds libflare,
# scripts/bench_prefill_nvfp4.cpp and experiments/plan_host_split.cpp of two source trees into
# <tree>/build-ab, then runs them alternately: the 16-bit paged prefill's GPU time on each
# plan (the kernels are the same) and BatchPrefill::plan()'s host time.
# Usage (GPU machine): experiments/plan_queue_ab.sh <tree A> <tree B> [rounds]
set -euo pipefail
export PATH="/usr/local/cuda/bin:$PATH" FLARE_LOG=quiet
ROUNDS=${3:-2}
for tree in "$1" "$2"; do
  bash "$(dirname "$0")/build_ab.sh" "$tree" scripts/bench_prefill_nvfp4.cpp \
    experiments/plan_host_split.cpp
done
for round in $(seq "$ROUNDS"); do
  for tree in "$1" "$2"; do
    echo "== round $round: $tree"
    FLARE_CACHE_DIR="$tree/build-ab/jit-cache" "$tree/build-ab/bench_prefill_nvfp4"
    "$tree/build-ab/plan_host_split"
  done
done
