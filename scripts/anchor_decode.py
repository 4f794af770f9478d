#!/usr/bin/env python3
"""PyTorch SDPA anchors for flare's decode benchmark, and the issue-4 table.

Measures F.scaled_dot_product_attention (cuDNN and flash backends, enable_gqa) on the shapes of
tests/gpu/decode_bench_test.cpp laid out contiguously (q [B, 32, 1, 128], k/v [B, 8, L, 128]
bf16, random values), timed like flare (CUDA events around each call, median of 30, rotating
among copies so >= 1 GiB of distinct KV cycles and nothing is served from L2), plus the
device-to-device copy ceiling. With --flare (the JSON lines the benchmark wrote) it prints the
table: flare TB/s next to the anchors, the ratios and the issue-4 targets.

With --stream (the JSON lines of scripts/kv_placement_probe.cu, run in the same call) it also
prints how fast a kernel that only reads b64 kv8192's bytes streams them from each page placement,
next to flare and cuDNN: the ceiling that page placement sets.

Usage: python3 scripts/anchor_decode.py --flare FILE [--stream FILE] [--out anchors.json]
"""
import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

Q_HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
ROTATION_BYTES = 1 << 30
WARMUP, TIMED = 5, 30
SHAPES = {  # case -> (batch, kv_len); the same names as the flare benchmark
    "b64_kv8192": (64, 8192),
    "b16_kv32768": (16, 32768),
    "b1_kv32768": (1, 32768),
    "b16_kv4096": (16, 4096),
    "b1_kv4096": (1, 4096),
    "b128_kv4096": (128, 4096),
    "b256_kv2048": (256, 2048),
}
# Variants compared with the anchor of another case (the same shape on contiguous KV); "_tc"
# cases are the same batches on the tensor-core loop (use_tensor_cores).
# "_wp" cases run whole-page items (kv_heads_per_item = 8, decode v16), "_wp4" items of 4 heads.
ANCHOR_OF = {"b64_kv8192_pages_in_order": "b64_kv8192",
             "b16_kv4096_pages_in_order": "b16_kv4096",
             "b16_kv4096_pages_in_order_tc": "b16_kv4096",
             "b64_kv8192_pages_in_order_tc": "b64_kv8192",
             "b64_kv8192_pages_in_order_wp": "b64_kv8192",
             "b64_kv8192_wp4": "b64_kv8192",
             **{f"{case}_tc": case for case in SHAPES},
             **{f"{case}_wp": case for case in SHAPES}}
TARGETS_TBPS = {"b64_kv8192": 2.7, "b16_kv32768": 2.9, "b1_kv32768": 2.3, "b16_kv4096": 2.4}
TARGETS_TBPS.update({f"{case}{suffix}": t for case, t in TARGETS_TBPS.items()
                     for suffix in ("_tc", "_wp")})


