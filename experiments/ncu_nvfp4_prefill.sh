#!/usr/bin/env bash
# Nsight Compute of the FA2 family's NVFP4 prefill kernel on one shape of
# scripts/bench_prefill_nvfp4.cpp (NCU_SHAPE, default "b16 q16"): the kernel's limiters (issue
# stalls, occupancy, instruction mix) and, with NCU_SASS=1, its per-SASS-instruction stall samples
# (a CSV in $OUT). The 16-bit kernel of the shape runs first (3 + 100 launches), so the skip lands
# on an NVFP4 launch in steady state. Usage (GPU machine, OUT set): experiments/ncu_nvfp4_prefill.sh [tree]
set -uo pipefail
export PATH=/usr/local/cuda/bin:$PATH FLARE_LOG=quiet
TREE=${1:-$PWD}
cd "$TREE" || exit 1
mkdir -p "$OUT"
[ -x build-ab/bench_prefill_nvfp4 ] || { cmake -S . -B build-ab -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DFLARE_BUILD_TESTS=OFF >/dev/null && cmake --build build-ab -j16 --target flare >/dev/null &&
  g++ -O2 -std=c++20 -Iinclude -I. scripts/bench_prefill_nvfp4.cpp -Lbuild-ab -lflare \
    -Wl,-rpath,"$PWD/build-ab" -o build-ab/bench_prefill_nvfp4; } || exit 1
export FLARE_CACHE_DIR=$PWD/build-ab/jit-cache FLARE_BENCH_ONLY=${NCU_SHAPE:-b16 q16}
build-ab/bench_prefill_nvfp4 >/dev/null  # compiles the units outside the profile
timeout 200 ncu -k regex:flare_prefill --launch-skip 110 --launch-count 1 \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
  --section LaunchStats --section InstructionStats --section MemoryWorkloadAnalysis \
  build-ab/bench_prefill_nvfp4 >"$OUT/ncu.txt" 2>&1
echo "ncu exit $?"
grep -E "Duration|Registers Per|Threads  |Achieved Occupancy|Theoretical Occupancy|Block Limit|Issue Slots Busy|Executed Ipc Active|No Eligible|Warp Cycles Per Issued|Executed Instructions  |Dynamic Shared|Memory Throughput|DRAM Throughput|Stall|Grid Size" "$OUT/ncu.txt" | head -40
if [ "${NCU_SASS:-0}" = 1 ]; then
  timeout 200 ncu -k regex:flare_prefill --launch-skip 110 --launch-count 1 \
    --section SourceCounters --section WarpStateStats --import-source no -f -o "$OUT/nvfp4" \
    build-ab/bench_prefill_nvfp4 >"$OUT/ncu_sass.log" 2>&1
  ncu -i "$OUT/nvfp4.ncu-rep" --page source --csv --print-source sass >"$OUT/nvfp4_sass.csv" 2>&1
  echo "sass page: $(wc -l <"$OUT/nvfp4_sass.csv") lines"; rm -f "$OUT/nvfp4.ncu-rep"
fi
