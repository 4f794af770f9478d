"""Why did disable_split_kv run 3-6% faster than the default plan on the H100 (PDL off, q16
b16-b32, twenty-seventh session) where both plans are the same whole tiles? Three wrappers on
separate workspaces, timed in turn: default, disable_split_kv, default again; then the default
re-planned on the second wrapper's workspace. GPU machine, flare installed:
python3 experiments/same_plan_check.py"""
import statistics

import torch

import flare
from paged_batch import DIM, HK, HQ, PS, paged_indices

D = torch.device("cuda:0")


def gpu_us(run, calls=50):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        start.record()
        for _ in range(calls):
            run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    return statistics.median(times)


def main():
    for batch, kv_len in ((16, 4096), (24, 8192), (32, 4096)):
        qo, indptr, indices, last = paged_indices(batch, 16, kv_len)
        kv = torch.randn(indices.shape[0], 2, PS, HK, DIM, dtype=torch.float16, device=D)
        q = torch.randn(batch * 16, HQ, DIM, dtype=torch.float16, device=D)
        runs = {}
        for name, disable in (("default", False), ("nosplit", True), ("default2", False)):
            ws = torch.empty(256 << 20, dtype=torch.uint8, device=D)
            w = flare.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
            w.plan(qo, indptr, indices, last, HQ, HK, DIM, PS, q_data_type=torch.float16,
                   kv_data_type=torch.float16, disable_split_kv=disable)
            out = torch.full((batch * 16, HQ, DIM), float("nan"), dtype=torch.float16, device=D)
            runs[name] = (w, out, lambda w=w, out=out: w.run(q, kv, out=out, enable_pdl=False))
            runs[name][2]()
            torch.cuda.synchronize()
            assert torch.isfinite(out).all()
        figures = {name: [] for name in runs}
        for _ in range(4):
            for name in list(runs) + list(reversed(runs)):
                figures[name].append(gpu_us(runs[name][2]))
        print(f"b{batch} q16 kv{kv_len}: " + ", ".join(
            f"{name} {min(v):.1f} (median {statistics.median(v):.1f})" for name, v in figures.items()))


if __name__ == "__main__":
    main()
