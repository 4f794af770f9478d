#!/usr/bin/env bash
# Issue 18 variant library, one device call: build, the user-variant GPU tests (document mask,
# T5 bias, RowContext's lengths) and prefill tests, the Python variant and FlashInfer-module
# tests, and the variant benchmark rows (causal, T5 bias, document mask, prefix-LM).
# Usage (GPU machine, OUT set): experiments/gpu_variant_library_check.sh
set -uo pipefail
export PATH=/usr/local/cuda/bin:$PATH FLARE_LOG=quiet FLARE_CACHE_DIR=$PWD/build-gpu/jit-cache
echo "== build $(date +%T)"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLARE_GTEST_SOURCE=/usr/src/googletest >$OUT/cmake.log 2>&1 &&
  cmake --build build-gpu -j16 --target flare_gpu_tests >$OUT/build.log 2>&1 || { tail -40 $OUT/build.log; exit 1; }
echo "== gpu tests $(date +%T)"
build-gpu/flare_gpu_tests --gtest_filter="${FILTER:-UserVariant*:PrefillGpu.*}" >$OUT/gpu_tests.log 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|Which is|max_abs" $OUT/gpu_tests.log | head -30
echo "== python $(date +%T)"
scripts/gpu_check_python.sh $OUT/python -q -k "variant or flashinfer_jit" 2>&1 | tail -25
python3 .anchors-fi/setup_fi.py /tmp/fi-site >$OUT/fi_setup.log 2>&1
echo "== bench variants $(date +%T)"
(cd /tmp && PYTHONPATH=/tmp/fi-site timeout 250 python3 $OLDPWD/scripts/bench_variants.py \
   --variants causal,relative_bias,document,prefix_lm --lengths 2048,8192 \
   --json $OUT/variants.json 2>&1 | grep -v Warning | tail -16)
echo "== done $(date +%T)"
