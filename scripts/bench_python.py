#!/usr/bin/env python3
"""Attention as users call it: flare's Python wrappers next to FlashInfer and PyTorch SDPA
(cuDNN, flash), called the same ways in one process (issue 17).

For each case it measures
  - host time of plan() (flare, FlashInfer): wall time of one call, median of --plan-calls;
  - host time of run(): wall time of each of --run-calls back-to-back calls (no
    synchronization inside the loop), median (and 90th percentile);
  - GPU time in a CUDA graph: --graph-calls calls captured once, replayed, events around five
    back-to-back replays (flare and FlashInfer through their use_cuda_graph wrappers);
  - eager time: CUDA events around each call, median of --eager-calls (what a user who does not
    capture sees: host time shows wherever it exceeds the kernel's).
Decode: the decode issue's shapes (GQA 32/8, D 128, bf16, page 16, pages in allocation order,
tensor-core loops; SDPA on the same tokens laid out contiguously). Prefill: ragged causal, 16
heads, D 128, bf16, batch 16 at 1024 / 4096 / 16384 tokens (FlashInfer's fa2 and fa3 backends),
and plan() alone for batch 64 of lengths uniform in [1, 2047] (flare plan-latency's batch);
--rope plans the prefill cases with pos_encoding_mode="ROPE_LLAMA" (SDPA rows left out: they have
no RoPE).

FlashInfer is imported when present (scripts/gpu_check.sh unpacks ../shared/bench/flashinfer);
without it its columns say n/a. Usage:
  python3 scripts/bench_python.py [--only decode|prefill] [--rope] [--json FILE] [--quick]
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flare

try:
    import flashinfer
    FLASHINFER = getattr(flashinfer, "__version__", "?")
except Exception as error:  # noqa: BLE001 - any import failure means "not measured"
    flashinfer = None
    FLASHINFER = f"not importable: {str(error).splitlines()[0][:80]}"

Q_HEADS, KV_HEADS, HEAD_DIM, PAGE = 32, 8, 128, 16
DTYPE = torch.bfloat16
DECODE_CASES = [(1, 32768), (16, 4096), (16, 32768), (64, 8192)]
PLAN_ONLY_DECODE = [(256, 2048)]
PREFILL_LENGTHS = [1024, 4096, 16384]
PREFILL_BATCH, PREFILL_HEADS = 16, 16
WORKSPACE_BYTES = 256 << 20


def options():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["decode", "prefill"])
    parser.add_argument("--json", help="write every measurement here")
    parser.add_argument("--quick", action="store_true", help="fewer calls (a smoke run)")
    parser.add_argument("--rope", action="store_true",
                        help='prefill with pos_encoding_mode="ROPE_LLAMA" (no SDPA rows)')
    parser.add_argument("--run-calls", type=int, default=1000)
    parser.add_argument("--plan-calls", type=int, default=200)
    parser.add_argument("--graph-calls", type=int, default=20)
    parser.add_argument("--eager-calls", type=int, default=30)
    args = parser.parse_args()
    if args.quick:
        args.run_calls, args.plan_calls, args.graph_calls, args.eager_calls = 50, 20, 3, 5
    return args


# --- timing ---------------------------------------------------------------------------------

def host_us(call, calls, drain_every=0):
    """Median and 90th percentile wall time of `calls` back-to-back calls, microseconds; with
    drain_every, the stream drained (outside the timed calls) every that many calls: back-to-back
    calls whose GPU time exceeds their host time fill the driver's launch queue, and a timed call
    then waits for the GPU instead of the host."""
    torch.cuda.synchronize()
    times = []
    for i in range(calls):
        if drain_every and i % drain_every == 0:
            torch.cuda.synchronize()
        start = time.perf_counter_ns()
        call()
        times.append((time.perf_counter_ns() - start) / 1e3)
    torch.cuda.synchronize()
    times.sort()
    return statistics.median(times), times[int(0.9 * (len(times) - 1))]


def eager_us(call, calls):
    """Median GPU-clock time between events recorded around each call, microseconds."""
    for _ in range(3):
        call()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
    stops = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
    for start, stop in zip(starts, stops):
        start.record()
        call()
        stop.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, stops)) * 1e3


def capture_graph(call, calls):
    """A CUDA graph of `calls` calls, after one warm-up call outside the capture (first calls may
    compile or allocate), replayed once."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            call()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def graph_us(call, calls):
    """GPU time of one call from a replayed capture of `calls` calls, microseconds."""
    graph = capture_graph(call, calls)
    # Events around five back-to-back replays: the host's submission of a replay, before its first
    # kernel starts, is counted once in five replays instead of once a replay (graphs of few
    # calls: prefill at L1024 captures three).
    replays = []
    for _ in range(5):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            graph.replay()
        stop.record()
        torch.cuda.synchronize()
        replays.append(start.elapsed_time(stop) * 1e3 / (5 * calls))
    return statistics.median(replays)


