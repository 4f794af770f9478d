#!/usr/bin/env python3
"""Where single_decode / single_prefill_with_kv_cache spend their host time (issue 17: run() <=
10 us): each step of the remembered-call path timed alone (median of 2000 calls, the stream
drained every 64), next to the whole call. Run on the GPU machine with flare installed."""
import statistics
import time

import torch

import flare
from flare import _single_decode, _single_prefill


def median_us(fn, calls=2000, drain=64):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    samples = []
    for i in range(calls):
        start = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - start)
        if i % drain == drain - 1:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return statistics.median(samples) / 1000.0


def main():
    dt = torch.bfloat16
    q = torch.randn(32, 128, device="cuda", dtype=dt)
    k = torch.randn(1024, 8, 128, device="cuda", dtype=dt)
    v = torch.randn_like(k)
    qp = torch.randn(128, 32, 128, device="cuda", dtype=dt)
    kp = torch.randn(128, 8, 128, device="cuda", dtype=dt)
    vp = torch.randn_like(kp)
    flare.single_decode_with_kv_cache(q, k, v)
    flare.single_prefill_with_kv_cache(qp, kp, vp, causal=True)
    steps = {
        "single_decode whole call": lambda: flare.single_decode_with_kv_cache(q, k, v),
        "single_prefill whole call": lambda: flare.single_prefill_with_kv_cache(
            qp, kp, vp, causal=True),
        "is_current_stream_capturing": torch.cuda.is_current_stream_capturing,
        "q.shape, k.shape, v.shape": lambda: (q.shape, k.shape, v.shape),
        "q.dtype x3": lambda: (q.dtype, k.dtype, v.dtype),
        "q.device, k.device": lambda: (q.device, k.device),
        "hash of a 16-entry call tuple": lambda: hash((q.shape, k.shape, v.shape, q.dtype,
                                                       k.dtype, v.dtype, q.device, k.device,
                                                       "NHD", "NONE", False, -1, None, None,
                                                       None, None)),
        "k.unsqueeze(1) x2": lambda: (k.unsqueeze(1), v.unsqueeze(1)),
        "q.new_empty((1, 32, 128))": lambda: q.new_empty((1, 32, 128)),
        "q[None] and a [0]": lambda: q[None][0],
        "is_cuda(q)": lambda: flare._tensors.is_cuda(q),
        "_flare.current_stream(0)": lambda: flare._flare.current_stream(0),
    }
    decoder_entry = next(iter(_single_decode._single_decoders._entries.values()))
    decoder, indices = decoder_entry
    kpg, vpg = k.unsqueeze(1), v.unsqueeze(1)
    out = q.new_empty((1, 32, 128))
    qb = q[None]
    steps["decoder.run alone (1 launch)"] = lambda: decoder.run(
        qb, (kpg, vpg), indices, out, None, 1.0, 1.0, 1.0, True, True, None, None)
    prefill = next(iter(_single_prefill._prefills._entries.values()))
    outp = qp.new_empty((128, 32, 128))
    steps["prefill.run_ragged alone"] = lambda: prefill.run_ragged(
        qp, kp, vp, False, outp, None, None, 1.0, 1.0, 1.0, True, True, None, None, None, None)
    for name, fn in steps.items():
        print(f"| {name} | {median_us(fn):.2f} |")


if __name__ == "__main__":
    main()
