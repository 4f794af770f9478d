#!/usr/bin/env bash
# The Python half of `make test`: builds flare._flare in the CMake build tree and runs the
# pytest suite (python/tests) against it. Installs what is missing first: Python headers and
# pip (Debian packages) and, from PyPI, nanobind, numpy and pytest into <build>/pydeps-* (pip
# --target: no root, no virtualenv, no change to the system's packages).
# Usage: bash python/run_tests.sh [build-dir]   (environment: PYTHON, JOBS)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=$(realpath -m "${1:-build}")
PY=$(command -v "${PYTHON:-python3}")
JOBS=${JOBS:-$(nproc)}
# One folder per interpreter: compiled packages (numpy) only load into the Python they were
# built for.
DEPS="$BUILD/pydeps-$("$PY" -c 'import sys; print(sys.implementation.cache_tag)')"
export PYTHONPATH="$DEPS${PYTHONPATH:+:$PYTHONPATH}"

apt_install() {
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}
if ! "$PY" -m pip --version >/dev/null 2>&1; then apt_install python3-pip; fi
if [ ! -f "$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h" ]; then
  apt_install python3-dev
fi
if ! "$PY" -c 'import nanobind, numpy, pytest' >/dev/null 2>&1; then
  echo "python/run_tests.sh: installing nanobind, numpy, pytest into $DEPS"
  "$PY" -m pip install --quiet --disable-pip-version-check --upgrade --target "$DEPS" \
    "nanobind>=2.0" "numpy>=1.22" "pytest>=7"
fi

cmake -S . -B "$BUILD" -G Ninja -DFLARE_BUILD_PYTHON=ON -DPython_EXECUTABLE="$PY" >/dev/null
cmake --build "$BUILD" -j "$JOBS" --target _flare

# -ra lists every skipped test with its reason (no PyTorch, no GPU) in the summary.
status=0
PYTHONPATH="$BUILD/python:$PYTHONPATH" "$PY" -m pytest python/tests -ra -p no:cacheprovider \
  "${@:2}" || status=$?
if [ "$status" -eq 5 ]; then
  # The numpy tests always run, so collecting nothing means the suite itself is broken.
  echo "python/run_tests.sh: pytest collected no tests from python/tests" >&2
  exit 1
fi
exit "$status"