def guarded(label, measure):
    """measure() or None with the reason printed: one library's failure leaves the others."""
    try:
        return measure()
    except Exception as error:  # noqa: BLE001
        print(f"  {label}: {type(error).__name__}: {str(error).splitlines()[0][:160]}")
        return None


def small_op_arguments(doc, add=None):
    """The parsed --calls / --json arguments of a script timing small operations beside
    FlashInfer (bench_rope_apply.py, bench_rope_decode.py, bench_state_ops.py; `add(parser)`
    adds its own), torch seeded and the device line printed."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--json", help="write every row here")
    if add is not None:
        add(parser)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"flashinfer {FLASHINFER}")
    return args


def small_op_times(call, calls):
    """A small operation's GPU time in a CUDA-graph replay, eager time and host time (us)."""
    return {"graph_us": graph_us(call, calls), "eager_us": eager_us(call, calls),
            "host_us": host_us(call, 200)[0]}


def write_json(path, rows):
    """rows into `path` as JSON (nothing without a path)."""
    if path:
        with open(path, "w") as f:
            json.dump(rows, f, indent=1)


# --- decode ---------------------------------------------------------------------------------

def decode_inputs(batch, kv_len):
    pages_per = kv_len // PAGE
    pages = batch * pages_per
    cache = torch.randn(pages, 2, PAGE, KV_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
    indptr = torch.arange(0, pages + 1, pages_per, dtype=torch.int32)
    indices = torch.arange(pages, dtype=torch.int32, device="cuda")  # allocation order
    last = torch.full((batch,), PAGE, dtype=torch.int32)
    q = torch.randn(batch, Q_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
    return cache, indptr, indices, last, q


def decode_wrapper(module, workspace, graph, batch, pages, use_tensor_cores=True):
    if not graph:
        return module.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD",
                                                         use_tensor_cores=use_tensor_cores)
    buffers = dict(
        paged_kv_indptr_buffer=torch.empty(batch + 1, dtype=torch.int32, device="cuda"),
        paged_kv_indices_buffer=torch.empty(pages, dtype=torch.int32, device="cuda"),
        paged_kv_last_page_len_buffer=torch.empty(batch, dtype=torch.int32, device="cuda"))
    return module.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_cuda_graph=True,
                                                     use_tensor_cores=use_tensor_cores, **buffers)


def measure_decode_library(module, workspace, batch, kv_len, inputs, args, plan_only=False):
    cache, indptr, indices, last, q = inputs

    def plan(wrapper):
        wrapper.plan(indptr, indices, last, Q_HEADS, KV_HEADS, HEAD_DIM, PAGE,
                     q_data_type=DTYPE, kv_data_type=DTYPE)

    wrapper = decode_wrapper(module, workspace, False, batch, indices.shape[0])
    plan(wrapper)
    row = {"plan_us": host_us(lambda: plan(wrapper), args.plan_calls)[0]}
    if plan_only:
        return row
    out = wrapper.run(q, cache)
    row["run_us"], row["run_p90_us"] = host_us(lambda: wrapper.run(q, cache), args.run_calls)
    row["eager_us"] = eager_us(lambda: wrapper.run(q, cache, out=out), args.eager_calls)
    graphed = decode_wrapper(module, workspace, True, batch, indices.shape[0])
    plan(graphed)
    row["graph_us"] = graph_us(lambda: graphed.run(q, cache, out=out), args.graph_calls)
    return row


def measure_decode_sdpa(backend, batch, kv_len, args):
    q = torch.randn(batch, Q_HEADS, 1, HEAD_DIM, device="cuda", dtype=DTYPE)
    k = torch.randn(batch, KV_HEADS, kv_len, HEAD_DIM, device="cuda", dtype=DTYPE)
    v = torch.randn_like(k)

    def call():
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    call()
    row = {}
    row["run_us"], row["run_p90_us"] = host_us(call, args.run_calls)
    row["eager_us"] = eager_us(call, args.eager_calls)
    row["graph_us"] = graph_us(call, args.graph_calls)
    return row


