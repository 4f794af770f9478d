#!/usr/bin/env python3
"""Shared-prefix decode through the public Python API (issue 20; the FlashInfer paper's Table 5,
../shared/papers/002_b09e1c85831c9bbe.txt appendix G.2): flare's MultiLevelCascadeAttentionWrapper
(level 0: the batch's shared prefix, read once for all its queries; level 1: each request's own
suffix; both levels in one prefill launch plus the merge launch) and the same wrapper with
fused_levels=False (the levels one after another, merged: FlashInfer's way) next to flare's
single format (one batch decode whose every request lists the prefix's
pages and then its own), FlashInfer's MultiLevelCascadeAttentionWrapper and single-format batch
decode, and PyTorch SDPA (cuDNN) on the equivalent dense problem, in one process.

Shapes: decode (one query token per request), unique suffix 128 tokens per request, 32 query /
32 KV heads, head dim 128, bf16, page 16; prefix 1024 / 8192 / 32768; batch 16 and 64. Also the
cascade with an empty prefix level against plain decode (issue 20: <= 5% over it).

Per case: GPU time from a CUDA-graph replay (the wrappers' use_cuda_graph mode), eager GPU time
(CUDA events around each run(), median of --calls) and host time of run() (wall time,
back-to-back calls, median). SDPA's dense K/V (batch x (prefix + suffix)
tokens, materialized) is skipped where it would exceed --sdpa-gib.
FlashInfer's cascade wrapper JIT-compiles its merge module on first use from sources the carried
package lacks: install them into the FlashInfer site first (scripts/flashinfer_sources.sh).
Usage: python3 scripts/bench_cascade.py [--prefixes 1024,8192,32768] [--batches 16,64]
       [--calls 20] [--json F]
"""
import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flare
from bench_python import FLASHINFER, eager_us, flashinfer, graph_us, guarded, host_us

HEADS, HEAD_DIM, PAGE, SUFFIX, DTYPE = 32, 128, 16, 128, torch.bfloat16
WORKSPACE_BYTES = 256 << 20


def options():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefixes", default="1024,8192,32768")
    parser.add_argument("--batches", default="16,64")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--sdpa-gib", type=float, default=24.0)
    parser.add_argument("--json", help="write every measurement here")
    return parser.parse_args()


