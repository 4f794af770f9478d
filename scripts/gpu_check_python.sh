#!/usr/bin/env bash
# The Python package on a GPU machine (called by scripts/gpu_check.sh): pip-installs flare from
# this tree (scikit-build-core builds libflare and the extension; no network, so the build
# requirements nanobind and scikit-build-core must already be installed) and runs the pytest
# suite, whose PyTorch CUDA tests then run: batch decode against torch SDPA in float64, a
# CUDA-graph capture of a decode step replayed across changing lengths, merge and append on
# the GPU.
# Usage: scripts/gpu_check_python.sh [log-dir]   (environment: PYTHON; extra args go to pytest)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
PY=${PYTHON:-python3}
LOG_DIR=${1:-$(mktemp -d)}
mkdir -p "$LOG_DIR"

"$PY" -c 'import torch; assert torch.cuda.is_available(), "torch sees no CUDA device"'
echo "gpu_check_python: pip install (build log: $LOG_DIR/pip_install.log)"
if ! "$PY" -m pip install --no-build-isolation --no-deps --force-reinstall -v . \
    >"$LOG_DIR/pip_install.log" 2>&1; then
  tail -n 60 "$LOG_DIR/pip_install.log"
  exit 1
fi

# From /tmp so that `import flare` finds the installed package, not this tree.
status=0
(cd /tmp && "$PY" -m pytest "$OLDPWD/python/tests" -ra -p no:cacheprovider \
   --junitxml="$LOG_DIR/pytest.xml" "${@:2}") || status=$?
if [ "$status" -eq 5 ]; then
  echo "gpu_check_python: pytest collected no tests from python/tests" >&2
  exit 1
fi
exit "$status"
