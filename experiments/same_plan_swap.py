"""Same plan, four wrappers x four outputs (experiments/same_plan_check.py): does the time follow
the wrapper (its workspace) or the output tensor? GPU machine: cd experiments && python3
same_plan_swap.py"""
import torch

import flare
from paged_batch import DIM, HK, HQ, PS, paged_indices
from same_plan_check import gpu_us
D = torch.device("cuda:0")
for batch, kv_len in ((24, 8192), (16, 4096)):
    qo, indptr, indices, last = paged_indices(batch, 16, kv_len)
    kv = torch.randn(indices.shape[0], 2, PS, HK, DIM, dtype=torch.float16, device=D)
    q = torch.randn(batch * 16, HQ, DIM, dtype=torch.float16, device=D)
    ws_, outs = [], []
    for i in range(4):
        ws = torch.empty(256 << 20, dtype=torch.uint8, device=D)
        w = flare.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
        w.plan(qo, indptr, indices, last, HQ, HK, DIM, PS, q_data_type=torch.float16, kv_data_type=torch.float16)
        ws_.append(w); outs.append(torch.empty((batch * 16, HQ, DIM), dtype=torch.float16, device=D))
    res = {}
    for _ in range(3):
        for wi in range(4):
            for oi in range(4):
                res.setdefault((wi, oi), []).append(gpu_us(lambda: ws_[wi].run(q, kv, out=outs[oi], enable_pdl=False), 30))
    print(f"b{batch} kv{kv_len} rows wrapper, cols out:")
    for wi in range(4):
        print("  " + " ".join(f"{min(res[(wi, oi)]):6.1f}" for oi in range(4)))
