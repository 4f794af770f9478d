#!/usr/bin/env bash
# One device call for branch bsr-tensor-cores (issue 23): the tensor-core BSR SpMM's GPU tests
# (and the hyb / CSR ones, whose remainder launch it shares), compute-sanitizer memcheck on the
# corrupted block columns, the Python `bsr` / `hyb` tests, then scripts/bench_bsr.cpp next to
# cuSPARSE's BSR and CSR SpMM. Logs in $OUT.  Usage: bash experiments/bsr_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH
B=build-gpu
OUT=${OUT:-$PWD/bsr_check_out}
mkdir -p "$OUT"
export FLARE_CACHE_DIR=$PWD/$B/jit-cache FLARE_LOG=quiet
t0=$(date +%s)
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release > "$OUT/cfg.log" 2>&1 || { tail -20 "$OUT/cfg.log"; exit 1; }
cmake --build $B -j16 --target flare flare_gpu_tests > "$OUT/build.log" 2>&1 ||
  { grep -E "error" -A3 "$OUT/build.log" | head -40; exit 1; }
g++ -O2 -std=c++20 -Iinclude -I. -I/usr/local/cuda/include scripts/bench_bsr.cpp -L$B -lflare \
  -L/usr/local/cuda/lib64 -lcusparse -lcudart -Wl,-rpath,$PWD/$B -o $B/bench_bsr || exit 1
timeout 200 $B/flare_gpu_tests --gtest_filter='BsrGpu*:HybGpu*:SpmmGpu*' > "$OUT/t.log" 2>&1
echo "gpu tests rc $?"; grep -E "PASSED|FAILED|Failure|Expected|row " "$OUT/t.log" | head -20
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 99 $B/flare_gpu_tests \
  --gtest_filter='BsrGpu.*:HybGpu.Corrupted*' > "$OUT/memcheck.log" 2>&1
echo "memcheck rc $?"; grep -E "ERROR SUMMARY" "$OUT/memcheck.log" | head -2
timeout 200 bash scripts/gpu_check_python.sh "$OUT/py" -q -k "bsr or hyb" 2>&1 | tail -3
timeout 240 $B/bench_bsr > "$OUT/bench_bsr.log" 2>&1; echo "bench rc $?"
grep -E "^\|" "$OUT/bench_bsr.log"
echo "total $(( $(date +%s) - t0 )) s"
