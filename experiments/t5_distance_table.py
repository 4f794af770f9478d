#!/usr/bin/env python3
"""Issue 18's T5 bias (within 10% of causal): does a bias-by-distance table (one load a near
score, no logarithm, no branch) close the gap? Times causal, flare.variants'
relative_position_bias and a user variant reading table[h][min(q - kv, max_distance)]
(experiments/variants/t5_distance_table.cu; the table expanded from the same 32 buckets by
torch) through the public API, eager, --calls each, --rounds alternating; checks the two T5
outputs agree. Shapes: bench_variants.py's (b16 h16 D128 bf16, ragged causal).
Usage: python3 experiments/t5_distance_table.py [--lengths 2048,4096,8192,16384] [--calls 10]
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))
import flare  # noqa: E402
from bench_python import eager_us  # noqa: E402
from bench_variants import (BATCH, DTYPE, HEAD_DIM, HEADS, MAX_DISTANCE, WORKSPACE_BYTES,  # noqa: E402
                            relative_table, t5_bucket, visible_pairs)

SOURCE = open(os.path.join(os.path.dirname(__file__), "variants", "t5_distance_table.cu")).read()
DISTANCE = flare.AttentionVariant(name="t5_distance_table", scalars=("max_distance",),
                                  tensors={"table": ("float32", ("num_qo_heads", None))},
                                  source=SOURCE)


def distance_table():
    n = torch.arange(int(MAX_DISTANCE) + 1, device="cuda")
    return relative_table()[:, t5_bucket(n)].contiguous()


def run_one(kind, q, k, v, indptr, calls):
    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    wrapper = flare.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD")
    plan = {"causal": True}
    run_kwargs = {}
    if kind == "t5":
        plan["variant"] = flare.variants.relative_position_bias()
        run_kwargs = {"table": relative_table(), "max_distance": MAX_DISTANCE}
    elif kind == "t5_distance":
        plan["variant"] = DISTANCE
        run_kwargs = {"table": distance_table(), "max_distance": MAX_DISTANCE}
    wrapper.plan(indptr, indptr, HEADS, HEADS, HEAD_DIM, q_data_type=DTYPE, kv_data_type=DTYPE,
                 **plan)
    out = wrapper.run(q, k, v, **run_kwargs)
    return eager_us(lambda: wrapper.run(q, k, v, out=out, **run_kwargs), calls), out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", default="2048,4096,8192,16384")
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    for length in map(int, args.lengths.split(",")):
        torch.manual_seed(length)
        q, k, v = (torch.randn(BATCH * length, HEADS, HEAD_DIM, dtype=DTYPE, device="cuda")
                   for _ in range(3))
        indptr = torch.arange(BATCH + 1, dtype=torch.int32) * length
        flops = 4 * HEAD_DIM * HEADS * visible_pairs(length, "causal") * BATCH
        for r in range(args.rounds):
            times, outs = {}, {}
            for kind in ("causal", "t5", "t5_distance"):
                times[kind], outs[kind] = run_one(kind, q, k, v, indptr, args.calls)
            diff = (outs["t5"].float() - outs["t5_distance"].float()).abs().max().item()
            cells = "  ".join(f"{kind} {times[kind]:8.1f} us {flops / times[kind] / 1e6:6.1f} TF/s"
                              for kind in times)
            print(f"L{length} round {r}: {cells}  | t5/causal {times['t5'] / times['causal']:.3f}"
                  f" distance/causal {times['t5_distance'] / times['causal']:.3f}"
                  f"  max|t5 - distance| {diff:.2e}", flush=True)


if __name__ == "__main__":
    main()
