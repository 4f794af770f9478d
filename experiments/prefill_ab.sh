#!/usr/bin/env bash
# A/B of the prefill kernels of two source trees (issue 18 experiment): builds libflare and
# scripts/bench_prefill.cpp of each into <tree>/build-ab, then runs the benchmark alternately,
# `rounds` times each, with the caller's FLARE_BENCH_* settings (e.g. FLARE_BENCH_WINDOW_LEFT,
# FLARE_BENCH_ONLY). Usage: experiments/prefill_ab.sh <tree A> <tree B> [rounds]  (GPU machine)
set -euo pipefail
export PATH="/usr/local/cuda/bin:$PATH" FLARE_LOG=quiet
ROUNDS=${3:-2}
for tree in "$1" "$2"; do
  (cd "$tree" && cmake -S . -B build-ab -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLARE_BUILD_TESTS=OFF \
     >/dev/null && cmake --build build-ab -j"$(nproc)" --target flare >/dev/null &&
   g++ -O2 -std=c++20 -Iinclude -I. scripts/bench_prefill.cpp -Lbuild-ab -lflare \
     -Wl,-rpath,"$PWD/build-ab" -o build-ab/bench_prefill)
done
for round in $(seq "$ROUNDS"); do
  for tree in "$1" "$2"; do
    echo "== round $round: $tree"
    FLARE_CACHE_DIR="$tree/build-ab/jit-cache" "$tree/build-ab/bench_prefill" | grep -E "^causal|^case"
  done
done
