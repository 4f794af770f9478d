"""Why bench_python.py's eager ragged causal prefill b16 h16 L1024 D128 runs ~7% under its CUDA
graph (issue 17: "prefill b16 L1024 through Python within 5% of the same kernel timed from
C++"; thirty-seventh session: not in a clean process, but on tensors drawn after
torch.manual_seed, docs/perf.md). Not a user script.

Prints, for flare's ragged wrapper (auto backend) and SDPA cuDNN in the same process:
  - eager time with events around each call (bench_python.py's method), PDL on and off;
  - events around 30 back-to-back calls, divided by 30;
  - the GPU time of a replayed graph of 3 calls (bench_python.py's graph_us);
  - the kernels one eager call launches (torch.profiler / CUPTI), their durations and the idle
    gaps between consecutive kernels of 6 calls (with and without events between calls).
Usage (GPU machine, flare installed): python3 experiments/eager_gap_probe.py [length]
[bench-sequence | seed-ab | bench-seed] (bench-sequence: eager per call after bench_python.py's
steps before it; seed-ab, bench-seed: the functions below)
"""
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flare

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "scripts"), HERE]
import bench_python  # noqa: E402  (imports FlashInfer where it can)
from bench_python import eager_us, graph_us  # noqa: E402
from eager_timing import time_runs  # noqa: E402

B, H, D = 16, 16, 128
L = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
FLOPS = 4 * B * H * D * L * (L + 1) / 2


def per_call(call):
    return eager_us(call, 30)  # bench_python.py's eager time: events around each of 30 calls


def batched(call):
    return time_runs(call, repeats=30, rounds=5)  # events around 30 back-to-back calls


def graphed(call):
    return graph_us(call, 3)  # bench_python.py's graph time, three calls a graph


def kernel_trace(label, call, with_events):
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(6):
            if with_events:
                torch.cuda.Event(enable_timing=True).record()
            call()
        torch.cuda.synchronize()
    kernels = sorted((e for e in prof.events() if e.device_type.name == "CUDA"),
                     key=lambda e: e.time_range.start)
    print(f"-- {label}: {len(kernels)} device events in 6 calls")
    last_end = None
    for e in kernels:
        gap = "" if last_end is None else f" gap {e.time_range.start - last_end:.1f}"
        print(f"   {e.name[:60]:60s} {e.time_range.elapsed_us():8.1f} us{gap}")
        last_end = e.time_range.end


def seed_ab(w, indptr, q, k, v, out):
    """The thirty-seventh session's open question: in one process, flare's eager time on tensors
    drawn before any torch.manual_seed was ~165 us, and ~187 us on tensors drawn after
    torch.manual_seed(0 / 1 / 123) (bench_python.py seeds), same statistics, same kernel;
    cuDNN 155 us on either. Separates the call from the data: A drawn unseeded (main() drew q,
    k, v before this), measured; then manual_seed(0) with A kept; then B drawn seeded; then B's
    values copied into A's storage; cuDNN on A's and B's values."""
    def eager(q_, k_, v_):
        return rate(per_call(lambda: w.run(q_, k_, v_, out=out)))

    def cudnn(q_, k_, v_):
        qs, ks, vs = (x.view(B, L, H, D).transpose(1, 2).contiguous() for x in (q_, k_, v_))
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return rate(per_call(lambda: F.scaled_dot_product_attention(qs, ks, vs,
                                                                        is_causal=True)))

    print(f"A (unseeded values)                 flare {eager(q, k, v)} | cudnn {cudnn(q, k, v)}")
    torch.manual_seed(0)
    print(f"A again, after torch.manual_seed(0) flare {eager(q, k, v)}")
    qb = torch.randn_like(q)
    kb, vb = torch.randn_like(qb), torch.randn_like(qb)
    print(f"B (seeded values)                   flare {eager(qb, kb, vb)} | "
          f"cudnn {cudnn(qb, kb, vb)}")
    print(f"A again                             flare {eager(q, k, v)}")
    a_values = (q.clone(), k.clone(), v.clone())
    for dst, src in zip((q, k, v), (qb, kb, vb)):
        dst.copy_(src)
    print(f"B's values in A's storage           flare {eager(q, k, v)}")
    for dst, src in zip((qb, kb, vb), a_values):
        dst.copy_(src)
    print(f"A's values in B's storage           flare {eager(qb, kb, vb)}")
    print(f"B's q, A's k and v                  flare {eager(q, kb, vb)}")


