#!/usr/bin/env bash
# Forty-sixth session's device checks (GPU machine, OUT set):
#   verify: the user / library variant GPU tests under auto (tests/gpu/library_variant_test.cpp,
#     split out last session and not GPU-run since), the Python variant / cascade tests, then
#     experiments/bench_t5_decode.py (T5 by buckets and by distance in decode, both loops).
#   capture: the destructors-during-a-capture fix (src/jit/cuda_memory.cpp): its GPU test on
#     this tree's library, then on the same library with RelaxedCaptureScope a no-op (built in
#     a worktree, loaded with LD_PRELOAD), where it should fail; the Python graph / capture tests; bench_t5_decode.
#   control: only that test, with and without the relaxed mode.
#   ab: this tree against itself with experiments/ab_base.patch reversed (untracked, carried;
#     the change under test, e.g. the distance bias's far entry once an item, or the row pairs'
#     shared loads): the distance-bias GPU tests under auto and fa2, memcheck of the prefill
#     one, then C++ bench_prefill of both libraries (the base loaded with LD_PRELOAD) in two
#     rounds, causal beside them; then bench_variants.py (flare: causal, distance bias).
#   decode: the CUDA-core decode loop on logits_affine_on's tiles (kernels/decode_cuda_core.cuh):
#     the user / library variant GPU tests under auto, bench_t5_decode.py, then
#     bench_variants.py (flare, eager) for causal and T5 by buckets and by distance.
#   t5: C++ bench_prefill, ragged causal b16 h16 D 128 at 1024 / 4096 / 16384, plain and with
#     T5's bias by buckets and by distance (FLARE_BENCH_VARIANT), then Nsight Compute of the
#     distance-bias launch and the causal one at 4096 (pipes, issue stalls, instruction mix, and
#     the SASS lines by stall samples).
set -uo pipefail
stage=${1:?verify|capture|control|t5|ab|decode}
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH FLARE_LOG=quiet
mkdir -p "$OUT"
if [ "$stage" = verify ]; then
  source experiments/family_tests.sh
  family_tests "$PWD" auto '*UserVariant*:*LibraryVariant*'
  rm -f "$OUT"/tests_auto_*.log
  scripts/gpu_check_python.sh "$OUT/py" -q -k "variant or relative or distance or cascade" 2>&1 |
    tail -n 3
  (tree=$PWD && cd /tmp && PYTHONPATH=$tree/scripts timeout 150 python3 \
    "$tree/experiments/bench_t5_decode.py" --calls 20 2>&1 | grep -E "^\||rror")
fi
if [ "$stage" = capture ] || [ "$stage" = control ]; then
  source experiments/family_tests.sh
  [ "$stage" = capture ] &&
    family_tests "$PWD" auto '*DestructorsDuring*:*BatchDecodeGraph*:BatchDecodeErrors*'
  [ "$stage" = control ] && family_tests "$PWD" auto '*DestructorsDuring*'
  rm -rf /tmp/start && mkdir -p /tmp/start &&
    tar --exclude='./build*' --exclude=./.git -cf - . | tar -xf - -C /tmp/start
  sed -i 's/if (d_ != nullptr \&\& d_->cuThreadExchangeStreamCaptureMode(&mode_) != kSuccess) d_ = nullptr;/d_ = nullptr;/' \
    /tmp/start/src/jit/driver_api.h
  grep -c "^    d_ = nullptr;" /tmp/start/src/jit/driver_api.h
  { cmake -S /tmp/start -B /tmp/start/build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DFLARE_BUILD_TESTS=OFF && cmake --build /tmp/start/build -j"$(nproc)" --target flare; } \
    >"$OUT/build_start.log" 2>&1 || tail -n 5 "$OUT/build_start.log"
  echo "-- the test without the relaxed mode (expected: FAILED)"
  LD_PRELOAD=/tmp/start/build/libflare.so FLARE_CACHE_DIR=$PWD/build-ab/jit-cache \
    build-ab/flare_gpu_tests --gtest_filter='*DestructorsDuring*' 2>&1 |
    grep -E "^\[  (PASSED|FAILED) |Failure|error|rror" | head -6
fi
if [ "$stage" = capture ]; then
  scripts/gpu_check_python.sh "$OUT/py" -q -k "capture or graph or collected" 2>&1 | tail -n 3
  (tree=$PWD && cd /tmp && PYTHONPATH=$tree/scripts timeout 150 python3 \
    "$tree/experiments/bench_t5_decode.py" --calls 20 2>&1 | grep -E "^\||rror")
