"""flare.AttentionVariant on PyTorch CUDA tensors: a user variant with the built-in's math
matches the built-in (soft-cap, decode on both loops, paged and ragged prefill), its scalars
come by keyword at run(), a compile error in its source is raised at plan() with the user's
line, and missing scalars are TypeErrors before any launch. Skipped visibly without PyTorch or
a CUDA device."""

import math

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device (torch.cuda.is_available() is False)", allow_module_level=True)

import flare  # noqa: E402
from gpu_paged_cache import GpuPagedCache  # noqa: E402

DEVICE = torch.device("cuda:0")
SOFT_CAP = flare.AttentionVariant(name="user_soft_cap", scalars=("cap",), source=r"""
struct Variant : flare::VariantBase {
  __device__ static float query_scale(const flare::VariantParams& p) {
    return p.sm_scale / Scalars::cap(p);
  }
  __device__ float logits_transform(const flare::VariantParams& p, float s, int) const {
    return Scalars::cap(p) * flare::kLog2e * flare::tanh_via_exp2(s);
  }
};
""")


def workspace():
    return torch.empty(64 << 20, dtype=torch.uint8, device=DEVICE)


@pytest.mark.parametrize("use_tensor_cores", [False, True])
def test_decode_user_soft_cap_matches_the_built_in(use_tensor_cores):
    cache = GpuPagedCache([1, 33, 700, 4100], 4, 128, 16, "NHD", torch.bfloat16, seed=5)
    q = torch.randn(4, 16, 128, generator=torch.Generator().manual_seed(6)).to(
        torch.bfloat16).to(DEVICE)
    outputs = []
    for variant, soft_cap in ((None, 20.0), (SOFT_CAP, None)):
        wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(workspace(),
                                                           use_tensor_cores=use_tensor_cores)
        wrapper.plan(cache.indptr, cache.indices.to(DEVICE), cache.last_page_len, 16, 4, 128, 16,
                     q_data_type=torch.bfloat16, logits_soft_cap=soft_cap, variant=variant)
        kwargs = {} if variant is None else {"cap": 20.0}
        outputs.append(wrapper.run(q, cache.cache, return_lse=True, **kwargs))
        with pytest.raises(TypeError):
            wrapper.run(q, cache.cache, temperature=1.0)
    (o_builtin, lse_builtin), (o_user, lse_user) = outputs
    assert torch.isfinite(o_user).all()
    assert (o_user.float() - o_builtin.float()).abs().max().item() <= 2e-2
    assert (lse_user - lse_builtin).abs().max().item() <= 1e-3


@pytest.mark.parametrize("paged", [True, False])
def test_prefill_user_soft_cap_matches_the_built_in(paged):
    qo_lens, kv_lens = [5, 130, 64], [70, 130, 300]
    cache = GpuPagedCache(kv_lens, 2, 128, 16, "NHD", torch.float16, seed=7)
    generator = torch.Generator().manual_seed(8)
    q = torch.randn(sum(qo_lens), 8, 128, generator=generator).to(torch.float16).to(DEVICE)
    k = torch.randn(sum(kv_lens), 2, 128, generator=generator).to(torch.float16).to(DEVICE)
    v = torch.randn(sum(kv_lens), 2, 128, generator=generator).to(torch.float16).to(DEVICE)
    qo = torch.tensor([0, 5, 135, 199], dtype=torch.int32)
    kv = torch.tensor([0, 70, 200, 500], dtype=torch.int32)
    outputs = []
    for variant, soft_cap in ((None, 15.0), (SOFT_CAP, None)):
        if paged:
            wrapper = flare.BatchPrefillWithPagedKVCacheWrapper(workspace())
            wrapper.plan(qo, cache.indptr, cache.indices.to(DEVICE), cache.last_page_len, 8, 2,
                         128, 16, causal=True, q_data_type=torch.float16,
                         logits_soft_cap=soft_cap, variant=variant)
            args = (q, cache.cache)
        else:
            wrapper = flare.BatchPrefillWithRaggedKVCacheWrapper(workspace())
            wrapper.plan(qo, kv, 8, 2, 128, causal=True, q_data_type=torch.float16,
                         logits_soft_cap=soft_cap, variant=variant)
            args = (q, k, v)
        kwargs = {} if variant is None else {"cap": 15.0}
        outputs.append(wrapper.run(*args, return_lse=True, **kwargs))
        if variant is not None:
            with pytest.raises(TypeError, match=r"needs variant 'user_soft_cap'.s argument"):
                wrapper.run(*args)
    (o_builtin, lse_builtin), (o_user, lse_user) = outputs
    assert torch.isfinite(o_user).all()
    assert (o_user.float() - o_builtin.float()).abs().max().item() <= 4e-3
    assert (lse_user - lse_builtin).abs().max().item() <= 1e-3


