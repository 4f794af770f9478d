#!/usr/bin/env bash
# The thirty-seventh session's device calls (docs/perf.md "Thirty-seventh session").
#   probe: the package installed, experiments/eager_gap_probe.py at L1024 (eager per call and
#     batched, PDL on / off, the graph wrapper, CUPTI kernel traces), then bench_python.py
#     (decode and prefill; FlashInfer from the carried .anchors-fi; in the session's call with a
#     clock warm-up since dropped).
#   fi: bench_variants.py (flare, FlashInfer) soft-cap / window / causal at 8192 / 16384, then
#     bench_block_sparse.py (flare, FlashInfer) at 32768 and (flare) at 8192, densities 0.1 / 0.9.
#   (Its seed and fa2start stages ran in the thirty-eighth session and were removed with what they
#   measured: docs/perf.md "Thirty-eighth session" A and B.)
# Usage (GPU machine, OUT set; carry .anchors-fi): bash experiments/session37_check.sh probe
set -uo pipefail
stage=${1:?probe|fi}
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
