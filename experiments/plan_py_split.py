"""Where a paged prefill plan() spends its host time through Python (issue 17): the whole
wrapper call, the extension's BatchPrefill.plan alone and the index conversions, medians of 300
back-to-back calls, on the NVFP4 bench's shapes with 16-bit and NVFP4 (uint8) K/V and CPU index
tensors; then a cProfile of NVFP4 plan() at b64 q1 kv2048 (the 120 us of the twenty-fifth
session's bench_prefill_nvfp4.py, against 24-36 with 16-bit K/V).
GPU machine, flare installed: python3 experiments/plan_py_split.py"""
import cProfile
import pstats
import statistics
import time

import torch

import flare
from flare._tensors import host_index
from flare import _prefill_gpu
from paged_batch import DIM, HK, HQ, PS, paged_indices
D = torch.device("cuda:0")


def med(f, n=300):
    f(); torch.cuda.synchronize(); ts = []
    for _ in range(n):
        t = time.perf_counter_ns(); f(); ts.append((time.perf_counter_ns() - t) / 1e3)
    return statistics.median(ts)


def planner(batch, q_len, kv_len, causal, kv_dtype, ws):
    qo, indptr, indices, last = paged_indices(batch, q_len, kv_len)
    w = flare.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
    return w, lambda: w.plan(qo, indptr, indices, last, HQ, HK, DIM, PS, causal=causal,
                             q_data_type=torch.float16, kv_data_type=kv_dtype), (qo, indptr, last)


ws = torch.empty(256 << 20, dtype=torch.uint8, device=D)
for kv_dtype in (torch.float16, torch.uint8):
    for batch, q_len, kv_len, causal in ((1, 4096, 4096, True), (4, 1024, 1024, True),
                                         (64, 1, 2048, False), (150, 1, 1024, False),
                                         (16, 16, 4096, False)):
        w, f, (qo, indptr, last) = planner(batch, q_len, kv_len, causal, kv_dtype, ws)
        whole = med(f)
        prefill = w._gpu.planned[0]
        hosts = (host_index(qo, "qo"), host_index(indptr, "kv"), host_index(last, "last"))
        stream = _prefill_gpu._flare.current_stream(0)
        ext = med(lambda: prefill.plan(*hosts, stream))
        counts = getattr(prefill, "plan_counts", None)
        print(f"{kv_dtype} b{batch} q{q_len} kv{kv_len}: plan() {whole:.1f} us, extension plan "
              f"{ext:.1f}, plan_counts {counts}")

w, f, _ = planner(64, 1, 2048, False, torch.uint8, ws)
f(); torch.cuda.synchronize()
profile = cProfile.Profile()
profile.enable()
for _ in range(200):
    f()
profile.disable()
pstats.Stats(profile).sort_stats("tottime").print_stats(15)