def test_compile_errors_cite_the_users_line():
    broken = flare.AttentionVariant(name="broken", source="struct Variant : flare::VariantBase {\n"
                                    "  int x = ;\n};\n")
    cache = GpuPagedCache([10], 2, 64, 16, "NHD", torch.float16, seed=1)
    wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(workspace())
    with pytest.raises(RuntimeError, match=r"broken\(2\)"):
        wrapper.plan(cache.indptr, cache.indices.to(DEVICE), cache.last_page_len, 4, 2, 64, 16,
                     q_data_type=torch.float16, variant=broken)


def test_built_in_terms_with_a_variant_are_errors():
    cache = GpuPagedCache([10], 2, 64, 16, "NHD", torch.float16, seed=1)
    wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(workspace())
    with pytest.raises(ValueError, match="logits_soft_cap is a built-in variant term"):
        wrapper.plan(cache.indptr, cache.indices.to(DEVICE), cache.last_page_len, 4, 2, 64, 16,
                     q_data_type=torch.float16, logits_soft_cap=30.0, variant=SOFT_CAP)


SLOPES = flare.AttentionVariant(name="user_alibi", tensors={"slopes": (torch.float32, (16,))},
                                source=r"""
struct Variant : flare::VariantBase {
  float step;
  int q_pos;
  __device__ void init(const flare::VariantParams& p, const flare::RowContext& row) {
    step = Tensors::slopes(p)[row.qo_head] * flare::kLog2e;
    q_pos = row.q_pos;
  }
  __device__ float logits_transform(const flare::VariantParams&, float s, int kv_pos) const {
    return s + step * static_cast<float>(kv_pos - q_pos);
  }
};
""")


def test_a_variant_tensor_reproduces_the_built_in_alibi():
    heads = 16  # a power of two: the default slopes are 2^(-8 (h + 1) / heads)
    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)],
                          dtype=torch.float32, device=DEVICE)
    cache = GpuPagedCache([3, 200, 1500], 4, 128, 16, "NHD", torch.bfloat16, seed=9)
    q = torch.randn(3, heads, 128, generator=torch.Generator().manual_seed(10)).to(
        torch.bfloat16).to(DEVICE)
    outputs = []
    for variant, mode in ((None, "ALIBI"), (SLOPES, "NONE")):
        wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(workspace(), use_tensor_cores=True)
        wrapper.plan(cache.indptr, cache.indices.to(DEVICE), cache.last_page_len, heads, 4, 128,
                     16, q_data_type=torch.bfloat16, pos_encoding_mode=mode, variant=variant)
        kwargs = {} if variant is None else {"slopes": slopes}
        outputs.append(wrapper.run(q, cache.cache, **kwargs))
        if variant is not None:
            with pytest.raises(ValueError, match="tensor slopes must be float32, got float16"):
                wrapper.run(q, cache.cache, slopes=slopes.half())
            with pytest.raises(ValueError, match=r"tensor slopes must have shape \[16\], got \[8\]"):
                wrapper.run(q, cache.cache, slopes=slopes[:8])
            with pytest.raises(ValueError, match="tensor slopes must be contiguous"):
                wrapper.run(q, cache.cache, slopes=torch.zeros(32, device=DEVICE)[::2])
    assert (outputs[0].float() - outputs[1].float()).abs().max().item() <= 2e-2


