#!/usr/bin/env python3
"""Fine-grained sparse decode (Quest; issue 20, paper 002 appendix G.5, Tables 9-11) through the
public Python API: flare's PerHeadSparseDecodeWrapper, where each KV head reads its own
--budgets pages chosen from the request's pages, next to PyTorch SDPA (cuDNN / default) on the
same selected pages, gathered per head first (what a user without a sparse kernel runs),
FlexAttention (torch.compile'd, its flex-decoding kernel) over the whole cache with a BlockMask
that shows each head exactly its chosen pages (16-token KV blocks, no gather), and the dense
decode over the whole sequence (flare's batch decode) for scale.

Shapes: batch 1, page 16, 32 query / 32 KV heads, head dim 128, bf16, HND cache; sequence
--lengths; the selected pages random per head (seeded). Times: GPU time of a CUDA-graph replay
where the wrapper can be captured, and eager CUDA events around each call (all), median of
--calls; host time of run(). Flex is compiled before timing and its eager time is the compiled
call; the copy of the HND cache into Flex's [1, H, tokens, D] layout is made once, untimed.
Usage: python3 scripts/bench_quest.py [--lengths 4096,16384,32768] [--budgets 64,256,512]
       [--calls 20] [--flex-full-blocks] [--json F]
"""
import argparse
import functools
import json

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention

import flare
from bench_python import eager_us, graph_us, guarded, host_us

HEADS, HEAD_DIM, PAGE, DTYPE = 32, 128, 16, torch.bfloat16
WORKSPACE_BYTES = 128 << 20


def options():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="4096,16384,32768")
    parser.add_argument("--budgets", default="64,256,512")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--flex-full-blocks", action="store_true",
                        help="give Flex the chosen pages as full blocks instead of partial ones")
    parser.add_argument("--json", help="write every measurement here")
    return parser.parse_args()


def selected_pages(pages, budget, seed):
    """[HEADS, budget] sorted page ids per KV head (int64, host)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.stack([torch.sort(torch.randperm(pages, generator=generator)[:budget]).values
                        for _ in range(HEADS)])


def measure_flare(k_cache, v_cache, q, chosen, calls):
    budget = chosen.shape[1]
    indptr = torch.arange(0, HEADS * budget + 1, budget, dtype=torch.int32)
    indices = chosen.flatten().to(torch.int32).cuda()
    last = torch.full((HEADS,), PAGE, dtype=torch.int32)
    # The graph mode's fixed buffers (a serving loop's: one capture, a new selection a step).
    int_buffer = lambda n: torch.empty(n, dtype=torch.int32, device="cuda")  # noqa: E731
    wrapper = flare.sparse.PerHeadSparseDecodeWrapper(
        torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda"), use_tensor_cores=True,
        use_cuda_graph=True, paged_kv_indptr_buffer=int_buffer(HEADS + 1),
        paged_kv_indices_buffer=int_buffer(HEADS * budget),
        paged_kv_last_page_len_buffer=int_buffer(HEADS))
    wrapper.plan(indptr, indices, last, HEADS, HEADS, HEAD_DIM, PAGE, q_data_type=DTYPE,
                 kv_data_type=DTYPE)
    q1 = q.unsqueeze(0)  # [batch 1, H_qo, D]
    out = wrapper.run(q1, (k_cache, v_cache))
    run = lambda: wrapper.run(q1, (k_cache, v_cache), out=out)  # noqa: E731
    return ({"eager_us": eager_us(run, calls), "run_us": host_us(run, calls)[0],
             "graph_us": guarded("flare graph", lambda: graph_us(run, 5))},
            wrapper.run(q1, (k_cache, v_cache)).view(HEADS, HEAD_DIM))


def measure_sdpa(k_cache, v_cache, q, chosen, calls, gather):
    """SDPA over each head's selected tokens; gather=True includes the per-head gather."""
    heads = torch.arange(HEADS, device="cuda")[:, None]
    pages = chosen.cuda()

    def gathered():
        # k_cache [pages, H, page, D] -> [H, budget, page, D] -> [1, H, budget * page, D]
        k = k_cache[pages, heads].reshape(1, HEADS, -1, HEAD_DIM)
        v = v_cache[pages, heads].reshape(1, HEADS, -1, HEAD_DIM)
        return k, v

    k, v = gathered()
    qq = q.unsqueeze(0).unsqueeze(2)  # [1, H, 1, D]

    def run():
        kk, vv = gathered() if gather else (k, v)
        return F.scaled_dot_product_attention(qq, kk, vv)

    out = run()
    return {"eager_us": eager_us(run, calls), "run_us": host_us(run, calls)[0],
            "graph_us": guarded("sdpa graph", lambda: graph_us(run, 5))}, out.view(HEADS, HEAD_DIM)


