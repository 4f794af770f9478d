"""NVFP4 paged prefill (the FA2 family's NVFP4 kernels convert codes and scales in shared memory;
for the Hopper family run() stages the planned pages to 16 bits, then the 16-bit kernels) under
backends auto, fa2 and fa3, next to the 16-bit paged prefill (auto) on the same shapes, through
flare's Python wrapper in one process:
GPU time per run() from CUDA events around 20 back-to-back eager runs (median of 5), fp16,
32 / 8 heads, D 128, page 16. Usage (GPU machine, flare installed): python3 this_file.py"""

import torch

import flare
from eager_timing import time_runs

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
    print(f"| b{batch} q{q_len} kv{kv_len} {'causal' if causal else 'full'} | {f16:.1f} | "
          + " | ".join(f"{results[k]:.1f} ({results[k] / f16:.2f})"
                       for k in ("nvfp4", "nvfp4 fa2", "nvfp4 fa3"))
          + f" | {kv_gb * 1e3:.0f} MB |")


def main():
    print(f"device: {torch.cuda.get_device_name(0)}")
    print("| shape | f16 KV us (auto) | NVFP4 auto us (/ f16) | NVFP4 fa2 | NVFP4 fa3 (staged) |"
          " 16-bit KV bytes |")
    print("|---|---|---|---|---|---|")
    for args in ((1, 4096, 4096, True), (4, 1024, 1024, True), (16, 16, 4096, False),
                 (64, 1, 2048, False)):
        case(*args)


if __name__ == "__main__":
    main()
