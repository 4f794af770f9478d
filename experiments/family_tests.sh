# Sourced by the session check scripts (GPU machine, OUT set): family_tests <tree> <backend>
# <gtest filter> builds the tree's GPU tests in its A/B build directory (<tree>/build-ab) and
# runs the filter's tests in 8 shards with FLARE_TEST_PREFILL_BACKEND=<backend>, then prints the
# number passed and the failed tests' names. fi_site prints FlashInfer's site (for PYTHONPATH)
# where .anchors-fi was carried (../shared/bench/flashinfer), nothing otherwise.
# GoogleTest's sources where the machine has no built library (as scripts/gpu_check.sh does).
family_tests_gtest=
[ -d /usr/src/googletest ] && [ ! -f /usr/lib/x86_64-linux-gnu/libgtest.a ] &&
  family_tests_gtest=/usr/src/googletest
family_tests() {
  local tree=$1 backend=$2 filter=$3 i
  { cmake -S "$tree" -B "$tree/build-ab" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DFLARE_BUILD_TESTS=ON ${family_tests_gtest:+-DFLARE_GTEST_SOURCE=$family_tests_gtest} &&
    cmake --build "$tree/build-ab" -j"$(nproc)" --target flare_gpu_tests; } \
    >"$OUT/build_tests.log" 2>&1 || { tail -n 20 "$OUT/build_tests.log"; return 1; }
  for i in 0 1 2 3 4 5 6 7; do
    FLARE_CACHE_DIR="$tree/build-ab/jit-cache" FLARE_TEST_PREFILL_BACKEND=$backend \
      GTEST_TOTAL_SHARDS=8 GTEST_SHARD_INDEX=$i timeout 150 "$tree/build-ab/flare_gpu_tests" \
      --gtest_filter="$filter" >"$OUT/tests_${backend}_$i.log" 2>&1 &
  done
  wait
  echo "$backend: $(cat "$OUT"/tests_"$backend"_*.log | grep -hE '^\[  PASSED  \]' |
    awk '{n += $4} END {print n + 0}') passed; failed:"
  cat "$OUT"/tests_"$backend"_*.log | grep -E "^\[  FAILED  \]" | sort -u | head
}

fi_site() {  # FlashInfer's site where .anchors-fi was carried (../shared/bench/flashinfer)
  [ -d .anchors-fi ] && python3 .anchors-fi/setup_fi.py /tmp/fi-site >"$OUT/fi_setup.log" 2>&1 &&
    echo /tmp/fi-site
}
