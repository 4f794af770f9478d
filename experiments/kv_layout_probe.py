"""Issue 17 probe: the same q1 paged prefill plan ran 130 us from C++ (scripts/
bench_prefill_nvfp4.cpp: separate K and V arrays, no PDL) and 166 us through Python
(split_vs_queue_sweep.py: one [pages, 2, page, heads, D] tensor, PDL on by default), b64 q1
kv2048 on one H200. Times run() (eager, CUDA events around 50 runs, best of 5 medians) on one
cache layout at a time: K and V interleaved per page or as two tensors, pages shuffled or in
order, programmatic dependent launch on or off (FLARE_PROBE_PDL=0 / 1 / both, default both).
GPU machine, flare installed: python3 experiments/kv_layout_probe.py"""
import os

import torch

import flare
from paged_batch import DIM, HK, HQ, PS, paged_indices
from eager_timing import time_runs

D = torch.device("cuda:0")
PDL = {"0": (False,), "1": (True,)}.get(os.environ.get("FLARE_PROBE_PDL", ""), (False, True))


ws = torch.empty(256 << 20, dtype=torch.uint8, device=D)
print("| b x q x kv | K/V | pages | PDL | run() us |")
print("|---|---|---|---|---|")
for batch, q_len, kv_len in ((64, 1, 2048), (64, 1, 8192), (16, 16, 4096)):
    num_pages = batch * ((kv_len + PS - 1) // PS)
    q = torch.randn(batch * q_len, HQ, DIM, dtype=torch.float16, device=D)
    combined = torch.randn(num_pages, 2, PS, HK, DIM, dtype=torch.float16, device=D)
    separate = (combined[:, 0].contiguous(), combined[:, 1].contiguous())
    for order in ("shuffled", "in order"):
        qo, indptr, indices, last = paged_indices(batch, q_len, kv_len, order == "shuffled")
        w = flare.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
        w.plan(qo, indptr, indices, last, HQ, HK, DIM, PS, causal=False,
               q_data_type=torch.float16, kv_data_type=torch.float16)
        results = {}
        for label, kv in (("interleaved", combined), ("two tensors", separate)):
            out = torch.full((batch * q_len, HQ, DIM), float("nan"), dtype=torch.float16, device=D)
            w.run(q, kv, out=out)
            torch.cuda.synchronize()
            assert torch.isfinite(out).all()
            results[label] = out.clone()
            for pdl in PDL:
                t = min(time_runs(lambda: w.run(q, kv, out=out, enable_pdl=pdl), 50)
                        for _ in range(2))
                print(f"| {batch} x {q_len} x {kv_len} | {label} | {order} | {pdl} | {t:.1f} |",
                      flush=True)
        assert torch.equal(results["interleaved"], results["two tensors"])
