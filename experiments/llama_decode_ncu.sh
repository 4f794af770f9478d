#!/usr/bin/env bash
# ncu on one decode-megakernel step (issue 22): speed of light, memory workload, warp stalls and
# the scheduler, for the 1B shape (small enough for ncu's memory save/restore between passes).
# Usage: experiments/llama_decode_ncu.sh [model] [out-dir]   (run from the repository root,
# with flare installed: scripts/gpu_check_python.sh)
set -euo pipefail
MODEL=${1:-llama-3.2-1b}
OUT=${2:-/tmp}
cat >/tmp/llama_ncu_step.py <<PY
import torch
from flare.models import LlamaConfig, LlamaDecoder, random_llama_state_dict
c = LlamaConfig.preset("$MODEL")
dec = LlamaDecoder(c, random_llama_state_dict(c), num_pages=80)
for k, v in zip(dec.k_caches, dec.v_caches):
    k.normal_(); v.normal_()
indptr = torch.tensor([0, 80], dtype=torch.int32, device="cuda")
indices = torch.arange(80, dtype=torch.int32, device="cuda")
tok = torch.ones(1, dtype=torch.int32, device="cuda")
pos = torch.full((1,), 1024, dtype=torch.int32, device="cuda")
for _ in range(3):
    dec.step(tok, pos, indptr, indices)
torch.cuda.synchronize()
PY
cd /tmp
ncu -k flare_llama_decode --launch-skip 2 --launch-count 1 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
  --section SchedulerStats --section Occupancy \
  python3 /tmp/llama_ncu_step.py >"$OUT/ncu_llama.txt" 2>&1 || true
grep -E "Duration|DRAM Throughput|Memory Throughput|L2 Hit|Mem Busy|Max Bandwidth|Stall|Warp Cycles|Issued Warp|No Eligible|Active Warps|Eligible|dram__|L1/TEX Hit" "$OUT/ncu_llama.txt" | head -40
