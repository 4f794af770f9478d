"""Times the first plan() of a decode wrapper with a user variant in a fresh process: with an
empty JIT cache (NVRTC compiles) and with the disk cache that run left (the cubin is loaded).
Usage: python3 experiments/jit_warm_load.py  (a CUDA machine, flare installed)."""
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import time, torch, flare
v = flare.AttentionVariant(name="cap_probe", scalars=("cap",), source='''
struct Variant : flare::VariantBase {
  __device__ static float query_scale(const flare::VariantParams& p) { return p.sm_scale / Scalars::cap(p); }
  __device__ float logits_transform(const flare::VariantParams& p, float s, int) const {
    return Scalars::cap(p) * flare::kLog2e * flare::tanh_via_exp2(s);
  }
};''')
torch.cuda.init(); torch.empty(1, device="cuda")
w = flare.BatchDecodeWithPagedKVCacheWrapper(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"),
                                             use_tensor_cores=True)
indptr = torch.tensor([0, 4], dtype=torch.int32); last = torch.tensor([16], dtype=torch.int32)
start = time.perf_counter()
w.plan(indptr, torch.arange(4, dtype=torch.int32, device="cuda"), last, 32, 8, 128, 16,
       q_data_type=torch.bfloat16, variant=v)
print(f"{(time.perf_counter() - start) * 1e3:.1f}")
"""

with tempfile.TemporaryDirectory() as cache:
    env = dict(os.environ, FLARE_CACHE_DIR=cache, FLARE_LOG="quiet")
    for label in ("cold (NVRTC compile)", "warm (disk cache)", "warm again"):
        out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                             text=True, check=True).stdout.strip()
        print(f"first plan() with a user variant, {label}: {out} ms")