def test_single_calls_take_variants():
    generator = torch.Generator().manual_seed(11)
    q = torch.randn(8, 128, generator=generator).to(torch.float16).to(DEVICE)
    k = torch.randn(300, 2, 128, generator=generator).to(torch.float16).to(DEVICE)
    v = torch.randn(300, 2, 128, generator=generator).to(torch.float16).to(DEVICE)
    built_in = flare.single_decode_with_kv_cache(q, k, v, logits_soft_cap=25.0)
    user = flare.single_decode_with_kv_cache(q, k, v, variant=SOFT_CAP, cap=25.0)
    assert (user.float() - built_in.float()).abs().max().item() <= 4e-3
    with pytest.raises(TypeError, match="needs variant 'user_soft_cap'"):
        flare.single_decode_with_kv_cache(q, k, v, variant=SOFT_CAP)
    qs = torch.randn(50, 8, 128, generator=generator).to(torch.float16).to(DEVICE)
    built_in = flare.single_prefill_with_kv_cache(qs, k, v, causal=True, logits_soft_cap=25.0)
    user = flare.single_prefill_with_kv_cache(qs, k, v, causal=True, variant=SOFT_CAP, cap=25.0)
    assert (user.float() - built_in.float()).abs().max().item() <= 4e-3


def test_a_captured_variant_run_replays_across_plans():
    """Capture a decode step with a variant (scalar and tensor), plan() new lengths, replay:
    the replay matches an eager run of the same batch with the captured values."""
    batch, heads, kv_heads, head_dim, page = 3, 16, 4, 128, 16
    slopes = torch.linspace(0.05, 0.5, heads, dtype=torch.float32, device=DEVICE)
    both = flare.AttentionVariant(name="capped_alibi", scalars=("cap",),
                                  tensors={"slopes": torch.float32}, source=r"""
struct Variant : flare::VariantBase {
  float step;
  int q_pos;
  __device__ static float query_scale(const flare::VariantParams& p) {
    return p.sm_scale / Scalars::cap(p);
  }
  __device__ void init(const flare::VariantParams& p, const flare::RowContext& row) {
    step = Tensors::slopes(p)[row.qo_head] / Scalars::cap(p);
    q_pos = row.q_pos;
  }
  __device__ float logits_transform(const flare::VariantParams& p, float s, int kv_pos) const {
    s += step * static_cast<float>(kv_pos - q_pos);
    return Scalars::cap(p) * flare::kLog2e * flare::tanh_via_exp2(s);
  }
};
""")
    steps = [[5, 300, 17], [1000, 1, 64]]
    pool = 80
    buffers = (torch.zeros(batch + 1, dtype=torch.int32, device=DEVICE),
               torch.zeros(pool, dtype=torch.int32, device=DEVICE),
               torch.zeros(batch, dtype=torch.int32, device=DEVICE))
    graphed = flare.BatchDecodeWithPagedKVCacheWrapper(
        workspace(), use_cuda_graph=True, use_tensor_cores=True,
        paged_kv_indptr_buffer=buffers[0], paged_kv_indices_buffer=buffers[1],
        paged_kv_last_page_len_buffer=buffers[2])
    eager = flare.BatchDecodeWithPagedKVCacheWrapper(workspace(), use_tensor_cores=True)
    kv = torch.empty(pool, 2, page, kv_heads, head_dim, dtype=torch.bfloat16, device=DEVICE)
    q = torch.empty(batch, heads, head_dim, dtype=torch.bfloat16, device=DEVICE)
    out = torch.empty_like(q)
    graph = None
    for step, lens in enumerate(steps):
        used = sum((n + page - 1) // page for n in lens)
        cache = GpuPagedCache(lens, kv_heads, head_dim, page, "NHD", torch.bfloat16,
                              seed=20 + step, extra_pages=pool - used)
        kv.copy_(cache.cache)
        q.copy_(torch.randn(batch, heads, head_dim, device=DEVICE))
        for wrapper in (graphed, eager):
            wrapper.plan(cache.indptr, cache.indices.to(DEVICE), cache.last_page_len, heads,
                         kv_heads, head_dim, page, q_data_type=torch.bfloat16, variant=both)
        if graph is None:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                graphed.run(q, kv, out=out, cap=20.0, slopes=slopes)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                graphed.run(q, kv, out=out, cap=20.0, slopes=slopes)
        out.fill_(float("nan"))
        graph.replay()
        expected = eager.run(q, kv, cap=20.0, slopes=slopes)
        torch.cuda.synchronize()
        # The graph-mode plan may split differently (its grid is fixed): equal up to rounding.
        assert torch.isfinite(out).all(), f"step {step}: unwritten outputs"
        assert (out.float() - expected.float()).abs().max().item() <= 2e-2, f"step {step}"


def ragged_batch(seed):
    """Three requests (append, prefill, one token) of 8 query / 2 KV heads, D 128, bf16: lengths,
    q, k, v, host indptrs and the generator for more."""
    qo_lens, kv_lens = [3, 130, 1], [70, 130, 300]
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(qo_lens), 8, 128, generator=generator).to(torch.bfloat16).to(DEVICE)
    k = torch.randn(sum(kv_lens), 2, 128, generator=generator).to(torch.bfloat16).to(DEVICE)
    v = torch.randn(sum(kv_lens), 2, 128, generator=generator).to(torch.bfloat16).to(DEVICE)
    qo = torch.tensor([0, 3, 133, 134], dtype=torch.int32)
    kv = torch.tensor([0, 70, 200, 500], dtype=torch.int32)
    return qo_lens, kv_lens, q, k, v, qo, kv, generator


