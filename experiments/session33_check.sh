#!/usr/bin/env bash
# The thirty-third session's verification calls (docs/perf.md "Thirty-third session"):
#   tests: scripts/gpu_check.sh tests on the tree with the KV-head-major queue order (the
#     prefill kernels' queue_item changed), then the short-item shapes
#     (experiments/bench_small_q_prefill.cpp: 16-row plans keep the head-minor order).
#   bench: bench_block_sparse.py at 8192 / 16384 (flare, Flex, FlashInfer's wrapper, 20 calls)
#     and bench_python.py --only prefill (causal b16 1024 / 4096 / 16384 next to SDPA cuDNN and
#     FlashInfer fa3 in one process). Carry .anchors-fi.
# Usage (GPU machine, OUT set): bash experiments/session33_check.sh tests|bench
set -uo pipefail
stage=${1:?tests|bench}
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH FLARE_LOG=quiet
mkdir -p "$OUT"
if [ "$stage" = tests ]; then
  OUT=$OUT/gpu_check timeout 480 scripts/gpu_check.sh tests 2>&1 | tail -n 40
  g++ -O2 -std=c++20 -Iinclude -I. experiments/bench_small_q_prefill.cpp -Lbuild-gpu -lflare \
    -Wl,-rpath,"$PWD/build-gpu" -o build-gpu/bench_small_q_prefill &&
    FLARE_CACHE_DIR=$PWD/build-gpu/jit-cache timeout 60 build-gpu/bench_small_q_prefill | tail -n 9
fi
if [ "$stage" = bench ]; then
  scripts/gpu_check_python.sh "$OUT/py" -q -k no_such_test >/dev/null 2>&1
  python3 .anchors-fi/setup_fi.py /tmp/fi-site >/dev/null 2>&1
  (cd /tmp && PYTHONPATH=/tmp/fi-site:$OLDPWD/scripts timeout 200 python3 \
    "$OLDPWD/scripts/bench_block_sparse.py" --lengths 8192,16384 --calls 20 \
    --json "$OUT/block_sparse.json" 2>&1 | grep -v "Warning" | tail -12 &&
    PYTHONPATH=/tmp/fi-site:$OLDPWD/scripts timeout 240 python3 "$OLDPWD/scripts/bench_python.py" \
      --only prefill --json "$OUT/python_prefill.json" 2>&1 | grep -v "Warning" | tail -30)
fi
