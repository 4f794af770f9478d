#!/usr/bin/env bash
# Nsight Compute profile of one flare prefill launch next to one SDPA flash (FA2) launch on the
# same shape, so the two kernels' limiters (tensor-pipe use, issue stalls, shared-memory
# conflicts, L2 hit rate, instruction mix) can be compared line by line. One device call.
# Usage: scripts/profile_prefill.sh [case substring, default "seq 4096"]
#   FLARE_PROFILE_SKIP_FLASH=1 profiles flare only. Reports go to $OUT (default ./gpu_check_out).
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
OUT=${OUT:-$PWD/gpu_check_out}
BUILD=${BUILD:-build-gpu}
CASE=${1:-seq 4096}
mkdir -p "$OUT"
export FLARE_CACHE_DIR="$PWD/$BUILD/jit-cache"
GTEST=/usr/src/googletest
[ -d "$GTEST" ] && GTEST_ARG=-DFLARE_GTEST_SOURCE=$GTEST || GTEST_ARG=

echo "== build ($(date +%T))"
if ! { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release $GTEST_ARG &&
       cmake --build "$BUILD" -j"$(nproc)" --target flare &&
       g++ -O2 -std=c++20 -Iinclude -I. scripts/bench_prefill.cpp -L"$BUILD" -lflare \
         -Wl,-rpath,"$PWD/$BUILD" -o "$BUILD/bench_prefill"; } >"$OUT/profile_build.log" 2>&1; then
  tail -n 40 "$OUT/profile_build.log"
  exit 1
fi

SECTIONS=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
          --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section SchedulerStats
          --section InstructionStats --section Occupancy --section LaunchStats
          --section SourceCounters
          --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__inst_executed.sum,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,smsp__inst_executed_op_ldsm.sum,sm__cycles_elapsed.avg)

echo "== flare timing, case '$CASE' ($(date +%T))"
FLARE_BENCH_ONLY="$CASE" "$BUILD/bench_prefill"

echo "== ncu: flare_prefill ($(date +%T); report $OUT/ncu_flare.txt)"
FLARE_BENCH_ONLY="$CASE" ncu -k regex:flare_prefill --launch-skip 2 --launch-count 1 \
  "${SECTIONS[@]}" --import-source no -f -o "$OUT/flare" "$BUILD/bench_prefill" >"$OUT/ncu_flare.log" 2>&1
echo "ncu exit $?"
ncu -i "$OUT/flare.ncu-rep" >"$OUT/ncu_flare.txt" 2>&1
# Per-SASS-instruction counters (stall samples by reason, executed instructions): where the
# kernel waits, line by line.
ncu -i "$OUT/flare.ncu-rep" --page source --csv --print-source sass >"$OUT/ncu_flare_sass.csv" 2>&1
echo "sass page: $(wc -l <"$OUT/ncu_flare_sass.csv") lines"
rm -f "$OUT/flare.ncu-rep"

if [ "${FLARE_PROFILE_SKIP_FLASH:-0}" != 1 ]; then
  SEQ=$(echo "$CASE" | grep -oE '[0-9]+' | tail -n 1)
  cat >"$OUT/flash_one.py" <<EOF
import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
q = torch.randn(16, 16, ${SEQ:-4096}, 128, device="cuda", dtype=torch.bfloat16)
k, v = torch.randn_like(q), torch.randn_like(q)
with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
    for _ in range(4):
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
torch.cuda.synchronize()
EOF
  echo "== ncu: SDPA flash, seq ${SEQ:-4096} ($(date +%T); report $OUT/ncu_flash.txt)"
  ncu -k regex:flash_fwd --launch-skip 2 --launch-count 1 "${SECTIONS[@]}" --import-source no \
    python3 "$OUT/flash_one.py" >"$OUT/ncu_flash.txt" 2>&1
  echo "ncu exit $?"
fi

# The headline rows of both reports side by side.
for f in "$OUT"/ncu_flare.txt "$OUT"/ncu_flash.txt; do
  [ -f "$f" ] || continue
  echo "--- $(basename "$f")"
  grep -E "Duration|Registers Per|Achieved Occupancy|Compute \(SM\) Throughput|Memory Throughput|L1/TEX Hit|L2 Hit|DRAM Throughput|Issue Slots Busy|Executed Ipc Active|No Eligible|Warp Cycles Per Issued|Executed Instructions  |Dynamic Shared|Block Limit|hmma|pipe_|bank_conflicts|wavefronts|inst_executed|ldsm|cycles_elapsed" "$f" | head -n 60
done
