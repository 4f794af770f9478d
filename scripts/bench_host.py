#!/usr/bin/env python3
"""Host time of every public flare wrapper's run() (and plan()), next to FlashInfer's wrapper of
the same name called the same way in the same process (issue 17: run() <= 10 us for every
wrapper, at the median of 1000 back-to-back calls with CUDA tensors, no synchronization inside
the loop).

The problems are small. bf16, 32 query / 8 KV heads (block-sparse and the variant: 16 / 16),
head dim 128, page 16, NHD. Each row: plan() median of --plan-calls, back to back and (in
parentheses) each on an idle stream; run() median and 90th percentile of --run-calls calls with
the stream drained every 16 calls (outside the timed calls: where a call's GPU time exceeds its
host time, back-to-back calls fill the driver's launch queue and then time the GPU; the
back-to-back median is the next column); the kernel launches a run()
makes (torch.profiler; each costs ~2-3 us of host time); its GPU time in a CUDA-graph replay
(only where the run() can be captured as used here: CAPTURABLE).
FlashInfer's column is n/a where it is not importable (carry .anchors-fi: gpu_check.sh python)
or where its wrapper rejects the case (the reason prints).
Usage: python3 scripts/bench_host.py [--run-calls 1000] [--plan-calls 100] [--only NAME]
  [--json FILE]
"""
import argparse
import math
import warnings

import torch

import flare
from bench_python import FLASHINFER, flashinfer, graph_us, guarded, host_us, write_json

Q_HEADS, KV_HEADS, HEAD_DIM, PAGE, DTYPE = 32, 8, 128, 16, torch.bfloat16
MHA_HEADS = 16
WORKSPACE_BYTES = 128 << 20


def cuda(x):
    return x.to("cuda")


class Paged:
    """batch requests of kv_len tokens each in a page-16 NHD cache, pages shuffled."""

    def __init__(self, batch, kv_len, first_page=0):
        self.batch, self.kv_len = batch, kv_len
        per = (kv_len + PAGE - 1) // PAGE
        self.pages = first_page + batch * per
        self.cache = torch.randn(self.pages, 2, PAGE, KV_HEADS, HEAD_DIM, device="cuda",
                                 dtype=DTYPE)
        self.indptr = torch.arange(0, batch * per + 1, per, dtype=torch.int32)
        self.indices = cuda(first_page + torch.randperm(batch * per).to(torch.int32))
        self.last = torch.full((batch,), kv_len - (per - 1) * PAGE, dtype=torch.int32)


# --- the cases: each returns (plan, run) closures for one library module -------------------------

def decode(module, workspace, tensor_cores=True, graph=False):
    p = Paged(16, 256)
    q = torch.randn(16, Q_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
    out = torch.empty_like(q)
    if graph:
        wrapper = module.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
            workspace, cuda(p.indptr), torch.empty_like(p.indices), cuda(p.last), "NHD",
            use_tensor_cores=tensor_cores)
    else:
        wrapper = module.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD",
                                                            use_tensor_cores=tensor_cores)

    def plan():
        wrapper.plan(p.indptr, p.indices, p.last, Q_HEADS, KV_HEADS, HEAD_DIM, PAGE,
                     q_data_type=DTYPE, kv_data_type=DTYPE)

    return plan, lambda: wrapper.run(q, p.cache, out=out)


