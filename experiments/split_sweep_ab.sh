#!/usr/bin/env bash
# A/B of a planner change through the Python API (issue 17): installs flare from tree A and from
# tree B once each (into two directories), then runs experiments/split_vs_queue_sweep.py
# (default plan against disable_split_kv on q1 / q16 paged prefill) from A and from B in turn,
# `rounds` times, so that drifts of the machine fall on both alike (the GPU machine's host swung
# between two speeds for the same code). The script is this tree's for both; FLARE_AB_SCRIPT
# names another (e.g. experiments/plan_py_one.py for plan()'s host time).
# Usage (GPU machine): experiments/split_sweep_ab.sh <tree A> <tree B> [rounds [script args]]
#   e.g. git archive <branch> | tar -x -C .scratch/b, carried to the machine, then
#   experiments/split_sweep_ab.sh . .scratch/b 2
set -euo pipefail
ROUNDS=${3:-1}
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
    tree=$1
    [ "$side" = b ] && tree=$2
    echo "== round $round: $tree"
    PYTHONPATH="/tmp/flare_ab_$side" \
      python3 "$here/${FLARE_AB_SCRIPT:-experiments/split_vs_queue_sweep.py}" "${@:4}" 2>&1 |
      grep -v "^\[flare\]"
  done
done