def bench_decode(args, workspace):
    results = []
    for batch, kv_len in DECODE_CASES + PLAN_ONLY_DECODE:
        plan_only = (batch, kv_len) in PLAN_ONLY_DECODE
        case = {"case": f"decode b{batch} kv{kv_len}", "kv_bytes": 2 * batch * kv_len *
                KV_HEADS * HEAD_DIM * 2}
        print(f"{case['case']}")
        inputs = decode_inputs(batch, kv_len)
        case["flare"] = guarded("flare", lambda: measure_decode_library(
            flare, workspace, batch, kv_len, inputs, args, plan_only))
        if flashinfer is not None:
            case["flashinfer"] = guarded("flashinfer", lambda: measure_decode_library(
                flashinfer, workspace, batch, kv_len, inputs, args, plan_only))
        inputs = None  # frees the cache before the SDPA copies
        if not plan_only:
            for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION),
                                  ("flash", SDPBackend.FLASH_ATTENTION)):
                case[name] = guarded(name, lambda: measure_decode_sdpa(backend, batch, kv_len,
                                                                       args))
        torch.cuda.empty_cache()
        results.append(case)
    return results


# --- prefill --------------------------------------------------------------------------------

def prefill_wrapper(module, workspace, backend, graph, batch):
    kwargs = {} if backend is None else {"backend": backend}
    if graph:
        kwargs.update(use_cuda_graph=True,
                      qo_indptr_buf=torch.empty(batch + 1, dtype=torch.int32, device="cuda"),
                      kv_indptr_buf=torch.empty(batch + 1, dtype=torch.int32, device="cuda"))
    return module.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", **kwargs)