SIGMOID = flare.AttentionVariant(name="flash_sigmoid", scalars=("bias",), use_softmax=False,
                                 source=r"""
struct Variant : flare::VariantBase {
  static constexpr bool use_softmax = false;
  __device__ static float query_scale(const flare::VariantParams& p) { return p.sm_scale; }
  __device__ float logits_transform(const flare::VariantParams& p, float s, int) const {
    return 1.0f / (1.0f + __expf(-(s + Scalars::bias(p))));
  }
};
""")


def sigmoid_reference(q, k, v, qo_lens, kv_lens, bias, causal):
    """float64 o = sum_j sigmoid(q.k / sqrt(D) + bias) v_j over the visible keys (GQA)."""
    group = q.shape[1] // k.shape[1]
    out, q_at, kv_at = [], 0, 0
    for qo_len, kv_len in zip(qo_lens, kv_lens):
        qi = q[q_at:q_at + qo_len].double().transpose(0, 1)  # [H, q, D]
        ki = k[kv_at:kv_at + kv_len].double().repeat_interleave(group, 1).transpose(0, 1)
        vi = v[kv_at:kv_at + kv_len].double().repeat_interleave(group, 1).transpose(0, 1)
        w = torch.sigmoid(qi @ ki.transpose(1, 2) / q.shape[2] ** 0.5 + bias)
        if causal:
            q_pos = torch.arange(qo_len, device=q.device)[:, None] + kv_len - qo_len
            w = w * (torch.arange(kv_len, device=q.device)[None, :] <= q_pos)
        out.append((w @ vi).transpose(0, 1))
        q_at, kv_at = q_at + qo_len, kv_at + kv_len
    return torch.cat(out)


