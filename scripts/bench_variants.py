#!/usr/bin/env python3
"""Attention variants through the public Python API (issue 18): flare's FA2 prefill with its
built-in variants and with a user-defined variant of the same math, next to FlexAttention
(torch.compile'd flex_attention) and FlashInfer (fa2, fa3) in the same process.

Shapes are the papers' variant tables: batch 16, 16 query and KV heads, head dim 128, bf16,
causal, ragged layout for flare and FlashInfer ([tokens, heads, D]) and [B, H, S, D] for
FlexAttention. Variants: causal, logits soft-cap 30, sliding window 1024 (left), ALiBi
(FlashInfer's default slopes), fused RoPE (pos_encoding_mode="ROPE_LLAMA"; no Flex row: Flex
has no q/k transform), user:soft_cap (flare.AttentionVariant with the built-in
soft-cap's math: the cost of writing a variant oneself), and flare.variants' prefix-LM (a prefix
of a quarter of each sequence), T5 relative position bias (causal, 32 buckets, max distance
128; Flex as a score_mod with the same buckets), distance_bias (T5 again, through
flare.variants.distance_bias() with t5_distance_bias()'s table: one load a near key),
document masking (each sequence packed with documents of L/16 to L/4 tokens, causal inside
each; Flex as a mask_mod on the same ids) and
sigmoid (no softmax: flare only, causal pairs). FlashInfer's output is compared with flare's
(itself compared with Flex): a FlashInfer row more than WRONG_DIFF away prints as wrong, not as
a rate. TFLOP/s count the visible (query, key) pairs: 4 * D * H * pairs. Times: CUDA events
around each eager call, median of --calls.
Usage: python3 scripts/bench_variants.py [--lengths 1024,4096,16384] [--calls 5] [--json F]
       [--variants causal,prefix_lm,...] [--libraries flare,flex,flashinfer]
       [--flare-backend auto|fa2|fa3]
"""
import argparse
import json
import math

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import flare
from bench_python import FLASHINFER, eager_us, flashinfer, guarded

BATCH, HEADS, HEAD_DIM, DTYPE = 16, 16, 128, torch.bfloat16
CAP, WINDOW = 30.0, 1024
WORKSPACE_BYTES = 256 << 20
VARIANTS = ["causal", "soft_cap", "window", "alibi", "rope", "user:soft_cap", "prefix_lm",
            "relative_bias", "distance_bias", "document", "sigmoid"]
LIBRARY = {"prefix_lm": flare.variants.prefix_lm(),
           "relative_bias": flare.variants.relative_position_bias(),
           "distance_bias": flare.variants.distance_bias(),
           "document": flare.variants.document_mask(),
           "sigmoid": flare.variants.sigmoid()}
MAX_DISTANCE = 128.0
WRONG_DIFF = 0.1  # FlashInfer's output this far from flare's (itself checked against Flex)

USER_SOFT_CAP = flare.AttentionVariant(name="soft_cap", scalars=("cap",), source=r"""
struct Variant : flare::VariantBase {
  __device__ static float query_scale(const flare::VariantParams& p) {
    return p.sm_scale / Scalars::cap(p);
  }
  __device__ float logits_transform(const flare::VariantParams& p, float s, int) const {
    return Scalars::cap(p) * flare::kLog2e * flare::fast_tanh(s);
  }
  // Logits within +-cap (a cap of at most 54.7): the built-in's fixed-offset softmax.
  static constexpr bool kLogitsBounded = true;
  __device__ static float logits_bound(const flare::VariantParams& p) {
    return Scalars::cap(p) * flare::kLog2e;
  }
};
""")


def options():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="1024,4096,16384")
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help="comma list of " + ", ".join(VARIANTS))
    parser.add_argument("--libraries", default="flare,flex,flashinfer",
                        help="comma list of flare, flex, flashinfer (flare always runs: the others "
                             "are checked against it)")
    parser.add_argument("--flare-backend", default="auto", choices=["auto", "fa2", "fa3"],
                        help="flare's prefill family (auto: the Hopper family on sm_90)")
    parser.add_argument("--json", help="write every measurement here")
    return parser.parse_args()


def alibi_slopes(heads):
    """FlashInfer's default ALiBi slopes (heads a power of two)."""
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)],
                        dtype=torch.float32, device="cuda")


def prefix_of(length):
    return length // 4


def t5_bucket(n):
    """T5's causal bucket (32 buckets, MAX_DISTANCE) of n = q - kv >= 0, as torch ops."""
    n = n.clamp(min=0)
    large = 16 + (torch.log(n.float().clamp(min=1) / 16) / math.log(MAX_DISTANCE / 16) * 16).long()
    return torch.where(n < 16, n, large.clamp(max=31))


