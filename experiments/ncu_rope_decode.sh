#!/usr/bin/env bash
# Nsight Compute of flare's tensor-core decode with and without fused RoPE on the shapes where
# issue 18's 5% is missed (b1 kv32768, b16 kv4096; GQA 32 / 8, D 128, bf16, page 16, pages in
# allocation order, bench_rope_decode.py's inputs): duration, grid, occupancy, DRAM throughput,
# instructions, warp stalls, and the decode kernel's and merge kernel's shares. The question
# (forty-fourth session): what costs RoPE 5-7% at short runs and 1-2% at long ones.
# Usage (GPU machine, OUT set): experiments/ncu_rope_decode.sh
set -uo pipefail
export PATH=/usr/local/cuda/bin:$PATH FLARE_LOG=quiet
mkdir -p "$OUT"
python3 -c 'import flare' 2>/dev/null || scripts/gpu_check_python.sh "$OUT/py" -q -k no_such_test >/dev/null 2>&1
cat >"$OUT/one.py" <<'PY'
import sys, torch
sys.path.insert(0, sys.argv[4])
import flare
from bench_python import DTYPE, HEAD_DIM, KV_HEADS, PAGE, Q_HEADS, decode_inputs, decode_wrapper
batch, kv_len, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
cache, indptr, indices, last, q = decode_inputs(batch, kv_len)
workspace = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
wrapper = decode_wrapper(flare, workspace, False, batch, indices.numel(), True)
wrapper.plan(indptr, indices, last, Q_HEADS, KV_HEADS, HEAD_DIM, PAGE, q_data_type=DTYPE,
             kv_data_type=DTYPE, pos_encoding_mode=mode)
for _ in range(4):
    out = wrapper.run(q, cache)
torch.cuda.synchronize()
PY
M=dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,sm__cycles_active.avg,gpc__cycles_elapsed.max
for shape in "1 32768" "16 4096"; do
  for mode in NONE ROPE_LLAMA; do
    set -- $shape
    f="$OUT/ncu_b$1_kv$2_$mode.txt"
    (cd /tmp && timeout 200 ncu -k "regex:(?i)(decode|merge)" --launch-skip 2 --launch-count 2 --section SpeedOfLight \
      --section Occupancy --section LaunchStats --section WarpStateStats --metrics "$M" \
      python3 "$OUT/one.py" "$1" "$2" "$mode" "$OLDPWD/scripts") >"$f" 2>&1
    echo "--- b$1 kv$2 $mode (exit $?)"
    grep -E "^  [a-zA-Z_]+.*\(|Duration|Registers Per|Block Size|Grid Size|Achieved Occupancy|DRAM Throughput|inst_executed|cycles_active|Warp Cycles Per Issued|Dynamic Shared" "$f" | head -48
  done
done