class Case:
    """The paged cache: the prefix's pages first, then each request's suffix pages."""

    def __init__(self, batch, prefix):
        self.batch, self.prefix = batch, prefix
        self.prefix_pages = prefix // PAGE
        self.suffix_pages = SUFFIX // PAGE
        pages = self.prefix_pages + batch * self.suffix_pages
        self.cache = torch.randn(pages, 2, PAGE, HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
        self.q = torch.randn(batch, HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
        suffix_ids = torch.arange(self.prefix_pages, pages, dtype=torch.int32)
        prefix_ids = torch.arange(self.prefix_pages, dtype=torch.int32)
        full = [torch.cat([prefix_ids, suffix_ids[r * self.suffix_pages:(r + 1) * self.suffix_pages]])
                for r in range(batch)]
        # Single format: every request lists the prefix's pages, then its own.
        self.single = (torch.arange(0, batch + 1, dtype=torch.int32) * full[0].shape[0],
                       torch.cat(full).cuda(), torch.full((batch,), PAGE, dtype=torch.int32))
        # Cascade: level 0 one group of all queries over the prefix; level 1 per request.
        prefix_last = PAGE if self.prefix_pages else 0
        self.levels = (
            [torch.tensor([0, batch], dtype=torch.int32),
             torch.arange(batch + 1, dtype=torch.int32)],
            [torch.tensor([0, self.prefix_pages], dtype=torch.int32),
             torch.arange(0, batch + 1, dtype=torch.int32) * self.suffix_pages],
            [prefix_ids.cuda(), suffix_ids.cuda()],
            [torch.tensor([prefix_last], dtype=torch.int32),
             torch.full((batch,), PAGE, dtype=torch.int32)])


def measure(run, calls, graphed_run=None):
    run()
    torch.cuda.synchronize()
    timing = {"eager_us": eager_us(run, calls), "run_us": host_us(run, calls)[0]}
    if graphed_run is not None:
        timing["graph_us"] = guarded("graph", lambda: graph_us(graphed_run, 5))
    return timing


def device_like(x):
    return torch.empty_like(x, device="cuda")


def cascade(module, workspace, case, calls, **extra):
    """extra: flare's constructor keywords (fused_levels)."""
    qo, kv_indptr, kv_indices, last = case.levels

    def planned(graph):
        buffers = {} if not graph else dict(
            qo_indptr_buf_arr=[device_like(x) for x in qo],
            paged_kv_indptr_buf_arr=[device_like(x) for x in kv_indptr],
            paged_kv_indices_buf_arr=[device_like(x) for x in kv_indices],
            paged_kv_last_page_len_buf_arr=[device_like(x) for x in last])
        wrapper = module.MultiLevelCascadeAttentionWrapper(2, workspace, "NHD",
                                                           use_cuda_graph=graph, **buffers, **extra)
        wrapper.plan(qo, kv_indptr, kv_indices, last, HEADS, HEADS, HEAD_DIM, PAGE,
                     q_data_type=DTYPE, kv_data_type=DTYPE)
        return wrapper

    wrapper, graphed = planned(False), guarded("cascade graph mode", lambda: planned(True))
    graphed_run = (lambda: graphed.run(case.q, case.cache)) if graphed else None
    return (measure(lambda: wrapper.run(case.q, case.cache), calls, graphed_run),
            wrapper.run(case.q, case.cache))


def single(module, workspace, case, calls):
    indptr, indices, last = case.single

    def planned(graph):
        buffers = {} if not graph else dict(
            paged_kv_indptr_buffer=device_like(indptr), paged_kv_indices_buffer=device_like(indices),
            paged_kv_last_page_len_buffer=device_like(last))
        wrapper = module.BatchDecodeWithPagedKVCacheWrapper(
            workspace, "NHD", use_tensor_cores=True, use_cuda_graph=graph, **buffers)
        wrapper.plan(indptr, indices, last, HEADS, HEADS, HEAD_DIM, PAGE, q_data_type=DTYPE,
                     kv_data_type=DTYPE)
        return wrapper

    wrapper, graphed = planned(False), planned(True)
    out = wrapper.run(case.q, case.cache)
    return (measure(lambda: wrapper.run(case.q, case.cache, out=out), calls,
                    lambda: graphed.run(case.q, case.cache, out=out)),
            wrapper.run(case.q, case.cache))


def sdpa(case, calls, max_gib):
    tokens = case.prefix + SUFFIX
    if 2 * case.batch * tokens * HEADS * HEAD_DIM * 2 > max_gib * (1 << 30):
        raise MemoryError(f"dense K/V above --sdpa-gib {max_gib}")
    k_pref = case.cache[:case.prefix_pages, 0].reshape(-1, HEADS, HEAD_DIM)
    v_pref = case.cache[:case.prefix_pages, 1].reshape(-1, HEADS, HEAD_DIM)
    suffix = case.cache[case.prefix_pages:].reshape(case.batch, case.suffix_pages, 2, PAGE,
                                                   HEADS, HEAD_DIM)
    k = torch.cat([k_pref.expand(case.batch, -1, -1, -1),
                   suffix[:, :, 0].reshape(case.batch, SUFFIX, HEADS, HEAD_DIM)], 1)
    v = torch.cat([v_pref.expand(case.batch, -1, -1, -1),
                   suffix[:, :, 1].reshape(case.batch, SUFFIX, HEADS, HEAD_DIM)], 1)
    k, v = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
    q = case.q.unsqueeze(2)

    def run():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v)

    return measure(run, calls, run), run().squeeze(2)


def ratio_of(row, other):
    """other's time over flare cascade's: graph time where both have one, else eager."""
    a, b = row.get(other), row.get("flare cascade")
    if not a or not b:
        return "n/a"
    key = "graph_us" if a.get("graph_us") and b.get("graph_us") else "eager_us"
    return f"{a[key] / b[key]:.2f} ({key[:-3]})"


def main():
    args = options()
    torch.manual_seed(0)
    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    fi_workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"flashinfer {FLASHINFER}")
    rows = []
    for batch in [int(x) for x in args.batches.split(",")]:
        for prefix in [0] + [int(x) for x in args.prefixes.split(",")]:
            case = Case(batch, prefix)
            row = {"batch": batch, "prefix": prefix}
            results = {
                "flare cascade": guarded("flare cascade",
                                         lambda: cascade(flare, workspace, case, args.calls)),
                "flare levels": guarded("flare levels", lambda: cascade(
                    flare, workspace, case, args.calls, fused_levels=False)),
                "flare single": guarded("flare single",
                                        lambda: single(flare, workspace, case, args.calls))}
            if flashinfer is not None:
                results["flashinfer cascade"] = guarded(
                    "flashinfer cascade", lambda: cascade(flashinfer, fi_workspace, case, args.calls))
                results["flashinfer single"] = guarded(
                    "flashinfer single", lambda: single(flashinfer, fi_workspace, case, args.calls))
            if prefix:
                results["sdpa cudnn"] = guarded("sdpa cudnn",
                                                lambda: sdpa(case, args.calls, args.sdpa_gib))
            reference = results["flare single"][1] if results["flare single"] else None
            for name, result in results.items():
                if result is None:
                    continue
                timing, out = result
                row[name] = timing
                if reference is not None:
                    timing["max_diff"] = (out.float() - reference.float()).abs().max().item()
            rows.append(row)
            case = None  # free the cache before the next shape
            torch.cuda.empty_cache()
    names = ["flare cascade", "flare levels", "flare single", "flashinfer cascade",
             "flashinfer single", "sdpa cudnn"]
    print("\nShared-prefix decode, GPU us in a CUDA graph / eager (host run() us); suffix 128, "
          "32/32 heads, D 128")
    print("| batch | prefix | " + " | ".join(names) +
          " | FI cascade / flare cascade | flare levels / flare cascade | "
          "flare single / flare cascade |")
    print("|---|---|" + "---|" * (len(names) + 3))
    for row in rows:
        cells = []
        for name in names:
            t = row.get(name)
            graph = f"{t['graph_us']:.1f}" if t and t.get("graph_us") else "n/a"
            cells.append(f"{graph} / {t['eager_us']:.1f} ({t['run_us']:.0f})" if t else "n/a")
        ratio, fused, gain = (ratio_of(row, "flashinfer cascade"), ratio_of(row, "flare levels"),
                              ratio_of(row, "flare single"))
        print(f"| {row['batch']} | {row['prefix']} | " + " | ".join(cells) +
              f" | {ratio} | {fused} | {gain} |")
    diffs = ", ".join(f"{name}@b{row['batch']}p{row['prefix']}={row[name]['max_diff']:.2g}"
                      for row in rows for name in names
                      if row.get(name) and "max_diff" in row[name])
    print("max |x - flare single|: " + diffs)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