@pytest.mark.parametrize("fixed_split_size", [None, 64])
def test_sigmoid_attention_without_softmax(fixed_split_size):
    """FlashSigmoid as a variant without softmax: ragged prefill (split rows added up by the
    merge) and decode on both loops against float64; no lse exists, so return_lse raises."""
    qo_lens, kv_lens, q, k, v, qo, kv, generator = ragged_batch(9)
    wrapper = flare.BatchPrefillWithRaggedKVCacheWrapper(workspace())
    wrapper.plan(qo, kv, 8, 2, 128, causal=True, q_data_type=torch.bfloat16, variant=SIGMOID,
                 fixed_split_size=fixed_split_size)
    out = wrapper.run(q, k, v, bias=-0.5)
    expected = sigmoid_reference(q, k, v, qo_lens, kv_lens, -0.5, causal=True)
    scale = max(1.0, expected.abs().max().item())
    assert (out.double() - expected).abs().max().item() <= 2e-2 * scale
    with pytest.raises(ValueError, match="use_softmax = false"):
        wrapper.run(q, k, v, bias=-0.5, return_lse=True)

    cache = GpuPagedCache([1, 33, 700, 4100], 2, 128, 16, "NHD", torch.bfloat16, seed=10)
    qd = torch.randn(4, 8, 128, generator=generator).to(torch.bfloat16).to(DEVICE)
    ks, vs = zip(*(cache.tokens(b) for b in range(cache.batch)))
    expected = sigmoid_reference(qd, torch.cat(ks), torch.cat(vs), [1] * 4, cache.kv_lens, 0.25,
                                 causal=False)
    scale = max(1.0, expected.abs().max().item())
    for use_tensor_cores in (False, True):
        decode = flare.BatchDecodeWithPagedKVCacheWrapper(workspace(),
                                                          use_tensor_cores=use_tensor_cores)
        decode.plan(cache.indptr, cache.indices.to(DEVICE), cache.last_page_len, 8, 2, 128, 16,
                    q_data_type=torch.bfloat16, variant=SIGMOID,
                    fixed_split_size=fixed_split_size and 256)
        out = decode.run(qd, cache.cache, bias=0.25)
        assert (out.double() - expected).abs().max().item() <= 2e-2 * scale, use_tensor_cores


def test_precompile_fills_the_cache_for_each_variant():
    """flare.jit.precompile compiles every kernel of each variant's wrappers in parallel; a
    second call finds them all in the cache, and a plan() of those configurations compiles
    nothing more."""
    kwargs = dict(num_qo_heads=8, num_kv_heads=2, head_dim=128, dtype=torch.bfloat16)
    first = flare.jit.precompile([None, SOFT_CAP, SIGMOID], **kwargs)
    # Per variant: two decode loops, and paged and ragged prefill with four tiles each and the
    # merge (shared by all).
    assert first["kernels"] == 3 * (2 + 8) + 1, first
    assert first["compiled"] + first["from_cache"] == first["kernels"]
    second = flare.jit.precompile([None, SOFT_CAP, SIGMOID], **kwargs)
    assert second["compiled"] == 0 and second["from_cache"] == second["kernels"], second
    with pytest.raises(ValueError, match="unknown kinds"):
        flare.jit.precompile(kinds=("decode", "encode"), **kwargs)
    with pytest.raises(TypeError, match="variant must be a flare.AttentionVariant"):
        flare.jit.precompile(["soft_cap"], **kwargs)


def masked_reference(q, k, v, qo_lens, kv_lens, visible, bias=None):
    """float64 softmax attention with visible(request, q_pos [q, 1], kv_pos [1, kv]) -> bool and
    an optional bias(request, q_pos, kv_pos) -> [H, q, kv] added to the scaled logits."""
    group = q.shape[1] // k.shape[1]
    out, q_at, kv_at = [], 0, 0
    for r, (qo_len, kv_len) in enumerate(zip(qo_lens, kv_lens)):
        qi = q[q_at:q_at + qo_len].double().transpose(0, 1)
        ki = k[kv_at:kv_at + kv_len].double().repeat_interleave(group, 1).transpose(0, 1)
        vi = v[kv_at:kv_at + kv_len].double().repeat_interleave(group, 1).transpose(0, 1)
        q_pos = torch.arange(qo_len, device=q.device)[:, None] + kv_len - qo_len
        kv_pos = torch.arange(kv_len, device=q.device)[None, :]
        s = qi @ ki.transpose(1, 2) / q.shape[2] ** 0.5
        if bias is not None:
            s = s + bias(r, q_pos, kv_pos)
        s = s.masked_fill(~visible(r, q_pos, kv_pos), float("-inf"))
        out.append((torch.softmax(s, -1) @ vi).transpose(0, 1))
        q_at, kv_at = q_at + qo_len, kv_at + kv_len
    return torch.cat(out)


