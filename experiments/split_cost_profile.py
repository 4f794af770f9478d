"""Issue 17 probe, after split_vs_queue_sweep.py: what a split costs on the GPU. For q1 / q16
paged prefill shapes, four plans (default = Algorithm 1 with fill splits, no split, and uniform
cuts at kv/2 and kv/4 via fixed_split_size, which balance without fill splits), each with its
plan size (work items, merge items, partial slots), run() time (eager, CUDA events around 50
runs, median of 5) and the GPU time of each kernel it launches (torch.profiler, 20 runs).
Separates the attention kernel's time from the merge's and prices an extra item.
GPU machine, flare installed: python3 experiments/split_cost_profile.py"""
import collections

import torch
from torch.profiler import ProfilerActivity, profile

import flare
from paged_batch import DIM, HK, HQ, PS, paged_indices
from eager_timing import time_runs

D = torch.device("cuda:0")
SHAPES = [(64, 1, 1024), (64, 1, 2048), (64, 1, 8192), (100, 1, 2048), (150, 1, 8192),
          (16, 16, 4096), (8, 1, 8192)]


def kernel_us(w, q, kv, out, runs=20):
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            w.run(q, kv, out=out)
        torch.cuda.synchronize()
    per = collections.defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            name = e.name.split("<")[0].split("(")[0][-28:]
            per[name] += e.device_time / runs
    return dict(per)


ws = torch.empty(256 << 20, dtype=torch.uint8, device=D)
print("| b x q x kv | plan | items x heads / merges / slots | run() us | kernels (us) |")
print("|---|---|---|---|---|")
for batch, q_len, kv_len in SHAPES:
    qo, indptr, indices, last = paged_indices(batch, q_len, kv_len)
    kv = torch.randn(indices.shape[0], 2, PS, HK, DIM, dtype=torch.float16, device=D)
    q = torch.randn(batch * q_len, HQ, DIM, dtype=torch.float16, device=D)
    w = flare.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
    modes = [("default", {}), ("no split", {"disable_split_kv": True}),
             ("cut kv/2", {"fixed_split_size": kv_len // 2}),
             ("cut kv/4", {"fixed_split_size": kv_len // 4})]
    if batch == 8:
        modes = modes[:2]
    for label, kwargs in modes:
        w.plan(qo, indptr, indices, last, HQ, HK, DIM, PS, causal=False,
               q_data_type=torch.float16, kv_data_type=torch.float16, **kwargs)
        out = torch.full((batch * q_len, HQ, DIM), float("nan"), dtype=torch.float16, device=D)
        w.run(q, kv, out=out)
        torch.cuda.synchronize()
        assert torch.isfinite(out).all()
        items, heads, merges, slots = w._gpu.planned[0].plan_counts
        t = min(time_runs(lambda: w.run(q, kv, out=out), 50) for _ in range(2))
        kernels = kernel_us(w, q, kv, out)
        ks = ", ".join(f"{k} {v:.1f}" for k, v in sorted(kernels.items(), key=lambda x: -x[1]))
        print(f"| {batch} x {q_len} x {kv_len} | {label} | {items} x {heads} / {merges} / {slots} "
              f"| {t:.1f} | {ks} |", flush=True)
