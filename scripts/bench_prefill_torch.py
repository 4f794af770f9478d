# PyTorch SDPA (flash, cuDNN) on the shapes of scripts/bench_prefill.cpp, in the same run:
# bf16, causal, batch 16, 16 heads, head_dim 128; the uniform 512-1024 and Zipf (mean 1024)
# batches padded and request by request (the faster counts); append 128 on 32768 (non-causal
# SDPA: top-left causal would be wrong for q_len < kv_len, and the 128-token triangle is 0.2% of
# the work), and those 128 tokens as 128 one-token decode steps.
# FLARE_BENCH_ONLY=<substring> runs only the cases whose name contains it (as the C++ bench).
# --print-zipf-lengths prints the Zipf batch and exits (no GPU, no torch), to compare with
# `bench_prefill --print-zipf-lengths`.
import os
import sys

MASK64 = (1 << 64) - 1
ZIPF_MIN_LEN, ZIPF_MAX_LEN = 16, 16384
ZIPF_SEED = 2024


def splitmix64(state):
    """Returns (new state, next 64-bit value), as splitmix64() in bench_prefill.cpp."""
    state = (state + 0x9E3779B97F4A7C15) & MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return state, z ^ (z >> 31)


def zipf_lengths(batch, mean, seed):
    """zipf_lengths() of bench_prefill.cpp line by line (integer arithmetic only, so both give
    the same list): a bounded power law of density ~ x^-1.5 on [16, 16384], scaled by the
    smallest multiple of 1/1024 whose clipped sum reaches batch * mean, the excess taken off
    the first longest request."""
    assert batch >= 1 and ZIPF_MIN_LEN <= mean <= ZIPF_MAX_LEN, (batch, mean)
    steps, span = 1 << 20, 32
    raw, state = [], seed
    for _ in range(batch):
        state, x = splitmix64(state)
        m = steps + x % ((span - 1) * steps + 1)
        raw.append(ZIPF_MAX_LEN * steps * steps // (m * m))

    def scaled(scale):
        return [min(max(x * scale // 1024, ZIPF_MIN_LEN), ZIPF_MAX_LEN) for x in raw]

    target = batch * mean
    lo, hi = 1, 1 << 20
    while lo < hi:
        mid = (lo + hi) // 2
        if sum(scaled(mid)) < target:
            lo = mid + 1
        else:
            hi = mid
    lengths = scaled(lo)
    longest = lengths.index(max(lengths))
    lengths[longest] -= sum(lengths) - target
    assert lengths[longest] >= ZIPF_MIN_LEN, lengths
    return lengths


def print_lengths(label, lengths):
    """The line bench_prefill.cpp's print_lengths() prints."""
    total = sum(lengths)
    print(f"{label}: batch {len(lengths)}, min {min(lengths)}, max {max(lengths)}, "
          f"mean {total / len(lengths):.1f}, sum {total}: " + " ".join(map(str, lengths)))


ZIPF = zipf_lengths(16, 1024, ZIPF_SEED)
if "--print-zipf-lengths" in sys.argv[1:]:
    print_lengths("zipf lengths", ZIPF)
    sys.exit(0)

# torch only past this point: the length check above runs without it.
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

ONLY = os.environ.get("FLARE_BENCH_ONLY")


def selected(name):
    return ONLY is None or ONLY in name


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


def backend_ms(fn, backend):
    """Median ms of fn under one SDPA backend; NaN (with a note) if the backend rejects it."""
    try:
        with sdpa_kernel([backend]):
            return median_ms(fn)
    except Exception as error:  # a backend that rejects the shape
        print("  skipped:", str(error).splitlines()[0][:100])
        return float("nan")


def tflops(flops, fn, backend):
    return flops / backend_ms(fn, backend) / 1e9


def best_of(*values):
    """The largest non-NaN value (NaN if all are NaN: no backend ran it)."""
    finite = [x for x in values if x == x]
    return max(finite) if finite else float("nan")


def variable_length_row(name, lens):
    """Causal batch of per-request lengths: the faster of padded to the max length and request
    by request, FLOPs of the real (unpadded) causal triangles."""
    flops = sum(4 * H * n * n * D / 2 for n in lens)
    qs = [torch.randn(1, H, n, D, device=dev, dtype=torch.bfloat16) for n in lens]
    qp = torch.randn(len(lens), H, max(lens), D, device=dev, dtype=torch.bfloat16)
    best = []
    for _, b in BACKENDS:
        per_request = tflops(flops, lambda: [F.scaled_dot_product_attention(x, x, x, is_causal=True)
                                             for x in qs], b)
        padded = tflops(flops, lambda: F.scaled_dot_product_attention(qp, qp, qp, is_causal=True),
                        b)
        best.append(best_of(per_request, padded))
    print(f"{name + ' (best)':34s} {best[0]:11.1f} {best[1]:11.1f}", flush=True)


print("device", torch.cuda.get_device_name(0))
print(f"{'case':34s} {'flash TF/s':>11s} {'cudnn TF/s':>11s}")
for L in [1024, 4096, 16384]:
    name = "causal b16 seq " + str(L)
    if not selected(name):
        continue
    q = torch.randn(16, H, L, D, device=dev, dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    flops = 4 * 16 * H * L * L * D / 2
    row = [tflops(flops, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), b)
           for _, b in BACKENDS]
    print(f"{name:34s} {row[0]:11.1f} {row[1]:11.1f}", flush=True)
    del q, k, v

def uniform_lengths(batch, seed):
    """The uniform 512-1024 list of bench_prefill.cpp (splitmix64, same seed)."""
    state, lengths = seed, []
    for _ in range(batch):
        state, x = splitmix64(state)
        lengths.append(512 + x % 513)
    return lengths


if selected("causal b16 uniform 512-1024"):
    variable_length_row("causal b16 uniform 512-1024", uniform_lengths(16, 11))
    torch.cuda.empty_cache()

if selected("causal b16 zipf mean 1024"):
    print_lengths("zipf lengths", ZIPF)
    variable_length_row("causal b16 zipf mean 1024", ZIPF)
    torch.cuda.empty_cache()

# Append: 128 new tokens per request on a 32768-token cache; then the same 128 tokens as 128
# one-token SDPA calls, step t against the first 32768 - 127 + t keys (what token t sees),
# timed as one Python loop end to end (launch overhead included, like flare's plan+run loop).
APPEND_NAME, VERSUS_NAME = "append b8 128 on 32768", "append vs decode b8 128 on 32768"
if selected(APPEND_NAME) or selected(VERSUS_NAME):
    NEW, CACHE = 128, 32768
    q = torch.randn(8, H, NEW, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(8, H, CACHE, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    flops = 4 * 8 * H * NEW * CACHE * D
    append_ms = [backend_ms(lambda: F.scaled_dot_product_attention(q, k, v), b)
                 for _, b in BACKENDS]
    if selected(APPEND_NAME):
        print(f"{APPEND_NAME:34s} {flops / append_ms[0] / 1e9:11.1f} "
              f"{flops / append_ms[1] / 1e9:11.1f}", flush=True)
    if selected(VERSUS_NAME):
        def decode_steps():
            for t in range(NEW):
                kv_len = CACHE - (NEW - 1) + t
                F.scaled_dot_product_attention(q[:, :, t:t + 1], k[:, :, :kv_len],
                                               v[:, :, :kv_len])
        parts = []
        for (label, b), append in zip(BACKENDS, append_ms):
            decode = backend_ms(decode_steps, b)
            parts.append(f"{label}: append {append:.3f} ms, 128 decode steps {decode:.3f} ms, "
                         f"speedup {decode / append:.1f}x")
        print(f"{VERSUS_NAME:34s} " + " | ".join(parts), flush=True)
