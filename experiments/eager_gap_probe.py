"""Where flare's ragged causal prefill b16 h16 L1024 D128 loses time through Python (issues 17
and 19): eager against CUDA graph against the kernel alone, cuDNN in the same process (docs/perf.md,
thirty-seventh session C: the eager gap seen after torch.manual_seed did not repeat in the
thirty-eighth; thirty-eighth session: the graph row). Not a user script.

Prints, for flare's ragged wrapper (auto backend) and SDPA cuDNN in the same process:
  - eager time with events around each call (bench_python.py's method), PDL on and off;
  - events around 30 back-to-back calls, divided by 30;
  - the GPU time of a replayed graph of 3 calls (bench_python.py's graph_us);
  - the kernels one eager call launches (torch.profiler / CUPTI), their durations and the idle
    gaps between consecutive kernels of 6 calls (with and without events between calls).
Usage (GPU machine, flare installed): python3 experiments/eager_gap_probe.py [length]
[bench-sequence | graph-gap] (bench-sequence: eager per call after bench_python.py's steps
before it; graph-gap: the function below)
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
from bench_python import capture_graph, eager_us, graph_us  # noqa: E402
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


def print_trace(label, work):
    """The device events of work() under torch.profiler (CUPTI) in start order: durations and the
    idle gaps between consecutive ones."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        work()
        torch.cuda.synchronize()
    kernels = sorted((e for e in prof.events() if e.device_type.name == "CUDA"),
                     key=lambda e: e.time_range.start)
    print(f"-- {label}: {len(kernels)} device events")
    last_end = None
    for e in kernels:
        gap = "" if last_end is None else f" gap {e.time_range.start - last_end:.1f}"
        print(f"   {e.name[:60]:60s} {e.time_range.elapsed_us():8.1f} us{gap}")
        last_end = e.time_range.end


def kernel_trace(label, call, with_events):
    for _ in range(3):
        call()
    torch.cuda.synchronize()

    def six_calls():
        for _ in range(6):
            if with_events:
                torch.cuda.Event(enable_timing=True).record()
            call()
    print_trace(f"{label}, 6 calls", six_calls)


def graph_trace(label, call):
    """The kernels of two replays of a captured graph of 3 calls (torch.profiler / CUPTI), their
    durations and the idle gaps between consecutive kernels."""
    graph = capture_graph(call, 3)
    for _ in range(2):
        graph.replay()
    torch.cuda.synchronize()

    def two_replays():
        graph.replay()
        graph.replay()
    print_trace(f"{label}, two replays of 3 calls", two_replays)


def graph_gap(w, gw, q, k, v, out, sdpa):
    """Thirty-eighth session: bench_python's graph row of flare at L1024 (176-178 us) sits ~9%
    above its eager row (162 us) while cuDNN's graph row is at or under its eager one. Three
    interleaved rounds of: the plain wrapper eager; the use_cuda_graph wrapper eager, in a graph
    of 3, and in a graph of 3 with PDL off; cuDNN eager and in a graph of 3; the SM clock
    (NVML) before each round. Then CUPTI traces of the two graphs."""
    rows = {
        "plain wrapper, eager": lambda: per_call(lambda: w.run(q, k, v, out=out)),
        "graph wrapper, eager": lambda: per_call(lambda: gw.run(q, k, v, out=out)),
        "graph wrapper, graph of 3": lambda: graphed(lambda: gw.run(q, k, v, out=out)),
        "graph wrapper, graph of 3, no PDL": lambda: graphed(
            lambda: gw.run(q, k, v, out=out, enable_pdl=False)),
        "cudnn, eager": lambda: per_call(sdpa),
        "cudnn, graph of 3": lambda: graphed(sdpa),
    }
    for round_ in range(3):
        print(f"round {round_ + 1}: SM clock {torch.cuda.clock_rate()} MHz")
        for name, measure in rows.items():
            print(f"   {name:36s} {rate(measure())}")
    graph_trace("flare graph wrapper, graph of 3", lambda: gw.run(q, k, v, out=out))
    graph_trace("flare graph wrapper, graph of 3, no PDL",
                lambda: gw.run(q, k, v, out=out, enable_pdl=False))
    graph_trace("cudnn, graph of 3", sdpa)


def rate(us):
    return f"{us:7.1f} us {FLOPS / us / 1e6:6.1f} TFLOP/s"


def main():
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
    if len(sys.argv) > 2 and sys.argv[2] == "graph-gap":
        graph_gap(w, gw, q, k, v, out, sdpa)
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
