"""Decode tokens/s of flare.models.LlamaDecoder (the whole-model megakernel, issue 22) next to
the same model in PyTorch, gpt-fast's way, in the same process.

Both decode `--new-tokens` tokens per request after a prompt of `--prompt` tokens whose K/V are
random bf16 values (the kernels read every cached row; values do not change the time). Weights
are random, of the model's exact shapes: bf16, or with --weights int4 4-bit projections (group
128, bf16 scales) and a bf16 LM head. Each side runs one CUDA graph per step that also
feeds the step's greedy tokens back and advances the positions, replayed back to back; the time
is CUDA events around the replays. Also printed: the eager step (Python call per step), the host
time of one step() call, and the bytes a step reads (weights + KV) per second as a fraction of
this device's copy bandwidth (a 2 GiB device-to-device copy, read + write bytes). With
--temperature the flare side also runs sampled in its kernel (--top-k, --top-p; the baseline
stays greedy): the last column.

The baseline: a Llama in plain PyTorch with a static dense KV cache [batch, kv_heads, max_len,
128] and SDPA over it with a mask (gpt-fast's model), torch.compile(mode=--compile-mode), then
captured in a CUDA graph per step. With 4-bit weights its projections are gpt-fast's int4 path,
torch's tinygemm kernel (aten._weight_int4pack_mm) on the same codes and scales (zero points 0).

Usage: python scripts/bench_llama_decode.py --model llama-3.1-8b --prompt 1024 6144 --batch 1 4
"""

import argparse
import time

import torch
import torch.nn.functional as F

from flare.models import LlamaConfig, LlamaDecoder, random_llama_state_dict


def copy_bandwidth():
    a = torch.empty(1 << 30, dtype=torch.int16, device="cuda").random_()
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        b.copy_(a)
    end.record()
    torch.cuda.synchronize()
    return 2 * a.numel() * 2 * 10 / (start.elapsed_time(end) * 1e-3)


def timed_replays(graph, n):
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e-3 / n


def capture(fn):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


class Int4Linear:
    """gpt-fast's 4-bit linear: tinygemm's packed codes, [K / 128, N, 2] scales and zeros."""

    def __init__(self, codes, scales, inner_k_tiles=8):
        swapped = ((codes & 0x0F) << 4) | (codes >> 4)  # tinygemm: even column in the high nibble
        self.packed = torch.ops.aten._convert_weight_to_int4pack(swapped.contiguous(),
                                                                 inner_k_tiles)
        self.scales_and_zeros = torch.stack(
            [scales.t(), torch.zeros_like(scales.t())], dim=-1).contiguous()

    def __call__(self, x):
        return torch.ops.aten._weight_int4pack_mm(x, self.packed, 128, self.scales_and_zeros)


class TorchLlama:
    """gpt-fast's decode step: bf16 activations, static dense KV cache, SDPA with a mask;
    bf16 weights through F.linear, 4-bit ones through tinygemm (Int4Linear)."""

    def __init__(self, config, sd, batch, max_len):
        from flare.models import weight_list

        w, scales = weight_list(config, sd)
        self.c, self.embed, self.final_norm, self.lm_head = config, w[0], w[1], w[2]
        self.layers = []
        for l in range(config.num_layers):
            t = w[3 + 9 * l: 12 + 9 * l]
            if scales:
                s = scales[7 * l: 7 * l + 7]
                proj = [Int4Linear(t[i], s[i]) for i in range(7)]
            else:
                proj = [lambda x, wt=t[i]: F.linear(x, wt) for i in range(7)]
            self.layers.append(proj + list(t[7:9]))
        shape = (batch, config.kv_heads, max_len, config.head_dim)
        self.k = [torch.randn(shape, dtype=torch.bfloat16, device="cuda") for _ in self.layers]
        self.v = [torch.randn(shape, dtype=torch.bfloat16, device="cuda") for _ in self.layers]
        self.inv_freq = torch.tensor(config.rope_inv_freq(), device="cuda")
        self.max_len = max_len

    def norm(self, x, g):
        xf = x.float()
        return g * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.c.rms_eps)).to(x.dtype)

    def rope(self, x, cos, sin):
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    def step(self, tokens, pos):
        c, B = self.c, tokens.shape[0]
        angle = pos.float()[:, None] * self.inv_freq[None, :]
        cos, sin = angle.cos().to(torch.bfloat16)[:, None, :], angle.sin().to(torch.bfloat16)[:, None, :]
        mask = (torch.arange(self.max_len, device="cuda")[None, :] <= pos[:, None])[:, None, None, :]
        rows = torch.arange(B, device="cuda")
        x = self.embed[tokens]
        for l, (wq, wk, wv, wo, wg, wu, wd, g1, g2) in enumerate(self.layers):
            h = self.norm(x, g1)
            q = self.rope(wq(h).view(B, c.heads, c.head_dim), cos, sin)
            k = self.rope(wk(h).view(B, c.kv_heads, c.head_dim), cos, sin)
            v = wv(h).view(B, c.kv_heads, c.head_dim)
            self.k[l][rows, :, pos] = k
            self.v[l][rows, :, pos] = v
            o = F.scaled_dot_product_attention(q[:, :, None, :], self.k[l], self.v[l],
                                               attn_mask=mask, enable_gqa=True)
            x = x + wo(o.reshape(B, c.heads * c.head_dim))
            h = self.norm(x, g2)
            x = x + wd(F.silu(wg(h)) * wu(h))
        logits = F.linear(self.norm(x, self.final_norm), self.lm_head)
        return logits.argmax(-1)


