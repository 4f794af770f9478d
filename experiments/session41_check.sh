#!/usr/bin/env bash
# Forty-first session's device checks (GPU machine, OUT set):
#   hopper: the prefill / cascade / RoPE GPU tests through scripts/gpu_check.sh tests (auto,
#     then fa2 and fa3 alone, then the sanitizer set, synccheck included), then racecheck and
#     synccheck of the RoPE prefill tests under auto (ragged RoPE now on the Hopper family) and
#     fa3, then bench_prefill with RoPE under auto and fa2 (two rounds).
#   (further stages below, each with its own comment)
set -uo pipefail
stage=${1:?hopper|race|final|python|rope_apply}
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH FLARE_LOG=quiet
mkdir -p "$OUT"
if [ "$stage" = hopper ]; then
  FLARE_GPU_FILTER='*Prefill*:*Cascade*:*Rope*:*Rotary*:*Hopper*:*IndexSafety*' \
    OUT=$OUT/check bash scripts/gpu_check.sh tests 2>&1 | grep -vE "^\[  SKIPPED|^=========  +(Host|Saved)"
  build=$PWD/build-gpu
  export FLARE_CACHE_DIR=$build/jit-cache
  for backend in auto fa3; do
    for tool in racecheck synccheck; do
      FLARE_TEST_PREFILL_BACKEND=$backend compute-sanitizer --tool $tool --error-exitcode 99 \
        "$build/flare_gpu_tests" --gtest_filter='PrefillGpu.FusedRope*:UserVariantPrefill.Rotary*:PrefillHopper.CustomMaskAndVariantFlags' \
        >"$OUT/rope_${tool}_$backend.log" 2>&1
      echo "rope $tool $backend: exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/rope_${tool}_$backend.log" | tail -n 1) $(grep -E 'tests? ran' "$OUT/rope_${tool}_$backend.log" | tail -n 1)"
    done
  done
  g++ -O2 -std=c++20 -Iinclude -I. scripts/bench_prefill.cpp -L"$build" -lflare \
    -Wl,-rpath,"$build" -o "$build/bench_prefill" || exit 1
  for round in 1 2; do
    for backend in "" fa2; do
      echo "== round $round: rope, backend ${backend:-auto}"
      env ${backend:+FLARE_BENCH_BACKEND=$backend} FLARE_BENCH_ROPE=1 timeout 150 "$build/bench_prefill" 2>&1 |
        grep -vE "^case|^$|zipf lengths|append vs decode" | head -8
    done
  done
fi
#   race: racecheck of PrefillGpu.CustomMaskTreeAttention, four runs, kernels with line info
#     (the reports name lines), then the Python RoPE prefill next to FlashInfer (carry .anchors-fi).
if [ "$stage" = race ]; then
  build=$PWD/build-gpu
  gtest_source=
  [ ! -f /usr/lib/x86_64-linux-gnu/libgtest.a ] && [ -d /usr/src/googletest ] && gtest_source=/usr/src/googletest
  { cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      ${gtest_source:+-DFLARE_GTEST_SOURCE="$gtest_source"} &&
    cmake --build "$build" -j"$(nproc)" --target flare_gpu_tests; } >"$OUT/build.log" 2>&1 ||
    { tail -n 20 "$OUT/build.log"; exit 1; }
  for run in 1 2 3 4; do
    FLARE_JIT_LINEINFO=1 FLARE_CACHE_DIR=$build/jit-cache-lineinfo compute-sanitizer --tool racecheck \
      --racecheck-report all --print-limit 40 "$build/flare_gpu_tests" \
      --gtest_filter='PrefillGpu.CustomMaskTreeAttention' >"$OUT/race_$run.log" 2>&1
    echo "run $run: $(grep -E 'RACECHECK SUMMARY' "$OUT/race_$run.log")"
    grep -E "^=========  +(Error|Warning|Read|Write|at |in |by thread)" "$OUT/race_$run.log" |
      grep -vE "Host Frame" | head -n 24
  done
  python3 -c 'import flare' 2>/dev/null ||
    scripts/gpu_check_python.sh "$OUT/py" -q -k "rope and prefill" 2>&1 | tail -n 3
  python3 .anchors-fi/setup_fi.py /tmp/fi-site >/dev/null 2>&1
  tree=$PWD
  cd /tmp
  PYTHONPATH=/tmp/fi-site timeout 300 python3 "$tree/scripts/bench_variants.py" --variants causal,rope \
    --libraries flare,flashinfer --lengths 2048,8192,16384 --calls 10 2>&1 | grep -vE "Warning|warn" | tail -n 24
