#!/usr/bin/env bash
# GPU verification of flare on a CUDA machine, in one or two device calls: builds everything,
# runs every GPU test against the CPU float64 reference (decode, prefill, merge, append, the
# CLI's cuda round trips, the JIT's device test; the prefill tests once more on each kernel
# family, between which the default backend chooses on sm_90), compute-sanitizer memcheck,
# racecheck and synccheck on small cases of each kernel family, the Python package's pytest
# suite with PyTorch CUDA tensors, the decode and prefill benchmarks next to PyTorch SDPA
# (cuDNN, flash) on the same shapes in the same run, and SpMM / SDDMM next to cuSPARSE from C++
# (scripts/bench_sparse.cpp) and next to torch.sparse through Python. Short tables print last;
# full logs go to $OUT.
# Usage: scripts/gpu_check.sh [all|tests|bench|decode|python]   (default all; `tests` then
#   `bench` splits the work across two calls of a 10-minute limit: the build is reused; `decode`
#   builds the GPU tests only and runs the decode tests, their sanitizer case and the decode
#   benchmark; `python` installs the package, runs its suite, scripts/bench_python.py (which
#   imports FlashInfer from .anchors-fi when it was carried: ../shared/bench/flashinfer/README.md)
#   and scripts/bench_host.py (every wrapper's run() / plan() host time)
#   FLARE_GTEST_SOURCE=<googletest tree> when GoogleTest is not installed (default: the
#   machine's /usr/src/googletest, or .deps/googletest); FLARE_GPU_FILTER=<gtest filter>
#   restricts the GPU tests.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
STAGE=${1:-all}
OUT=${OUT:-$PWD/gpu_check_out}
BUILD=${BUILD:-build-gpu}
mkdir -p "$OUT"
export FLARE_CACHE_DIR="$PWD/$BUILD/jit-cache"
export FLARE_LOG=quiet
status=0
step() { echo "== $* ($(date +%T))"; }
run_logged() {  # name, command...: runs, keeps the log, prints the gtest summary lines
  local name=$1; shift
  "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|tests? ran" "$OUT/$name.log" | tail -n 25
  echo "$name: exit $rc"
  [ "$rc" -eq 0 ] || status=1
}

step "device"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,utilization.gpu \
  --format=csv | tee "$OUT/device.txt"

step "build (log: $OUT/build.log)"
gtest_source=${FLARE_GTEST_SOURCE:-}
[ -z "$gtest_source" ] && [ -d .deps/googletest ] && gtest_source="$PWD/.deps/googletest"
[ -z "$gtest_source" ] && [ ! -f /usr/lib/x86_64-linux-gnu/libgtest.a ] && [ -d /usr/src/googletest ] &&
  gtest_source=/usr/src/googletest
if [ "$STAGE" = decode ] || [ "$STAGE" = python ]; then
  build_extra() { :; }
  targets=(flare_gpu_tests)
else
  build_extra() {
    g++ -O2 -std=c++20 -Iinclude -I. scripts/bench_prefill.cpp -L"$BUILD" -lflare \
      -Wl,-rpath,"$PWD/$BUILD" -o "$BUILD/bench_prefill" &&
      g++ -O2 -std=c++20 -Iinclude -I. -I/usr/local/cuda/include scripts/bench_sparse.cpp \
        -L"$BUILD" -lflare -L/usr/local/cuda/lib64 -lcusparse -lcudart \
        -Wl,-rpath,"$PWD/$BUILD" -o "$BUILD/bench_sparse"
  }
  targets=(flare_gpu_tests flare_cli flare_tools_tests flare_jit_tests)
fi
if ! { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
         ${gtest_source:+-DFLARE_GTEST_SOURCE="$gtest_source"} &&
       cmake --build "$BUILD" -j"$(nproc)" --target "${targets[@]}" && build_extra; } \
    >"$OUT/build.log" 2>&1; then
  tail -n 40 "$OUT/build.log"
  exit 1
fi

run_sharded() {  # name, gtest filter: the GPU test binary in parallel shards (the JIT compiles
  # of a cold cache dominate a serial run: ~9 minutes for half the suite), one log per shard
  local name=$1 filter=$2 shards=${FLARE_GPU_SHARDS:-8} i rc=0
  for ((i = 0; i < shards; i++)); do
    GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i "$BUILD/flare_gpu_tests" \
      --gtest_filter="$filter" --gtest_output="json:$OUT/${name}_$i.json" >"$OUT/${name}_$i.log" 2>&1 &
  done
  for ((i = 0; i < shards; i++)); do wait -n || rc=1; done
  cat "$OUT/${name}"_*.log >"$OUT/$name.log"
  grep -E "^\[  FAILED  \]" "$OUT/$name.log" | sort -u | tail -n 25
  echo "$name: $(grep -hE '^\[  PASSED  \]' "$OUT/${name}"_*.log | awk '{n += $4} END {print n + 0}') passed" \
    "in $shards shards; exit $rc"
  [ "$rc" -eq 0 ] || status=1
}

