"""Custom-mask prefill at head dim 256 on Hopper: the Hopper family (backend "fa3", newly
allowed: the mask bits gathered before S = Q K^T) next to the FA2 family (backend "fa2", which
"auto" took before and whose 128- and 64-row kernels spill 32 bytes on sm_90a), ragged fp16,
32 / 4 heads, a causal-triangle custom mask, through flare's Python wrapper in one process:
GPU time per run() from CUDA events around 20 back-to-back eager runs (median of 5).
Usage (GPU machine, flare installed): python3 this_file.py"""

import torch

import flare
from eager_timing import time_runs

DEVICE = torch.device("cuda:0")


def case(batch, q_len, kv_len, mode):
    hq, hk, d = 32, 4, 256
    q = torch.randn(batch * q_len, hq, d, dtype=torch.float16, device=DEVICE)
    k = torch.randn(batch * kv_len, hk, d, dtype=torch.float16, device=DEVICE)
    v = torch.randn(batch * kv_len, hk, d, dtype=torch.float16, device=DEVICE)
    qo_indptr = torch.arange(batch + 1, dtype=torch.int32, device=DEVICE) * q_len
    kv_indptr = torch.arange(batch + 1, dtype=torch.int32, device=DEVICE) * kv_len
    mask = torch.tril(torch.ones(batch, q_len, kv_len, dtype=torch.bool, device=DEVICE),
                      diagonal=kv_len - q_len).reshape(-1)
    ws = torch.empty(256 << 20, dtype=torch.uint8, device=DEVICE)
    times, outs = {}, {}
    for backend in ("fa2", "fa3"):
        w = flare.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend=backend)
        w.plan(qo_indptr, kv_indptr, hq, hk, d, custom_mask=mask, pos_encoding_mode=mode)
        outs[backend] = w.run(q, k, v).float()
        times[backend] = time_runs(lambda: w.run(q, k, v))
    diff = float((outs["fa2"] - outs["fa3"]).abs().max())
    print(f"| b{batch} q{q_len} kv{kv_len} {mode} | {times['fa2']:.1f} | {times['fa3']:.1f} | "
          f"{times['fa2'] / times['fa3']:.2f} | {diff:.1e} |", flush=True)


def main():
    print(torch.cuda.get_device_name(0))
    print("| shape | FA2 family us | Hopper family us | FA2 / Hopper | max abs diff |")
    print("|---|---|---|---|---|")
    for batch, q_len, kv_len, mode in [(1, 4096, 4096, "NONE"), (4, 1024, 2048, "NONE"),
                                       (17, 577, 2048, "ALIBI"), (128, 37, 512, "NONE")]:
        case(batch, q_len, kv_len, mode)


if __name__ == "__main__":
    main()