fi
if [ "$stage" = t5 ]; then
  B=${BUILD:-build-ab}
  export FLARE_CACHE_DIR=$PWD/$B/jit-cache
  { cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLARE_BUILD_TESTS=OFF &&
    cmake --build "$B" -j"$(nproc)" --target flare &&
    g++ -O2 -std=c++20 -Iinclude -I. scripts/bench_prefill.cpp -L"$B" -lflare \
      -Wl,-rpath,"$PWD/$B" -o "$B/bench_prefill"; } >"$OUT/build_bench.log" 2>&1 ||
    { tail -n 20 "$OUT/build_bench.log"; exit 1; }
  for variant in none relative_position_bias distance_bias; do
    echo "-- $variant"
    if [ $variant = none ]; then
      FLARE_BENCH_ONLY="causal b16 seq" "$B/bench_prefill" | grep -E "causal b16 seq"
    else
      FLARE_BENCH_VARIANT=$variant FLARE_BENCH_ONLY="causal b16 seq" "$B/bench_prefill" |
        grep -E "causal b16 seq"
    fi
  done
  M=sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum
  for variant in none distance_bias; do
    env $([ $variant != none ] && echo FLARE_BENCH_VARIANT=$variant) \
      FLARE_BENCH_ONLY="causal b16 seq ${NCU_LEN:-4096}" timeout 200 ncu -k 'regex:prefill' \
      --launch-skip 3 --launch-count 1 --section SpeedOfLight --section WarpStateStats \
      --section SchedulerStats --section InstructionStats --section SourceCounters \
      --metrics $M -f -o "$OUT/ncu_$variant" "$B/bench_prefill" >"$OUT/ncu_$variant.log" 2>&1
    ncu -i "$OUT/ncu_$variant.ncu-rep" --page details >"$OUT/ncu_$variant.txt" 2>&1
    ncu -i "$OUT/ncu_$variant.ncu-rep" --page source --csv --print-source sass \
      >"$OUT/sass_$variant.csv" 2>&1
    echo "== ncu $variant"
    grep -E "Duration|Issue Slots Busy|Warp Cycles Per Issued|Executed Ipc A|smsp__inst_executed.sum|pipe_(fma|alu|lsu|xu|tensor)|issue_active|global_op_ld" \
      "$OUT/ncu_$variant.txt" | head -14
    python3 experiments/ncu_small_item_stalls.py "$OUT/sass_$variant.csv" 12
    gzip -f "$OUT/sass_$variant.csv"
    rm -f "$OUT/ncu_$variant.ncu-rep"
  done
fi
if [ "$stage" = ab ]; then
  source experiments/family_tests.sh
  family_tests "$PWD" auto '*UserVariant*'
  family_tests "$PWD" fa2 '*UserVariant*'
  export FLARE_CACHE_DIR=$PWD/build-ab/jit-cache
  compute-sanitizer --tool memcheck --error-exitcode 99 build-ab/flare_gpu_tests \
    --gtest_filter='UserVariantPrefill.LibraryDistanceBias*' >"$OUT/memcheck.log" 2>&1
  echo "memcheck: exit $? $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -n 1)"
  g++ -O2 -std=c++20 -Iinclude -I. scripts/bench_prefill.cpp -Lbuild-ab -lflare \
    -Wl,-rpath,"$PWD/build-ab" -o build-ab/bench_prefill || exit 1
  rm -rf /tmp/base && mkdir -p /tmp/base &&
    tar --exclude='./build*' --exclude=./.git -cf - . | tar -xf - -C /tmp/base
  (cd /tmp/base && patch -R -p1 <experiments/ab_base.patch >/dev/null) || echo "patch -R failed"
  { cmake -S /tmp/base -B /tmp/base/build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DFLARE_BUILD_TESTS=OFF && cmake --build /tmp/base/build -j"$(nproc)" --target flare; } \
    >"$OUT/build_base.log" 2>&1 || tail -n 5 "$OUT/build_base.log"
  for round in 1 2; do
    for lib in base new; do
      echo "-- round $round, $lib"
      pre=$([ $lib = base ] && echo /tmp/base/build/libflare.so)
      LD_PRELOAD=$pre FLARE_BENCH_VARIANT=distance_bias FLARE_BENCH_ONLY="causal b16 seq" \
        build-ab/bench_prefill | grep -E "causal b16 seq"
    done
    echo "-- round $round, causal"
    FLARE_BENCH_ONLY="causal b16 seq" build-ab/bench_prefill | grep -E "causal b16 seq"
  done
  scripts/gpu_check_python.sh "$OUT/py" -q -k "distance" 2>&1 | tail -n 1
  (tree=$PWD && cd /tmp && PYTHONPATH=$tree/scripts timeout 200 python3 \
    "$tree/scripts/bench_variants.py" --lengths 1024,2048,4096,8192,16384 --calls 10 \
    --libraries flare --variants causal,distance_bias \
    --json "$OUT/variants.json" 2>&1 | grep -vE "Warning|warn|INFO" | grep -E "time")
fi
if [ "$stage" = decode ]; then
  source experiments/family_tests.sh
  family_tests "$PWD" auto '*UserVariant*'
  scripts/gpu_check_python.sh "$OUT/py" -q -k "variant or relative or distance" 2>&1 | tail -n 1
  (tree=$PWD && cd /tmp && PYTHONPATH=$tree/scripts timeout 150 python3 \
    "$tree/experiments/bench_t5_decode.py" --calls 20 2>&1 | grep -E "^\||rror")
  (tree=$PWD && cd /tmp && PYTHONPATH=$tree/scripts timeout 200 python3 \
    "$tree/scripts/bench_variants.py" --lengths 2048,4096,8192,16384 --calls 10 \
    --libraries flare --variants causal,relative_bias,distance_bias \
    --json "$OUT/variants.json" 2>&1 | grep -vE "Warning|warn|INFO" | grep -E "time|^\| (causal|rel|dist)")
fi
