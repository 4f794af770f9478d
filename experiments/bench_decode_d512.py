#!/usr/bin/env python3
"""Decode at head_dim 512 (issue 21) through flare's Python API, next to flare's D 256 loop on the
same KV bytes (twice the KV heads, the same head group of 4) and PyTorch SDPA's backends that take
D 512, in one process. bf16, page 16, pages in allocation order, CUDA-core loop (the only one at
D 512). GPU time per call from a replayed CUDA graph of 20 calls; KV bytes / time in TB/s.

Prediction (before the first run): D 512 within 0.8x of D 256's bandwidth at equal bytes (its
items take 2 tokens a group against 4, so twice the per-tile fixed work a token), and ahead of
every SDPA backend that runs it.
Usage: python3 experiments/bench_decode_d512.py"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flare

sys.path.insert(0, __file__.rsplit("/", 2)[0] + "/scripts")
from bench_python import decode_wrapper, graph_us  # noqa: E402

PAGE, DTYPE, GROUP = 16, torch.bfloat16, 4
CASES = [(1, 32768), (16, 4096), (64, 2048)]


def flare_decode(batch, kv_len, kv_heads, head_dim, workspace):
    pages_per = kv_len // PAGE
    pages = batch * pages_per
    cache = torch.randn(pages, 2, PAGE, kv_heads, head_dim, device="cuda", dtype=DTYPE)
    q = torch.randn(batch, kv_heads * GROUP, head_dim, device="cuda", dtype=DTYPE)
    wrapper = decode_wrapper(flare, workspace, True, batch, pages, use_tensor_cores=False)
    wrapper.plan(torch.arange(0, pages + 1, pages_per, dtype=torch.int32),
                 torch.arange(pages, dtype=torch.int32, device="cuda"),
                 torch.full((batch,), PAGE, dtype=torch.int32), kv_heads * GROUP, kv_heads,
                 head_dim, PAGE, q_data_type=DTYPE, kv_data_type=DTYPE)
    out = torch.full_like(q, float("nan"))
    us = graph_us(lambda: wrapper.run(q, cache, out=out), 20)
    assert torch.isfinite(out).all(), "flare left NaN in the output"
    return us


def sdpa_decode(batch, kv_len, kv_heads, head_dim, backend):
    q = torch.randn(batch, kv_heads * GROUP, 1, head_dim, device="cuda", dtype=DTYPE)
    k = torch.randn(batch, kv_heads, kv_len, head_dim, device="cuda", dtype=DTYPE)
    v = torch.randn_like(k)

    def call():
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    call()
    return graph_us(call, 20)


def main():
    print("device", torch.cuda.get_device_name(0), "| torch", torch.__version__)
    workspace = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    print("| case | KV MB | flare D 512 | flare D 256 (2x heads) | 512 / 256 time | SDPA efficient D 512 | SDPA math D 512 |")
    print("|---|---|---|---|---|---|---|")
    for batch, kv_len in CASES:
        kv_bytes = 2 * batch * kv_len * 4 * 512 * 2
        wide = flare_decode(batch, kv_len, 4, 512, workspace)
        narrow = flare_decode(batch, kv_len, 8, 256, workspace)
        cells = []
        for backend in (SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH):
            try:
                t = sdpa_decode(batch, kv_len, 4, 512, backend)
                cells.append(f"{t:.1f} us ({t / wide:.2f}x flare)")
            except Exception as error:  # noqa: BLE001 - a backend that refuses D 512
                cells.append(f"n/a ({type(error).__name__})")
            torch.cuda.empty_cache()
        print(f"| b{batch} kv{kv_len} GQA 16/4 | {kv_bytes / 1e6:.0f} | {wide:.1f} us "
              f"({kv_bytes / wide / 1e6:.2f} TB/s) | {narrow:.1f} us "
              f"({kv_bytes / narrow / 1e6:.2f} TB/s) | {wide / narrow:.2f} | {cells[0]} | "
              f"{cells[1]} |")
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
