"""JIT cost of user variants (issue 18 experiment, not a user script), each step in a fresh
process on one empty cache directory: flare.jit.precompile of four variants (built-in, soft-cap,
sigmoid, ALiBi from a tensor) on every core, cold; the same call again (all from the cache);
then the first plan() of a decode and a prefill wrapper with one of those variants (the cubins
load from the disk). Usage: python3 experiments/jit_precompile_cost.py (a CUDA machine, flare
installed)."""
import os
import subprocess
import sys
import tempfile

VARIANTS = r'''
import time, torch, flare
SOFT_CAP = flare.AttentionVariant(name="cap", scalars=("cap",), source="""
struct Variant : flare::VariantBase {
  __device__ static float query_scale(const flare::VariantParams& p) { return p.sm_scale / Scalars::cap(p); }
  __device__ float logits_transform(const flare::VariantParams& p, float s, int) const {
    return Scalars::cap(p) * flare::kLog2e * flare::tanh_via_exp2(s);
  }
};""")
SIGMOID = flare.AttentionVariant(name="sig", scalars=("bias",), use_softmax=False, source="""
struct Variant : flare::VariantBase {
  static constexpr bool use_softmax = false;
  __device__ static float query_scale(const flare::VariantParams& p) { return p.sm_scale; }
  __device__ float logits_transform(const flare::VariantParams& p, float s, int) const {
    return 1.0f / (1.0f + __expf(-(s + Scalars::bias(p))));
  }
};""")
ALIBI = flare.AttentionVariant(name="alibi_t", tensors={"slopes": "float32"}, source="""
struct Variant : flare::VariantBase {
  float step; int q_pos;
  __device__ void init(const flare::VariantParams& p, const flare::RowContext& row) {
    step = Tensors::slopes(p)[row.qo_head] * flare::kLog2e; q_pos = row.q_pos;
  }
  __device__ float logits_transform(const flare::VariantParams&, float s, int kv_pos) const {
    return s + step * static_cast<float>(kv_pos - q_pos);
  }
};""")
torch.cuda.init(); torch.empty(1, device="cuda")
'''

PRECOMPILE = VARIANTS + r'''
r = flare.jit.precompile([None, SOFT_CAP, SIGMOID, ALIBI], num_qo_heads=32, num_kv_heads=8,
                         head_dim=128, dtype=torch.bfloat16)
per = r["compile_seconds"] / max(r["compiled"], 1)
print(f"{r['kernels']} kernels, {r['compiled']} compiled, {r['from_cache']} from the cache: "
      f"wall {r['wall_seconds']:.2f} s, compile {r['compile_seconds']:.1f} s summed "
      f"({per:.2f} s a kernel)")
'''

FIRST_PLAN = VARIANTS + r'''
ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
d = flare.BatchDecodeWithPagedKVCacheWrapper(ws, use_tensor_cores=True)
indptr = torch.tensor([0, 4], dtype=torch.int32); last = torch.tensor([16], dtype=torch.int32)
start = time.perf_counter()
d.plan(indptr, torch.arange(4, dtype=torch.int32, device="cuda"), last, 32, 8, 128, 16,
       q_data_type=torch.bfloat16, variant=SIGMOID)
decode_ms = (time.perf_counter() - start) * 1e3
p = flare.BatchPrefillWithRaggedKVCacheWrapper(ws)
qo = torch.tensor([0, 300], dtype=torch.int32)
start = time.perf_counter()
p.plan(qo, qo, 32, 8, 128, causal=True, q_data_type=torch.bfloat16, variant=SOFT_CAP)
prefill_ms = (time.perf_counter() - start) * 1e3
print(f"first plan() after precompile: decode {decode_ms:.1f} ms, prefill {prefill_ms:.1f} ms")
'''

with tempfile.TemporaryDirectory() as cache:
    env = dict(os.environ, FLARE_CACHE_DIR=cache, FLARE_LOG="quiet")
    for label, code in (("cold precompile", PRECOMPILE), ("precompile again", PRECOMPILE),
                        ("new process", FIRST_PLAN)):
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True)
        print(f"{label}: {out.stdout.strip() or out.stderr.strip()[-400:]}")
