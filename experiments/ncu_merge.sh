#!/usr/bin/env bash
# Nsight Compute of flare's merge kernels next to FlashInfer's on one shape (merge_state of two
# [seq, 32, 128] bf16 states, and merge_states of [seq, 2, 32, 128]; seq NCU_SEQ, default 4096):
# achieved occupancy, registers, DRAM throughput, bytes in flight (the forty-third session's
# question: 3.0 and 1.8 TB/s against FlashInfer's 3.9, docs/perf.md forty-third F). Carry
# .anchors-fi (and .anchors-fi-extra for FlashInfer's merge sources).
# Usage (GPU machine, OUT set): experiments/ncu_merge.sh
set -uo pipefail
export PATH=/usr/local/cuda/bin:$PATH FLARE_LOG=quiet
mkdir -p "$OUT"
python3 -c 'import flare' 2>/dev/null || scripts/gpu_check_python.sh "$OUT/py" -q -k no_such_test >/dev/null 2>&1
python3 .anchors-fi/setup_fi.py /tmp/fi-site >"$OUT/fi_setup.log" 2>&1
scripts/flashinfer_sources.sh install /tmp/fi-site >>"$OUT/fi_setup.log" 2>&1
cat >"$OUT/one.py" <<'PY'
import sys, torch
lib, op, seq = sys.argv[1], sys.argv[2], int(sys.argv[3])
if lib == "flare":
    import flare as m
else:
    import flashinfer as m
v = torch.randn(seq, 2, 32, 128, device="cuda").to(torch.bfloat16)
s = torch.randn(seq, 2, 32, device="cuda") * 4
a, b, sa, sb = v[:, 0].contiguous(), v[:, 1].contiguous(), s[:, 0].contiguous(), s[:, 1].contiguous()
for _ in range(4):
    out = m.merge_state(a, sa, b, sb) if op == "pair" else m.merge_states(v, s)
torch.cuda.synchronize()
PY
M=dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,dram__bytes_write.sum,sm__warps_active.avg.pct_of_peak_sustained_active,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,smsp__inst_executed.sum
for op in pair states; do
  for lib in flare flashinfer; do
    # The last of the four calls (the first compile and warm up); merge kernels only.
    (cd /tmp && PYTHONPATH=/tmp/fi-site timeout 200 ncu -k 'regex:(?i)merge' --launch-skip 3 \
      --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats \
      --section WarpStateStats --section MemoryWorkloadAnalysis --metrics "$M" \
      python3 "$OUT/one.py" $lib $op "${NCU_SEQ:-4096}") >"$OUT/ncu_${op}_$lib.txt" 2>&1
    echo "--- $op $lib (exit $?)"
    grep -E "  [a-zA-Z_]*(merge|Merge)|Duration|Registers Per|Block Size|Grid Size|Achieved Occupancy|Theoretical Occupancy|Memory Throughput|DRAM Throughput|dram__|warps_active|Warp Cycles Per Issued|Stall|Waves Per SM" \
      "$OUT/ncu_${op}_$lib.txt" | head -30
  done
done
