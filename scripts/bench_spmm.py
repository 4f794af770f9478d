#!/usr/bin/env python3
"""SpMM through the public Python API (issue 23): flare.sparse.SpmmPlan on CUDA tensors (the CSR
kernels: merge-based) with the auto-tuner's schedule and with the default one, and with
format="auto" (CSR and the hyb(c, k) decompositions of flare/_spmm_plan.py's AUTO_HYB, each tuned,
the fastest kept), next to cuSPARSE through torch.sparse.mm on the same CSR tensor, in one process: float32,
or --dtype float16 / bfloat16 (A's values and X in that dtype, float32 sums in both libraries).

Graphs: seeded synthetic graphs from flare.sparse.graph, named as such (no real graph is read
here), of the dissertation's graph set: R-MAT of cora's, citeseer's, pubmed's and ppi's sizes
(2,708 / 3,327 / 19,717 / 44,906 nodes, 10,556 / 9,228 / 88,651 / 1,271,274 edges), of arxiv's
(169,343 nodes, 1.89M edges) and of a quarter of reddit's edges (232,965 nodes, 23.2M edges),
and a near-uniform graph of ogbn-proteins' node count (132,534 nodes, 9.9M edges: a quarter of
its edges). Values are random normals.

Per graph and feature size d: the tuner's choice (feature tile, chunk items) and search time
(the plan's first run; a fresh FLARE_CACHE_DIR searches, a warm one reads the choice), then GPU
time from a CUDA-graph replay and eager time of each call;
the achieved rate against the minimum traffic (A's indptr, indices and values read once, X read
once, Y written once) and that traffic over the device's copy bandwidth measured in the same
process (a device-to-device copy of 1 GiB).
Usage: python3 scripts/bench_spmm.py [--features 32,128,512] [--graphs cora,...,reddit]
       [--dtype float32] [--calls 20] [--json F]
"""
import argparse
import json

import torch

import flare
from bench_python import eager_us, graph_us, guarded, host_us

# The dissertation's graph set (its table of node and edge counts), synthetic and seeded.
GRAPHS = {"cora": ("rmat", 2708, 10556), "citeseer": ("rmat", 3327, 9228),
          "pubmed": ("rmat", 19717, 88651), "ppi": ("rmat", 44906, 1271274),
          "arxiv": ("rmat", 169343, 1890000), "reddit": ("rmat", 232965, 23200000),
          "proteins": ("uniform", 132534, 9890000)}


