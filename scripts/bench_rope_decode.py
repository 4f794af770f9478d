#!/usr/bin/env python3
"""Fused RoPE in decode through the public Python API (issue 18: within 5% of decode without
it): flare's BatchDecodeWithPagedKVCacheWrapper with pos_encoding_mode "NONE" and "ROPE_LLAMA"
on both loops (use_tensor_cores False / True), and FlashInfer's wrapper the same way when
.anchors-fi was carried, in one process. bf16, 32 query / 8 KV heads, head dim 128, page 16,
pages in allocation order. GPU time per call from a CUDA-graph replay.
Usage: python3 scripts/bench_rope_decode.py [--calls 20] [--json F]
"""
import torch

import flare
from bench_python import (DTYPE, HEAD_DIM, KV_HEADS, PAGE, Q_HEADS, decode_inputs, decode_wrapper,
                          flashinfer, graph_us, guarded, small_op_arguments, write_json)

SHAPES = [(1, 32768), (16, 4096), (64, 8192), (16, 32768)]
WORKSPACE_BYTES = 256 << 20


def measure(module, batch, kv_len, inputs, tensor_cores, mode, calls):
    cache, indptr, indices, last, q = inputs
    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    wrapper = decode_wrapper(module, workspace, True, batch, indices.numel(), tensor_cores)
    wrapper.plan(indptr, indices, last, Q_HEADS, KV_HEADS, HEAD_DIM, PAGE, q_data_type=DTYPE,
                 kv_data_type=DTYPE, pos_encoding_mode=mode)
    out = wrapper.run(q, cache)
    return graph_us(lambda: wrapper.run(q, cache, out=out), calls), out


def main():
    args = small_op_arguments(__doc__)
    rows = []
    for batch, kv_len in SHAPES:
        inputs = decode_inputs(batch, kv_len)
        for tensor_cores in (False, True):
            row = {"batch": batch, "kv_len": kv_len, "tensor_cores": tensor_cores}
            for library, module in (("flare", flare), ("flashinfer", flashinfer)):
                if module is None:
                    continue
                for mode in ("NONE", "ROPE_LLAMA"):
                    result = guarded(f"{library} {mode} b{batch} kv{kv_len} tc={tensor_cores}",
                                     lambda: measure(module, batch, kv_len, inputs, tensor_cores,
                                                     mode, args.calls))
                    if result:
                        row[f"{library}_{mode}_us"] = result[0]
            rows.append(row)
        del inputs
        torch.cuda.empty_cache()
    print("\n| decode | loop | flare us | flare RoPE us | RoPE / plain | FlashInfer us | "
          "FlashInfer RoPE us | flare RoPE x FlashInfer RoPE |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        def get(key):
            return r.get(key)

        def fmt(x, digits=1):
            return "n/a" if x is None else f"{x:.{digits}f}"

        plain, rope = get("flare_NONE_us"), get("flare_ROPE_LLAMA_us")
        fi_plain, fi_rope = get("flashinfer_NONE_us"), get("flashinfer_ROPE_LLAMA_us")
        print(f"| b{r['batch']} kv{r['kv_len']} | {'tensor cores' if r['tensor_cores'] else 'CUDA cores'}"
              f" | {fmt(plain)} | {fmt(rope)} | {fmt(rope / plain if plain and rope else None, 3)}"
              f" | {fmt(fi_plain)} | {fmt(fi_rope)} | "
              f"{fmt(fi_rope / rope if fi_rope and rope else None, 2)} |")
    write_json(args.json, rows)


if __name__ == "__main__":
    main()
