#!/usr/bin/env bash
# The thirty-eighth session's device calls (docs/perf.md "Thirty-eighth session").
#   graph: experiments/eager_gap_probe.py 1024 graph-gap (flare's use_cuda_graph wrapper eager and
#     in a graph of 3, PDL on / off, against the plain wrapper and cuDNN, three interleaved rounds;
#     CUPTI traces of the graphs).
# Usage (GPU machine, OUT set): bash experiments/session38_check.sh graph
set -uo pipefail
stage=${1:?graph|softcap|tests|variants|fa2softcap}
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH FLARE_LOG=quiet
mkdir -p "$OUT"
tree=$PWD
install_package() {
  python3 -c 'import flare' 2>/dev/null ||
    scripts/gpu_check_python.sh "$OUT/py" -q -k no_such_test >/dev/null 2>&1
}
if [ "$stage" = graph ]; then
  install_package
  cd /tmp
  timeout 200 python3 "$tree/experiments/eager_gap_probe.py" 1024 graph-gap 2>&1 |
    grep -vE "Warning|_warn_once|capture_end"
fi
#   softcap <main tree> <patched tree>: the fixed-offset softmax for bounded logits (soft-cap, bf16)
#     against main: C++ bench_prefill ragged / paged causal b16 with FLARE_BENCH_SOFT_CAP=30 (two
#     rounds), causal without the cap as the control (one round); then the patched tree's Hopper
#     and user-variant prefill tests under fa3.
# soft_cap_ab <main tree> <patched tree>: both built, then the rounds above (the caller's
# FLARE_BENCH_* settings, e.g. FLARE_BENCH_BACKEND, pass through).
soft_cap_ab() {
  local main=$1 patched=$2 t round cap
  for t in "$main" "$patched"; do
    bash experiments/build_ab.sh "$t" scripts/bench_prefill.cpp >/dev/null 2>&1 ||
      echo "build of $t failed"
  done
  for round in 1 2 3; do
    for t in "$main" "$patched"; do
      cap=30; [ "$round" = 3 ] && cap=
      echo "== round $round: $t ${cap:+soft-cap $cap}${cap:-(no cap)}"
      env FLARE_CACHE_DIR="$t/build-ab/jit-cache" ${cap:+FLARE_BENCH_SOFT_CAP=$cap} timeout 150 \
        "$t/build-ab/bench_prefill" 2>&1 | grep -vE "^case|^$|zipf lengths" | head -8
    done
  done
}
if [ "$stage" = softcap ]; then
  soft_cap_ab "${2:?the tree of main}" "${3:?the tree with the patch}"
  source experiments/family_tests.sh
  family_tests "$3" fa3 'PrefillHopper*:UserVariantPrefill*'
fi
#   tests: this tree's Hopper, user-variant and prefill GPU tests under fa3 (less the four that
#     pin 16-row tiles), the user-variant decode tests, then compute-sanitizer memcheck of
#     PrefillHopper.SoftCapFixedOffsetAtTheEndsOfItsRange.
#   (FLARE_TESTS_FILTER=<gtest filter> instead of that list.)
if [ "$stage" = tests ]; then
  source experiments/family_tests.sh
  family_tests "$tree" fa3 "${FLARE_TESTS_FILTER:-PrefillHopper*:UserVariantPrefill*:PrefillGpu*:UserVariantDecode*:-PrefillGpu.EveryQueryTile:UserVariantPrefill.LibraryPrefixLm*:UserVariantPrefill.LibraryDocumentMask*:UserVariantPrefill.AMaskThatIsNotAWindow*}"
  FLARE_CACHE_DIR="$tree/build-ab/jit-cache" timeout 200 compute-sanitizer --tool memcheck \
    --error-exitcode 99 "$tree/build-ab/flare_gpu_tests" \
    --gtest_filter='PrefillHopper.SoftCapFixedOffset*' >"$OUT/memcheck.log" 2>&1
  echo "memcheck exit $?; $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -n 1)"
fi
#   variants: the package installed, bench_variants.py (flare, FlashInfer fa3) causal / soft-cap /
#     user soft-cap at 8192 / 16384 (FlashInfer's soft-cap modules JIT-compile on first use).
if [ "$stage" = variants ]; then
  install_package
  python3 .anchors-fi/setup_fi.py /tmp/fi-site >/dev/null 2>&1
  cd /tmp
  PYTHONPATH=/tmp/fi-site:$tree/scripts timeout 450 python3 "$tree/scripts/bench_variants.py" \
    --libraries flare,flashinfer --lengths 8192,16384 --variants causal,soft_cap,user:soft_cap \
    --calls 10 2>&1 | grep -E "^\||rror"
fi
#   fa2softcap <main tree> <patched tree>: experiments/patches/fa2-fixed-offset.patch (the mma.sync
#     family with the fixed offset) against main under FLARE_BENCH_BACKEND=fa2, soft-cap 30, two
#     rounds (causal without the cap as the control), then the patched tree's FA2 prefill tests
#     with the new PrefillGpu.SoftCapFixedOffsetOnTheMmaSyncFamily. Trees: `git archive HEAD | tar
#     -x -C .scratch/<name>`, then `git apply` the patch in the patched one (from its root).
if [ "$stage" = fa2softcap ]; then
  FLARE_BENCH_BACKEND=fa2 soft_cap_ab "${2:?the tree of main}" "${3:?the tree with the patch}"
  source experiments/family_tests.sh
  family_tests "$3" fa2 'PrefillGpu.*:UserVariantPrefill.*'
fi