def graph_parser(description):
    """The options both sparse benchmarks take: feature sizes, graphs, calls, a JSON file."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--features", default="32,128,512")
    parser.add_argument("--graphs", default="cora,citeseer,pubmed,ppi,arxiv,proteins,reddit")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--json", help="write every measurement here")
    return parser


def synthetic_graph(name, values):
    """(kind, nodes, edges, host indptr, A as a CUDA torch CSR tensor holding `values(nnz)`) of
    the seeded synthetic graph `name`."""
    kind, nodes, edges = GRAPHS[name]
    indptr, indices = flare.sparse.graph(kind, nodes, edges, seed=1)
    a = torch.sparse_csr_tensor(torch.from_numpy(indptr), torch.from_numpy(indices),
                                values(indices.shape[0]), (nodes, nodes)).cuda()
    return kind, nodes, edges, indptr, a


def options():
    parser = graph_parser(__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    return parser.parse_args()


def copy_bandwidth():
    """Device copy bandwidth (bytes read + written per second) of a 1 GiB copy."""
    src = torch.empty(1 << 28, dtype=torch.float32, device="cuda").normal_()
    dst = torch.empty_like(src)
    us = eager_us(lambda: dst.copy_(src), 10)
    return 2 * src.numel() * 4 / (us * 1e-6)


def main():
    args = options()
    torch.manual_seed(0)
    bandwidth = copy_bandwidth()
    dtype = getattr(torch, args.dtype)
    element = torch.empty((), dtype=dtype).element_size()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, copy bandwidth "
          f"{bandwidth / 1e12:.2f} TB/s, {args.dtype}")
    rows = []
    for name in args.graphs.split(","):
        kind, nodes, edges, indptr, a = synthetic_graph(
            name, lambda nnz: torch.randn(nnz, dtype=dtype))
        # flare's plans once (A's arrays on the device), as a serving loop would keep them.
        triple = (a.crow_indices().to(torch.int32), a.col_indices().to(torch.int32), a.values())
        plan = flare.sparse.SpmmPlan(triple, shape=(nodes, nodes))
        default_plan = flare.sparse.SpmmPlan(triple, shape=(nodes, nodes), tune=False)
        auto_plan = flare.sparse.SpmmPlan(triple, shape=(nodes, nodes), format="auto")
        for d in (int(x) for x in args.features.split(",")):
            x = torch.randn(nodes, d, device="cuda", dtype=dtype)
            row = {"graph": f"{name} (synthetic {kind})", "nodes": nodes, "nnz": int(edges),
                   "d": d, "dtype": args.dtype,
                   "max_degree": int((indptr[1:] - indptr[:-1]).max())}
            traffic = edges * (4 + element) + (nodes + 1) * 4 + 2 * nodes * d * element
            got = plan.run(x)  # the search (or the cached choice)
            chosen = plan.schedule(d, dtype)
            row["schedule"] = (chosen["feature_tile"], chosen["chunk_items"])
            row["search_ms"], row["from_cache"] = chosen["search_ms"], chosen["from_cache"]
            flare_call = lambda: plan.run(x)  # noqa: E731
            default_call = lambda: default_plan.run(x)  # noqa: E731
            auto_got = auto_plan.run(x)  # the search across formats
            auto = auto_plan.schedule(d, dtype)
            row["auto_format"], row["auto_formats_us"] = auto["format"], auto["format_timings_us"]
            auto_call = lambda: auto_plan.run(x)  # noqa: E731
            torch_call = lambda: torch.sparse.mm(a, x)  # noqa: E731
            # torch may lack cuSPARSE's 16-bit SpMM: then flare alone, checked against float32.
            want = guarded("cusparse", torch_call)
            labels = (("flare", flare_call), ("default", default_call), ("auto", auto_call),
                      ("cusparse", torch_call))
            if want is None:
                want = torch.sparse.mm(a.float(), x.float())
                labels = labels[:3]
            row["max_rel_diff"] = max(relative_error(got, want), relative_error(auto_got, want))
            if dtype != torch.float32:
                # Each library's error against float32 sums of the same 16-bit operands.
                exact = torch.sparse.mm(a.float(), x.float())
                row["flare_error"] = relative_error(got, exact)
                if len(labels) > 2:
                    row["cusparse_error"] = relative_error(want, exact)
            for label, call in labels:
                row[f"{label}_eager_us"] = eager_us(call, args.calls)
                row[f"{label}_graph_us"] = guarded(f"{label} graph", lambda: graph_us(call, 5))
            best = min(row[f"{label}_graph_us"] or row[f"{label}_eager_us"]
                       for label in ("flare", "auto"))
            row["auto_host_us"] = host_us(auto_call, 200)
            row["cusparse_host_us"] = guarded("cusparse host", lambda: host_us(torch_call, 200))
            row["flare_traffic_fraction"] = traffic / (best * 1e-6) / bandwidth
            rows.append(row)
            del x
        del a, triple, plan, default_plan, auto_plan
        torch.cuda.empty_cache()
    print("\n| graph | d | flare tuned us (graph / eager) | schedule: tile, chunk (search ms) | "
          "flare default us | flare format=\"auto\" us (format chosen) | cuSPARSE us (graph / "
          "eager) | speedup tuned / default / auto | flare: minimum traffic / copy bandwidth | "
          "host us of run(): auto / torch.sparse.mm |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        tile, chunk = r["schedule"]
        search = "cached" if r["from_cache"] else f"{r['search_ms']:.0f} ms"
        print(f"| {r['graph']}, {r['nnz']:,} nnz, max degree {r['max_degree']:,} | {r['d']} | "
              f"{time_cell(r, 'flare')} | {tile}, {chunk} ({search}) | "
              f"{time_cell(r, 'default')} | {time_cell(r, 'auto')} ({r['auto_format']}) | "
              f"{time_cell(r, 'cusparse')} | "
              f"{speedup(r, 'cusparse'):.2f} / {speedup(r, 'cusparse', 'default'):.2f} / "
              f"{speedup(r, 'cusparse', 'auto'):.2f} | "
              f"{r['flare_traffic_fraction']:.2f} | {r['auto_host_us'][0]:.1f} / "
              f"{(r['cusparse_host_us'] or [float('nan')])[0]:.1f} |")
    if args.dtype != "float32":
        print("max |error| / max |float32 sums of the same operands|: " + ", ".join(
            f"{r['graph'].split()[0]}@{r['d']} flare {r['flare_error']:.1e} cuSPARSE "
            f"{r.get('cusparse_error', float('nan')):.1e}" for r in rows))
    finish(rows, "cuSPARSE", args.json)


def relative_error(got, want):
    """max |got - want| / max |want|, in float32."""
    return ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()


def time_cell(r, label):
    """"graph / eager" microseconds of one call in row r ("does not fit" when it did not run)."""
    if f"{label}_eager_us" not in r:
        return "does not fit"
    graph, eager = r[f"{label}_graph_us"], r[f"{label}_eager_us"]
    return f"{graph:.1f} / {eager:.1f}" if graph else f"n/a / {eager:.1f}"


def speedup(r, anchor, label="flare"):
    """The anchor's time over `label`'s: CUDA-graph times where both captured, else eager (nan
    when the anchor did not run)."""
    if f"{anchor}_eager_us" not in r:
        return float("nan")
    key = "graph_us" if r[f"{label}_graph_us"] and r[f"{anchor}_graph_us"] else "eager_us"
    return r[f"{anchor}_{key}"] / r[f"{label}_{key}"]


def finish(rows, anchor_name, json_path):
    """The largest relative difference per case, then every measurement to json_path."""
    print(f"max |flare - {anchor_name}| / max |{anchor_name}|: " +
          ", ".join(f"{r['graph'].split()[0]}@{r['d']}={r['max_rel_diff']:.1e}" for r in rows))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
