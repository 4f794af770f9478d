#!/usr/bin/env python3
"""SDDMM through the public Python API (issue 23): flare.sparse.sddmm on CUDA tensors (the CSR
kernel, nonzero-balanced warps) next to torch.sparse.sampled_addmm on the
same CSR tensor, float32, in one process; and Q K^T computed dense then gathered at the pattern
where that product fits in memory (the graphs up to ppi's size; not arxiv's and larger).

Graphs: bench_spmm.py's seeded synthetic graphs (named as such). Per graph and feature size d:
GPU time from a CUDA-graph replay and eager time of each call; the achieved rate against the
minimum traffic (A's indptr and indices read once, Q and K once, the output written once) over
the device's copy bandwidth measured in the same process.
Usage: python3 scripts/bench_sddmm.py [--features 32,128,512] [--graphs cora,...,reddit]
       [--calls 20] [--json F]
"""

import torch

import flare
from bench_python import eager_us, graph_us, guarded
from bench_spmm import copy_bandwidth, finish, graph_parser, speedup, synthetic_graph, time_cell

DENSE_LIMIT_BYTES = 20 << 30  # Q K^T must fit next to everything else


def options():
    return graph_parser(__doc__.splitlines()[0]).parse_args()


def main():
    args = options()
    torch.manual_seed(0)
    bandwidth = copy_bandwidth()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, copy bandwidth "
          f"{bandwidth / 1e12:.2f} TB/s")
    rows = []
    for name in args.graphs.split(","):
        kind, nodes, edges, _, a = synthetic_graph(name, torch.ones)
        pattern = (a.crow_indices().to(torch.int32), a.col_indices().to(torch.int32), None)
        for d in (int(x) for x in args.features.split(",")):
            q = torch.randn(nodes, d, device="cuda")
            k = torch.randn(nodes, d, device="cuda")
            row = {"graph": f"{name} (synthetic {kind})", "nodes": nodes, "nnz": int(edges),
                   "d": d}
            traffic = edges * 8 + (nodes + 1) * 4 + 2 * nodes * d * 4
            flare_call = lambda: flare.sparse.sddmm(pattern, q, k, shape=(nodes, nodes))  # noqa: E731
            torch_call = lambda: torch.sparse.sampled_addmm(a, q, k.T, beta=0.0)  # noqa: E731
            want = torch_call().values()
            got = flare_call()
            row["max_rel_diff"] = ((got - want).abs().max() / want.abs().max()).item()
            calls = [("flare", flare_call), ("sampled_addmm", torch_call)]
            if nodes * nodes * 4 <= DENSE_LIMIT_BYTES:
                r_idx = torch.repeat_interleave(torch.arange(nodes, device="cuda"),
                                                a.crow_indices().diff())
                c_idx = a.col_indices()
                calls.append(("dense", lambda: (q @ k.T)[r_idx, c_idx]))
            for label, call in calls:
                row[f"{label}_eager_us"] = eager_us(call, args.calls)
                row[f"{label}_graph_us"] = guarded(f"{label} graph", lambda: graph_us(call, 5))
            best = row["flare_graph_us"] or row["flare_eager_us"]
            row["flare_traffic_fraction"] = traffic / (best * 1e-6) / bandwidth
            rows.append(row)
            del q, k
        del a, pattern
        torch.cuda.empty_cache()
    print("\n| graph | d | flare us (graph / eager) | sampled_addmm us (graph / eager) | speedup "
          "| dense then gather us | flare: minimum traffic / copy bandwidth |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['graph']}, {r['nnz']:,} nnz | {r['d']} | {time_cell(r, 'flare')} | "
              f"{time_cell(r, 'sampled_addmm')} | {speedup(r, 'sampled_addmm'):.1f} | "
              f"{time_cell(r, 'dense')} | {r['flare_traffic_fraction']:.2f} |")
    finish(rows, "sampled_addmm", args.json)


if __name__ == "__main__":
    main()
