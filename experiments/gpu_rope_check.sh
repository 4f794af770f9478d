#!/usr/bin/env bash
# Issue 18 fused RoPE, one device call: build, the RoPE GPU tests (FILTER overrides), memcheck and
# racecheck on RoPE cases, the Python RoPE tests, and the decode / prefill RoPE benchmarks.
# Usage (GPU machine, OUT set): experiments/gpu_rope_check.sh
set -uo pipefail
export PATH=/usr/local/cuda/bin:$PATH FLARE_LOG=quiet FLARE_CACHE_DIR=$PWD/build-gpu/jit-cache
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLARE_GTEST_SOURCE=/usr/src/googletest >$OUT/cmake.log 2>&1 &&
  cmake --build build-gpu -j16 --target flare_gpu_tests >$OUT/build.log 2>&1 || { tail -40 $OUT/build.log; exit 1; }
echo "== gpu tests $(date +%T)"
build-gpu/flare_gpu_tests --gtest_filter="${FILTER:-*rope*:*Rope*:*Rotary*}" >$OUT/gpu_tests.log 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|Which is|max_abs" $OUT/gpu_tests.log | head -40
echo "== sanitizer $(date +%T)"
compute-sanitizer --tool memcheck build-gpu/flare_gpu_tests --gtest_filter='Cases/BatchDecodeVsReference.rope_llama:Cases/BatchDecodeVsReference.mma_rope_llama:UserVariantPrefill.Rotary*' >$OUT/memcheck.log 2>&1; tail -2 $OUT/memcheck.log
compute-sanitizer --tool racecheck build-gpu/flare_gpu_tests --gtest_filter='Cases/BatchDecodeVsReference.rope_llama:Cases/BatchDecodeVsReference.mma_rope_llama:UserVariantPrefill.Rotary*' >$OUT/racecheck.log 2>&1; tail -2 $OUT/racecheck.log
echo "== python $(date +%T)"
scripts/gpu_check_python.sh $OUT/python -q -k "rope or not_implemented" 2>&1 | tail -8
python3 .anchors-fi/setup_fi.py /tmp/fi-site >$OUT/fi_setup.log 2>&1
echo "== bench decode rope $(date +%T)"
(cd /tmp && PYTHONPATH=/tmp/fi-site python3 $OLDPWD/scripts/bench_rope_decode.py --json $OUT/rope_decode.json 2>&1 | grep -v Warning | tail -14)
echo "== bench prefill rope $(date +%T)"
(cd /tmp && PYTHONPATH=/tmp/fi-site python3 $OLDPWD/scripts/bench_variants.py --variants causal,rope --lengths 2048,8192 --json $OUT/rope_prefill.json 2>&1 | grep -v Warning | tail -10)
echo "== done $(date +%T)"
