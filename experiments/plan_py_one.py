"""plan() host time of paged b64 q1 kv2048 (32 / 8 heads, D 128, page 16, CPU index tensors)
with NVFP4 and 16-bit K/V, median of 300 calls (FLARE_AB_SCRIPT of experiments/split_sweep_ab.sh).
Usage: python3 plan_py_one.py [LABEL]"""
import statistics
import sys
import time

import torch

import flare
from paged_batch import DIM, HK, HQ, PS, paged_indices


def plan_us(kv_dtype, ws, calls=300):
    qo, indptr, indices, last = paged_indices(64, 1, 2048)
    w = flare.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
    call = lambda: w.plan(qo, indptr, indices, last, HQ, HK, DIM, PS,  # noqa: E731
                          q_data_type=torch.float16, kv_data_type=kv_dtype)
    call()
    torch.cuda.synchronize()
    times = []
    for _ in range(calls):
        t = time.perf_counter_ns()
        call()
        times.append((time.perf_counter_ns() - t) / 1e3)
    return statistics.median(times)


ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda:0")
print(f"{' '.join(sys.argv[1:])} {flare.__file__}: plan() b64 q1 kv2048 NVFP4 {plan_us(torch.uint8, ws):.1f} "
      f"us, 16-bit {plan_us(torch.float16, ws):.1f} us")