def median_ms(calls):
    """calls: list of zero-argument callables, used in rotation."""
    for i in range(WARMUP):
        calls[i % len(calls)]()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(TIMED)]
    stops = [torch.cuda.Event(enable_timing=True) for _ in range(TIMED)]
    for i in range(TIMED):
        starts[i].record()
        calls[(i + WARMUP) % len(calls)]()
        stops[i].record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in zip(starts, stops))
    return times[len(times) // 2]


def copy_ceiling_tbps():
    a = torch.randn(1 << 30, device="cuda", dtype=torch.bfloat16)
    b = torch.empty_like(a)
    ms = median_ms([lambda: b.copy_(a)])
    return 2 * a.numel() * 2 / (ms * 1e-3) / 1e12


def sdpa_anchor(batch, kv_len):
    kv_bytes = 2 * batch * KV_HEADS * kv_len * HEAD_DIM * 2
    copies = max(1, -(-ROTATION_BYTES // kv_bytes))
    sets = []
    for _ in range(copies):
        q = torch.randn(batch, Q_HEADS, 1, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(batch, KV_HEADS, kv_len, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        sets.append((q, k, v))
    row = {"kv_bytes": kv_bytes, "copies": copies}
    for name, backend in [("cudnn", SDPBackend.CUDNN_ATTENTION),
                          ("flash", SDPBackend.FLASH_ATTENTION)]:
        try:
            with sdpa_kernel([backend]):
                calls = [lambda s=s: F.scaled_dot_product_attention(*s, enable_gqa=True)
                         for s in sets]
                ms = median_ms(calls)
            row[name + "_us"] = ms * 1e3
            row[name + "_tbps"] = kv_bytes / (ms * 1e-3) / 1e12
        except Exception as error:  # a backend may refuse a shape; the table says so
            row[name + "_error"] = str(error).splitlines()[0][:120]
    del sets
    torch.cuda.empty_cache()
    return row


def fmt(x, digits=2):
    return "n/a" if x is None else f"{x:.{digits}f}"


def print_table(flare_rows, anchors):
    print(f"device: {anchors['device']}, torch {anchors['torch']}, "
          f"copy ceiling {anchors['copy_tbps']:.2f} TB/s (read + write)")
    header = (f"{'case':26s} {'flare us':>9s} {'flare TB/s':>10s} {'cuDNN TB/s':>10s} "
              f"{'flash TB/s':>10s} {'x cuDNN':>8s} {'x flash':>8s} {'target':>7s} "
              f"{'run() host':>10s} {'plan() host':>11s}")
    print(header)
    print("-" * len(header))
    for row in flare_rows:
        a = anchors["sdpa"].get(ANCHOR_OF.get(row["case"], row["case"]), {})
        cudnn, flash = a.get("cudnn_tbps"), a.get("flash_tbps")
        target = TARGETS_TBPS.get(row["case"])
        print(f"{row['case']:26s} {row['median_us']:9.1f} {row['tbps']:10.2f} {fmt(cudnn):>10s} "
              f"{fmt(flash):>10s} {fmt(cudnn and row['tbps'] / cudnn):>8s} "
              f"{fmt(flash and row['tbps'] / flash):>8s} {fmt(target, 1):>7s} "
              f"{fmt(row.get('run_host_us'), 1):>10s} {fmt(row.get('plan_host_us') or None, 1):>11s}")
    by_case = {r["case"]: r for r in flare_rows}

    def ratio(a, b, key):
        if a in by_case and b in by_case:
            return by_case[a][key] / by_case[b][key]
        return None
    print()
    print(f"zipf / uniform (same total KV) bandwidth: "
          f"{fmt(ratio('b64_zipf_mean2048', 'b64_uniform_same_total', 'tbps'), 3)} (target >= 0.90)")
    print(f"zipf / uniform, tensor-core loop: "
          f"{fmt(ratio('b64_zipf_mean2048_tc', 'b64_uniform_same_total_tc', 'tbps'), 3)}")
    print("tensor-core / CUDA-core loop time: " + ", ".join(
        f"{case} {fmt(ratio(case + '_tc', case, 'median_us'), 3)}"
        for case in ["b64_kv8192", "b16_kv32768", "b1_kv32768", "b16_kv4096", "b128_kv4096",
                     "b256_kv2048", "b64_zipf_mean2048", "b64_kv8192_e4m3", "b1_kv32768_e4m3",
                     "b16_kv4096_e4m3"]))
    print("tensor-core / CUDA-core loop time, other shapes: " + ", ".join(
        f"{case} {fmt(ratio(case + '_tc', case, 'median_us'), 3)}"
        for case in ["b64_kv2048_gqa1", "b64_kv8192_gqa8", "b64_kv16384_d64", "b64_kv4096_d256",
                     "b64_kv8192_f16", "b1_kv32768_d256"]))
    print(f"page 1 / page 16 bandwidth, b64 kv8192: "
          f"{fmt(ratio('b64_kv8192_page1', 'b64_kv8192', 'tbps'), 3)} (target >= 0.95)")
    print(f"page 1 / page 16 bandwidth, b16 kv4096: "
          f"{fmt(ratio('b16_kv4096_page1', 'b16_kv4096', 'tbps'), 3)}")
    print(f"fp8 e4m3 / bf16 requests per second, b64 kv8192: "
          f"{fmt(ratio('b64_kv8192_e4m3', 'b64_kv8192', 'requests_per_s'), 3)} (target >= 1.8); "
          f"tensor-core loop {fmt(ratio('b64_kv8192_e4m3_tc', 'b64_kv8192_tc', 'requests_per_s'), 3)}"
          f", its fp8 against the CUDA-core loop's bf16 "
          f"{fmt(ratio('b64_kv8192_e4m3_tc', 'b64_kv8192', 'requests_per_s'), 3)}")
    print(f"HND / NHD bandwidth, b64 kv8192: {fmt(ratio('b64_kv8192_hnd', 'b64_kv8192', 'tbps'), 3)}")
    cudnn_b64 = anchors["sdpa"].get("b64_kv8192", {}).get("cudnn_us")
    if cudnn_b64:
        def x_cudnn(case):
            return fmt(cudnn_b64 / by_case[case]["median_us"], 3) if case in by_case else "n/a"
        print(f"b64 kv8192 x cuDNN (target >= 1.0), tensor-core loop: pages in allocation order "
              f"{x_cudnn('b64_kv8192_pages_in_order_tc')} (FlashInfer's benchmark convention), "
              f"shuffled pages {x_cudnn('b64_kv8192_tc')}; CUDA-core loop "
              f"{x_cudnn('b64_kv8192_pages_in_order')} / {x_cudnn('b64_kv8192')}")
        print(f"b64 kv8192 x cuDNN, whole-page items: shuffled pages {x_cudnn('b64_kv8192_wp')} "
              f"(4 heads an item {x_cudnn('b64_kv8192_wp4')}), pages in allocation order "
              f"{x_cudnn('b64_kv8192_pages_in_order_wp')}")
    print("whole-page / one-head items time (tensor cores): " + ", ".join(
        f"{case} {fmt(ratio(case + '_wp', case + '_tc', 'median_us'), 3)}"
        for case in ["b64_kv8192", "b16_kv32768", "b1_kv32768", "b16_kv4096", "b128_kv4096",
                     "b64_zipf_mean2048", "b64_kv8192_pages_in_order", "b64_kv8192_gqa8",
                     "b64_kv16384_d64", "b64_kv8192_e4m3", "b1_kv32768_e4m3", "b16_kv4096_e4m3"]))
    print(f"whole-page items: zipf / uniform "
          f"{fmt(ratio('b64_zipf_mean2048_wp', 'b64_uniform_same_total_wp', 'tbps'), 3)}, "
          f"page 1 / page 16 {fmt(ratio('b64_kv8192_page1_wp', 'b64_kv8192_wp', 'tbps'), 3)}, "
          f"HND / NHD {fmt(ratio('b64_kv8192_hnd_wp', 'b64_kv8192_wp', 'tbps'), 3)}, "
          f"fp8 / bf16 requests/s "
          f"{fmt(ratio('b64_kv8192_e4m3_wp', 'b64_kv8192_wp', 'requests_per_s'), 3)}")
    print(f"pages in pool order / shuffled, b64 kv8192: "
          f"{fmt(ratio('b64_kv8192_pages_in_order', 'b64_kv8192', 'tbps'), 3)}, tensor-core loop "
          f"{fmt(ratio('b64_kv8192_pages_in_order_tc', 'b64_kv8192_tc', 'tbps'), 3)}")


def print_stream_ceilings(flare_rows, anchors, stream_path):
    """The KV-placement probe's streams next to flare's b64 kv8192 on tensor cores and cuDNN."""
    with open(stream_path) as f:
        streams = [json.loads(line) for line in f if line.strip()]
    by_case = {r["case"]: r for r in flare_rows}
    cudnn_us = anchors["sdpa"].get("b64_kv8192", {}).get("cudnn_us")
    print()
    print("b64 kv8192's 2 GiB read by kernels that only stream them (scripts/kv_placement_probe.cu,"
          " no compute):")
    for s in streams:
        x_cudnn = cudnn_us and cudnn_us / s["median_us"]
        print(f"  {s['geometry']:36s} {s['pattern']:26s} {s['median_us']:7.1f} us "
              f"{s['tbps']:5.2f} TB/s  {fmt(x_cudnn, 3)} x cuDNN")
    flare_geometry = [s for s in streams if s["geometry"].startswith("cp.async 128 thr 3x32 KiB 2/SM")
                      and "clusters" not in s["geometry"]]
    whole_page_geometry = [s for s in streams
                           if s["geometry"].startswith("cp.async 256 thr 3x64 KiB 1/SM")]
    for case, geometry, pattern in [
            ("b64_kv8192_tc", flare_geometry, "paged/head, shuffled"),
            ("b64_kv8192_pages_in_order_tc", flare_geometry, "paged/head, pool order"),
            ("b64_kv8192_wp", whole_page_geometry, "paged/page, shuffled")]:
        stream = next((s for s in geometry if s["pattern"] == pattern), None)
        if case in by_case and stream:
            print(f"  {case} / the stream of its pattern and geometry: "
                  f"{by_case[case]['median_us'] / stream['median_us']:.3f} (time)")
    shuffled = [s for s in streams if "shuffled" in s["pattern"]]
    if shuffled and cudnn_us:
        best = min(shuffled, key=lambda s: s["median_us"])
        print(f"  fastest stream of the shuffled pages: {best['median_us']:.1f} us "
              f"({best['geometry']}, {best['pattern']}) = {cudnn_us / best['median_us']:.3f} x cuDNN")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flare", help="JSON lines written by the flare decode benchmark")
    parser.add_argument("--stream", help="JSON lines written by scripts/kv_placement_probe.cu")
    parser.add_argument("--out", help="write the anchors as JSON here")
    args = parser.parse_args()
    props = torch.cuda.get_device_properties(0)
    anchors = {"device": props.name, "torch": torch.__version__,
               "copy_tbps": copy_ceiling_tbps(), "sdpa": {}}
    for case, (batch, kv_len) in SHAPES.items():
        anchors["sdpa"][case] = sdpa_anchor(batch, kv_len)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(anchors, f, indent=1)
    if args.flare:
        with open(args.flare) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        print_table(rows, anchors)
        if args.stream:
            print_stream_ceilings(rows, anchors, args.stream)
    else:
        print(json.dumps(anchors, indent=1))


if __name__ == "__main__":
    main()