def measure_prefill_library(module, backend, workspace, length, args, host_runs,
                            rope_staging=None):
    total = PREFILL_BATCH * length
    indptr = torch.arange(0, total + 1, length, dtype=torch.int32)
    q = torch.randn(total, PREFILL_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
    k, v = torch.randn_like(q), torch.randn_like(q)

    def plan(wrapper):
        wrapper.plan(indptr, indptr, PREFILL_HEADS, PREFILL_HEADS, HEAD_DIM, causal=True,
                     q_data_type=DTYPE, kv_data_type=DTYPE,
                     pos_encoding_mode="ROPE_LLAMA" if args.rope else "NONE",
                     **({} if rope_staging is None else {"rope_staging": rope_staging}))

    wrapper = prefill_wrapper(module, workspace, backend, False, PREFILL_BATCH)
    plan(wrapper)
    out = wrapper.run(q, k, v)
    row = {}
    if host_runs:
        row["plan_us"] = host_us(lambda: plan(wrapper), args.plan_calls)[0]
        # At most 200 calls: 1000 back-to-back runs over a kernel far longer than the call
        # fill the driver's launch queue (sooner with flare's ~1-2 KB launch parameters) and
        # time the GPU (docs/perf.md forty-second session D: 265 us "host" at L1024 RoPE).
        row["run_us"], row["run_p90_us"] = host_us(lambda: wrapper.run(q, k, v),
                                                   min(args.run_calls, 200))
    row["eager_us"] = eager_us(lambda: wrapper.run(q, k, v, out=out), args.eager_calls)
    graphed = prefill_wrapper(module, workspace, backend, True, PREFILL_BATCH)
    plan(graphed)
    row["graph_us"] = graph_us(lambda: graphed.run(q, k, v, out=out),
                               max(1, args.graph_calls * 1024 // length))
    return row


def measure_prefill_sdpa(backend, length, args):
    q = torch.randn(PREFILL_BATCH, PREFILL_HEADS, length, HEAD_DIM, device="cuda", dtype=DTYPE)
    k, v = torch.randn_like(q), torch.randn_like(q)

    def call():
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    call()
    return {"eager_us": eager_us(call, args.eager_calls),
            "graph_us": graph_us(call, max(1, args.graph_calls * 1024 // length))}


def measure_prefill_plan(module, backend, workspace, args):
    """plan() of batch 64, q_len = kv_len uniform in [1, 2047], causal (flare plan-latency's
    prefill batch)."""
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 2048, (64,), generator=generator)
    indptr = torch.zeros(65, dtype=torch.int32)
    indptr[1:] = torch.cumsum(lengths, 0)
    wrapper = prefill_wrapper(module, workspace, backend, False, 64)

    def plan():
        wrapper.plan(indptr, indptr, 32, 8, HEAD_DIM, causal=True, q_data_type=DTYPE,
                     kv_data_type=DTYPE)

    plan()
    return {"plan_us": host_us(plan, args.plan_calls)[0]}


def bench_prefill(args, workspace):
    results = []
    # flare's default ("auto": the Hopper family on sm_90) and its FA2 family side by side.
    libraries = [("flare", flare, None), ("flare fa2", flare, "fa2")]
    # RoPE: flare's default under use_cuda_graph is fused; "staged" (its k copy's room fixed
    # by the first plan) is the graph's opt-in.
    staged = [("flare staged", flare, None)] if args.rope else []
    if flashinfer is not None:
        # FlashInfer's fa3 backend plans ROPE_LLAMA and runs without it (bench_variants.py):
        # not the same attention, not timed.
        if not args.rope:
            libraries.append(("flashinfer fa3", flashinfer, "fa3"))
        libraries.append(("flashinfer fa2", flashinfer, "fa2"))
    for length in PREFILL_LENGTHS:
        flops = 4 * PREFILL_BATCH * PREFILL_HEADS * HEAD_DIM * length * (length + 1) / 2
        case = {"case": f"prefill b{PREFILL_BATCH} L{length}", "flops": flops}
        print(case["case"])
        for name, module, backend in libraries + staged:
            case[name] = guarded(name, lambda: measure_prefill_library(
                module, backend, workspace, length, args, host_runs=length == 1024,
                rope_staging="staged" if name == "flare staged" else None))
        for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION),
                              ("flash", SDPBackend.FLASH_ATTENTION)):
            if not args.rope:
                case[name] = guarded(name, lambda: measure_prefill_sdpa(backend, length, args))
        torch.cuda.empty_cache()
        results.append(case)
    case = {"case": "prefill plan b64 (lengths 1-2047)"}
    print(case["case"])
    for name, module, backend in libraries:
        case[name] = guarded(name, lambda: measure_prefill_plan(module, backend, workspace, args))
    results.append(case)
    return results


# --- tables ---------------------------------------------------------------------------------

def cell(row, key, digits=1):
    if not row or row.get(key) is None:
        return "n/a"
    return f"{row[key]:.{digits}f}"


def print_tables(args, decode, prefill):
    print(f"\ndevice: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"flashinfer {FLASHINFER}")
    if decode:
        print("\n| decode (us; TB/s of KV) | library | plan() host | run() host (p90) | "
              "GPU in graph | eager | eager TB/s | graph TB/s |")
        print("|---|---|---|---|---|---|---|---|")
        for case in decode:
            for name in ("flare", "flashinfer", "cudnn", "flash"):
                row = case.get(name)
                if name not in case:
                    continue
                tbps = {k: (case["kv_bytes"] / (row[k] * 1e-6) / 1e12 if row and row.get(k)
                            else None) for k in ("eager_us", "graph_us")}
                print(f"| {case['case']} | {name} | {cell(row, 'plan_us')} | "
                      f"{cell(row, 'run_us')} ({cell(row, 'run_p90_us')}) | "
                      f"{cell(row, 'graph_us')} | {cell(row, 'eager_us')} | "
                      f"{cell(tbps, 'eager_us', 2)} | {cell(tbps, 'graph_us', 2)} |")
    if prefill:
        kind = "causal RoPE" if args.rope else "causal"
        print(f"\n| prefill {kind} (TFLOP/s; us) | library | plan() host | run() host (p90) | "
              "graph TFLOP/s | eager TFLOP/s |")
        print("|---|---|---|---|---|---|")
        for case in prefill:
            for name in ("flare", "flare staged", "flare fa2", "flashinfer fa3",
                         "flashinfer fa2", "cudnn", "flash"):
                if name not in case:
                    continue
                row = case[name]
                rate = {k: (case["flops"] / (row[k] * 1e-6) / 1e12
                            if "flops" in case and row and row.get(k) else None)
                        for k in ("graph_us", "eager_us")}
                print(f"| {case['case']} | {name} | {cell(row, 'plan_us')} | "
                      f"{cell(row, 'run_us')} ({cell(row, 'run_p90_us')}) | "
                      f"{cell(rate, 'graph_us')} | {cell(rate, 'eager_us')} |")


def main():
    args = options()
    torch.manual_seed(0)
    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    decode = bench_decode(args, workspace) if args.only != "prefill" else []
    prefill = bench_prefill(args, workspace) if args.only != "decode" else []
    print_tables(args, decode, prefill)
    write_json(args.json, {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                           "flashinfer": FLASHINFER, "decode": decode, "prefill": prefill})


if __name__ == "__main__":
    main()