@functools.lru_cache(maxsize=None)
def compiled_flex():
    """flex_attention through torch.compile, made once (a fresh graph per cache length)."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    return torch.compile(flex_attention, dynamic=False)


def flex_inputs(k_cache, v_cache, q, chosen, full_blocks):
    """Flex's q [1, H, 1, D], the whole cache as k, v [1, H, pages * PAGE, D] and a BlockMask
    that shows each head its chosen pages. The cache is HND [pages, H, PAGE, D]; the permute +
    reshape is a copy, made here once and never timed: Flex gets a contiguous per-head layout
    that flare's paged kernel does not need."""
    pages, device = k_cache.shape[0], k_cache.device
    k, v = (c.permute(1, 0, 2, 3).reshape(1, HEADS, pages * PAGE, HEAD_DIM)
            for c in (k_cache, v_cache))
    # Built from the page ids, not a mask_mod over every token. One query row, so one Q block
    # (kv_num_blocks [1, H, 1], kv_indices [1, H, 1, pages]); seq_lengths (1, tokens) must match
    # q and k exactly. Each head's row lists its chosen pages (ascending), then the others, which
    # the count stops before. On torch 2.11 a query shorter than 128 rows takes the flex-decoding
    # kernel (no padding of q to 16 / 128): BLOCK_M 16 must divide the Q block (128) and its
    # BLOCK_N is cut down to the 16-token KV block.
    visible = torch.zeros(HEADS, pages, dtype=torch.int32).scatter_(1, chosen, 1)
    order = torch.argsort(visible, dim=1, descending=True, stable=True)
    indices = order.to(device=device, dtype=torch.int32).view(1, HEADS, 1, pages)
    count = torch.full((1, HEADS, 1), chosen.shape[1], dtype=torch.int32, device=device)
    shape = {"BLOCK_SIZE": (128, PAGE), "seq_lengths": (1, pages * PAGE)}
    if full_blocks:
        # Full blocks skip mask_mod, but then flex decoding splits KV by the whole length (not
        # by the listed blocks), so only the splits that cover the first budget pages work.
        mask = BlockMask.from_kv_blocks(torch.zeros_like(count), indices, count, indices, **shape)
    else:
        # Partial blocks with the default mask_mod (noop: every token of a listed block is
        # visible), which the compiled kernel folds away; the KV splits cover only the listed
        # pages. Eager flex_attention would ignore the block list: only the compiled one is run.
        mask = BlockMask.from_kv_blocks(count, indices, **shape)
    return q.view(1, HEADS, 1, HEAD_DIM), k, v, mask


@torch.no_grad()  # no logsumexp output
def measure_flex(k_cache, v_cache, q, chosen, calls, full_blocks=False):
    """torch.compile'd flex_attention over the whole cache, the chosen pages by BlockMask."""
    flex = compiled_flex()
    qq, k, v, mask = flex_inputs(k_cache, v_cache, q, chosen, full_blocks)
    run = lambda: flex(qq, k, v, block_mask=mask)  # noqa: E731
    out = run()  # compiles (and picks its kernel) outside every timed region
    return ({"eager_us": eager_us(run, calls), "run_us": host_us(run, calls)[0],
             "graph_us": guarded("flex graph", lambda: graph_us(run, 5)),
             "blocks": "full" if full_blocks else "partial"}, out.view(HEADS, HEAD_DIM))


