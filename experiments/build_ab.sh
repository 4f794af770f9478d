#!/usr/bin/env bash
# The build step of the A/B scripts (prefill_ab.sh, plan_queue_ab.sh): libflare of a source tree
# into <tree>/build-ab (no tests), then each tool source (a path inside that tree) linked
# against it as <tree>/build-ab/<name without .cpp>.
# Usage (GPU machine): experiments/build_ab.sh <tree> <tool.cpp>...
set -euo pipefail
export PATH="/usr/local/cuda/bin:$PATH"
tree=$1
shift
cd "$tree"
cmake -S . -B build-ab -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLARE_BUILD_TESTS=OFF >/dev/null
cmake --build build-ab -j"$(nproc)" --target flare >/dev/null
for tool in "$@"; do
  g++ -O2 -std=c++20 -Iinclude -I. "$tool" -Lbuild-ab -lflare -Wl,-rpath,"$PWD/build-ab" \
    -o "build-ab/$(basename "$tool" .cpp)"
done
