#!/usr/bin/env bash
# The thirty-fifth session's device calls (docs/perf.md "Thirty-fifth session"): the Hopper
# family's consumer warpgroups each with their own item record (kernels/prefill_hopper.cuh), so
# the first to finish an item starts the next while the other writes its output.
#   ab <base>: C++ bench_prefill of both trees alternately, causal b16 (1024 / 4096 / 16384,
#     uniform, Zipf; ragged and paged), then with a left window of 256 keys (items of 2-3 KV
#     tiles, as the document mask's at 2048), two rounds each.
#   qonly <tree>: the same A/B against a tree with the bulk Q copy alone (no warpgroup records),
#     then the host cost of encoding q's tensor map (experiments/tensor_map_encode_cost.cpp).
#   branches <main> <epilogue> <half>: trees of main and of main with
#     experiments/patches/epilogue-row-tables.patch and q-bulk-half-tile.patch applied
#     (patch -p1); the epilogue tree against main (as ab), then C++ bench_cascade (b16 / b64, prefix 0 / 1024: decode-shaped levels, whose
#     few rows the half-tile patch gathers) on main and the half-tile tree, two rounds.
#   tests: scripts/gpu_check.sh tests (every GPU test, both families again, sanitizers).
#   python: the Python GPU tests of the prefill, variant, cascade and block-sparse wrappers.
#   variants: bench_variants.py (flare and FlexAttention; causal, window, ALiBi, document) and
#     bench_block_sparse.py at 8192 (density 0.1 / 0.9), through Python.
# Usage (GPU machine, OUT set; the base tree made here with
#   mkdir -p .scratch/base && git archive <base> | tar -x -C .scratch/base):
#   bash experiments/session35_check.sh ab .scratch/base | tests | python | variants
set -uo pipefail
stage=${1:?ab|qonly|branches|tests|python|variants}
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH FLARE_LOG=quiet
mkdir -p "$OUT"
if [ "$stage" = ab ]; then
  base=${2:?base tree}
  FLARE_BENCH_ONLY="causal b16" timeout 300 bash experiments/prefill_ab.sh "$base" . 2 2>&1 |
    grep -v "^\[flare\]"
  echo "== window 256"
  FLARE_BENCH_ONLY="causal b16 seq" FLARE_BENCH_WINDOW_LEFT=256 timeout 200 \
    bash experiments/prefill_ab.sh "$base" . 2 2>&1 | grep -v "^\[flare\]"
fi
if [ "$stage" = qonly ]; then  # the bulk Q copy alone against it with the warpgroup records
  base=${2:?tree with the bulk Q copy alone}
  FLARE_BENCH_ONLY="causal b16" timeout 200 bash experiments/prefill_ab.sh "$base" . 2 2>&1 |
    grep -E "^== round|^causal"
  FLARE_BENCH_ONLY="causal b16 seq" FLARE_BENCH_WINDOW_LEFT=256 timeout 150 \
    bash experiments/prefill_ab.sh "$base" . 2 2>&1 | grep -E "^== round|^causal"
  g++ -O2 -std=c++20 -Iinclude -I. experiments/tensor_map_encode_cost.cpp -Lbuild-ab -lflare \
    -Wl,-rpath,"$PWD/build-ab" -o build-ab/tensor_map_encode_cost && build-ab/tensor_map_encode_cost
fi
if [ "$stage" = branches ]; then  # the two patches left unrun, each against main
  main=${2:?the tree of main}
  epilogue=${3:?the tree with epilogue-row-tables.patch}
  half=${4:?the tree with q-bulk-half-tile.patch}
  FLARE_BENCH_ONLY="causal b16" timeout 200 bash experiments/prefill_ab.sh "$main" "$epilogue" 2 \
    2>&1 | grep -E "^== round|^causal"
  FLARE_BENCH_ONLY="causal b16 seq" FLARE_BENCH_WINDOW_LEFT=256 timeout 150 \
    bash experiments/prefill_ab.sh "$main" "$epilogue" 2 2>&1 | grep -E "^== round|^causal"
  # main's libflare is in <tree>/build-ab already (prefill_ab.sh); build_ab.sh links the tool.
  for tree in "$main" "$half"; do
    bash experiments/build_ab.sh "$tree" scripts/bench_cascade.cpp >/dev/null 2>&1 ||
      echo "build of $tree failed"
  done
  for round in 1 2; do
    for tree in "$main" "$half"; do
      echo "== cascade round $round: $tree"
      FLARE_CACHE_DIR="$tree/build-ab/jit-cache" timeout 60 "$tree/build-ab/bench_cascade" 16,64 0,1024 \
        2>&1 | grep -E "^\| [0-9]"
    done
  done
fi
if [ "$stage" = tests ]; then
  OUT=$OUT/gpu_check timeout 480 scripts/gpu_check.sh tests 2>&1 | tail -n 40
fi
if [ "$stage" = python ]; then
  timeout 400 scripts/gpu_check_python.sh "$OUT/py_tests" -q \
    -k "prefill or variant or cascade or sparse" 2>&1 | tail -n 3
fi
if [ "$stage" = variants ]; then
  python3 -c 'import flare' 2>/dev/null ||
    scripts/gpu_check_python.sh "$OUT/py" -q -k no_such_test >/dev/null 2>&1
  (cd /tmp && PYTHONPATH=$OLDPWD/scripts timeout 300 python3 "$OLDPWD/scripts/bench_variants.py" \
    --libraries flare,flex --lengths 2048,4096,8192,16384 \
    --variants causal,window,alibi,document --calls 10 2>&1 | grep -E "^\||document")
  (cd /tmp && PYTHONPATH=$OLDPWD/scripts timeout 150 python3 "$OLDPWD/scripts/bench_block_sparse.py" \
    --libraries flare,flex --lengths 8192 --densities 0.1,0.9 2>&1 | grep -E "^\|")
fi