def bench_flare(config, sd, batch, prompt, new_tokens, page_size=16, sampling=None):
    pages_per_request = -(-(prompt + new_tokens + 2) // page_size)
    dec = LlamaDecoder(config, sd, num_pages=batch * pages_per_request, page_size=page_size)
    for k, v in zip(dec.k_caches, dec.v_caches):
        k.normal_()
        v.normal_()
    gen = torch.Generator().manual_seed(0)
    indices = torch.randperm(batch * pages_per_request, generator=gen).to(torch.int32).cuda()
    indptr = (torch.arange(batch + 1, dtype=torch.int32) * pages_per_request).cuda()
    tokens = torch.randint(0, config.vocab, (batch,), dtype=torch.int32, device="cuda")
    positions = torch.full((batch,), prompt, dtype=torch.int32, device="cuda")
    next_tokens = torch.empty(batch, dtype=torch.int32, device="cuda")
    logits = torch.empty((batch, config.vocab), device="cuda")

    sampling = sampling or {}

    def one_step():
        dec.step(tokens, positions, indptr, indices, next_tokens=next_tokens, logits=logits,
                 **sampling)
        tokens.copy_(next_tokens)
        positions.add_(1)

    graph = capture(one_step)
    positions.fill_(prompt)
    graph_s = timed_replays(graph, new_tokens)
    positions.fill_(prompt)
    one_step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(new_tokens):
        one_step()
    torch.cuda.synchronize()
    eager_s = (time.perf_counter() - start) / new_tokens
    host = []
    for _ in range(20):
        t0 = time.perf_counter()
        dec.step(tokens, positions, indptr, indices, next_tokens=next_tokens, logits=logits,
                 **sampling)
        host.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
    error = dec.take_error()
    assert error is None, error
    return graph_s, eager_s, sorted(host)[len(host) // 2]


def bench_torch(config, sd, batch, prompt, new_tokens, mode):
    model = TorchLlama(config, sd, batch, prompt + new_tokens + 2)
    step = torch.compile(model.step, mode=mode) if mode != "eager" else model.step
    tokens = torch.randint(0, config.vocab, (batch,), device="cuda")
    pos = torch.full((batch,), prompt, dtype=torch.long, device="cuda")
    t0 = time.perf_counter()
    with torch.no_grad():
        for _ in range(3):
            step(tokens, pos)
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - t0

        def one_step():
            tokens.copy_(step(tokens, pos))
            pos.add_(1)

        graph = capture(one_step)
        pos.fill_(prompt)
        graph_s = timed_replays(graph, new_tokens)
    return graph_s, compile_s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--prompt", type=int, nargs="+", default=[1024])
    ap.add_argument("--batch", type=int, nargs="+", default=[1])
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--weights", choices=["bf16", "int4"], default="bf16")
    ap.add_argument("--compile-mode", default="max-autotune-no-cudagraphs",
                    help="torch.compile mode of the baseline; 'eager' skips compiling, 'none' "
                         "skips the baseline")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="> 0: also time flare sampling in its kernel (the baseline stays greedy)")
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=1.0)
    args = ap.parse_args()
    sampling = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=1)
    config = LlamaConfig.preset(args.model)
    config.weight_format = args.weights
    sd = random_llama_state_dict(config)
    copy_bw = copy_bandwidth()
    print(f"device {torch.cuda.get_device_name()}, copy bandwidth {copy_bw / 1e12:.2f} TB/s, "
          f"torch {torch.__version__}, baseline torch.compile mode {args.compile_mode}, "
          f"weights {args.weights} ({config.step_weight_bytes() / 1e9:.2f} GB a step)")
    print("| model | batch | prompt | flare tok/s (graph) | flare eager tok/s | step() host us "
          "| bytes/s vs copy | baseline tok/s | flare / baseline | flare sampled tok/s (graph) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for batch in args.batch:
        for prompt in args.prompt:
            graph_s, eager_s, host_s = bench_flare(config, sd, batch, prompt, args.new_tokens)
            avg_len = prompt + args.new_tokens / 2
            kv_bytes = batch * config.num_layers * 2 * avg_len * config.kv_heads * config.head_dim * 2
            fraction = (config.step_weight_bytes() + kv_bytes) / graph_s / copy_bw
            base = "-"
            ratio = "-"
            sampled = "-"
            if args.temperature > 0:
                sampled_s = bench_flare(config, sd, batch, prompt, args.new_tokens,
                                        sampling=sampling)[0]
                sampled = f"{batch / sampled_s:.1f} (T {args.temperature:g}, top-k {args.top_k}, " \
                          f"top-p {args.top_p:g})"
            if args.compile_mode != "none":
                try:
                    base_s, compile_s = bench_torch(config, sd, batch, prompt, args.new_tokens,
                                                    args.compile_mode)
                    base = f"{batch / base_s:.1f} (compile {compile_s:.0f} s)"
                    ratio = f"{base_s / graph_s:.2f}x"
                except (RuntimeError, NotImplementedError) as e:  # an int4 op this torch lacks
                    base = f"failed: {str(e).splitlines()[0][:120]}"
            print(f"| {args.model} {args.weights} | {batch} | {prompt} | {batch / graph_s:.1f} | "
                  f"{batch / eager_s:.1f} | {host_s * 1e6:.0f} | {fraction:.2f} | {base} | "
                  f"{ratio} | {sampled} |", flush=True)


if __name__ == "__main__":
    main()
