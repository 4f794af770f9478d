#!/usr/bin/env python3
"""Block-sparse attention through the public Python API (issue 20): flare's
BlockSparseAttentionWrapper next to FlexAttention (torch.compile'd flex_attention with a
BlockMask of the same blocks) and FlashInfer's BlockSparseAttentionWrapper, in one process.

Shapes: one sequence of --lengths tokens, --heads query / KV heads (32), head dim 128, bf16, a BSR mask
of 64 x 64 blocks shared by the heads, each block row keeping a random --densities fraction of
its column blocks (at least one; the diagonal block always); blocks are whole (no mask inside).
TFLOP/s count the visible pairs: 4 * D * H * kept blocks * 64 * 64. "per density" is the time
over the density, relative to the densest case's: 1.0 when time is proportional to density.
Times: CUDA events around each eager call, median of --calls.
Usage: python3 scripts/bench_block_sparse.py [--lengths 8192,16384,32768]
       [--densities 0.1,0.3,0.5,0.9] [--calls 5] [--heads 32]
       [--libraries flare,flex,flashinfer] [--json F]
"""
import argparse
import json

import torch
from torch.nn.attention.flex_attention import BlockMask

import flare
from bench_python import FLASHINFER, eager_us, flashinfer, guarded
from bench_variants import compiled_flex_attention

HEAD_DIM, BLOCK, DTYPE = 128, 64, torch.bfloat16
WORKSPACE_BYTES = 512 << 20


def options():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="8192,16384,32768")
    parser.add_argument("--densities", default="0.1,0.3,0.5,0.9")
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--heads", type=int, default=32, help="query and KV heads")
    parser.add_argument("--libraries", default="flare,flex,flashinfer")
    parser.add_argument("--json", help="write every measurement here")
    return parser.parse_args()


def block_mask_rows(blocks, density, seed):
    """Per block row, the sorted kept column blocks (int64 tensors on the host)."""
    generator = torch.Generator().manual_seed(seed)
    keep = max(1, round(density * blocks))
    rows = []
    for r in range(blocks):
        others = torch.randperm(blocks - 1, generator=generator)[:keep - 1]
        others = others + (others >= r).long()  # skip the diagonal, which is always kept
        rows.append(torch.sort(torch.cat([torch.tensor([r]), others])).values)
    return rows


def measure_library(module, rows, q, k, v, calls):
    blocks = len(rows)
    indptr = torch.tensor([0] + [len(r) for r in rows]).cumsum(0).to(torch.int32)
    indices = torch.cat(rows).to(torch.int32)
    length, heads = q.shape[0], q.shape[1]
    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    wrapper = module.BlockSparseAttentionWrapper(workspace)
    wrapper.plan(indptr, indices, length, length, BLOCK, BLOCK, heads, heads, HEAD_DIM,
                 q_data_type=DTYPE, kv_data_type=DTYPE)
    assert blocks * BLOCK == length
    out = wrapper.run(q, k, v)
    return eager_us(lambda: wrapper.run(q, k, v), calls), out


def measure_flex(compiled, rows, q, k, v, calls):
    blocks = len(rows)
    counts = torch.tensor([len(r) for r in rows], dtype=torch.int32)
    table = torch.zeros(blocks, blocks, dtype=torch.int32)
    for r, cols in enumerate(rows):
        table[r, :len(cols)] = cols.to(torch.int32)
    # Whole blocks as Flex's "full" blocks: its kernel then skips the mask_mod on them.
    none = torch.zeros_like(counts)
    mask = BlockMask.from_kv_blocks(none.view(1, 1, blocks).cuda(),
                                    torch.zeros_like(table).view(1, 1, blocks, blocks).cuda(),
                                    counts.view(1, 1, blocks).cuda(),
                                    table.view(1, 1, blocks, blocks).cuda(), BLOCK_SIZE=BLOCK)
    qb, kb, vb = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))

    # Flex's kernel tiles must divide the 64-token blocks (its default BLOCK_M is 128).
    tiles = {"BLOCK_M": BLOCK, "BLOCK_N": BLOCK}

    def call():
        return compiled(qb, kb, vb, block_mask=mask, kernel_options=tiles)

    out = call()
    return eager_us(call, calls), out.squeeze(0).transpose(0, 1)


def main():
    args = options()
    torch.manual_seed(0)
    compiled = compiled_flex_attention()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"flashinfer {FLASHINFER}")
    libraries = set(args.libraries.split(","))
    rows_out = []
    for length in (int(x) for x in args.lengths.split(",")):
        q = torch.randn(length, args.heads, HEAD_DIM, device="cuda", dtype=DTYPE)
        k, v = torch.randn_like(q), torch.randn_like(q)
        for density in (float(x) for x in args.densities.split(",")):
            rows = block_mask_rows(length // BLOCK, density, seed=length + int(density * 100))
            kept = sum(len(r) for r in rows)
            flops = 4.0 * HEAD_DIM * args.heads * kept * BLOCK * BLOCK
            row = {"length": length, "density": kept / (length // BLOCK) ** 2}
            outs = {}
            for name, measure in (
                    ("flare", lambda: measure_library(flare, rows, q, k, v, args.calls)),
                    ("flex", lambda: measure_flex(compiled, rows, q, k, v, args.calls)),
                    ("flashinfer", (lambda: measure_library(flashinfer, rows, q, k, v, args.calls))
                     if flashinfer is not None else None)):
                result = guarded(f"{name} {length} {density}", measure) \
                    if measure and name in libraries else None
                if result:
                    row[f"{name}_us"], outs[name] = result
                    row[f"{name}_tflops"] = flops / result[0] / 1e6
            if "flare" in outs:
                row["max_diff"] = {n: (o.float() - outs["flare"].float()).abs().max().item()
                                   for n, o in outs.items() if n != "flare"}
            rows_out.append(row)
    print("\n| length | density | flare TFLOP/s | Flex | flare / Flex | FlashInfer | "
          "flare / FI | flare us per density (rel.) |")
    print("|---|---|---|---|---|---|---|---|")
    for length in sorted({r["length"] for r in rows_out}):
        group = [r for r in rows_out if r["length"] == length and "flare_us" in r]
        densest = max(group, key=lambda r: r["density"]) if group else None
        for r in [r for r in rows_out if r["length"] == length]:
            def cell(key):
                return f"{r[key]:.1f}" if key in r else "n/a"

            def ratio(other):
                return (f"{r[other + '_us'] / r['flare_us']:.2f}"
                        if "flare_us" in r and other + "_us" in r else "n/a")

            per = (f"{(r['flare_us'] / r['density']) / (densest['flare_us'] / densest['density']):.2f}"
                   if "flare_us" in r else "n/a")
            print(f"| {length} | {r['density']:.2f} | {cell('flare_tflops')} | "
                  f"{cell('flex_tflops')} | {ratio('flex')} | {cell('flashinfer_tflops')} | "
                  f"{ratio('flashinfer')} | {per} |")
    print("max |x - flare|: " + ", ".join(
        f"{n}@{r['length']}/{r['density']:.2f}={d:.3g}" for r in rows_out
        for n, d in r.get("max_diff", {}).items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows_out, f, indent=1)


if __name__ == "__main__":
    main()
