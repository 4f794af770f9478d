"""Issue 17 probe: does Algorithm 1's fill split pay on the GPU where the one-queue order alone
ends a few percent past the mean? GPU time of run() on the default plan against the plan
disable_split_kv gives (no cuts, no fill splits, no merge), paged 16-bit prefill, 32 / 8 heads,
D 128, page 16, shuffled pages, two alternating rounds (eager, CUDA events around 50 runs,
median of 5). GPU machine, flare installed: python3 experiments/split_vs_queue_sweep.py"""
import statistics

import torch

import flare
from paged_batch import DIM, HK, HQ, PS, paged_indices

D = torch.device("cuda:0")
SHAPES = [(b, 1, kv) for b in (40, 64, 100, 150, 200, 300) for kv in (1024, 2048, 8192)]
SHAPES += [(16, 16, 4096), (8, 16, 4096), (24, 16, 4096), (32, 8, 2048)]


def gpu_us(w, q, kv, out):
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(50):
            w.run(q, kv, out=out)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / 50)
    return statistics.median(times)


ws = torch.empty(256 << 20, dtype=torch.uint8, device=D)
print("| batch | q | kv | default us | no split us | no split / default |")
print("|---|---|---|---|---|---|")
for batch, q_len, kv_len in SHAPES:
    qo, indptr, indices, last = paged_indices(batch, q_len, kv_len)
    kv = torch.randn(indices.shape[0], 2, PS, HK, DIM, dtype=torch.float16, device=D)
    q = torch.randn(batch * q_len, HQ, DIM, dtype=torch.float16, device=D)
    w = flare.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
    figures = {False: [], True: []}
    for disable in (False, True, False, True):
        w.plan(qo, indptr, indices, last, HQ, HK, DIM, PS, causal=False,
               q_data_type=torch.float16, kv_data_type=torch.float16, disable_split_kv=disable)
        out = torch.full((batch * q_len, HQ, DIM), float("nan"), dtype=torch.float16, device=D)
        w.run(q, kv, out=out)
        torch.cuda.synchronize()
        figures[disable].append(gpu_us(w, q, kv, out))
        assert torch.isfinite(out).all()
    a, b = min(figures[False]), min(figures[True])
    print(f"| {batch} | {q_len} | {kv_len} | {a:.1f} | {b:.1f} | {b / a:.3f} |")
