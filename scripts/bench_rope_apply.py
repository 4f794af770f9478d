#!/usr/bin/env python3
"""RoPE outside attention through the public Python API: flare's apply_rope_pos_ids_inplace and
apply_rope_with_cos_sin_cache_inplace next to FlashInfer's functions of the same names (when
.anchors-fi was carried) and a torch-eager rotation, in one process. q and k as views of one
fused qkv tensor (vLLM's layout), bf16, 32 query / 8 KV heads, head dim 128, positions of one
long request. Bandwidth-bound: the rate counts q and k read and written once (the copy ceiling
of the device is the bound). GPU time per call from a CUDA-graph replay; eager time; host time
of a call. Every library's output is compared with flare's (a wrong row prints instead of a rate).
Usage: python3 scripts/bench_rope_apply.py [--tokens 1,64,1024,8192,32768] [--calls 20]
       [--json F]
"""
import torch

import flare
from bench_python import flashinfer, guarded, small_op_arguments, small_op_times, write_json

Q_HEADS, KV_HEADS, HEAD_DIM, DTYPE = 32, 8, 128, torch.bfloat16
THETA = 5e5
WRONG = 0.05  # bf16 outputs of one rotation: a few units in the last place


def fused(tokens):
    qkv = torch.randn(tokens, (Q_HEADS + 2 * KV_HEADS) * HEAD_DIM, device="cuda").to(DTYPE)
    q = qkv[:, :Q_HEADS * HEAD_DIM].view(tokens, Q_HEADS, HEAD_DIM)
    k = qkv[:, Q_HEADS * HEAD_DIM:(Q_HEADS + KV_HEADS) * HEAD_DIM].view(tokens, KV_HEADS,
                                                                       HEAD_DIM)
    return qkv, q, k


def cos_sin_table(rows):
    freq = THETA ** (-torch.arange(0, HEAD_DIM, 2, dtype=torch.float64, device="cuda") / HEAD_DIM)
    angle = torch.arange(rows, dtype=torch.float64, device="cuda")[:, None] * freq[None, :]
    return torch.cat([angle.cos(), angle.sin()], dim=1).float().contiguous()


def torch_rotation(q, k, pos):
    """The rotation as torch-eager code would write it (rotate-half), into q and k."""
    freq = THETA ** (-torch.arange(0, HEAD_DIM, 2, dtype=torch.float32, device="cuda") / HEAD_DIM)
    angle = pos.float()[:, None] * freq[None, :]
    cos, sin = angle.cos()[:, None, :], angle.sin()[:, None, :]
    for x in (q, k):
        lo, hi = x[..., :HEAD_DIM // 2].float(), x[..., HEAD_DIM // 2:].float()
        x[..., :HEAD_DIM // 2] = (lo * cos - hi * sin).to(DTYPE)
        x[..., HEAD_DIM // 2:] = (hi * cos + lo * sin).to(DTYPE)


def measure(name, call, bytes_moved, calls):
    times = small_op_times(call, calls)
    return dict(times, library=name, tb_per_s=bytes_moved / times["graph_us"] / 1e6)


def bench(tokens, calls):
    qkv, q, k = fused(tokens)
    base = qkv.clone()
    pos = torch.arange(tokens, device="cuda", dtype=torch.int64) + 1000
    table = cos_sin_table(tokens + 1000)
    query = qkv[:, :Q_HEADS * HEAD_DIM]  # the [tokens, heads * head_dim] views of the table form
    key = qkv[:, Q_HEADS * HEAD_DIM:(Q_HEADS + KV_HEADS) * HEAD_DIM]
    moved = 2 * (q.numel() + k.numel()) * 2  # q and k read and written, 2 bytes each
    libraries = {
        "flare pos_ids": lambda: flare.apply_rope_pos_ids_inplace(q, k, pos, rope_theta=THETA),
        "flare cos_sin_cache": lambda: flare.apply_rope_with_cos_sin_cache_inplace(
            pos, query, key, HEAD_DIM, table),
        "torch eager": lambda: torch_rotation(q, k, pos),
    }
    if flashinfer is not None:
        fi = flashinfer
        libraries["FlashInfer pos_ids"] = lambda: fi.apply_rope_pos_ids_inplace(
            q, k, pos, rope_theta=THETA)
        libraries["FlashInfer cos_sin_cache"] = lambda: fi.apply_rope_with_cos_sin_cache_inplace(
            pos, query, key, HEAD_DIM, table)
    # Correctness first: each library once from the same input, against flare's pos_ids result.
    qkv.copy_(base)
    libraries["flare pos_ids"]()
    want = qkv.clone()
    rows = []
    for name, call in libraries.items():
        qkv.copy_(base)
        if guarded(name, lambda: call() or True) is None:  # raised: reason printed
            continue
        error = (qkv.float() - want.float()).abs().max().item()
        if error > WRONG:
            print(f"  {name}: output differs from flare's by {error:.3g}: not timed")
            continue
        row = guarded(name, lambda: measure(name, call, moved, calls))
        if row:
            row["tokens"] = tokens
            rows.append(row)
    return rows


def main():
    args = small_op_arguments(
        __doc__, lambda parser: parser.add_argument("--tokens", default="1,64,1024,8192,32768"))
    rows = []
    for tokens in (int(t) for t in args.tokens.split(",")):
        rows += bench(tokens, args.calls)
    print("| tokens | library | graph us | TB/s | eager us | host us |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['tokens']} | {r['library']} | {r['graph_us']:.1f} | {r['tb_per_s']:.2f} | "
              f"{r['eager_us']:.1f} | {r['host_us']:.1f} |")
    write_json(args.json, rows)


if __name__ == "__main__":
    main()
