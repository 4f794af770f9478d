#!/usr/bin/env python3
"""Fine-grained sparse decode (Quest; issue 20, paper 002 appendix G.5, Tables 9-11) through the
public Python API: flare's PerHeadSparseDecodeWrapper, where each KV head reads its own
--budgets pages chosen from the request's pages, next to PyTorch SDPA (cuDNN / default) on the
same selected pages, gathered per head first (what a user without a sparse kernel runs), and
the dense decode over the whole sequence (flare's batch decode) for scale.

Shapes: batch 1, page 16, 32 query / 32 KV heads, head dim 128, bf16, HND cache; sequence
--lengths; the selected pages random per head (seeded). Times: GPU time of a CUDA-graph replay
where the wrapper can be captured, and eager CUDA events around each call (all), median of
--calls; host time of run().
Usage: python3 scripts/bench_quest.py [--lengths 4096,16384,32768] [--budgets 64,256,512]
       [--calls 20] [--json F]
"""
import argparse
import json

import torch
import torch.nn.functional as F

import flare
from bench_python import eager_us, graph_us, guarded, host_us

HEADS, HEAD_DIM, PAGE, DTYPE = 32, 128, 16, torch.bfloat16
WORKSPACE_BYTES = 128 << 20


def options():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="4096,16384,32768")
    parser.add_argument("--budgets", default="64,256,512")
    parser.add_argument("--calls", type=int, default=20)
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
    wrapper = flare.sparse.PerHeadSparseDecodeWrapper(
        torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda"), use_tensor_cores=True)
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
                     lambda: measure_sdpa(k_cache, v_cache, q, chosen, args.calls, True))):
                result = guarded(name, measure)
                if result:
                    row[name], outs[name] = result
            if "flare" in outs:
                row["max_diff"] = {n: (o.float() - outs["flare"].float()).abs().max().item()
                                   for n, o in outs.items() if n != "flare"}
            rows.append(row)
    print("\nQuest decode, batch 1, page 16, 32/32 heads, D 128: GPU us in a CUDA graph / eager "
          "(host run() us)")
    print("| length | pages per head | flare | SDPA on the gathered pages | SDPA with the gather "
          "| (SDPA + gather) / flare | dense flare decode |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        def cell(name):
            t = r.get(name)
            if not t:
                return "n/a"
            graph = f"{t['graph_us']:.1f}" if t.get("graph_us") else "n/a"
            host = f" ({t['run_us']:.0f})" if "run_us" in t else ""
            return f"{graph} / {t['eager_us']:.1f}{host}"

        ratio = "n/a"
        if r.get("flare") and r.get("sdpa+gather"):
            key = ("graph_us" if r["flare"].get("graph_us") and r["sdpa+gather"].get("graph_us")
                   else "eager_us")
            ratio = f"{r['sdpa+gather'][key] / r['flare'][key]:.1f} ({key[:-3]})"
        print(f"| {r['length']} | {r['budget']} | {cell('flare')} | {cell('sdpa')} | "
              f"{cell('sdpa+gather')} | {ratio} | {cell('dense')} |")
    print("max |x - flare|: " + ", ".join(f"{n}@{r['length']}/{r['budget']}={d:.3g}"
                                          for r in rows for n, d in r.get("max_diff", {}).items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
