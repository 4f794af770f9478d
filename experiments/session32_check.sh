#!/usr/bin/env bash
# The thirty-second session's device calls (docs/perf.md "Thirty-second session"):
#   tests: scripts/gpu_check.sh tests on main (the merge_heads kernel and the review commits had
#     not run the whole GPU list), then the empty-prefix question of perf.md H: the cascade at
#     prefix 0 and 1024 with the query tile fixed at 16 (FA2 family) and 64 (Hopper family, whose
#     producer prefetches the next item) next to plan_cascade's own choice.
#   fi: FlashInfer's own MultiLevelCascadeAttentionWrapper next to flare's in one process
#     (scripts/bench_cascade.py after scripts/flashinfer_sources.sh install; carry .anchors-fi
#     and .anchors-fi-extra); then bench_block_sparse.py at 8192 / 16384 (flare, Flex, FlashInfer).
#   ncu: the empty-prefix cascade's tiles (kv tile 32 / 64 / 128 at query tiles 16 and 64) and
#     Nsight Compute of its prefill launch next to the suffix decode at b16 prefix 0 (occupancy,
#     waves, DRAM throughput, stalls: where its 1.27x comes from).
#   sweep: the kv-tile sweep alone, then bench_block_sparse.py at 16384, densities 0.1 / 0.9,
#     20 calls (is the fi stage's 385 TFLOP/s at 0.9 against v15's 464 noise or a regression?).
# Usage (GPU machine, OUT set): bash experiments/session32_check.sh tests|fi|ncu|sweep
set -uo pipefail
stage=${1:?tests|fi|ncu|sweep}
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH FLARE_LOG=quiet
mkdir -p "$OUT"
if [ "$stage" = tests ]; then
  OUT=$OUT/gpu_check timeout 470 scripts/gpu_check.sh tests 2>&1 | tail -n 60
  g++ -O2 -std=c++20 -Iinclude -I. scripts/bench_cascade.cpp -Lbuild-gpu -lflare \
    -Wl,-rpath,"$PWD/build-gpu" -o build-gpu/bench_cascade &&
    FLARE_CACHE_DIR=$PWD/build-gpu/jit-cache timeout 90 build-gpu/bench_cascade 16,64 0,1024 0,16,64
fi
if [ "$stage" = fi ]; then
  scripts/gpu_check_python.sh "$OUT/py" -q -k no_such_test >/dev/null 2>&1
  python3 .anchors-fi/setup_fi.py /tmp/fi-site >/dev/null 2>&1
  scripts/flashinfer_sources.sh install /tmp/fi-site || exit 1
  (cd /tmp && PYTHONPATH=/tmp/fi-site:$OLDPWD/scripts timeout 420 \
    python3 "$OLDPWD/scripts/bench_cascade.py" --json "$OUT/cascade.json" 2>&1 |
    grep -v "Warning" | tail -30 &&
    PYTHONPATH=/tmp/fi-site:$OLDPWD/scripts timeout 200 python3 "$OLDPWD/scripts/bench_block_sparse.py" \
      --lengths 8192,16384 --json "$OUT/block_sparse.json" 2>&1 | grep -v "Warning" | tail -14)
fi
if [ "$stage" = ncu ] || [ "$stage" = sweep ]; then
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLARE_BUILD_TESTS=OFF >/dev/null &&
    cmake --build build-gpu -j"$(nproc)" --target flare >/dev/null &&
    g++ -O2 -std=c++20 -Iinclude -I. scripts/bench_cascade.cpp -Lbuild-gpu -lflare \
      -Wl,-rpath,"$PWD/build-gpu" -o build-gpu/bench_cascade || exit 1
  export FLARE_CACHE_DIR=$PWD/build-gpu/jit-cache
  timeout 120 build-gpu/bench_cascade 16,64 0 16,64 0,32,64,128
fi
if [ "$stage" = sweep ]; then
  scripts/gpu_check_python.sh "$OUT/py" -q -k no_such_test >/dev/null 2>&1
  python3 .anchors-fi/setup_fi.py /tmp/fi-site >/dev/null 2>&1
  (cd /tmp && PYTHONPATH=/tmp/fi-site:$OLDPWD/scripts timeout 240 python3 \
    "$OLDPWD/scripts/bench_block_sparse.py" --lengths 16384 --densities 0.1,0.9 --calls 20 2>&1 |
    grep -v "Warning" | tail -8)
fi
if [ "$stage" = ncu ]; then
  for kernel in flare_prefill flare_decode; do
    timeout 150 ncu -k "$kernel" --launch-skip 3 --launch-count 1 --section SpeedOfLight \
      --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis \
      --section WarpStateStats build-gpu/bench_cascade 16 0 0 >"$OUT/ncu_$kernel.txt" 2>&1
    echo "== ncu $kernel"
    grep -E "Duration|DRAM Throughput|Memory Throughput|Registers Per|Shared Memory Config|Dynamic Shared|Block Size|Grid Size|Waves Per SM|Theoretical Occ|Achieved Occ|Block Limit|Warp Cycles Per Issued|Active Warps Per|L2 Hit|Mem Busy" \
      "$OUT/ncu_$kernel.txt" | head -40
  done
fi
