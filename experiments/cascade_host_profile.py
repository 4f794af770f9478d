"""Where the host time of MultiLevelCascadeAttentionWrapper.run() goes (issue 20): each level's
run(return_lse=True), the merge, and a cProfile of back-to-back runs, batch 16, prefix 1024,
suffix 128, 32/32 heads, D 128, bf16. Run from scripts/ (imports bench_cascade)."""
import cProfile
import pstats
import sys

import torch

sys.path.insert(0, "scripts")
import flare  # noqa: E402
from bench_cascade import HEAD_DIM, HEADS, PAGE, Case  # noqa: E402
from bench_python import host_us  # noqa: E402

case = Case(16, 1024)
ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
w = flare.MultiLevelCascadeAttentionWrapper(2, ws, "NHD")
qo, kv_indptr, kv_indices, last = case.levels
w.plan(qo, kv_indptr, kv_indices, last, HEADS, HEADS, HEAD_DIM, PAGE,
       q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
w.run(case.q, case.cache)
print("level kernels   ", w._kernels)
o1, s1 = w._run_level(1, case.q, case.cache)
o0, s0 = w._run_level(0, case.q, case.cache)
print("cascade run      %.1f us" % host_us(lambda: w.run(case.q, case.cache), 300)[0])
print("level 1 run+lse  %.1f us" % host_us(lambda: w._run_level(1, case.q, case.cache), 300)[0])
print("level 0 run+lse  %.1f us" % host_us(lambda: w._run_level(0, case.q, case.cache), 300)[0])
print("merge in place   %.1f us" % host_us(lambda: flare.merge_state_in_place(o1, s1, o0, s0), 300)[0])
print("torch.empty x2   %.1f us" % host_us(lambda: (torch.empty_like(o1), torch.empty_like(s1)), 300)[0])
prof = cProfile.Profile()
prof.enable()
for _ in range(300):
    w.run(case.q, case.cache)
prof.disable()
torch.cuda.synchronize()
pstats.Stats(prof).sort_stats("tottime").print_stats(18)
