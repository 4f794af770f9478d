"""Where a megakernel decode step's time goes (issue 22): per-CTA stage timestamps
(LlamaDecoder.set_trace, kernels/llama_decode_params.cuh) of one step, summarized per stage
over layers: the critical path (the last CTA's signal minus the previous stage's last signal),
the median and slowest CTA's work (its signal minus its wait's end), and the median wait.

Usage: python experiments/llama_decode_trace.py [--model llama-3.1-8b] [--batch 1] [--prompt 1024]
"""

import argparse

import torch

from flare.models import LlamaConfig, LlamaDecoder, random_llama_state_dict

STAGES = ["qkv", "attention", "o", "gate_up", "down"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--weights", choices=["bf16", "int4"], default="bf16")
    args = ap.parse_args()
    config = LlamaConfig.preset(args.model)
    config.weight_format = args.weights
    sd = random_llama_state_dict(config)
    pages = -(-(args.prompt + 8) // 16)
    dec = LlamaDecoder(config, sd, num_pages=args.batch * pages)
    for k, v in zip(dec.k_caches, dec.v_caches):
        k.normal_()
        v.normal_()
    indptr = (torch.arange(args.batch + 1, dtype=torch.int32) * pages).cuda()
    indices = torch.arange(args.batch * pages, dtype=torch.int32).cuda()
    tokens = torch.ones(args.batch, dtype=torch.int32, device="cuda")
    positions = torch.full((args.batch,), args.prompt, dtype=torch.int32, device="cuda")
    impl = dec._impl
    trace = torch.zeros((impl.num_ctas, impl.trace_events), dtype=torch.int64, device="cuda")
    for _ in range(3):
        dec.step(tokens, positions, indptr, indices)
    impl.set_trace(trace)
    dec.step(tokens, positions, indptr, indices)
    torch.cuda.synchronize()
    impl.set_trace(None)
    t = (trace - trace[:, 0].min()).double() / 1e3  # us from the first CTA's start
    L = config.num_layers
    total = t[:, -1].max().item()
    print(f"{args.model} batch {args.batch} prompt {args.prompt}: step {total:.0f} us "
          f"({args.batch * 1e6 / total:.0f} tok/s), embed {t[:, 1].max().item():.1f} us")
    print("| stage | critical path us (sum over layers) | median CTA work | slowest CTA work | median wait |")
    print("|---|---|---|---|---|")
    previous_release = t[:, 1].max()
    sums = {s: [0.0, 0.0, 0.0, 0.0] for s in STAGES}
    prev_signal = t[:, 1]
    for layer in range(L):
        for i, name in enumerate(STAGES):
            e = 2 + 2 * (layer * 5 + i)
            done, signal = t[:, e], t[:, e + 1]
            release = signal.max()
            sums[name][0] += (release - previous_release).item()
            work = signal - done
            sums[name][1] += work.median().item()
            sums[name][2] += work.max().item()
            sums[name][3] += (done - prev_signal).median().item()
            previous_release = release
            prev_signal = signal
    for name in STAGES:
        c, m, s, w = sums[name]
        print(f"| {name} | {c:.0f} | {m:.0f} | {s:.0f} | {w:.0f} |")
    lm_done, end = t[:, -2], t[:, -1]
    print(f"| lm_head | {(end.max() - previous_release).item():.0f} | {(end - lm_done).median().item():.0f} | "
          f"{(end - lm_done).max().item():.0f} | {(lm_done - prev_signal).median().item():.0f} |")


if __name__ == "__main__":
    main()