fi
#   final <old tree>: this tree's prefill / cascade GPU tests under auto and fa3, racecheck (three
#     runs) and synccheck of the Hopper sanitizer cases, then bench_prefill against <old tree>
#     (plain and RoPE, auto, one round each, interleaved).
if [ "$stage" = final ]; then
  old=${2:?the old tree}
  source experiments/family_tests.sh
  filter='PrefillGpu.*:UserVariantPrefill.*:*CascadeGpu*:PrefillHopper.*:IndexSafetyPrefillGpu.*'
  family_tests "$PWD" auto "$filter"
  family_tests "$PWD" fa3 "$filter:-PrefillGpu.EveryQueryTile:UserVariantPrefill.LibraryPrefixLm*:UserVariantPrefill.LibraryDocumentMask*:UserVariantPrefill.AMaskThatIsNotAWindow*"
  cases='PrefillGpu.CustomMaskTreeAttention:PrefillHopper.RaggedF16Gqa8OddLengths:PrefillHopper.FewCtasTakeManyItemsInTurn:CascadeGpuStructure.*:PrefillGpu.EmptyRequestsAndQueriesBeyondTheCache'
  export FLARE_CACHE_DIR=$PWD/build-ab/jit-cache
  for tool in racecheck racecheck racecheck synccheck memcheck; do
    compute-sanitizer --tool $tool --error-exitcode 99 build-ab/flare_gpu_tests \
      --gtest_filter="$cases" >"$OUT/san.log" 2>&1
    echo "$tool: exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san.log" | tail -n 1) $(grep -E 'tests? ran' "$OUT/san.log" | tail -n 1)"
    awk '/^\[ RUN/ { test = $0 } /^========= / && !/COMPUTE-SANITIZER|SUMMARY|Host Frame|Saved host/ && n < 12 {
           if (n++ == 0) print test; print }' "$OUT/san.log"
  done
  for t in "$old" "$PWD"; do
    bash experiments/build_ab.sh "$t" scripts/bench_prefill.cpp >/dev/null 2>&1 || echo "build of $t failed"
  done
  for rope in 0 1; do
    for t in "$old" "$PWD"; do
      echo "== rope $rope: $(basename "$t")"
      FLARE_CACHE_DIR="$t/build-ab/jit-cache" FLARE_BENCH_ROPE=$rope \
        timeout 150 "$t/build-ab/bench_prefill" 2>&1 | grep -vE "^case|^$|zipf lengths|append vs" | head -7
    done
  done
fi
#   python: the package's prefill / RoPE / cascade tests on the GPU, then bench_variants' causal
#     and RoPE rows next to FlashInfer (carry .anchors-fi).
if [ "$stage" = python ]; then
  scripts/gpu_check_python.sh "$OUT/py" -q -k "prefill or rope or cascade or variant" 2>&1 | tail -n 3
  python3 .anchors-fi/setup_fi.py /tmp/fi-site >/dev/null 2>&1
  tree=$PWD
  cd /tmp
  PYTHONPATH=/tmp/fi-site timeout 300 python3 "$tree/scripts/bench_variants.py" --variants causal,rope \
    --libraries flare,flashinfer --lengths 2048,8192,16384 --calls 10 2>&1 |
    grep -vE "Warning|warn|INFO" | tail -n 14
fi
#   rope_apply: apply_rope's GPU tests (C++ against the CPU reference, memcheck of the safety
#     cases), its Python tests on CUDA tensors, then scripts/bench_rope_apply.py next to
#     FlashInfer's functions (carry .anchors-fi).
if [ "$stage" = rope_apply ]; then
  source experiments/family_tests.sh
  family_tests "$PWD" auto '*Rope*'
  FLARE_CACHE_DIR=$PWD/build-ab/jit-cache compute-sanitizer --tool memcheck --error-exitcode 99 \
    build-ab/flare_gpu_tests --gtest_filter='RopeGpuSafety.*:RopeGpuCosSinCache.*' >"$OUT/memcheck.log" 2>&1
  echo "memcheck: exit $? $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -n 1)"
  scripts/gpu_check_python.sh "$OUT/py" -q -k "rope" 2>&1 | tail -n 3
  python3 .anchors-fi/setup_fi.py /tmp/fi-site >/dev/null 2>&1
  tree=$PWD
  cd /tmp
  PYTHONPATH=/tmp/fi-site timeout 300 python3 "$tree/scripts/bench_rope_apply.py" \
    --json "$OUT/rope_apply.json" 2>&1 | grep -vE "Warning|warn|INFO" | tail -n 24
fi
