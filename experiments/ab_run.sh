#!/usr/bin/env bash
# One-off A/B of the forty-ninth session's host-time changes (GPU machine, OUT set): bench_host
# rows of the changed wrappers with this tree, then with experiments/ab_before.patch reversed
# (made here, not committed: git diff <before> HEAD -- python/flare src python/src >
# experiments/ab_before.patch; the forty-ninth used 4d1322a).
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH FLARE_LOG=quiet
rows() {
  for case in "tensor cores" "Shared" "Variable" "MultiLevel"; do
    (tree=$PWD && cd /tmp && PYTHONPATH=$tree/scripts timeout 100 python3 \
      "$tree/scripts/bench_host.py" --only "$case" 2>&1 | grep -E "^\| [A-Z]" | cut -d'|' -f2-5)
  done
}
for round in 1; do
  scripts/gpu_check_python.sh "$OUT/py" -q -k no_test_has_this_name >/dev/null 2>&1
  echo "== after (round $round)"; rows
  patch -s -R -p1 <experiments/ab_before.patch
  scripts/gpu_check_python.sh "$OUT/py" -q -k no_test_has_this_name >/dev/null 2>&1
  echo "== before (round $round)"; rows
  patch -s -p1 <experiments/ab_before.patch
done
