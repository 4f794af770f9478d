#!/usr/bin/env python3
"""T5's relative position bias in decode through the public Python API: flare's
BatchDecodeWithPagedKVCacheWrapper without a variant, with flare.variants.relative_position_bias
(32 buckets, max distance 128) and with distance_bias (the same buckets as a table per
distance, t5_distance_bias) on both loops; bench_python's decode inputs (bf16, 32 query / 8 KV
heads, D 128, page 16); GPU time per call from a CUDA-graph replay; the two T5 outputs compared.
Usage (GPU machine, PYTHONPATH=scripts): python3 experiments/bench_t5_decode.py [--calls 20]
  [--shapes 64x8192,...] [--order distance,buckets,plain] [--loops cuda,tensor] [--rounds 3]
"""
import statistics

import torch

import flare
from bench_python import (DTYPE, HEAD_DIM, KV_HEADS, PAGE, Q_HEADS, decode_inputs, decode_wrapper,
                          graph_us, guarded, small_op_arguments)

SHAPES = [(1, 32768), (16, 4096), (64, 8192)]
WORKSPACE_BYTES = 256 << 20
MAX_DISTANCE = 128.0


def measure(batch, inputs, tensor_cores, kind, calls):
    cache, indptr, indices, last, q = inputs
    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    wrapper = decode_wrapper(flare, workspace, True, batch, indices.numel(), tensor_cores)
    table = torch.linspace(-2, 2, Q_HEADS * 32, device="cuda").view(Q_HEADS, 32)
    variant, kwargs = {
        "plain": (None, {}),
        "buckets": (flare.variants.relative_position_bias(),
                    {"table": table, "max_distance": MAX_DISTANCE}),
        "distance": (flare.variants.distance_bias(),
                     {"bias": flare.variants.t5_distance_bias(table, MAX_DISTANCE)}),
    }[kind]
    wrapper.plan(indptr, indices, last, Q_HEADS, KV_HEADS, HEAD_DIM, PAGE, q_data_type=DTYPE,
                 kv_data_type=DTYPE, variant=variant)
    out = wrapper.run(q, cache, **kwargs)
    return graph_us(lambda: wrapper.run(q, cache, out=out, **kwargs), calls), out


def add_arguments(parser):
    parser.add_argument("--shapes", default=",".join(f"{b}x{n}" for b, n in SHAPES),
                        help="batch x KV length, comma-separated")
    parser.add_argument("--order", default="plain,buckets,distance",
                        help="the order the three kinds are measured in")
    parser.add_argument("--loops", default="cuda,tensor")
    parser.add_argument("--rounds", type=int, default=3,
                        help="measurements of each kind, interleaved; the median is reported "
                             "(a whole measurement sometimes runs 1.2x slow: docs/perf.md, "
                             "forty-sixth session E)")


def main():
    args = small_op_arguments(__doc__, add_arguments)
    shapes = [tuple(int(x) for x in shape.split("x")) for shape in args.shapes.split(",")]
    loops = [loop == "tensor" for loop in args.loops.split(",")]
    print("| decode | loop | plain us | T5 buckets us | T5 distance us | buckets / plain | "
          "distance / plain | max abs(buckets - distance) |")
    print("|---|---|---|---|---|---|---|---|")
    for batch, kv_len in shapes:
        inputs = decode_inputs(batch, kv_len)
        for tensor_cores in loops:
            kinds = args.order.split(",")
            times = {kind: [] for kind in kinds}
            outputs = {}
            for _ in range(args.rounds):
                for kind in kinds:
                    result = guarded(f"{kind} b{batch} kv{kv_len} tc={tensor_cores}",
                                     lambda: measure(batch, inputs, tensor_cores, kind,
                                                     args.calls))
                    if result is not None:
                        times[kind].append(result[0])
                        outputs[kind] = result[1]
            if not all(times.values()):
                continue
            plain, buckets, distance = (statistics.median(times[k])
                                        for k in ("plain", "buckets", "distance"))
            o_b, o_d = outputs["buckets"], outputs["distance"]
            diff = (o_b.float() - o_d.float()).abs().max().item()
            print(f"| b{batch} kv{kv_len} | {'tensor cores' if tensor_cores else 'CUDA cores'} | "
                  f"{plain:.1f} | {buckets:.1f} | {distance:.1f} | {buckets / plain:.3f} | "
                  f"{distance / plain:.3f} | {diff:.2e} |", flush=True)
        inputs = None  # the cache freed before the next shape
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