sanitize() {  # filter [racecheck exclusions]: compute-sanitizer memcheck, racecheck and synccheck
  for tool in memcheck racecheck synccheck; do
    local filter=$1
    [ "$tool" = racecheck ] && [ -n "${2:-}" ] && filter="$1:-$2"
    compute-sanitizer --tool "$tool" --error-exitcode 99 "$BUILD/flare_gpu_tests" \
      --gtest_filter="$filter" >"$OUT/$tool.log" 2>&1
    local rc=$?
    echo "$tool: exit $rc; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$tool.log" | tail -n 1);" \
      "$(grep -E 'tests? ran' "$OUT/$tool.log" | tail -n 1)"
    if [ "$rc" -ne 0 ]; then  # the first report and the test it came from, for the caller's log
      status=1
      awk '/^\[ RUN/ { test = $0 } /^========= / && !/COMPUTE-SANITIZER|SUMMARY/ && n < 24 {
             if (n++ == 0) print test; print }' "$OUT/$tool.log"
    fi
  done
}

decode_bench() {  # the decode benchmark next to the SDPA anchors and the KV-placement streams
  FLARE_DECODE_BENCH="$OUT/flare_bench.jsonl" "$BUILD/flare_gpu_tests" \
    --gtest_filter='DecodeBenchmark.*' >"$OUT/decode_bench.log" 2>&1 ||
    { status=1; tail -n 20 "$OUT/decode_bench.log"; }
  local stream=() cap
  cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d .)
  if [ "${cap:-0}" -lt 90 ]; then
    echo "kv_placement_probe: needs sm_90 (TMA bulk copies); skipped on compute capability $cap"
  elif nvcc -std=c++20 -O3 -arch=sm_90a -o "$BUILD/kv_placement_probe" \
       scripts/kv_placement_probe.cu >"$OUT/kv_probe.log" 2>&1 &&
       "$BUILD/kv_placement_probe" --flare-only --rounds 2 --json "$OUT/streams.jsonl" \
       >>"$OUT/kv_probe.log" 2>&1; then
    stream=(--stream "$OUT/streams.jsonl")
  else
    status=1; tail -n 20 "$OUT/kv_probe.log"
  fi
  PYTHONUNBUFFERED=1 python3 scripts/anchor_decode.py --flare "$OUT/flare_bench.jsonl" \
    "${stream[@]}" --out "$OUT/anchors.json" >"$OUT/decode_table.txt" 2>&1 || status=1
}

if [ "$STAGE" = decode ]; then
  step "decode GPU tests vs the float64 reference"
  run_logged gpu_tests "$BUILD/flare_gpu_tests" \
    --gtest_filter="${FLARE_GPU_FILTER:-*Decode*}:-DecodeBenchmark.*" \
    --gtest_output="json:$OUT/gpu_tests.json"
  step "compute-sanitizer memcheck, racecheck and synccheck, small decode case"
  sanitize 'BatchDecodeErrors.SanitizerSmallCase'
  step "decode benchmark vs PyTorch SDPA (logs: $OUT/decode_bench.log, $OUT/anchors.json)"
  decode_bench
  cat "$OUT/decode_table.txt"
fi

if [ "$STAGE" = all ] || [ "$STAGE" = tests ]; then
  step "GPU tests vs the float64 reference"
  run_sharded gpu_tests "${FLARE_GPU_FILTER:-*}:-DecodeBenchmark.*"
  # On sm_90 the suite above runs the Hopper prefill family where auto picks it (ragged K/V
  # without RoPE) and FA2 elsewhere: the prefill tests run again on each family alone (under fa3
  # less the four that pin the FA2 family's 16-row query tiles, which kFA3 refuses).
  for family in fa2 fa3; do
    step "prefill GPU tests again on one family (backend $family)"
    only_fa2=""
    [ "$family" = fa3 ] && only_fa2="-PrefillGpu.EveryQueryTile:UserVariantPrefill.LibraryPrefixLm*"\
":UserVariantPrefill.AMaskThatIsNotAWindow*"
    FLARE_TEST_PREFILL_BACKEND=$family run_sharded "gpu_tests_$family" \
      "PrefillGpu.*:UserVariantPrefill.*:*CascadeGpu*${only_fa2:+:$only_fa2}"
  done
  step "CLI cuda round trips and JIT device test"
  run_logged tools_tests "$BUILD/flare_tools_tests" --gtest_filter='*Cuda*:*Gpu*:*GPU*:*Device*'
  run_logged jit_device_tests "$BUILD/flare_jit_tests" --gtest_filter='*Driver*:*Device*:*Gpu*'

  step "compute-sanitizer (memcheck, racecheck, synccheck): each kernel family, bad indices"
  # Racecheck skips the megakernel tests whose CTAs reuse pipeline stages (the 4-bit model, and
  # the multi-step kernel whose stream wraps across steps): it reports every reuse as a WAR
  # hazard between the consumers' reads and the producer's next bulk copy, which the stage's
  # `empty` mbarrier orders (docs/megakernel_design.md, "Verification"): racecheck credits an
  # mbarrier arrival only with the arriving thread's own accesses, not with those its warp's
  # __syncwarp or a bar.sync ordered before it (experiments/racecheck_mbarrier_probe.cu).
  sanitize 'BatchDecodeErrors.SanitizerSmallCase:PrefillGpu.EmptyRequestsAndQueriesBeyondTheCache:PrefillGpu.CustomMaskTreeAttention:PrefillHopper.RaggedF16Gqa8OddLengths:MergeGpu.PairOddShapes:MergeStatesRaggedGpuIndptr.*:CascadeGpuStructure.*:AppendPagedKVGpu.*:*IndexSafety*:LlamaDecoderGpu.*:SpmmGpu.ColumnsOutside*:SddmmGpu.ColumnsOutside*:HybGpu.Corrupted*:BsrGpu.BlockColumnsOutside*:RopeGpuSafety.*:RopeGpuCosSinCache.*' \
    'LlamaDecoderGpu.FourBit*:LlamaDecoderGpu.Generate*'