def t5_bucket(n, max_distance):
    """transformers' _relative_position_bucket(bidirectional=False, 32 buckets) of n = i - j."""
    n = n.clamp(min=0)
    if max_distance <= 16:  # every n >= 16 is past max_distance: the last bucket
        return torch.where(n < 16, n, torch.full_like(n, 31))
    large = 16 + (torch.log(n.float().clamp(min=1) / 16) / math.log(max_distance / 16) * 16).long()
    return torch.where(n < 16, n, large.clamp(max=31))


def check_t5_decode(buckets, generator, variant, **run_kwargs):
    """Decode on both loops with a T5 variant of max distance 64 (run_kwargs its arguments)
    against T5's buckets of the bucket table `buckets` in float64: four requests of 1 to 4100
    tokens."""
    cache = GpuPagedCache([1, 33, 700, 4100], 2, 128, 16, "NHD", torch.bfloat16, seed=12)
    qd = torch.randn(4, 8, 128, generator=generator).to(torch.bfloat16).to(DEVICE)
    ks, vs = zip(*(cache.tokens(b) for b in range(cache.batch)))
    expected = masked_reference(
        qd, torch.cat(ks), torch.cat(vs), [1] * 4, cache.kv_lens, lambda r, i, j: j <= i,
        bias=lambda r, i, j: buckets.double()[:, t5_bucket(i - j, 64)])
    for use_tensor_cores in (False, True):
        decode = flare.BatchDecodeWithPagedKVCacheWrapper(workspace(),
                                                          use_tensor_cores=use_tensor_cores)
        decode.plan(cache.indptr, cache.indices.to(DEVICE), cache.last_page_len, 8, 2, 128, 16,
                    q_data_type=torch.bfloat16, variant=variant)
        out = decode.run(qd, cache.cache, **run_kwargs)
        assert (out.double() - expected).abs().max().item() <= 2e-2, use_tensor_cores


def test_library_prefix_lm_and_relative_position_bias():
    """flare.variants: prefix-LM (plan without the kernel's causal mask) and T5's relative
    position bias, ragged prefill and decode on both loops, against float64; their tensors'
    symbolic extents are checked against the plan."""
    qo_lens, kv_lens, q, k, v, qo, kv, generator = ragged_batch(11)

    prefix = torch.tensor([50, 7, 0], dtype=torch.int32, device=DEVICE)
    wrapper = flare.BatchPrefillWithRaggedKVCacheWrapper(workspace())
    wrapper.plan(qo, kv, 8, 2, 128, causal=False, q_data_type=torch.bfloat16,
                 variant=flare.variants.prefix_lm())
    out = wrapper.run(q, k, v, prefix_len=prefix)
    expected = masked_reference(q, k, v, qo_lens, kv_lens,
                                lambda r, i, j: (j < int(prefix[r])) | (j <= i))
    assert (out.double() - expected).abs().max().item() <= 2e-2
    with pytest.raises(ValueError, match=r"must have shape \[batch=3\], got \[4\]"):
        wrapper.run(q, k, v, prefix_len=torch.zeros(4, dtype=torch.int32, device=DEVICE))

    table = torch.randn(8, 32, generator=generator).to(DEVICE)
    rpb = flare.variants.relative_position_bias()
    wrapper.plan(qo, kv, 8, 2, 128, causal=True, q_data_type=torch.bfloat16, variant=rpb)
    out = wrapper.run(q, k, v, table=table, max_distance=128.0)
    expected = masked_reference(
        q, k, v, qo_lens, kv_lens, lambda r, i, j: j <= i,
        bias=lambda r, i, j: table.double()[:, t5_bucket(i - j, 128)])
    assert (out.double() - expected).abs().max().item() <= 2e-2
    with pytest.raises(ValueError, match=r"must have shape \[num_qo_heads=8, 32\]"):
        wrapper.run(q, k, v, table=table[:4], max_distance=128.0)

    check_t5_decode(table, generator, rpb, table=table, max_distance=64.0)


