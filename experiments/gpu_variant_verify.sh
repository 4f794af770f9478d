#!/usr/bin/env bash
# Device calls for the user-variant work. `tests`: builds this tree's GPU tests (and, in the
# background, an older tree for the A/B), runs every GPU test against the reference and
# compute-sanitizer memcheck on user-variant cases. `ab <tree>`: decode_ab.sh plus the prefill
# benchmark of both trees, interleaved.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH FLARE_LOG=quiet
OUT=${OUT:-/tmp/out}
gt=-DFLARE_GTEST_SOURCE=/usr/src/googletest
build_tree() {  # src dir, build dir
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release $gt >/dev/null &&
    cmake --build "$2" -j"${3:-16}" --target flare_gpu_tests flare &&
    g++ -O2 -std=c++20 -I"$1/include" -I"$1" "$1/scripts/bench_prefill.cpp" -L"$2" -lflare \
      -Wl,-rpath,"$PWD/$2" -o "$2/bench_prefill"
}
case $1 in
tests)
  other=$2
  (setsid nohup nice -n 10 bash -c "$(declare -f build_tree); gt=$gt; build_tree $other build-gpu-$(basename "$other") 6" \
    >/tmp/ab_prebuild.log 2>&1 &)
  build_tree . build-gpu >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  FLARE_CACHE_DIR=$PWD/build-gpu/jit-cache build-gpu/flare_gpu_tests --gtest_filter='-DecodeBenchmark.*' \
    >"$OUT/gpu_tests.log" 2>&1
  echo "gpu tests: exit $?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]" "$OUT/gpu_tests.log" | tail -20
  FLARE_CACHE_DIR=$PWD/build-gpu/jit-cache compute-sanitizer --tool memcheck --error-exitcode 99 \
    build-gpu/flare_gpu_tests --gtest_filter='UserVariantPrefill.Alibi*:UserVariantDecode.Wrong*' \
    >"$OUT/memcheck.log" 2>&1
  echo "memcheck: exit $? $(grep 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1)"
  ;;
ab)
  other=$2; ob=build-gpu-$(basename "$other")
  while pgrep -f "build-gpu-$(basename "$other")" >/dev/null; do sleep 2; done
  tail -2 /tmp/ab_prebuild.log
  OUT=/tmp/ab scripts/decode_ab.sh "$other" b1_kv32768,b16_kv4096,b64_kv8192,b64_kv8192_e4m3 2
  for round in 1 2; do
    for b in "$ob" build-gpu; do
      echo "-- prefill round $round $b"
      FLARE_CACHE_DIR=$PWD/$b/jit-cache FLARE_BENCH_ONLY="causal b16 seq" "$b/bench_prefill" | tail -3
    done
  done
  ;;
esac
