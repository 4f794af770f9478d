#!/usr/bin/env python3
"""Paged prefill through Python (issue 19's "paged within 5% of ragged"): flare's paged wrapper at
FLARE_BENCH_PAGE (default 16) rows a page, pages shuffled, next to flare's ragged wrapper, SDPA
cuDNN on the same tokens contiguous and, when importable, FlashInfer fa3 on the same paged cache;
bench_python.py's prefill shapes (ragged causal b16 h16 D 128 bf16, 1024 / 4096 / 16384). Graph
and eager TFLOP/s, plan() / run() host us at 1024.
GPU machine, flare installed: python3 experiments/bench_paged_prefill.py"""
import os
import sys

import torch
from torch.nn.attention import SDPBackend

import flare

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from bench_python import (DTYPE, HEAD_DIM, PREFILL_BATCH, PREFILL_HEADS,  # noqa: E402
                          PREFILL_LENGTHS, WORKSPACE_BYTES, eager_us, graph_us, guarded, host_us,
                          measure_prefill_library, measure_prefill_sdpa, options)

try:
    import flashinfer
except Exception:  # noqa: BLE001 - any import failure means "not measured"
    flashinfer = None

PAGE = int(os.environ.get("FLARE_BENCH_PAGE", "16"))


def measure_paged(module, backend, workspace, length, args, host_runs):
    pages_per = (length + PAGE - 1) // PAGE
    num_pages = PREFILL_BATCH * pages_per
    qo = torch.arange(0, PREFILL_BATCH * length + 1, length, dtype=torch.int32)
    kv_indptr = torch.arange(0, num_pages + 1, pages_per, dtype=torch.int32)
    last = torch.full((PREFILL_BATCH,), (length - 1) % PAGE + 1, dtype=torch.int32)
    indices = torch.randperm(num_pages, generator=torch.Generator().manual_seed(1)).to(
        torch.int32).cuda()
    q = torch.randn(PREFILL_BATCH * length, PREFILL_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
    cache = torch.randn(num_pages, 2, PAGE, PREFILL_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
    kwargs = {} if backend is None else {"backend": backend}

    def plan(wrapper):
        wrapper.plan(qo, kv_indptr, indices, last, PREFILL_HEADS, PREFILL_HEADS, HEAD_DIM, PAGE,
                     causal=True, q_data_type=DTYPE, kv_data_type=DTYPE)

    wrapper = module.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", **kwargs)
    plan(wrapper)
    out = wrapper.run(q, cache)
    row = {}
    if host_runs:
        row["plan_us"] = host_us(lambda: plan(wrapper), args.plan_calls)[0]
        row["run_us"] = host_us(lambda: wrapper.run(q, cache), args.run_calls)[0]
    row["eager_us"] = eager_us(lambda: wrapper.run(q, cache, out=out), args.eager_calls)
    graphed = module.BatchPrefillWithPagedKVCacheWrapper(
        workspace, "NHD", use_cuda_graph=True,
        qo_indptr_buf=torch.empty(PREFILL_BATCH + 1, dtype=torch.int32, device="cuda"),
        paged_kv_indptr_buf=torch.empty(PREFILL_BATCH + 1, dtype=torch.int32, device="cuda"),
        paged_kv_indices_buf=torch.empty(num_pages, dtype=torch.int32, device="cuda"),
        paged_kv_last_page_len_buf=torch.empty(PREFILL_BATCH, dtype=torch.int32, device="cuda"),
        **kwargs)
    plan(graphed)
    row["graph_us"] = graph_us(lambda: graphed.run(q, cache, out=out),
                               max(1, args.graph_calls * 1024 // length))
    return row


def main():
    args = options()
    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    print(f"device: {torch.cuda.get_device_name(0)}, page {PAGE}")
    print("| case | library | graph TFLOP/s | eager TFLOP/s | plan() / run() host us |")
    print("|---|---|---|---|---|")
    for length in PREFILL_LENGTHS:
        flops = 4 * PREFILL_BATCH * PREFILL_HEADS * HEAD_DIM * length * (length + 1) / 2
        rows = {
            f"flare paged {PAGE}": guarded("flare paged", lambda: measure_paged(
                flare, None, workspace, length, args, length == 1024)),
            "flare ragged": guarded("flare ragged", lambda: measure_prefill_library(
                flare, None, workspace, length, args, length == 1024)),
            "cudnn": guarded("cudnn", lambda: measure_prefill_sdpa(
                SDPBackend.CUDNN_ATTENTION, length, args)),
        }
        if flashinfer is not None:
            rows[f"flashinfer fa3 paged {PAGE}"] = guarded("flashinfer", lambda: measure_paged(
                flashinfer, "fa3", workspace, length, args, length == 1024))
        for name, row in rows.items():
            if row is None:
                continue
            host = (f"{row['plan_us']:.1f} / {row['run_us']:.1f}" if "plan_us" in row else "")
            print(f"| b{PREFILL_BATCH} L{length} | {name} | {flops / row['graph_us'] / 1e6:.1f} | "
                  f"{flops / row['eager_us'] / 1e6:.1f} | {host} |")
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