fi

python_bench() {  # the user's path: flare, FlashInfer and SDPA through Python in one process
  local fi_path=""
  if [ -d .anchors-fi ]; then  # ../shared/bench/flashinfer, carried (its README)
    python3 .anchors-fi/setup_fi.py /tmp/fi-site >"$OUT/flashinfer_setup.log" 2>&1 &&
      fi_path=/tmp/fi-site
    # FlashInfer's cascade sources, where carried (scripts/flashinfer_sources.sh).
    if [ -n "$fi_path" ] && [ -d .anchors-fi-extra ]; then
      scripts/flashinfer_sources.sh install "$fi_path" >>"$OUT/flashinfer_setup.log" 2>&1
    fi
  fi
  (cd /tmp && PYTHONPATH="$fi_path${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1      python3 "$OLDPWD/scripts/bench_python.py" --json "$OUT/bench_python.json" "$@")     >"$OUT/bench_python.log" 2>&1 || { status=1; tail -n 20 "$OUT/bench_python.log"; }
  sed -n '/^device:/,$p' "$OUT/bench_python.log"
  # Every wrapper's run() / plan() host time (issue 17: run() <= 10 us), FlashInfer beside it.
  (cd /tmp && PYTHONPATH="$OLDPWD/scripts${fi_path:+:$fi_path}" PYTHONUNBUFFERED=1 \
     python3 "$OLDPWD/scripts/bench_host.py" --json "$OUT/bench_host.json") \
    >"$OUT/bench_host.log" 2>&1 || { status=1; tail -n 20 "$OUT/bench_host.log"; }
  grep "^|" "$OUT/bench_host.log"
}

if [ "$STAGE" = python ]; then
  step "python package (logs: $OUT/python)"
  scripts/gpu_check_python.sh "$OUT/python" -q 2>&1 | tail -n 25 || status=1
  step "through Python next to FlashInfer and SDPA (log: $OUT/bench_python.log)"
  python_bench
fi

if [ "$STAGE" = all ] || [ "$STAGE" = bench ]; then
  step "python package (logs: $OUT/python)"
  scripts/gpu_check_python.sh "$OUT/python" -q 2>&1 | tail -n 15 || status=1

  step "decode benchmark vs PyTorch SDPA (logs: $OUT/decode_bench.log, $OUT/anchors.json)"
  decode_bench

  step "through Python next to FlashInfer and SDPA (log: $OUT/bench_python.log)"
  python_bench

  step "prefill benchmark vs PyTorch SDPA (log: $OUT/prefill_bench.log)"
  { "$BUILD/bench_prefill" && PYTHONUNBUFFERED=1 python3 scripts/bench_prefill_torch.py &&
    for variant in relative_position_bias distance_bias; do  # T5 from C++ (issue 18: vs causal)
      echo "-- FLARE_BENCH_VARIANT=$variant"
      FLARE_BENCH_VARIANT=$variant FLARE_BENCH_ONLY="causal b16 seq" "$BUILD/bench_prefill"
    done; } >"$OUT/prefill_bench.log" 2>&1 || status=1
  echo "-- decode (TB/s of KV read; ratios against SDPA in this run)"
  cat "$OUT/decode_table.txt"
  step "SpMM / SDDMM from C++ next to cuSPARSE, then through Python next to torch.sparse (log: $OUT/sparse_bench.log)"
  { "$BUILD/bench_sparse" && (cd /tmp && PYTHONUNBUFFERED=1 python3 "$OLDPWD/scripts/bench_spmm.py" &&
      PYTHONUNBUFFERED=1 python3 "$OLDPWD/scripts/bench_sddmm.py"); } >"$OUT/sparse_bench.log" 2>&1 ||
    status=1
  echo "-- prefill (TFLOP/s)"
  cat "$OUT/prefill_bench.log"
  echo "-- SpMM / SDDMM (us; ratios against the anchor in this run)"
  grep -E "^\||^max|^device" "$OUT/sparse_bench.log"
fi
step "done: status $status"
exit "$status"
