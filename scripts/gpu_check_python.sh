#!/usr/bin/env bash
# The Python package on a GPU machine (called by scripts/gpu_check.sh): pip-installs flare from
# this tree (scikit-build-core builds libflare and the extension; no network, so the build
# requirements nanobind and scikit-build-core must already be installed) and runs the pytest
# suite, whose PyTorch CUDA tests then run: batch decode against torch SDPA in float64, a
# CUDA-graph capture of a decode step replayed across changing lengths, merge and append on
# the GPU.
# Usage: scripts/gpu_check_python.sh [log-dir]   (environment: PYTHON, FLARE_PYTEST_WORKERS;
#   extra args go to pytest)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
PY=${PYTHON:-python3}
LOG_DIR=${1:-$(mktemp -d)}
mkdir -p "$LOG_DIR"

"$PY" -c 'import torch; assert torch.cuda.is_available(), "torch sees no CUDA device"'

# A Python extension must use the process's shared libstdc++. A copy linked statically into it
# (a toolchain default, or -static-libstdc++ in LDFLAGS) has its locale tables interposed by the
# libstdc++.so that numpy and torch already loaded, and crashes formatting the first error
# message. Probe the compiler; drop the static flags or take another compiler if needed.
links_shared_libstdcxx() {
  local dir ok
  dir=$(mktemp -d)
  printf '#include <sstream>\nstd::string f(long x) { std::ostringstream s; s << x; return s.str(); }\n' \
    >"$dir/probe.cpp"
  # shellcheck disable=SC2086  # the flags are word lists
  "$1" -shared -fPIC ${CXXFLAGS:-} ${LDFLAGS:-} -o "$dir/probe.so" "$dir/probe.cpp" >/dev/null 2>&1 &&
    readelf -d "$dir/probe.so" | grep -q 'NEEDED.*libstdc++'
  ok=$?
  rm -rf "$dir"
  return $ok
}
CXX=${CXX:-$(command -v c++ || command -v g++)}
if ! links_shared_libstdcxx "$CXX"; then
  echo "gpu_check_python: $CXX links libstdc++ statically; looking for a shared link"
  for flags in LDFLAGS CXXFLAGS; do
    export "$flags=$(echo " ${!flags:-} " | sed 's/ -static-libstdc++ / /g; s/ -static-libgcc / /g')"
  done
  if ! links_shared_libstdcxx "$CXX"; then
    for candidate in /usr/bin/g++ /usr/bin/g++-14 /usr/bin/g++-13 /usr/bin/g++-12 /usr/bin/clang++; do
      if [ -x "$candidate" ] && links_shared_libstdcxx "$candidate"; then CXX=$candidate; break; fi
    done
  fi
  links_shared_libstdcxx "$CXX" || { echo "gpu_check_python: no compiler links libstdc++ shared" >&2; exit 1; }
fi
export CXX CUDAHOSTCXX=${CUDAHOSTCXX:-$CXX}
echo "gpu_check_python: C++ compiler $CXX $("$CXX" -dumpfullversion 2>/dev/null)"
echo "gpu_check_python: pip install (build log: $LOG_DIR/pip_install.log)"
if ! "$PY" -m pip install --no-build-isolation --no-deps --force-reinstall -v . \
    >"$LOG_DIR/pip_install.log" 2>&1; then
  tail -n 60 "$LOG_DIR/pip_install.log"
  exit 1
fi

installed=$(cd /tmp && "$PY" -c 'import flare, os; print(os.path.dirname(flare.__file__))')
for library in "$installed"/*.so; do
  echo "gpu_check_python: $library needs $(readelf -d "$library" | grep -o 'NEEDED.*' | tr '\n' ' ')"
done

# From /tmp so that `import flare` finds the installed package, not this tree. With
# pytest-xdist, FLARE_PYTEST_WORKERS processes (default 4) share the GPU: the suite took ~93 s
# on an H200 that way, over 200 s in one process (its JIT compiles and two torch.compile runs).
workers=()
if "$PY" -c 'import xdist' 2>/dev/null && [ "${FLARE_PYTEST_WORKERS:-4}" -gt 1 ]; then
  workers=(-n "${FLARE_PYTEST_WORKERS:-4}")
fi
status=0
(cd /tmp && "$PY" -m pytest "$OLDPWD/python/tests" -ra -p no:cacheprovider \
   --junitxml="$LOG_DIR/pytest.xml" "${workers[@]}" "${@:2}") || status=$?
if [ "$status" -eq 5 ]; then
  echo "gpu_check_python: pytest collected no tests from python/tests" >&2
  exit 1
fi
exit "$status"