def paged_prefill(module, workspace, sink=False):
    p = Paged(4, 300)
    qo_indptr = torch.arange(0, 4 * 64 + 1, 64, dtype=torch.int32)
    q = torch.randn(4 * 64, Q_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
    out = torch.empty_like(q)
    if sink:
        wrapper = module.BatchAttentionWithAttentionSinkWrapper(
            workspace, "NHD", q_data_type=DTYPE, kv_data_type=DTYPE, head_dim_qk=HEAD_DIM,
            head_dim_vo=HEAD_DIM)
        sinks = torch.randn(Q_HEADS, device="cuda")
    else:
        wrapper = module.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")

    def plan():
        wrapper.plan(qo_indptr, p.indptr, p.indices, p.last, Q_HEADS, KV_HEADS, HEAD_DIM, PAGE,
                     causal=True, q_data_type=DTYPE, kv_data_type=DTYPE)

    if sink:
        return plan, lambda: wrapper.run(q, p.cache, sinks, 1.0 / math.sqrt(HEAD_DIM))
    return plan, lambda: wrapper.run(q, p.cache, out=out)


def ragged_prefill(module, workspace, variant=None):
    heads = MHA_HEADS if variant else Q_HEADS
    kv_heads = MHA_HEADS if variant else KV_HEADS
    indptr = torch.arange(0, 4 * 128 + 1, 128, dtype=torch.int32)
    q = torch.randn(4 * 128, heads, HEAD_DIM, device="cuda", dtype=DTYPE)
    k = torch.randn(4 * 128, kv_heads, HEAD_DIM, device="cuda", dtype=DTYPE)
    v = torch.randn_like(k)
    out = torch.empty_like(q)
    wrapper = module.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD")
    extra, tensors = {}, {}
    if variant == "distance_bias":
        extra["variant"] = flare.variants.distance_bias()
        tensors["bias"] = flare.variants.t5_distance_bias(
            torch.randn(heads, 32, device="cuda"), 128.0)

    def plan():
        wrapper.plan(indptr, indptr, heads, kv_heads, HEAD_DIM, causal=True, q_data_type=DTYPE,
                     kv_data_type=DTYPE, **extra)

    return plan, lambda: wrapper.run(q, k, v, out=out, **tensors)


def cascade(module, workspace):
    """Two levels: a 256-token prefix shared by 16 decode requests, then 64 tokens each."""
    batch = 16
    prefix, suffix = Paged(1, 256), None
    suffix = Paged(batch, 64, first_page=prefix.pages)
    cache = torch.cat([prefix.cache, suffix.cache[prefix.pages:]])
    qo = [torch.tensor([0, batch], dtype=torch.int32), torch.arange(batch + 1, dtype=torch.int32)]
    q = torch.randn(batch, Q_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
    wrapper = module.MultiLevelCascadeAttentionWrapper(2, workspace, "NHD")

    def plan():
        wrapper.plan(qo, [prefix.indptr, suffix.indptr], [prefix.indices, suffix.indices],
                     [prefix.last, suffix.last], Q_HEADS, KV_HEADS, HEAD_DIM, PAGE,
                     q_data_type=DTYPE, kv_data_type=DTYPE)

    return plan, lambda: wrapper.run(q, cache)


def shared_prefix(module, workspace, prefill):
    """FlashInfer's older shared-prefix wrappers: a contiguous 256-token prefix, paged suffixes."""
    batch = 4 if prefill else 16
    p = Paged(batch, 64)
    k_shared = torch.randn(256, KV_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
    v_shared = torch.randn_like(k_shared)
    q_len = 16 if prefill else 1
    q = torch.randn(batch * q_len, Q_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
    if prefill:
        wrapper = module.BatchPrefillWithSharedPrefixPagedKVCacheWrapper(workspace, "NHD")
        qo_indptr = torch.arange(0, batch * q_len + 1, q_len, dtype=torch.int32)

        def plan():
            wrapper.begin_forward(qo_indptr, p.indptr, p.indices, p.last, Q_HEADS, KV_HEADS,
                                  HEAD_DIM, PAGE, q_data_type=DTYPE, kv_data_type=DTYPE)

        return plan, lambda: wrapper.forward(q, k_shared, v_shared, p.cache, causal=True)
    wrapper = module.BatchDecodeWithSharedPrefixPagedKVCacheWrapper(workspace, "NHD")

    def plan():
        wrapper.begin_forward(p.indptr, p.indices, p.last, Q_HEADS, KV_HEADS, HEAD_DIM, PAGE,
                              data_type=DTYPE)

    return plan, lambda: wrapper.forward(q, k_shared, v_shared, p.cache)


def block_sparse(module, workspace):
    """512 x 512 tokens in 64 x 64 blocks, the diagonal and one more block a row."""
    blocks, length = 8, 512
    rows = [sorted({r, (r * 5 + 3) % blocks}) for r in range(blocks)]
    indptr = torch.tensor([0] + [len(r) for r in rows]).cumsum(0).to(torch.int32)
    indices = torch.tensor([c for r in rows for c in r], dtype=torch.int32)
    q = torch.randn(length, MHA_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
    k, v = torch.randn_like(q), torch.randn_like(q)
    out = torch.empty_like(q)
    wrapper = module.BlockSparseAttentionWrapper(workspace)

    def plan():
        wrapper.plan(indptr, indices, length, length, 64, 64, MHA_HEADS, MHA_HEADS, HEAD_DIM,
                     q_data_type=DTYPE, kv_data_type=DTYPE)

    return plan, lambda: wrapper.run(q, k, v, out=out)


def variable_block_sparse(module, workspace):
    heads, blocks = 4, 4
    sizes = torch.full((heads, blocks), 64, dtype=torch.int32)
    mask = torch.eye(blocks, dtype=torch.bool).expand(heads, blocks, blocks).contiguous()
    mask[:, :, 0] = True
    q = torch.randn(heads, blocks * 64, HEAD_DIM, device="cuda", dtype=DTYPE)
    k, v = torch.randn_like(q), torch.randn_like(q)
    wrapper = module.VariableBlockSparseAttentionWrapper(workspace)

    def plan():
        wrapper.plan(mask, sizes, sizes, heads, heads, HEAD_DIM, q_data_type=DTYPE,
                     kv_data_type=DTYPE)

    return plan, lambda: wrapper.run(q, k, v)


def single_decode(module, workspace):
    q = torch.randn(Q_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
    k = torch.randn(1024, KV_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
    v = torch.randn_like(k)
    return None, lambda: module.single_decode_with_kv_cache(q, k, v)


def single_prefill(module, workspace):
    q = torch.randn(128, Q_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
    k = torch.randn(128, KV_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
    v = torch.randn_like(k)
    return None, lambda: module.single_prefill_with_kv_cache(q, k, v, causal=True)


CASES = {
    "BatchDecode (tensor cores)": decode,
    "BatchDecode (CUDA cores)": lambda m, w: decode(m, w, tensor_cores=False),
    "CUDAGraphBatchDecode": lambda m, w: decode(m, w, graph=True),
    "BatchPrefill paged": paged_prefill,
    "BatchPrefill ragged": ragged_prefill,
    "BatchPrefill ragged, distance_bias variant": lambda m, w: ragged_prefill(m, w,
                                                                               "distance_bias"),
    "BatchPrefill ragged, MHA causal (its control)": lambda m, w: ragged_prefill(m, w, "causal"),
    "BatchAttentionWithAttentionSink": lambda m, w: paged_prefill(m, w, sink=True),
    "MultiLevelCascade (2 levels)": cascade,
    "BatchDecodeWithSharedPrefix": lambda m, w: shared_prefix(m, w, prefill=False),
    "BatchPrefillWithSharedPrefix": lambda m, w: shared_prefix(m, w, prefill=True),
    "BlockSparseAttention": block_sparse,
    "VariableBlockSparseAttention": variable_block_sparse,
    "single_decode_with_kv_cache": single_decode,
    "single_prefill_with_kv_cache": single_prefill,
}
FLARE_ONLY = {"BatchPrefill ragged, distance_bias variant"}
# The cases whose run() may be captured as used here (the others' wrappers are not use_cuda_graph:
# flare refuses their capture by name).
CAPTURABLE = {"CUDAGraphBatchDecode", "single_decode_with_kv_cache",
              "single_prefill_with_kv_cache"}
# FlashInfer's modules that .anchors-fi ships prebuilt (bf16 decode, fa2 / fa3 prefill); its other
# wrappers JIT-compile modules for minutes on first use (--flashinfer-all runs them too).
FLASHINFER_PREBUILT = {"BatchDecode (tensor cores)", "BatchDecode (CUDA cores)",
                       "CUDAGraphBatchDecode", "BatchPrefill paged", "BatchPrefill ragged",
                       "BatchPrefill ragged, MHA causal (its control)"}


def launches(run):
    """Kernel launches one run() makes (after a warm-up call)."""
    run()
    torch.cuda.synchronize()
    warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def measure(name, make, module, workspace, args):
    plan, run = make(module, workspace)
    row = {}
    if plan is not None:
        plan()
        row["plan_us"] = host_us(plan, args.plan_calls)[0]
        # Each plan() on an idle stream: back to back, a plan's asynchronous copies of its
        # schedule may wait for the copies of the plans before it (a staging buffer's reuse).
        row["plan_idle_us"] = host_us(plan, args.plan_calls, drain_every=1)[0]
    run()
    torch.cuda.synchronize()
    row["run_us"], row["run_p90_us"] = host_us(run, args.run_calls, drain_every=16)
    row["back_to_back_us"] = host_us(run, args.run_calls)[0]
    row["launches"] = launches(run)
    if name in CAPTURABLE:
        row["gpu_us"] = guarded("graph", lambda: graph_us(run, 10))
    return row


def cell(row, key):
    if row is None or row.get(key) is None:
        return "n/a"
    return f"{row[key]:.1f}" if isinstance(row[key], float) else str(row[key])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-calls", type=int, default=1000)
    parser.add_argument("--plan-calls", type=int, default=100)
    parser.add_argument("--only", help="cases whose name contains this")
    parser.add_argument("--json")
    parser.add_argument("--flashinfer-all", action="store_true",
                        help="FlashInfer on every case, JIT-compiling what it lacks (minutes)")
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"flashinfer {FLASHINFER}")
    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    rows = []
    print("| wrapper | flare run() us (p90) | back to back | launches | GPU us | plan() us "
          "(idle stream) | FlashInfer run() us (p90) | back to back | launches | GPU us | "
          "plan() us (idle stream) |\n|---|---|---|---|---|---|---|---|---|---|---|")
    for name, make in CASES.items():
        if args.only and args.only not in name:
            continue
        row = {"case": name,
               "flare": guarded(f"{name}: flare",
                                lambda: measure(name, make, flare, workspace, args))}
        if flashinfer is not None and name not in FLARE_ONLY and \
                (args.flashinfer_all or name in FLASHINFER_PREBUILT):
            row["flashinfer"] = guarded(f"{name}: FlashInfer",
                                        lambda: measure(name, make, flashinfer, workspace,
                                                        args))
        rows.append(row)
        torch.cuda.empty_cache()
        f, fi = row["flare"], row.get("flashinfer")
        print(f"| {name} | {cell(f, 'run_us')} ({cell(f, 'run_p90_us')}) | "
              f"{cell(f, 'back_to_back_us')} | {cell(f, 'launches')} | {cell(f, 'gpu_us')} | "
              f"{cell(f, 'plan_us')} ({cell(f, 'plan_idle_us')}) | {cell(fi, 'run_us')} "
              f"({cell(fi, 'run_p90_us')}) | {cell(fi, 'back_to_back_us')} | "
              f"{cell(fi, 'launches')} | {cell(fi, 'gpu_us')} | {cell(fi, 'plan_us')} "
              f"({cell(fi, 'plan_idle_us')}) |")
    write_json(args.json, rows)


if __name__ == "__main__":
    main()
