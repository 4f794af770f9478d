#!/usr/bin/env python3
"""The attention sink in the kernels against the paged prefill without one and against the
previous composition (the prefill, then merge_state_in_place with each head's sink state): GPU
time a call from CUDA events around back-to-back eager runs and the host time of run(),
gpt-oss-like shapes (64 q / 8 KV heads, D 64 and 128, page 16, bf16): decode steps (one query
token a request) and a causal prefill. Run on the GPU machine with flare installed."""
import statistics

import torch

import flare
from flare.cascade import merge_state_in_place
from single_call_costs import median_us  # this folder's: the host-time loop

PAGE = 16


def paged(batch, kv_len, kv_heads, dim):
    per = -(-kv_len // PAGE)
    cache = torch.randn(batch * per, 2, PAGE, kv_heads, dim, device="cuda", dtype=torch.bfloat16)
    indptr = torch.arange(0, batch * per + 1, per, dtype=torch.int32)
    indices = torch.randperm(batch * per, dtype=torch.int32).cuda()
    last = torch.full((batch,), kv_len - (per - 1) * PAGE, dtype=torch.int32)
    return cache, indptr, indices, last


def gpu_us(fn, reps=50):
    """GPU time a call: CUDA events around `reps` back-to-back eager calls (the shapes are
    GPU-bound: each call's kernels outlast its host time), median of 10."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1000.0 / reps)
    return statistics.median(samples)


def main():
    print("| shape | D | plain prefill GPU us | sink in the kernels | prefill + merge "
          "(before) | sink / plain | host run() us: sink, prefill + merge |")
    print("|---|---|---|---|---|---|---|")
    for dim in (64, 128):
        for batch, q_len, kv_len in ((64, 1, 4096), (16, 1, 32768), (4, 1024, 1024)):
            cache, indptr, indices, last = paged(batch, kv_len, 8, dim)
            qo = torch.arange(0, batch * q_len + 1, q_len, dtype=torch.int32)
            q = torch.randn(batch * q_len, 64, dim, device="cuda", dtype=torch.bfloat16)
            sink = torch.randn(64, device="cuda")
            ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
            plain = flare.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
            sinked = flare.BatchAttentionWithAttentionSinkWrapper(
                torch.empty_like(ws), "NHD", head_dim_qk=dim, head_dim_vo=dim)
            for w in (plain, sinked):
                w.plan(qo, indptr, indices, last, 64, 8, dim, PAGE, causal=True,
                       q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
            out = torch.empty_like(q)
            lse = torch.empty(q.shape[:2], device="cuda")
            zero = torch.zeros(64, dim, device="cuda", dtype=torch.bfloat16)

            def composed():  # the forty-seventh session's sink: prefill, then one merge
                plain.run(q, cache, out=out, lse=lse, return_lse=True, lse_base="ln")
                merge_state_in_place(out, lse, zero.expand(out.shape), sink.expand(lse.shape),
                                     lse_base="ln")

            def in_kernels():
                sinked.run(q, cache, sink, out=out)

            def plain_run():
                plain.run(q, cache, out=out)

            in_kernels()
            expected = out.clone()
            composed()
            torch.testing.assert_close(out, expected, atol=2e-2, rtol=1e-2)
            t_plain, t_sink, t_comp = gpu_us(plain_run), gpu_us(in_kernels), gpu_us(composed)
            host_sink = median_us(in_kernels, 1000, 16)
            host_composed = median_us(composed, 1000, 16)
            print(f"| b{batch} q{q_len} kv{kv_len} | {dim} | {t_plain:.1f} | {t_sink:.1f} | "
                  f"{t_comp:.1f} | {t_sink / t_plain:.3f} | {host_sink:.1f}, "
                  f"{host_composed:.1f} |")

if __name__ == "__main__":
    main()
