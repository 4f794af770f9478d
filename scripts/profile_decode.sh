#!/usr/bin/env bash
# Nsight Compute counters of one flare decode launch next to one SDPA cuDNN launch on the same
# shape (contiguous KV), at the clocks the benchmark runs at (--clock-control none): DRAM bytes
# read against the KV bytes, DRAM throughput against its peak, issue activity, duration. One
# device call after scripts/gpu_check.sh (reuses $BUILD, default build-gpu).
# Usage: scripts/profile_decode.sh [flare bench cases, comma list; default b64_kv8192]
#   Reports go to $OUT (default ./gpu_check_out).
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
OUT=${OUT:-$PWD/gpu_check_out}
BUILD=${BUILD:-build-gpu}
CASES=${1:-b64_kv8192}
mkdir -p "$OUT"
export FLARE_CACHE_DIR="$PWD/$BUILD/jit-cache" FLARE_LOG=quiet
METRICS=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct,sm__throughput.avg.pct_of_peak_sustained_elapsed,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__registers_per_thread,dram__cycles_elapsed.avg.per_second,gpc__cycles_elapsed.avg.per_second,lts__t_sectors_srcunit_tex_op_read.sum,smsp__inst_executed.sum

for case in ${CASES//,/ }; do
  echo "== ncu: flare_decode, $case ($(date +%T))"
  FLARE_DECODE_BENCH="$OUT/profile_bench.jsonl" FLARE_DECODE_BENCH_CASES="$case" \
    ncu --clock-control none -k regex:flare_decode --launch-skip 10 --launch-count 1 \
    --metrics "$METRICS" "$BUILD/flare_gpu_tests" --gtest_filter='DecodeBenchmark.*' \
    >"$OUT/ncu_decode_$case.txt" 2>&1
  echo "ncu exit $?"
  grep -E "^\s+(gpu__|dram__|lts__|sm__|smsp__|launch__|gpc__)" "$OUT/ncu_decode_$case.txt"
done

cat >"$OUT/cudnn_one.py" <<'PY'
import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
q = torch.randn(64, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
sets = [(torch.randn(64, 8, 8192, 128, device="cuda", dtype=torch.bfloat16),
         torch.randn(64, 8, 8192, 128, device="cuda", dtype=torch.bfloat16)) for _ in range(2)]
with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
    for i in range(6):
        F.scaled_dot_product_attention(q, *sets[i % 2], enable_gqa=True)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    F.scaled_dot_product_attention(q, *sets[0], enable_gqa=True)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
PY
echo "== ncu: SDPA cuDNN, b64 kv8192 ($(date +%T))"
ncu --clock-control none --profile-from-start off --metrics "$METRICS" python3 "$OUT/cudnn_one.py" \
  >"$OUT/ncu_decode_cudnn.txt" 2>&1
echo "ncu exit $?"
grep -E "^\s+[a-zA-Z_0-9]+.*\(|^\s+(gpu__|dram__|lts__|sm__|smsp__|launch__|gpc__)" "$OUT/ncu_decode_cudnn.txt" | head -40
