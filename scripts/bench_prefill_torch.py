# PyTorch SDPA (flash, cuDNN) on the shapes of scripts/bench_prefill.cpp, in the same run:
# bf16, causal, batch 16, 16 heads, head_dim 128; the uniform 512-1024 batch padded and request
# by request (the faster counts); append 128 on 32768 (non-causal SDPA: top-left causal would be
# wrong for q_len < kv_len, and the 128-token triangle is 0.2% of the work).
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

dev = torch.device("cuda")
H, D = 16, 128
BACKENDS = [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)]


def median_ms(fn, iters=10, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


def tflops(flops, fn, backend):
    try:
        with sdpa_kernel([backend]):
            return flops / median_ms(fn) / 1e9
    except Exception as error:  # a backend that rejects the shape
        print("  skipped:", str(error).splitlines()[0][:100])
        return float("nan")


print("device", torch.cuda.get_device_name(0))
print(f"{'case':34s} {'flash TF/s':>11s} {'cudnn TF/s':>11s}")
for L in [1024, 4096, 16384]:
    q = torch.randn(16, H, L, D, device=dev, dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    flops = 4 * 16 * H * L * L * D / 2
    row = [tflops(flops, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), b)
           for _, b in BACKENDS]
    print(f"{'causal b16 seq ' + str(L):34s} {row[0]:11.1f} {row[1]:11.1f}", flush=True)
    del q, k, v

gen = torch.Generator().manual_seed(11)
lens = torch.randint(512, 1025, (16,), generator=gen).tolist()
flops = sum(4 * H * n * n * D / 2 for n in lens)
qs = [torch.randn(1, H, n, D, device=dev, dtype=torch.bfloat16) for n in lens]
Lmax = max(lens)
qp = torch.randn(16, H, Lmax, D, device=dev, dtype=torch.bfloat16)
best = []
for _, b in BACKENDS:
    per_request = tflops(flops, lambda: [F.scaled_dot_product_attention(x, x, x, is_causal=True)
                                         for x in qs], b)
    padded = tflops(flops, lambda: F.scaled_dot_product_attention(qp, qp, qp, is_causal=True), b)
    best.append(max(per_request, padded))
print(f"{'causal b16 uniform 512-1024 (best)':34s} {best[0]:11.1f} {best[1]:11.1f}", flush=True)

q = torch.randn(8, H, 128, D, device=dev, dtype=torch.bfloat16)
k = torch.randn(8, H, 32768, D, device=dev, dtype=torch.bfloat16)
v = torch.randn_like(k)
flops = 4 * 8 * H * 128 * 32768 * D
row = [tflops(flops, lambda: F.scaled_dot_product_attention(q, k, v), b) for _, b in BACKENDS]
print(f"{'append b8 128 on 32768':34s} {row[0]:11.1f} {row[1]:11.1f}", flush=True)
