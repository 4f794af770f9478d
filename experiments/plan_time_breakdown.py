#!/usr/bin/env python3
"""Where the host time of plan() goes through Python (issue 17 experiment, not a user script):
for decode b1 / b64 / b256 (kv 2048, bench_python's plan cases) and ragged causal prefill b64
(lengths uniform in [1, 2047], bench_python's prefill plan case), the median wall time of the
whole wrapper plan(), of the bare extension call (decoder.plan / prefill.plan with the same host
arrays) and the difference (the Python layer); then a cProfile of the wrapper's plan() by
own time. Run on the GPU machine with the package installed.
"""
import cProfile
import pstats
import statistics
import time

import torch

import flare

Q_HEADS, KV_HEADS, HEAD_DIM, PAGE = 32, 8, 128, 16
CALLS = 400


def median_us(call, calls=CALLS):
    torch.cuda.synchronize()
    times = []
    for _ in range(calls):
        start = time.perf_counter_ns()
        call()
        times.append((time.perf_counter_ns() - start) / 1e3)
    torch.cuda.synchronize()
    return statistics.median(times)


def profile(label, call):
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(CALLS):
        call()
    profiler.disable()
    print(f"-- cProfile of {label}, {CALLS} calls, by own time")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(8)


def decode_case(workspace, batch, kv_len):
    pages_per = kv_len // PAGE
    indptr = torch.arange(0, batch * pages_per + 1, pages_per, dtype=torch.int32)
    indices = torch.arange(batch * pages_per, dtype=torch.int32, device="cuda")
    last = torch.full((batch,), PAGE, dtype=torch.int32)
    wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=True)

    def plan():
        wrapper.plan(indptr, indices, last, Q_HEADS, KV_HEADS, HEAD_DIM, PAGE,
                     q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)

    plan()
    decoder = wrapper._gpu[0]
    stream = flare._flare.current_stream(0)
    whole = median_us(plan)
    bare = median_us(lambda: decoder.plan(indptr, last, stream))
    print(f"decode b{batch} kv{kv_len}: plan() {whole:.1f} us, extension call {bare:.1f} us, "
          f"Python layer {whole - bare:.1f} us")
    return plan


def prefill_case(workspace):
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 2048, (64,), generator=generator)
    indptr = torch.zeros(65, dtype=torch.int32)
    indptr[1:] = torch.cumsum(lengths, 0)
    wrapper = flare.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD")

    def plan():
        wrapper.plan(indptr, indptr, 32, 8, HEAD_DIM, causal=True, q_data_type=torch.bfloat16,
                     kv_data_type=torch.bfloat16)

    plan()
    prefill = wrapper._gpu.planned[0]
    stream = flare._flare.current_stream(0)
    whole = median_us(plan)
    bare = median_us(lambda: prefill.plan(indptr, indptr, None, stream))
    print(f"prefill b64 ragged causal: plan() {whole:.1f} us, extension call {bare:.1f} us, "
          f"Python layer {whole - bare:.1f} us")
    return plan


def main():
    workspace = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    plans = {}
    for batch in (1, 64, 256):
        plans[f"decode b{batch}"] = decode_case(workspace, batch, 2048)
    plans["prefill b64"] = prefill_case(workspace)
    for label in ("decode b256", "prefill b64"):
        profile(label, plans[label])


if __name__ == "__main__":
    main()
