#!/usr/bin/env bash
# Where the mma.sync family's warps wait on short items (docs/perf.md, thirty-second session
# E / F: plain q1 paged prefill at kv 128 is 1.18-1.25x the decode kernel, two pipeline changes
# did not move it): Nsight Compute's per-SASS-line stall sampling of the prefill launch and of
# the decode launch on the same shape (experiments/bench_small_q_prefill.cpp, default b64 q1
# kv128, 32 / 8 heads, page 16), the top lines of each, plus their warp-state summaries.
# Usage (GPU machine, OUT set): bash experiments/ncu_small_item_stalls.sh [batch q kv]  (~120 s)
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH FLARE_LOG=quiet FLARE_CACHE_DIR=$PWD/build-gpu/jit-cache
mkdir -p "$OUT"
[ $# -eq 3 ] && shape=("$@") || shape=(64 1 128)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLARE_BUILD_TESTS=OFF >/dev/null &&
  cmake --build build-gpu -j"$(nproc)" --target flare >/dev/null &&
  g++ -O2 -std=c++20 -Iinclude -I. experiments/bench_small_q_prefill.cpp -Lbuild-gpu -lflare \
    -Wl,-rpath,"$PWD/build-gpu" -o build-gpu/bench_small_q_prefill || exit 1
build-gpu/bench_small_q_prefill "${shape[@]}"
for kernel in flare_prefill flare_decode; do
  timeout 200 ncu -k "$kernel" --launch-skip 3 --launch-count 1 --section WarpStateStats \
    --section SourceCounters --section SpeedOfLight --section Occupancy -f -o "$OUT/$kernel" \
    build-gpu/bench_small_q_prefill "${shape[@]}" >"$OUT/$kernel.log" 2>&1
  ncu -i "$OUT/$kernel.ncu-rep" --page details >"$OUT/$kernel.details.txt" 2>&1
  ncu -i "$OUT/$kernel.ncu-rep" --page source --csv --print-source sass >"$OUT/$kernel.sass.csv" 2>&1
  echo "== $kernel"
  grep -E "Duration|DRAM Throughput|Warp Cycles Per Issued|Achieved Occupancy" "$OUT/$kernel.details.txt" | head -6
  python3 experiments/ncu_small_item_stalls.py "$OUT/$kernel.sass.csv" 20
done
