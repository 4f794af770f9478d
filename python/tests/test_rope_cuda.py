"""flare.apply_rope and its FlashInfer siblings on PyTorch CUDA tensors (kernels/rope_apply.cuh)
against a float64 torch rotation and against the CPU reference: float16 / bfloat16, both pair
layouts, a partial rotary_dim, Llama 3.1's frequencies, int32 and int64 pos_ids, q and k as
views of one fused qkv tensor, the _inplace forms on a side stream and in a CUDA graph. Skipped
visibly without PyTorch or without a CUDA device."""

import math

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device (torch.cuda.is_available() is False)", allow_module_level=True)

import flare  # noqa: E402

DEVICE = torch.device("cuda:0")
ULP = {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}


def rotate64(x, positions, rotary_dim, interleave, rope_scale, rope_theta):
    out = x.double().clone()
    half = rotary_dim // 2
    i = torch.arange(half, device=x.device, dtype=torch.float64)
    freq = rope_theta ** (-2.0 * i / rotary_dim) / rope_scale
    a = torch.arange(half, device=x.device) * (2 if interleave else 1)
    b = a + 1 if interleave else a + half
    angle = positions.double()[:, None, None] * freq[None, None, :]
    xa, xb = out[:, :, a].clone(), out[:, :, b].clone()
    out[:, :, a] = xa * torch.cos(angle) - xb * torch.sin(angle)
    out[:, :, b] = xb * torch.cos(angle) + xa * torch.sin(angle)
    return out


def assert_close(got, want, dtype):
    bound = 2 * ULP[dtype] * want.abs().clamp(min=1.0)
    err = (got.double() - want).abs()
    assert bool((err <= bound).all()), f"max error {err.max().item()} over bound"


def fused_qkv(nnz, q_heads, k_heads, head_dim, dtype, seed):
    """q and k as views of one [nnz, (q_heads + 2 k_heads) * head_dim] tensor (vLLM's layout)."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    qkv = torch.randn(nnz, (q_heads + 2 * k_heads) * head_dim, device=DEVICE, generator=g,
                      dtype=torch.float32).to(dtype)
    q = qkv[:, :q_heads * head_dim].view(nnz, q_heads, head_dim)
    k = qkv[:, q_heads * head_dim:(q_heads + k_heads) * head_dim].view(nnz, k_heads, head_dim)
    return qkv, q, k


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("rotary_dim", [None, 64])
def test_apply_rope_matches_float64_and_the_cpu(dtype, interleave, rotary_dim):
    indptr = torch.tensor([0, 7, 7, 40, 41], dtype=torch.int32, device=DEVICE)
    offsets = torch.tensor([0, 5, 123456, 9], dtype=torch.int32, device=DEVICE)
    positions = torch.cat([torch.arange(7), 123456 + torch.arange(33), torch.tensor([9])])
    _, q, k = fused_qkv(41, 8, 2, 128, dtype, 1)
    q_rope, k_rope = flare.apply_rope(q, k, indptr, offsets, rotary_dim=rotary_dim,
                                      interleave=interleave, rope_theta=5e5)
    rd = rotary_dim or 128
    pos = positions.to(DEVICE)
    assert_close(q_rope, rotate64(q, pos, rd, interleave, 1.0, 5e5), dtype)
    assert_close(k_rope, rotate64(k, pos, rd, interleave, 1.0, 5e5), dtype)
    q_cpu, k_cpu = flare.apply_rope(q.cpu(), k.cpu(), indptr.cpu(), offsets.cpu(),
                                    rotary_dim=rotary_dim, interleave=interleave, rope_theta=5e5)
    assert (q_rope.cpu().float() - q_cpu.float()).abs().max().item() <= 4 * ULP[dtype] * 8
    for ids in (positions.to(torch.int32), positions.to(torch.int64)):
        q_ids, k_ids = flare.apply_rope_pos_ids(q, k, ids.to(DEVICE), rotary_dim=rotary_dim,
                                                interleave=interleave, rope_theta=5e5)
        assert torch.equal(q_ids, q_rope) and torch.equal(k_ids, k_rope)


def test_inplace_forms_rotate_the_fused_tensor_only_where_q_and_k_are():
    dtype = torch.bfloat16
    qkv, q, k = fused_qkv(19, 4, 1, 128, dtype, 2)
    v_before = qkv[:, 5 * 128:].clone()
    pos = torch.arange(19, device=DEVICE, dtype=torch.int64) * 37
    q_want, k_want = flare.apply_llama31_rope_pos_ids(q, k, pos)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        flare.apply_llama31_rope_pos_ids_inplace(q, k, pos)
    stream.synchronize()
    assert torch.equal(q, q_want) and torch.equal(k, k_want)
    assert torch.equal(qkv[:, 5 * 128:], v_before)


def test_inplace_form_replays_in_a_cuda_graph():
    _, q, k = fused_qkv(64, 8, 8, 64, torch.float16, 3)
    indptr = torch.tensor([0, 64], dtype=torch.int32, device=DEVICE)
    offsets = torch.tensor([100], dtype=torch.int32, device=DEVICE)
    q0, k0 = q.clone(), k.clone()
    q_want, k_want = flare.apply_rope(q0, k0, indptr, offsets)
    flare.apply_rope_inplace(q0.clone(), k0.clone(), indptr, offsets)  # compiled before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        flare.apply_rope_inplace(q, k, indptr, offsets)
    q.copy_(q0)
    k.copy_(k0)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(q, q_want) and torch.equal(k, k_want)
    assert math.isfinite(q.float().abs().max().item())


@pytest.mark.parametrize("is_neox", [True, False])
def test_cos_sin_cache_forms_match_the_cpu(is_neox):
    dtype = torch.bfloat16
    qkv, q, k = fused_qkv(23, 4, 2, 128, dtype, 4)
    query = qkv[:, :4 * 128]
    key = qkv[:, 4 * 128:6 * 128]
    g = torch.Generator(device=DEVICE).manual_seed(5)
    table = torch.rand(500, 64, device=DEVICE, generator=g)
    positions = torch.randint(0, 500, (23,), device=DEVICE, generator=g)
    q_out, k_out = flare.apply_rope_with_cos_sin_cache(positions, query, key, 128, table,
                                                       is_neox=is_neox)
    q_cpu, k_cpu = flare.apply_rope_with_cos_sin_cache(positions.cpu(), query.cpu(), key.cpu(),
                                                       128, table.cpu(), is_neox=is_neox)
    assert (q_out.cpu().float() - q_cpu.float()).abs().max().item() <= 0.05
    assert (k_out.cpu().float() - k_cpu.float()).abs().max().item() <= 0.05
    flare.apply_rope_with_cos_sin_cache_inplace(positions, query, key, 128, table, is_neox=is_neox)
    assert torch.equal(query, q_out) and torch.equal(key, k_out)
