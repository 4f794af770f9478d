#!/usr/bin/env python3
"""The small per-step operations of a serving loop through the public Python API: merge_state,
merge_states (two and four states) and append_paged_kv_cache, flare next to FlashInfer's
functions of the same names (when .anchors-fi was carried), in one process. bf16, 32 query / 8
KV heads, head dim 128; merges over seq rows of 32 heads (float32 LSE), appends of nnz tokens
into a page-16 NHD cache (a decode step appends one token a request, a prefill a request's
prompt). Such calls are short on the GPU, so their host time decides what a step costs: per
call, the GPU time of a CUDA-graph replay, the eager time and the host time. Every library's
output is compared with flare's (a wrong result prints instead of a time).
Usage: python3 scripts/bench_state_ops.py [--calls 20] [--json F]
"""
import torch

import flare
from bench_python import flashinfer, guarded, small_op_arguments, small_op_times, write_json

Q_HEADS, KV_HEADS, HEAD_DIM, PAGE, DTYPE = 32, 8, 128, 16, torch.bfloat16
WRONG = 0.05  # bf16 outputs of one merge: a few units in the last place


def states(seq, count):
    v = torch.randn(seq, count, Q_HEADS, HEAD_DIM, device="cuda").to(DTYPE)
    s = torch.randn(seq, count, Q_HEADS, device="cuda") * 4
    return v, s


def merge_cases(seq):
    v, s = states(seq, 2)
    v_a, v_b, s_a, s_b = v[:, 0].contiguous(), v[:, 1].contiguous(), s[:, 0].contiguous(), \
        s[:, 1].contiguous()
    v4, s4 = states(seq, 4)
    cases = {"merge_state": {"flare": lambda: flare.merge_state(v_a, s_a, v_b, s_b)},
             "merge_states (2)": {"flare": lambda: flare.merge_states(v, s)},
             "merge_states (4)": {"flare": lambda: flare.merge_states(v4, s4)}}
    if flashinfer is not None:
        cases["merge_state"]["FlashInfer"] = lambda: flashinfer.merge_state(v_a, s_a, v_b, s_b)
        cases["merge_states (2)"]["FlashInfer"] = lambda: flashinfer.merge_states(v, s)
        cases["merge_states (4)"]["FlashInfer"] = lambda: flashinfer.merge_states(v4, s4)
    return cases


def append_case(batch, tokens_per_request, cached):
    """Appends tokens_per_request tokens to each of batch requests holding `cached` tokens."""
    total = cached + tokens_per_request
    pages_per_request = (total + PAGE - 1) // PAGE
    pages = batch * pages_per_request
    cache = torch.zeros(pages, 2, PAGE, KV_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
    indices = torch.randperm(pages, device="cuda").to(torch.int32)
    indptr = torch.arange(0, pages + 1, pages_per_request, device="cuda", dtype=torch.int32)
    last = torch.full((batch,), total - (pages_per_request - 1) * PAGE, device="cuda",
                      dtype=torch.int32)
    nnz = batch * tokens_per_request
    key = torch.randn(nnz, KV_HEADS, HEAD_DIM, device="cuda").to(DTYPE)
    value = torch.randn_like(key)
    append_indptr = torch.arange(0, nnz + 1, tokens_per_request, device="cuda",
                                 dtype=torch.int32)
    seq_lens = torch.full((batch,), total, device="cuda", dtype=torch.int32)
    batch_indices, positions = flare.get_batch_indices_positions(append_indptr, seq_lens, nnz)
    args = (key, value, batch_indices, positions, cache, indices, indptr, last)
    calls = {"flare": lambda: flare.append_paged_kv_cache(*args)}
    if flashinfer is not None:
        calls["FlashInfer"] = lambda: flashinfer.append_paged_kv_cache(*args)
    return cache, calls


def first_output(result):
    return result[0] if isinstance(result, tuple) else result


def bench_merges(seq, calls):
    rows = []
    for op, libraries in merge_cases(seq).items():
        want = first_output(libraries["flare"]()).float()
        for name, call in libraries.items():
            got = guarded(name, call)
            if got is None:
                continue
            error = (first_output(got).float() - want).abs().max().item()
            if error > WRONG:
                print(f"  {op} {name}: differs from flare's by {error:.3g}: not timed")
                continue
            row = guarded(name, lambda: small_op_times(call, calls))
            if row:
                rows.append(dict(row, op=op, shape=f"seq {seq}", library=name))
    return rows


def bench_append(batch, tokens_per_request, cached, calls):
    cache, libraries = append_case(batch, tokens_per_request, cached)
    libraries["flare"]()
    want = cache.clone()
    rows = []
    for name, call in libraries.items():
        cache.zero_()
        if guarded(name, lambda: call() or True) is None:
            continue
        if not torch.equal(cache, want):
            print(f"  append {name}: the cache differs from flare's: not timed")
            continue
        row = guarded(name, lambda: small_op_times(call, calls))
        if row:
            rows.append(dict(row, op="append_paged_kv_cache",
                             shape=f"b{batch} x {tokens_per_request} (cached {cached})",
                             library=name))
    return rows


def main():
    args = small_op_arguments(__doc__)
    rows = []
    for seq in (16, 128, 4096):
        rows += bench_merges(seq, args.calls)
    for batch, tokens, cached in ((64, 1, 2047), (1, 4096, 0)):
        rows += bench_append(batch, tokens, cached, args.calls)
    print("| op | shape | library | graph us | eager us | host us |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['op']} | {r['shape']} | {r['library']} | {r['graph_us']:.1f} | "
              f"{r['eager_us']:.1f} | {r['host_us']:.1f} |")
    write_json(args.json, rows)


if __name__ == "__main__":
    main()
