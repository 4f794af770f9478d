#!/usr/bin/env bash
# Nsight Compute of flare's Hopper prefill next to FlashInfer's fa3 backend on one shape
# (causal, 16 x NCU_LEN tokens (default 4096), 16 heads, D 128, bf16; ragged K/V, or with
# NCU_KV=paged a cache of 16-token pages in shuffled order; NCU_SOFT_CAP=30 for soft-capped
# logits): the two kernels' limiters side by side (tensor-pipe use, issue stalls, instruction
# mix, shared-memory wavefronts; NCU_SECTION_LIBS="" skips them). Carry .anchors-fi.
# Usage (GPU machine, OUT set): experiments/ncu_hopper_vs_fa3.sh
set -uo pipefail
export PATH=/usr/local/cuda/bin:$PATH FLARE_LOG=quiet FLARE_CACHE_DIR=$PWD/build-gpu/jit-cache
mkdir -p "$OUT"
python3 -c 'import flare' 2>/dev/null || scripts/gpu_check_python.sh $OUT/py -q -k no_such_test >/dev/null 2>&1
python3 .anchors-fi/setup_fi.py /tmp/fi-site >$OUT/fi_setup.log 2>&1
cat >$OUT/one.py <<'PY'
import sys, torch
lib = sys.argv[1]
if lib == "flare":
    import flare as fi
else:
    import flashinfer as fi
b, n, h, d = 16, int(sys.argv[2]), 16, 128
paged = sys.argv[3] == "paged"
cap = {"logits_soft_cap": float(sys.argv[4])} if float(sys.argv[4]) > 0 else {}
q = torch.randn(b * n, h, d, device="cuda", dtype=torch.bfloat16)
indptr = torch.arange(0, b + 1, dtype=torch.int32) * n
ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
if paged:  # page 16, pages in a shuffled order (bench_prefill's paged case)
    page = 16
    pages = b * n // page
    cache = torch.randn(pages, 2, page, h, d, device="cuda", dtype=torch.bfloat16)
    indices = torch.randperm(pages, dtype=torch.int32)
    kv_indptr = torch.arange(0, b + 1, dtype=torch.int32) * (n // page)
    last = torch.full((b,), page, dtype=torch.int32)
    w = fi.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend="fa3")
    w.plan(indptr, kv_indptr, indices.cuda(), last, h, h, d, page, causal=True,
           q_data_type=torch.bfloat16, **cap)
    args = (q, cache)
else:
    k, v = torch.randn_like(q), torch.randn_like(q)
    w = fi.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend="fa3")
    w.plan(indptr, indptr, h, h, d, causal=True, q_data_type=torch.bfloat16, **cap)
    args = (q, k, v)
for _ in range(4):
    o = w.run(*args)
torch.cuda.synchronize()
PY
M=sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,sm__cycles_elapsed.avg
for lib in ${NCU_SECTION_LIBS-flare flashinfer}; do
  PYTHONPATH=/tmp/fi-site timeout 200 ncu -k 'regex:(?i)prefill' --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
    --section LaunchStats --section InstructionStats --metrics $M python3 $OUT/one.py $lib ${NCU_LEN:-4096} ${NCU_KV:-ragged} ${NCU_SOFT_CAP:-0} >$OUT/ncu_$lib.txt 2>&1
  echo "--- $lib (exit $?)"
  grep -E "  [a-zA-Z_]*(Prefill|prefill)|Duration|Registers Per|Threads  |Achieved Occupancy|Compute \(SM\) Throughput|Issue Slots Busy|Executed Ipc Active|No Eligible|Warp Cycles Per Issued|Executed Instructions  |Dynamic Shared|gmma|pipe_|wavefronts|inst_executed|cycles_elapsed|Stall" $OUT/ncu_$lib.txt | head -40
done
# NCU_OPCODES=1: each kernel's executed instructions per SASS opcode (where the counts differ).
if [ "${NCU_OPCODES:-0}" = 1 ]; then
  for lib in ${NCU_LIBS:-flare flashinfer}; do
    PYTHONPATH=/tmp/fi-site timeout 200 ncu -k 'regex:(?i)prefill' --launch-skip 2 --launch-count 1 \
      --metrics sass__inst_executed_per_opcode --print-metric-instances details \
      python3 $OUT/one.py $lib ${NCU_LEN:-4096} ${NCU_KV:-ragged} ${NCU_SOFT_CAP:-0} >$OUT/opcodes_$lib.txt 2>&1
    echo "--- $lib opcodes (exit $?)"
    grep -A3 "sass__inst_executed_per_opcode" $OUT/opcodes_$lib.txt | head -8
  done
fi
# NCU_SASS=1: flare's per-SASS-instruction stall samples as well (where its warps wait).
if [ "${NCU_SASS:-0}" = 1 ]; then
  PYTHONPATH=/tmp/fi-site timeout 200 ncu -k 'regex:(?i)prefill' --launch-skip 2 --launch-count 1 \
    --section SourceCounters --section WarpStateStats --import-source no -f -o $OUT/flare \
    python3 $OUT/one.py flare ${NCU_LEN:-4096} ${NCU_KV:-ragged} ${NCU_SOFT_CAP:-0} >$OUT/ncu_sass.log 2>&1
  ncu -i $OUT/flare.ncu-rep --page source --csv --print-source sass >$OUT/flare_sass.csv 2>&1
  ncu -i $OUT/flare.ncu-rep --page details >$OUT/flare_source_details.txt 2>&1
  echo "sass page: $(wc -l <$OUT/flare_sass.csv) lines"; rm -f $OUT/flare.ncu-rep
fi
