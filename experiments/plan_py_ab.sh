#!/usr/bin/env bash
# A/B of plan()'s host time through Python where the GPU machine's host is noisy (the same
# unchanged plan() measured 17-29 us across back-to-back installs): installs flare from tree A
# and from tree B into two directories, then times plan() (experiments/plan_py_one.py: NVFP4 and
# 16-bit paged b64 q1 kv2048, median of 300 calls) from each in turn, `rounds` times, so that
# drifts of the host fall on both alike.
# Usage (GPU machine): experiments/plan_py_ab.sh <tree A> <tree B> [rounds]
set -euo pipefail
ROUNDS=${3:-8}
here=$(cd "$(dirname "$0")/.." && pwd)
logs=$(mktemp -d)
for side in a b; do
  tree=$1
  [ "$side" = b ] && tree=$2
  # No test selected: gpu_check_python.sh exits 1 after a good install; the log says which.
  (cd "$tree" && bash scripts/gpu_check_python.sh "$logs" -q -k no_such_test >/dev/null 2>&1) || true
  grep -q "Successfully installed" "$logs/pip_install.log" || { tail -n 40 "$logs/pip_install.log"; exit 1; }
  installed=$(cd /tmp && python3 -c 'import flare, os; print(os.path.dirname(flare.__file__))')
  rm -rf "/tmp/flare_ab_$side" && mkdir -p "/tmp/flare_ab_$side"
  cp -r "$installed" "/tmp/flare_ab_$side/flare"
done
for round in $(seq "$ROUNDS"); do
  for side in a b; do
    (cd /tmp && PYTHONPATH="/tmp/flare_ab_$side:$here/experiments" \
      python3 "$here/experiments/plan_py_one.py" "$side" 2>&1 | grep -v "^\[flare\]")
  done
done