def long_rows_batch(seed):
    """Rows long enough that most of their tiles lie past a max distance of 100-300: a 700-token
    append to 1100, one token over 900, a 257-token prefill; 8 query / 2 KV heads, D 128, bf16
    (ragged_batch's return values)."""
    generator = torch.Generator().manual_seed(seed)
    qo_lens, kv_lens = [700, 1, 257], [1100, 900, 257]
    q = torch.randn(sum(qo_lens), 8, 128, generator=generator).to(torch.bfloat16).to(DEVICE)
    k = torch.randn(sum(kv_lens), 2, 128, generator=generator).to(torch.bfloat16).to(DEVICE)
    v = torch.randn(sum(kv_lens), 2, 128, generator=generator).to(torch.bfloat16).to(DEVICE)
    qo = torch.tensor([0, 700, 701, 958], dtype=torch.int32)
    kv = torch.tensor([0, 1100, 2000, 2257], dtype=torch.int32)
    return qo_lens, kv_lens, q, k, v, qo, kv, generator


@pytest.mark.parametrize("backend", ["fa2", "fa3"])
@pytest.mark.parametrize("max_distance", [16.0, 100.0])
def test_relative_position_bias_far_tiles(backend, max_distance):
    """T5's bias on rows long enough that most of their tiles lie past max_distance (one
    constant a row: the Hopper family's affine-logits path on those tiles, logits_transform per
    logit on the tiles that straddle max_distance), both prefill families, against float64."""
    if backend == "fa3" and torch.cuda.get_device_capability(DEVICE) != (9, 0):
        pytest.skip("the Hopper family needs sm_90")
    qo_lens, kv_lens, q, k, v, qo, kv, generator = long_rows_batch(31)
    table = torch.randn(8, 32, generator=generator).to(DEVICE)
    wrapper = flare.BatchPrefillWithRaggedKVCacheWrapper(workspace(), backend=backend)
    wrapper.plan(qo, kv, 8, 2, 128, causal=True, q_data_type=torch.bfloat16,
                 variant=flare.variants.relative_position_bias())
    out = wrapper.run(q, k, v, table=table, max_distance=max_distance)
    expected = masked_reference(
        q, k, v, qo_lens, kv_lens, lambda r, i, j: j <= i,
        bias=lambda r, i, j: table.double()[:, t5_bucket(i - j, max_distance)])
    assert (out.double() - expected).abs().max().item() <= 2e-2


@pytest.mark.parametrize("backend", ["fa2", "fa3"])
def test_distance_bias_is_t5_with_its_table(backend):
    """flare.variants.distance_bias() with t5_distance_bias()'s table against T5's buckets in
    float64 (rows long enough for far tiles: the Hopper family's offset path), and a random
    table of 37 distances; decode on both loops; an empty table and a non-causal plan are
    refused before any launch."""
    if backend == "fa3" and torch.cuda.get_device_capability(DEVICE) != (9, 0):
        pytest.skip("the Hopper family needs sm_90")
    qo_lens, kv_lens, q, k, v, qo, kv, generator = long_rows_batch(41)
    table = torch.randn(8, 32, generator=generator).to(DEVICE)
    wrapper = flare.BatchPrefillWithRaggedKVCacheWrapper(workspace(), backend=backend)
    wrapper.plan(qo, kv, 8, 2, 128, causal=True, q_data_type=torch.bfloat16,
                 variant=flare.variants.distance_bias())
    for max_distance in (128.0, 300.0):
        out = wrapper.run(q, k, v, bias=flare.variants.t5_distance_bias(table, max_distance))
        expected = masked_reference(
            q, k, v, qo_lens, kv_lens, lambda r, i, j: j <= i,
            bias=lambda r, i, j: table.double()[:, t5_bucket(i - j, max_distance)])
        assert (out.double() - expected).abs().max().item() <= 2e-2, max_distance
    by_distance = torch.randn(8, 37, generator=generator).to(DEVICE)
    out = wrapper.run(q, k, v, bias=by_distance)
    expected = masked_reference(
        q, k, v, qo_lens, kv_lens, lambda r, i, j: j <= i,
        bias=lambda r, i, j: by_distance.double()[:, (i - j).clamp(0, 36)])
    assert (out.double() - expected).abs().max().item() <= 2e-2
    with pytest.raises(ValueError, match=r"must have shape \[num_qo_heads=8, at least 1\], "
                                         r"got \[8, 0\]"):
        wrapper.run(q, k, v, bias=by_distance[:, :0].contiguous())
    with pytest.raises(ValueError, match="requires the causal mask"):
        wrapper.plan(qo, kv, 8, 2, 128, causal=False, q_data_type=torch.bfloat16,
                     variant=flare.variants.distance_bias())

    check_t5_decode(table, generator, flare.variants.distance_bias(),
                    bias=flare.variants.t5_distance_bias(table, 64.0))


