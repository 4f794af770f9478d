#!/usr/bin/env bash
# A/B of the prefill kernels of two source trees (issue 18 experiment): builds libflare and
# scripts/bench_prefill.cpp of each into <tree>/build-ab, then runs the benchmark alternately,
# `rounds` times each, with the caller's FLARE_BENCH_* settings (e.g. FLARE_BENCH_WINDOW_LEFT,
# FLARE_BENCH_ONLY). Usage: experiments/prefill_ab.sh <tree A> <tree B> [rounds]  (GPU machine)
set -euo pipefail
export PATH="/usr/local/cuda/bin:$PATH" FLARE_LOG=quiet
ROUNDS=${3:-2}
for tree in "$1" "$2"; do
  bash "$(dirname "$0")/build_ab.sh" "$tree" scripts/bench_prefill.cpp
done
for round in $(seq "$ROUNDS"); do
  for tree in "$1" "$2"; do
    echo "== round $round: $tree"
    FLARE_CACHE_DIR="$tree/build-ab/jit-cache" "$tree/build-ab/bench_prefill" | grep -E "^causal|^case"
  done
done
