#!/usr/bin/env python3
"""Where the host time of flare's decode run() goes (issue 17 experiment, not a user script):
per-call wall time of the pieces of BatchDecodeWithPagedKVCacheWrapper.run() on the decode
benchmark's shapes, with the GPU backlogged (back-to-back calls) and drained (a sync every 8
calls): output allocation, the extension call with a preallocated output, the whole run(), and
torch's own empty launch (torch.Tensor.zero_ of a 1-element tensor) as a launch-cost yardstick.
"""
import statistics
import time

import torch

import flare

Q_HEADS, KV_HEADS, HEAD_DIM, PAGE = 32, 8, 128, 16


def percentiles(call, calls=1000, drain_every=0):
    torch.cuda.synchronize()
    times = []
    for i in range(calls):
        if drain_every and i % drain_every == 0:
            torch.cuda.synchronize()
        start = time.perf_counter_ns()
        call()
        times.append((time.perf_counter_ns() - start) / 1e3)
    torch.cuda.synchronize()
    times.sort()
    return (statistics.median(times), times[len(times) // 10], times[9 * len(times) // 10])


def main():
    workspace = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    tiny = torch.zeros(1, device="cuda")
    print("torch zero_ launch (median, p10, p90 us):", percentiles(tiny.zero_))
    for batch, kv_len in [(1, 32768), (16, 4096), (16, 32768), (64, 8192)]:
        pages = batch * kv_len // PAGE
        cache = torch.randn(pages, 2, PAGE, KV_HEADS, HEAD_DIM, device="cuda",
                            dtype=torch.bfloat16)
        indptr = torch.arange(0, pages + 1, kv_len // PAGE, dtype=torch.int32)
        indices = torch.arange(pages, dtype=torch.int32, device="cuda")
        last = torch.full((batch,), PAGE, dtype=torch.int32)
        q = torch.randn(batch, Q_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(workspace, use_tensor_cores=True)
        wrapper.plan(indptr, indices, last, Q_HEADS, KV_HEADS, HEAD_DIM, PAGE,
                     q_data_type=torch.bfloat16)
        out = wrapper.run(q, cache)
        decoder, page_ids, shape, _ = wrapper._gpu
        rows = {
            "run()": lambda: wrapper.run(q, cache),
            "run(out=)": lambda: wrapper.run(q, cache, out=out),
            "q.new_empty": lambda: q.new_empty(shape),
            "extension run": lambda: decoder.run(q, cache, page_ids, out, None, 1.0, 1.0, 1.0,
                                                 True, True),
            "extension run, no PDL": lambda: decoder.run(q, cache, page_ids, out, None, 1.0,
                                                         1.0, 1.0, True, False),
        }
        for name, call in rows.items():
            backlog = percentiles(call)
            drained = percentiles(call, drain_every=8)
            print(f"b{batch} kv{kv_len} {name:24s} backlogged {backlog[0]:6.1f} "
                  f"(p10 {backlog[1]:5.1f}, p90 {backlog[2]:6.1f})   drained {drained[0]:6.1f} "
                  f"(p10 {drained[1]:5.1f}, p90 {drained[2]:6.1f})")
        cache = None  # frees it before the next shape
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
