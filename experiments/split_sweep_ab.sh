#!/usr/bin/env bash
# A/B of a planner change through the Python API (issue 17): installs flare from tree A and runs
# experiments/split_vs_queue_sweep.py (default plan against disable_split_kv on q1 / q16 paged
# prefill), then the same from tree B, `rounds` times. The sweep script is this tree's for both.
# FLARE_AB_SCRIPT names another script of this tree to run instead (e.g.
# experiments/plan_py_split.py for plan()'s host time).
# Usage (GPU machine): experiments/split_sweep_ab.sh <tree A> <tree B> [rounds [script args]]
#   e.g. git archive <branch> | tar -x -C .scratch/b, carried to the machine, then
#   experiments/split_sweep_ab.sh . .scratch/b 2
set -euo pipefail
ROUNDS=${3:-1}
here=$(cd "$(dirname "$0")/.." && pwd)
logs=$(mktemp -d)
for round in $(seq "$ROUNDS"); do
  for tree in "$1" "$2"; do
    echo "== round $round: $tree"
    # No test selected: gpu_check_python.sh exits 1 after a good install; the log says which.
    (cd "$tree" && bash scripts/gpu_check_python.sh "$logs" -q -k no_such_test >/dev/null 2>&1) || true
    if ! grep -q "Successfully installed" "$logs/pip_install.log"; then
      tail -n 40 "$logs/pip_install.log"
      exit 1
    fi
    python3 "$here/${FLARE_AB_SCRIPT:-experiments/split_vs_queue_sweep.py}" "${@:4}" 2>&1 |
      grep -v "^\[flare\]"
  done
done
