#!/usr/bin/env bash
# The thirty-seventh session's device calls (docs/perf.md "Thirty-seventh session").
#   probe: the package installed, experiments/eager_gap_probe.py at L1024 (eager per call and
#     batched, PDL on / off, the graph wrapper, CUPTI kernel traces), then bench_python.py
#     (decode and prefill; FlashInfer from the carried .anchors-fi; in the session's call with a
#     clock warm-up since dropped).
#   fi: bench_variants.py (flare, FlashInfer) soft-cap / window / causal at 8192 / 16384, then
#     bench_block_sparse.py (flare, FlashInfer) at 32768 and (flare) at 8192, densities 0.1 / 0.9.
#   seed: experiments/eager_gap_probe.py 1024 seed-ab, then bench-seed (docs/perf.md
#     "Thirty-seventh session" C: flare's eager time on tensors drawn before and after
#     torch.manual_seed; bench_python.py's decode and prefill rows either way).
#   fa2start <main tree> <patched tree>: experiments/patches/fa2-item-start.patch (the mma.sync
#     family's item start: the queue atomic's value stored after thread 0's copies, the next
#     record prefetched to L1) against main, two rounds: bench_cascade b16 / b64 at prefix 0
#     (16-row FA2 items, the empty-prefix case of issue 20) and 1024 (the Hopper family's: a
#     control), bench_small_q_prefill (q1 rows on FA2), bench_prefill causal b16 under fa2 (long
#     items: expect no change); then the patched tree's prefill GPU tests under fa2 (gpu_check.sh's
#     fa2 pass: PrefillGpu, UserVariantPrefill, CascadeGpu). Trees: `git archive HEAD | tar -x -C
#     .scratch/<name>`, then `patch -p1 <` in the patched one.
# Usage (GPU machine, OUT set; carry .anchors-fi): bash experiments/session37_check.sh probe
set -uo pipefail
stage=${1:?probe|fi|seed|fa2start}
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH FLARE_LOG=quiet
mkdir -p "$OUT"
tree=$PWD
if [ "$stage" = probe ]; then
  scripts/gpu_check_python.sh "$OUT/py" -q -k no_such_test >/dev/null 2>&1
  python3 .anchors-fi/setup_fi.py /tmp/fi-site >/dev/null 2>&1
  cd /tmp
  timeout 120 python3 "$tree/experiments/eager_gap_probe.py" 1024 2>&1 |
    grep -vE "Warning|capture_end|_warn_once"
  PYTHONPATH=/tmp/fi-site:$tree/scripts timeout 400 python3 "$tree/scripts/bench_python.py" \
    2>&1 | grep -v "Warning" | tail -45
fi
if [ "$stage" = fi ]; then
  scripts/gpu_check_python.sh "$OUT/py" -q -k no_such_test >/dev/null 2>&1
  python3 .anchors-fi/setup_fi.py /tmp/fi-site >/dev/null 2>&1
  cd /tmp
  PYTHONPATH=/tmp/fi-site:$tree/scripts timeout 200 python3 "$tree/scripts/bench_variants.py" \
    --libraries flare,flashinfer --lengths 8192,16384 --variants causal,soft_cap,window \
    --calls 10 2>&1 | grep -E "^\|"
  PYTHONPATH=/tmp/fi-site:$tree/scripts timeout 150 python3 "$tree/scripts/bench_block_sparse.py" \
    --libraries flare,flashinfer --lengths 32768 --densities 0.1,0.9 2>&1 | grep -E "^\||rror"
  PYTHONPATH=$tree/scripts timeout 60 python3 "$tree/scripts/bench_block_sparse.py" \
    --libraries flare --lengths 8192 --densities 0.1,0.5,0.9 --calls 10 2>&1 | grep -E "^\|"
fi
if [ "$stage" = seed ]; then
  python3 -c 'import flare' 2>/dev/null ||
    scripts/gpu_check_python.sh "$OUT/py" -q -k no_such_test >/dev/null 2>&1
  cd /tmp
  for mode in seed-ab bench-seed; do
    timeout 120 python3 "$tree/experiments/eager_gap_probe.py" 1024 $mode 2>&1 |
      grep -vE "Warning|_warn_once"
  done
fi
if [ "$stage" = fa2start ]; then
  main=${2:?the tree of main}
  patched=${3:?the tree with the patch}
  for t in "$main" "$patched"; do
    bash experiments/build_ab.sh "$t" scripts/bench_cascade.cpp scripts/bench_prefill.cpp \
      experiments/bench_small_q_prefill.cpp >/dev/null 2>&1 || echo "build of $t failed"
  done
  for round in 1 2; do
    for t in "$main" "$patched"; do
      echo "== round $round: $t"
      export FLARE_CACHE_DIR="$t/build-ab/jit-cache"
      timeout 60 "$t/build-ab/bench_cascade" 16,64 0,1024 2>&1 | grep -E "^\| [0-9]"
      timeout 60 "$t/build-ab/bench_small_q_prefill" | grep -E "^\| [0-9]"
      FLARE_BENCH_BACKEND=fa2 FLARE_BENCH_ONLY="causal b16" timeout 90 "$t/build-ab/bench_prefill" |
        grep -E "^causal"
    done
  done
  unset FLARE_CACHE_DIR
  source experiments/family_tests.sh
  family_tests "$patched" fa2 'PrefillGpu.*:UserVariantPrefill.*:*CascadeGpu*'
fi
