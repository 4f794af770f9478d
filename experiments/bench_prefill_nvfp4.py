"""NVFP4 paged prefill (the FA2 family's NVFP4 kernels convert codes and scales in shared memory;
for the Hopper family run() stages the planned pages to 16 bits, then the 16-bit kernels) under
backends auto, fa2 and fa3, next to the 16-bit paged prefill (auto) on the same shapes, through
flare's Python wrapper in one process:
GPU time per run() from CUDA events around 20 back-to-back eager runs (median of 5), fp16,
32 / 8 heads, D 128, page 16. A second table (backend auto, 16-bit and NVFP4 KV): the GPU time
of a run() from a replayed CUDA graph (use_cuda_graph wrappers) and the host time of plan() and
run() (scripts/bench_python.py's timers: medians of back-to-back calls, no sync inside).
Usage (GPU machine, flare installed): python3 this_file.py"""

import os
import sys

import torch

import flare
from eager_timing import time_runs

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from bench_python import graph_us, host_us  # noqa: E402

DEVICE = torch.device("cuda:0")


def case(batch, q_len, kv_len, causal):
    hq, hk, d, ps = 32, 8, 128, 16
    pages_per = (kv_len + ps - 1) // ps
    total_pages = batch * pages_per
    indptr = torch.arange(batch + 1, dtype=torch.int32) * pages_per
    indices = torch.randperm(total_pages).to(torch.int32).to(DEVICE)
    last = torch.full((batch,), (kv_len - 1) % ps + 1, dtype=torch.int32)
    qo_indptr = torch.arange(batch + 1, dtype=torch.int32) * q_len
    q = torch.randn(batch * q_len, hq, d, dtype=torch.float16, device=DEVICE)
    kv16 = torch.randn(total_pages, 2, ps, hk, d, dtype=torch.float16, device=DEVICE)
    codes = torch.randint(0, 256, (total_pages, 2, ps, hk, d // 2), dtype=torch.uint8,
                          device=DEVICE)
    scales = torch.randint(0x30, 0x40, (total_pages, 2, ps, hk, d // 16), dtype=torch.uint8,
                           device=DEVICE)
    ws = torch.empty(256 << 20, dtype=torch.uint8, device=DEVICE)
    shape = f"b{batch} q{q_len} kv{kv_len} {'causal' if causal else 'full'}"
    results = {}
    for name, kv_dtype, backend in (("f16", torch.float16, "auto"),
                                    ("nvfp4", torch.uint8, "auto"),
                                    ("nvfp4 fa2", torch.uint8, "fa2"),
                                    ("nvfp4 fa3", torch.uint8, "fa3")):
        w = flare.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend=backend)
        w.plan(qo_indptr, indptr, indices, last, hq, hk, d, ps, causal=causal,
               q_data_type=torch.float16, kv_data_type=kv_dtype)
        if name == "f16":
            results[name] = time_runs(lambda: w.run(q, kv16))
        else:
            results[name] = time_runs(lambda: w.run(q, codes, kv_cache_sf=scales, k_scale=0.5,
                                                    v_scale=2.0))
    kv_gb = batch * kv_len * hk * d * 2 * 2 / 1e9
    f16 = results["f16"]
    print(f"| {shape} | {f16:.1f} | "
          + " | ".join(f"{results[k]:.1f} ({results[k] / f16:.2f})"
                       for k in ("nvfp4", "nvfp4 fa2", "nvfp4 fa3"))
          + f" | {kv_gb * 1e3:.0f} MB |")

    # Graph replay and host times, backend auto.
    row = {}
    for name, kv_dtype in (("f16", torch.float16), ("nvfp4", torch.uint8)):
        def plan(wrapper):
            wrapper.plan(qo_indptr, indptr, indices, last, hq, hk, d, ps, causal=causal,
                         q_data_type=torch.float16, kv_data_type=kv_dtype)

        def run(wrapper, out=None):
            if kv_dtype == torch.float16:
                return wrapper.run(q, kv16, out=out)
            return wrapper.run(q, codes, kv_cache_sf=scales, k_scale=0.5, v_scale=2.0, out=out)

        eager = flare.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
        plan(eager)
        out = run(eager)
        row[name + " plan"] = host_us(lambda: plan(eager), 20)[0]
        row[name + " run"] = host_us(lambda: run(eager, out), 50)[0]
        graphed = flare.BatchPrefillWithPagedKVCacheWrapper(
            ws, "NHD", use_cuda_graph=True,
            qo_indptr_buf=torch.empty(batch + 1, dtype=torch.int32, device=DEVICE),
            paged_kv_indptr_buf=torch.empty(batch + 1, dtype=torch.int32, device=DEVICE),
            paged_kv_indices_buf=torch.empty(total_pages, dtype=torch.int32, device=DEVICE),
            paged_kv_last_page_len_buf=torch.empty(batch, dtype=torch.int32, device=DEVICE))
        plan(graphed)
        row[name + " graph"] = graph_us(lambda: run(graphed, out), 10)
    GRAPH_ROWS.append(f"| {shape} | {row['f16 graph']:.1f} | {row['nvfp4 graph']:.1f} "
                      f"({row['nvfp4 graph'] / row['f16 graph']:.2f}) | "
                      f"{row['f16 plan']:.1f} / {row['f16 run']:.1f} | "
                      f"{row['nvfp4 plan']:.1f} / {row['nvfp4 run']:.1f} |")


GRAPH_ROWS = []


def main():
    print(f"device: {torch.cuda.get_device_name(0)}")
    print("| shape | f16 KV us (auto) | NVFP4 auto us (/ f16) | NVFP4 fa2 | NVFP4 fa3 (staged) |"
          " 16-bit KV bytes |")
    print("|---|---|---|---|---|---|")
    for args in ((1, 4096, 4096, True), (4, 1024, 1024, True), (16, 16, 4096, False),
                 (64, 1, 2048, False)):
        case(*args)
    print("\n| shape (auto) | f16 KV graph us | NVFP4 graph us (/ f16) | f16 plan() / run() host us |"
          " NVFP4 plan() / run() host us |")
    print("|---|---|---|---|---|")
    print("\n".join(GRAPH_ROWS))


if __name__ == "__main__":
    main()
