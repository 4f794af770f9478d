"""Issue 17 probe: does Algorithm 1's fill split pay on the GPU where the one-queue order alone
ends a few percent past the mean? GPU time of run() on the default plan against the plan
disable_split_kv gives (no cuts, no fill splits, no merge), paged 16-bit prefill, 32 / 8 heads,
D 128, page 16, shuffled pages, two alternating rounds (eager, CUDA events around 50 runs,
median of 5). `nvfp4` as an argument: NVFP4 K/V (uint8 codes, e4m3 block scales) on the q1
shapes of batch 64 and 150 and the q16 ones; `q16`: the q16 / q8 shapes alone.
FLARE_SWEEP_PDL=0 / 1: run()'s enable_pdl (unset: the wrapper's default, on).
GPU machine, flare installed:
python3 experiments/split_vs_queue_sweep.py [nvfp4] [q16]"""
import os
import statistics
import sys

import torch

import flare
from paged_batch import DIM, HK, HQ, PS, paged_indices

D = torch.device("cuda:0")
SHAPES = [(b, 1, kv) for b in (40, 64, 100, 150, 200, 300) for kv in (1024, 2048, 8192)]
SHAPES += [(b, 16, kv) for b in (8, 16, 24, 32, 48) for kv in (2048, 4096, 8192)]
SHAPES += [(32, 8, 2048), (64, 8, 2048)]
NVFP4 = "nvfp4" in sys.argv[1:]
PDL = {"0": False, "1": True}.get(os.environ.get("FLARE_SWEEP_PDL", ""))
if NVFP4:
    SHAPES = [s for s in SHAPES if s[0] in (64, 150) or s[1] > 1]
if "q16" in sys.argv[1:]:
    SHAPES = [s for s in SHAPES if s[1] > 1]


def gpu_us(run):
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(50):
            run()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / 50)
    return statistics.median(times)


ws = torch.empty(256 << 20, dtype=torch.uint8, device=D)
print("| batch | q | kv | default us | no split us | no split / default |")
print("|---|---|---|---|---|---|")
for batch, q_len, kv_len in SHAPES:
    qo, indptr, indices, last = paged_indices(batch, q_len, kv_len)
    if NVFP4:
        kv = torch.randint(0, 256, (indices.shape[0], 2, PS, HK, DIM // 2), dtype=torch.uint8,
                           device=D)
        sf = torch.randint(0x30, 0x40, (indices.shape[0], 2, PS, HK, DIM // 16),
                           dtype=torch.uint8, device=D)
    else:
        kv = torch.randn(indices.shape[0], 2, PS, HK, DIM, dtype=torch.float16, device=D)
    q = torch.randn(batch * q_len, HQ, DIM, dtype=torch.float16, device=D)
    w = flare.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
    figures = {False: [], True: []}
    for disable in (False, True, False, True):
        w.plan(qo, indptr, indices, last, HQ, HK, DIM, PS, causal=False,
               q_data_type=torch.float16, kv_data_type=kv.dtype, disable_split_kv=disable)
        out = torch.full((batch * q_len, HQ, DIM), float("nan"), dtype=torch.float16, device=D)
        if NVFP4:
            run = lambda: w.run(q, kv, kv_cache_sf=sf, k_scale=0.5, v_scale=2.0, out=out,
                                 enable_pdl=PDL)
        else:
            run = lambda: w.run(q, kv, out=out, enable_pdl=PDL)
        run()
        torch.cuda.synchronize()
        figures[disable].append(gpu_us(run))
        assert torch.isfinite(out).all()
    a, b = min(figures[False]), min(figures[True])
    print(f"| {batch} | {q_len} | {kv_len} | {a:.1f} | {b:.1f} | {b / a:.3f} |")