def test_library_document_mask():
    """flare.variants.document_mask(): packed documents (runs of 1-200 positions), ragged
    prefill and decode on both loops against float64, rows shorter than a request (its last
    positions alone); a plan without the causal mask is refused."""
    qo_lens, kv_lens, q, k, v, qo, kv, generator = ragged_batch(13)
    columns = max(kv_lens) - 5
    lengths = torch.randint(1, 200, (len(kv_lens), columns), generator=generator)
    ids = torch.stack([torch.repeat_interleave(torch.arange(columns), row)[:columns]
                       for row in lengths]).to(torch.int32)
    starts = flare.variants.document_starts(ids.to(DEVICE))
    assert starts.dtype == torch.int32 and starts.shape == ids.shape
    assert torch.equal(flare.variants.document_starts(torch.tensor([4, 4, 6, 6, 6, 1])),
                       torch.tensor([[0, 0, 2, 2, 2, 5]], dtype=torch.int32))

    def same_document(r, i, j):
        inside = (i < columns) & (j < columns)
        row = ids[r].to(DEVICE).long()
        same = row[i.clamp(max=columns - 1)] == row[j.clamp(max=columns - 1)]
        return (j <= i) & ((inside & same) | (i == j))

    doc = flare.variants.document_mask()
    wrapper = flare.BatchPrefillWithRaggedKVCacheWrapper(workspace())
    wrapper.plan(qo, kv, 8, 2, 128, causal=True, q_data_type=torch.bfloat16, variant=doc)
    out = wrapper.run(q, k, v, document_start=starts)
    expected = masked_reference(q, k, v, qo_lens, kv_lens, same_document)
    assert (out.double() - expected).abs().max().item() <= 2e-2
    with pytest.raises(ValueError, match="requires the causal mask"):
        wrapper.plan(qo, kv, 8, 2, 128, causal=False, q_data_type=torch.bfloat16, variant=doc)

    cache = GpuPagedCache([1, 33, 700, 4100], 2, 128, 16, "NHD", torch.bfloat16, seed=14)
    decode_ids = torch.repeat_interleave(torch.arange(4000), 7)[:4000].to(torch.int32)
    decode_ids = decode_ids.expand(4, 4000).contiguous()
    decode_starts = flare.variants.document_starts(decode_ids.to(DEVICE))
    qd = torch.randn(4, 8, 128, generator=generator).to(torch.bfloat16).to(DEVICE)
    ks, vs = zip(*(cache.tokens(b) for b in range(cache.batch)))
    row = decode_ids[0].to(DEVICE).long()
    expected = masked_reference(
        qd, torch.cat(ks), torch.cat(vs), [1] * 4, cache.kv_lens,
        lambda r, i, j: (j <= i) & (((i < 4000) & (j < 4000) & (row[i.clamp(max=3999)] ==
                                                                row[j.clamp(max=3999)]))
                                    | (i == j)))
    for use_tensor_cores in (False, True):
        decode = flare.BatchDecodeWithPagedKVCacheWrapper(workspace(),
                                                          use_tensor_cores=use_tensor_cores)
        decode.plan(cache.indptr, cache.indices.to(DEVICE), cache.last_page_len, 8, 2, 128, 16,
                    q_data_type=torch.bfloat16, variant=doc)
        out = decode.run(qd, cache.cache, document_start=decode_starts)
        assert (out.double() - expected).abs().max().item() <= 2e-2, use_tensor_cores
