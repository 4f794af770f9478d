"""Issue 17 probes through Python (GPU machine, flare installed): (1) cProfile of the paged
prefill wrapper's plan() on the Algorithm-1 shapes, top functions by own time, to find the
wrapper's share beyond the extension's BatchPrefill.plan; (2) the GPU time of run() at b64 q1
kv2048 on Algorithm 1's plan (fill splits, partial states, the merge) against the queue plan
that disable_split_kv gives (one entry per tile and KV head, no merge). 16-bit K/V, 32 / 8
heads, D 128, page 16, shuffled pages. Usage: python3 experiments/plan_py_profile.py"""
import cProfile
import pstats
import statistics

import torch

import flare

D = torch.device("cuda:0")
HQ, HK, DIM, PS = 32, 8, 128, 16


def wrapper_and_args(batch, q_len, kv_len):
    pages_per = (kv_len + PS - 1) // PS
    indptr = torch.arange(batch + 1, dtype=torch.int32) * pages_per
    indices = torch.randperm(batch * pages_per).to(torch.int32).to(D)
    last = torch.full((batch,), (kv_len - 1) % PS + 1, dtype=torch.int32)
    qo = torch.arange(batch + 1, dtype=torch.int32) * q_len
    ws = torch.empty(256 << 20, dtype=torch.uint8, device=D)
    return flare.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD"), (qo, indptr, indices, last)


for batch, q_len, kv_len, causal in ((1, 4096, 4096, True), (64, 1, 2048, False)):
    w, (qo, indptr, indices, last) = wrapper_and_args(batch, q_len, kv_len)
    plan = lambda: w.plan(qo, indptr, indices, last, HQ, HK, DIM, PS, causal=causal,
                          q_data_type=torch.float16, kv_data_type=torch.float16)
    plan()
    torch.cuda.synchronize()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(2000):
        plan()
    profile.disable()
    print(f"== b{batch} q{q_len} kv{kv_len}: cProfile of 2000 plan() calls, by own time")
    pstats.Stats(profile).sort_stats("tottime").print_stats(14)

batch, q_len, kv_len = 64, 1, 2048
w, (qo, indptr, indices, last) = wrapper_and_args(batch, q_len, kv_len)
pages = int(indptr[-1])
kv = torch.randn(pages, 2, PS, HK, DIM, dtype=torch.float16, device=D)
q = torch.randn(batch * q_len, HQ, DIM, dtype=torch.float16, device=D)
for disable in (False, True, False, True):
    w.plan(qo, indptr, indices, last, HQ, HK, DIM, PS, causal=False, q_data_type=torch.float16,
           kv_data_type=torch.float16, disable_split_kv=disable)
    out = w.run(q, kv)
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(50):
            w.run(q, kv, out=out)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / 50)
    assert torch.isfinite(out).all()
    print(f"b64 q1 kv2048 disable_split_kv={disable}: run() GPU {statistics.median(times):.1f} us "
          "(eager, median of 5 x 50)")