def document_ids(length):
    """[BATCH, length] int32 ids on the GPU: each row packed with documents of length / 16 to
    length / 4 tokens (seeded by the length)."""
    generator = torch.Generator().manual_seed(length)
    rows = []
    for _ in range(BATCH):
        sizes = torch.randint(max(1, length // 16), max(2, length // 4) + 1, (length,),
                              generator=generator)
        rows.append(torch.repeat_interleave(torch.arange(length), sizes)[:length])
    return torch.stack(rows).to(torch.int32).cuda()


def visible_pairs(length, variant):
    """Visible (query, key) pairs of one sequence (the batch's mean for documents)."""
    if variant == "document":
        _, counts = torch.unique_consecutive(document_ids(length).cpu().flatten(),
                                             return_counts=True)
        return int((counts * (counts + 1) // 2).sum()) // BATCH
    if variant == "prefix_lm":
        p = prefix_of(length)
        return p * p + (length * (length + 1) - p * (p + 1)) // 2
    if variant == "window":
        w = min(WINDOW, length - 1)
        return length * (w + 1) - w * (w + 1) // 2
    return length * (length + 1) // 2


def plan_kwargs(variant):
    return {"soft_cap": {"logits_soft_cap": CAP}, "window": {"window_left": WINDOW},
            "alibi": {"pos_encoding_mode": "ALIBI"},
            "rope": {"pos_encoding_mode": "ROPE_LLAMA"}}.get(variant, {})


def library_run_kwargs(variant, length):
    if variant == "prefix_lm":
        return {"prefix_len": torch.full((BATCH,), prefix_of(length), dtype=torch.int32,
                                         device="cuda")}
    if variant == "relative_bias":
        return {"table": relative_table(), "max_distance": MAX_DISTANCE}
    if variant == "distance_bias":  # T5 again, its buckets expanded by distance once
        return {"bias": flare.variants.t5_distance_bias(relative_table(), MAX_DISTANCE)}
    if variant == "document":
        return {"document_start": flare.variants.document_starts(document_ids(length))}
    return {"bias": -1.0}


def relative_table():
    return torch.linspace(-2, 2, HEADS * 32, device="cuda").view(HEADS, 32)


def measure_wrapper(module, backend, variant, q, k, v, indptr, calls):
    kwargs = {} if backend is None else {"backend": backend}
    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    wrapper = module.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", **kwargs)
    user = variant == "user:soft_cap"
    if variant in LIBRARY:
        plan = {"variant": LIBRARY[variant], "causal": variant != "prefix_lm"}
        run_kwargs = library_run_kwargs(variant, int(indptr[1]))
    else:
        plan = {"causal": True, **({"variant": USER_SOFT_CAP} if user else plan_kwargs(variant))}
        run_kwargs = {"cap": CAP} if user else {}
    wrapper.plan(indptr, indptr, HEADS, HEADS, HEAD_DIM, q_data_type=DTYPE, kv_data_type=DTYPE,
                 **plan)
    out = wrapper.run(q, k, v, **run_kwargs)
    return eager_us(lambda: wrapper.run(q, k, v, out=out, **run_kwargs), calls), out


def measure_flex(variant, length, q, k, v, calls, compiled):
    if variant in ("user:soft_cap", "sigmoid", "rope"):  # Flex has no q/k transform
        return None, None
    qb, kb, vb = (x.view(BATCH, length, HEADS, HEAD_DIM).transpose(1, 2) for x in (q, k, v))
    prefix = prefix_of(length)
    docs = document_ids(length)

    def mask(b, h, q_idx, kv_idx):
        visible = q_idx >= kv_idx
        if variant == "prefix_lm":
            return visible | (kv_idx < prefix)
        if variant == "document":
            return visible & (docs[b, q_idx] == docs[b, kv_idx])
        return visible & (q_idx - kv_idx <= WINDOW) if variant == "window" else visible

    block_mask = create_block_mask(mask, BATCH if variant == "document" else None, None, length,
                                   length, device="cuda")
    slopes = alibi_slopes(HEADS)
    table = relative_table()
    score_mod = {
        "soft_cap": lambda s, b, h, qi, ki: CAP * torch.tanh(s / CAP),
        "alibi": lambda s, b, h, qi, ki: s + slopes[h] * (ki - qi),
        "relative_bias": lambda s, b, h, qi, ki: s + table[h, t5_bucket(qi - ki)],
    }.get("relative_bias" if variant == "distance_bias" else variant)  # T5 either way

    def call():
        return compiled(qb, kb, vb, score_mod=score_mod, block_mask=block_mask)

    out = call()
    return eager_us(call, calls), out.transpose(1, 2).reshape(-1, HEADS, HEAD_DIM)


def compiled_flex_attention():
    """torch.compile'd flex_attention, allowed one compiled graph per shape and mask function:
    more than dynamo's default of 8, past which it falls back to eager flex_attention (which
    materializes the scores: out of memory)."""
    for limit in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, 64)
    return torch.compile(flex_attention, dynamic=False)


def main():
    args = options()
    libraries = set(args.libraries.split(","))
    torch.manual_seed(0)
    compiled = compiled_flex_attention()
    device = torch.cuda.get_device_name()
    print(f"device: {device}, torch {torch.__version__}, flashinfer {FLASHINFER}")
    rows = []
    for length in (int(x) for x in args.lengths.split(",")):
        total = BATCH * length
        indptr = torch.arange(0, total + 1, length, dtype=torch.int32)
        q = torch.randn(total, HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
        k, v = torch.randn_like(q), torch.randn_like(q)
        for variant in args.variants.split(","):
            flops = 4.0 * HEAD_DIM * HEADS * BATCH * visible_pairs(length, variant)
            row = {"length": length, "variant": variant}
            result = guarded(f"flare {variant} {length}", lambda: measure_wrapper(
                flare, None if args.flare_backend == "auto" else args.flare_backend, variant, q, k, v,
                indptr, args.calls))
            flare_out = None
            if result:
                row["flare_us"], flare_out = result
            result = guarded(f"flex {variant} {length}", lambda: measure_flex(
                variant, length, q, k, v, args.calls, compiled)) if "flex" in libraries else None
            if result and result[0] is not None:
                row["flex_us"], flex_out = result
                if flare_out is not None:
                    row["max_diff_vs_flex"] = (flare_out.float() - flex_out.float()).abs().max().item()
            for backend in ("fa2", "fa3"):
                if (flashinfer is None or "flashinfer" not in libraries or
                        variant == "user:soft_cap" or variant in LIBRARY):
                    continue
                if variant == "rope" and backend == "fa3":  # FlashInfer's fa3 has no RoPE
                    continue
                result = guarded(f"flashinfer {backend} {variant} {length}", lambda: measure_wrapper(
                    flashinfer, backend, variant, q, k, v, indptr, args.calls))
                if result:
                    diff = (None if flare_out is None else
                            (result[1].float() - flare_out.float()).abs().max().item())
                    row[f"flashinfer_{backend}_max_diff_vs_flare"] = diff
                    # A library that does not compute the variant (FlashInfer's sm90 kernels
                    # take no ALiBi slopes) is not an anchor: its time is kept apart.
                    wrong = diff is not None and diff > WRONG_DIFF
                    row[f"flashinfer_{backend}{'_wrong' if wrong else ''}_us"] = result[0]
            for key in [k_ for k_ in row if k_.endswith("_us")]:
                row[key.replace("_us", "_tflops")] = flops / row[key] / 1e6
            rows.append(row)
            # A row as soon as it is measured: a call that runs out of time keeps what it got
            # (FlashInfer's first use of a variant builds its module for minutes).
            print("measured:", ", ".join(f"{key} {value:.1f}" for key, value in row.items()
                                         if key.endswith("_tflops")), f"({variant} {length})",
                  flush=True)
            del flare_out
        q = k = v = None  # freed before the next length's tensors
        torch.cuda.empty_cache()
    print("\n| variant | length | flare TFLOP/s | FlexAttention | flare / Flex | FlashInfer fa2 | fa3 | flare / fa2 |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        def cell(key):
            value = row.get(key)
            if value is None and row.get(key.replace("_tflops", "_wrong_tflops")) is not None:
                diff = row[key.replace("_tflops", "_max_diff_vs_flare")]
                return f"wrong (max diff {diff:.2g})"
            return "n/a" if value is None else f"{value:.1f}"
        ratio = (f"{row['flex_us'] / row['flare_us']:.2f}"
                 if "flex_us" in row and "flare_us" in row else "n/a")
        ratio_fa2 = (f"{row['flashinfer_fa2_us'] / row['flare_us']:.2f}"
                     if "flashinfer_fa2_us" in row and "flare_us" in row else "n/a")
        print(f"| {row['variant']} | {row['length']} | {cell('flare_tflops')} | "
              f"{cell('flex_tflops')} | {ratio} | {cell('flashinfer_fa2_tflops')} | "
              f"{cell('flashinfer_fa3_tflops')} | {ratio_fa2} |")
    by_length = {}
    for row in rows:
        by_length.setdefault(row["length"], {})[row["variant"]] = row.get("flare_us")
    for length, times in by_length.items():
        if times.get("soft_cap") and times.get("user:soft_cap"):
            print(f"user soft-cap / built-in soft-cap time, length {length}: "
                  f"{times['user:soft_cap'] / times['soft_cap']:.3f}")
        if times.get("causal") and times.get("rope"):
            print(f"fused RoPE / causal time, length {length}: "
                  f"{times['rope'] / times['causal']:.3f}")
        if times.get("causal") and times.get("relative_bias"):
            print(f"relative bias / causal time, length {length}: "
                  f"{times['relative_bias'] / times['causal']:.3f}")
        if times.get("causal") and times.get("distance_bias"):
            print(f"distance bias (T5's table by distance) / causal time, length {length}: "
                  f"{times['distance_bias'] / times['causal']:.3f}")
        if times.get("causal") and times.get("document"):
            # Fewer pairs than causal: the target compares the rate over the visible pairs.
            rate = (visible_pairs(length, "causal") / times["causal"]) / (
                visible_pairs(length, "document") / times["document"])
            print(f"document mask: time {times['document'] / times['causal']:.3f} of causal, "
                  f"causal's TFLOP/s over document's {rate:.3f}")
    print("max |flare - Flex| per row:", ", ".join(
        f"{r['variant']}@{r['length']}={r['max_diff_vs_flex']:.3g}"
        for r in rows if "max_diff_vs_flex" in r))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