def bench_seed():
    """bench_python.py's own decode (b16 kv4096, tensor cores) and prefill (L1024) rows, flare's
    and cuDNN's, on tensors drawn before any torch.manual_seed, then after torch.manual_seed(0)
    (as bench_python.py's main() seeds): does the seed move the decode rows too (issue 17's
    eager decode at 0.95x cuDNN)?"""
    sys.argv = sys.argv[:1]
    args = bench_python.options()
    workspace = torch.empty(bench_python.WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    cudnn = SDPBackend.CUDNN_ATTENTION
    for label in ("unseeded", "after torch.manual_seed(0)"):
        if label != "unseeded":
            torch.manual_seed(0)
        inputs = bench_python.decode_inputs(16, 4096)
        rows = {
            "decode b16 kv4096 flare": bench_python.measure_decode_library(
                flare, workspace, 16, 4096, inputs, args),
            "decode b16 kv4096 cudnn": bench_python.measure_decode_sdpa(cudnn, 16, 4096, args),
            "prefill L1024 flare": bench_python.measure_prefill_library(
                flare, None, workspace, 1024, args, host_runs=False),
            "prefill L1024 cudnn": bench_python.measure_prefill_sdpa(cudnn, 1024, args),
        }
        for name, row in rows.items():
            print(f"{label:28s} {name:24s} eager {row['eager_us']:7.1f} us, "
                  f"graph {row['graph_us']:7.1f} us")


def rate(us):
    return f"{us:7.1f} us {FLOPS / us / 1e6:6.1f} TFLOP/s"


def main():
    if len(sys.argv) > 2 and sys.argv[2] == "bench-seed":
        bench_seed()
        return
    total = B * L
    indptr = torch.arange(0, total + 1, L, dtype=torch.int32)
    q = torch.randn(total, H, D, device="cuda", dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    w = flare.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD")
    w.plan(indptr, indptr, H, H, D, causal=True, q_data_type=torch.bfloat16,
           kv_data_type=torch.bfloat16)
    out = w.run(q, k, v)
    gw = flare.BatchPrefillWithRaggedKVCacheWrapper(
        torch.empty(256 << 20, dtype=torch.uint8, device="cuda"), "NHD", use_cuda_graph=True,
        qo_indptr_buf=torch.empty(B + 1, dtype=torch.int32, device="cuda"),
        kv_indptr_buf=torch.empty(B + 1, dtype=torch.int32, device="cuda"))
    gw.plan(indptr, indptr, H, H, D, causal=True, q_data_type=torch.bfloat16,
            kv_data_type=torch.bfloat16)
    qs = q.view(B, L, H, D).transpose(1, 2).contiguous()
    ks, vs = torch.randn_like(qs), torch.randn_like(qs)

    def sdpa():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)

    calls = {
        "flare eager (pdl)": lambda: w.run(q, k, v, out=out),
        "flare eager (no pdl)": lambda: w.run(q, k, v, out=out, enable_pdl=False),
        "flare graph wrapper, eager": lambda: gw.run(q, k, v, out=out),
        "cudnn": sdpa,
    }
    print(f"causal b{B} h{H} L{L} D{D} bf16 ({torch.cuda.get_device_name()})")
    if len(sys.argv) > 2 and sys.argv[2] == "seed-ab":
        seed_ab(w, indptr, q, k, v, out)
        return
    if len(sys.argv) > 2 and sys.argv[2] == "bench-sequence":
        # bench_python.py's order before its eager timing: plan() 20 times, then 50 run()
        # without out=, each step timed alone.
        eager = calls["flare eager (pdl)"]
        print(f"fresh wrapper               per call {rate(per_call(eager))}")
        for _ in range(20):
            w.plan(indptr, indptr, H, H, D, causal=True, q_data_type=torch.bfloat16,
                   kv_data_type=torch.bfloat16)
        print(f"after 20 plan()             per call {rate(per_call(eager))}")
        for _ in range(50):
            w.run(q, k, v)
        print(f"after 50 run() without out  per call {rate(per_call(eager))}")
        print(f"again                       per call {rate(per_call(eager))}")
        return
    for name, call in calls.items():
        graph = rate(graphed(call)) if "eager (" not in name else "n/a (eager wrapper)"
        print(f"{name:28s} per call {rate(per_call(call))} | 30 batched {rate(batched(call))}"
              f" | graph of 3 {graph}")
    kernel_trace("flare eager (pdl), events between", calls["flare eager (pdl)"], True)
    kernel_trace("flare eager (pdl), back to back", calls["flare eager (pdl)"], False)
    kernel_trace("flare eager (no pdl), back to back", calls["flare eager (no pdl)"], False)
    kernel_trace("flare graph wrapper, eager, back to back", calls["flare graph wrapper, eager"],
                 False)
    kernel_trace("cudnn, back to back", sdpa, False)


if __name__ == "__main__":
    main()