def measure_dense(k_cache, v_cache, q, calls):
    pages = k_cache.shape[0]
    wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(
        torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda"), "HND",
        use_tensor_cores=True)
    wrapper.plan(torch.tensor([0, pages], dtype=torch.int32),
                 torch.arange(pages, dtype=torch.int32, device="cuda"),
                 torch.tensor([PAGE], dtype=torch.int32), HEADS, HEADS, HEAD_DIM, PAGE,
                 q_data_type=DTYPE, kv_data_type=DTYPE)
    run = lambda: wrapper.run(q.unsqueeze(0), (k_cache, v_cache))  # noqa: E731
    run()
    return {"eager_us": eager_us(run, calls), "graph_us": guarded("dense graph",
                                                                  lambda: graph_us(run, 5))}


def main():
    args = options()
    torch.manual_seed(0)
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    rows = []
    for length in (int(x) for x in args.lengths.split(",")):
        pages = length // PAGE
        k_cache = torch.randn(pages, HEADS, PAGE, HEAD_DIM, device="cuda", dtype=DTYPE)
        v_cache = torch.randn_like(k_cache)
        q = torch.randn(HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
        dense = guarded("dense", lambda: measure_dense(k_cache, v_cache, q, args.calls))
        for budget in (int(x) for x in args.budgets.split(",")):
            if budget > pages:
                continue
            chosen = selected_pages(pages, budget, seed=length + budget)
            row = {"length": length, "budget": budget, "dense": dense}
            outs = {}
            for name, measure in (
                    ("flare", lambda: measure_flare(k_cache, v_cache, q, chosen, args.calls)),
                    ("sdpa", lambda: measure_sdpa(k_cache, v_cache, q, chosen, args.calls, False)),
                    ("sdpa+gather",
                     lambda: measure_sdpa(k_cache, v_cache, q, chosen, args.calls, True)),
                    ("flex", lambda: measure_flex(k_cache, v_cache, q, chosen, args.calls,
                                                  args.flex_full_blocks))):
                result = guarded(name, measure)
                if result:
                    row[name], outs[name] = result
            if "flare" in outs:
                row["max_diff"] = {n: (o.float() - outs["flare"].float()).abs().max().item()
                                   for n, o in outs.items() if n != "flare"}
            rows.append(row)
    print("\nQuest decode, batch 1, page 16, 32/32 heads, D 128: GPU us in a CUDA graph / eager "
          "(host run() us); Flex given the chosen pages as "
          f"{'full' if args.flex_full_blocks else 'partial'} blocks")
    print("| length | pages per head | flare | SDPA on the gathered pages | SDPA with the gather "
          "| (SDPA + gather) / flare | Flex on the same pages (block mask) | Flex / flare "
          "| dense flare decode |")
    print("|---|---|---|---|---|---|---|---|---|")

    def ratio(r, name):
        if not (r.get("flare") and r.get(name)):
            return "n/a"
        key = ("graph_us" if r["flare"].get("graph_us") and r[name].get("graph_us")
               else "eager_us")
        return f"{r[name][key] / r['flare'][key]:.1f} ({key[:-3]})"

    for r in rows:
        def cell(name):
            t = r.get(name)
            if not t:
                return "n/a"
            graph = f"{t['graph_us']:.1f}" if t.get("graph_us") else "n/a"
            host = f" ({t['run_us']:.0f})" if "run_us" in t else ""
            return f"{graph} / {t['eager_us']:.1f}{host}"

        print(f"| {r['length']} | {r['budget']} | {cell('flare')} | {cell('sdpa')} | "
              f"{cell('sdpa+gather')} | {ratio(r, 'sdpa+gather')} | {cell('flex')} | "
              f"{ratio(r, 'flex')} | {cell('dense')} |")
    print("max |x - flare|: " + ", ".join(f"{n}@{r['length']}/{r['budget']}={d:.3g}"
                                          for r in rows for n, d in r.get("max_diff", {}).items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
