"""NVFP4 KV decode (codes + e4m3 block scales decoded in the CUDA-core loop's gather) next to
bf16 KV decode (the CUDA-core and the tensor-core loop) on the same shapes, through flare's
Python wrapper in one process: GPU time per run() from a CUDA graph of 20 captured runs
(use_cuda_graph wrappers; scripts/bench_python.py graph_us, median of 5 replays); bf16 q,
32 / 8 heads, D 128, page 16. Issue 21 predicts NVFP4 faster at long KV (a quarter of bf16's
bytes, plus 1/16 for the scales).
Usage (GPU machine, flare installed): python3 this_file.py"""

import sys
from pathlib import Path

import torch

import flare

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from bench_python import graph_us  # noqa: E402

DEVICE = torch.device("cuda:0")
HQ, HK, D, PS = 32, 8, 128, 16


def case(batch, kv_len):
    pages_per = (kv_len + PS - 1) // PS
    total = batch * pages_per
    indptr = torch.arange(batch + 1, dtype=torch.int32, device=DEVICE) * pages_per
    indices = torch.randperm(total, device=DEVICE).to(torch.int32)
    last = torch.full((batch,), (kv_len - 1) % PS + 1, dtype=torch.int32, device=DEVICE)
    q = torch.randn(batch, HQ, D, dtype=torch.bfloat16, device=DEVICE)
    kv16 = torch.randn(total, 2, PS, HK, D, dtype=torch.bfloat16, device=DEVICE)
    codes = torch.randint(0, 256, (total, 2, PS, HK, D // 2), dtype=torch.uint8, device=DEVICE)
    scales = torch.randint(0x30, 0x40, (total, 2, PS, HK, D // 16), dtype=torch.uint8,
                           device=DEVICE)
    times = {}
    for name, kv_dtype, tensor_cores in (("bf16 cuda-core", torch.bfloat16, False),
                                         ("bf16 tensor-core", torch.bfloat16, True),
                                         ("nvfp4", torch.uint8, False)):
        w = flare.BatchDecodeWithPagedKVCacheWrapper(
            torch.empty(128 << 20, dtype=torch.uint8, device=DEVICE), "NHD",
            use_cuda_graph=True, use_tensor_cores=tensor_cores,
            paged_kv_indptr_buffer=torch.empty_like(indptr),
            paged_kv_indices_buffer=torch.empty_like(indices),
            paged_kv_last_page_len_buffer=torch.empty_like(last))
        w.plan(indptr, indices, last, HQ, HK, D, PS, q_data_type=torch.bfloat16,
               kv_data_type=kv_dtype)
        out = torch.empty_like(q)
        if kv_dtype == torch.uint8:
            times[name] = graph_us(lambda: w.run(q, codes, out=out, kv_cache_sf=scales,
                                                 k_scale=0.5, v_scale=2.0), 20)
        else:
            times[name] = graph_us(lambda: w.run(q, kv16, out=out), 20)
    best16 = min(times["bf16 cuda-core"], times["bf16 tensor-core"])
    bf16_gb = batch * kv_len * HK * D * 2 * 2 / 1e9
    print(f"| b{batch} kv{kv_len} | {times['bf16 cuda-core']:.1f} | "
          f"{times['bf16 tensor-core']:.1f} | {times['nvfp4']:.1f} | "
          f"{times['nvfp4'] / best16:.2f} | {bf16_gb / best16 * 1e6:.0f} | "
          f"{bf16_gb * 0.28125 / times['nvfp4'] * 1e6:.0f} |", flush=True)


def main():
    print(torch.cuda.get_device_name(0))
    print("| shape | bf16 CUDA-core us | bf16 tensor-core us | NVFP4 us | NVFP4 / best bf16 | "
          "bf16 GB/s | NVFP4 GB/s |")
    print("|---|---|---|---|---|---|---|")
    for batch, kv_len in [(1, 32768), (16, 8192), (64, 4096), (128, 2048), (256, 1024)]:
        case(batch, kv_len)


if __name__ == "__main__":
    main()
