"""The wrappers on CPU torch tensors (DLPack import of torch, bfloat16 and fp8 caches, outputs
allocated as torch tensors). Skipped visibly where PyTorch is not installed."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import flare  # noqa: E402
from attention_reference import (PagedCache, max_abs_error, reference_attention,  # noqa: E402
                                 reference_merge)


def to_torch(array, dtype):
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32)).to(dtype)


def test_decode_bfloat16_on_cpu_torch():
    cache = PagedCache([1, 7, 0, 40], 2, 64, 3, seed=30)
    kv = to_torch(cache.cache, torch.bfloat16)  # unused slots stay NaN
    q = torch.randn(cache.batch, 8, 64, generator=torch.Generator().manual_seed(31)).to(
        torch.bfloat16)
    wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(torch.empty(16, dtype=torch.uint8))
    wrapper.plan(torch.from_numpy(cache.indptr), torch.from_numpy(cache.indices),
                 torch.from_numpy(cache.last_page_len), 8, 2, 64, 3,
                 q_data_type=torch.bfloat16)
    out, lse = wrapper.run(q, kv, return_lse=True)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16
    k = to_torch(cache.k, torch.bfloat16).float().numpy()
    v = to_torch(cache.v, torch.bfloat16).float().numpy()
    expected_o, expected_lse = reference_attention(q.float().numpy(), k, v,
                                                   np.arange(cache.batch + 1), cache.kv_indptr)
    assert max_abs_error(out.float().numpy(), expected_o) <= 2e-2  # bfloat16 output rounding
    assert max_abs_error(lse.numpy(), expected_lse) <= 1e-4


@pytest.mark.parametrize("fp8", ["float8_e4m3fn", "float8_e5m2"])
def test_decode_fp8_cache_with_scales_on_cpu_torch(fp8):
    fp8_dtype = getattr(torch, fp8)
    cache = PagedCache([13, 29], 1, 64, 16, seed=32)
    kv = to_torch(np.nan_to_num(cache.cache), torch.float32).to(fp8_dtype)
    q = torch.randn(2, 4, 64, generator=torch.Generator().manual_seed(33)).to(torch.float16)
    wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(torch.empty(16, dtype=torch.uint8))
    wrapper.plan(torch.from_numpy(cache.indptr), torch.from_numpy(cache.indices),
                 torch.from_numpy(cache.last_page_len), 4, 1, 64, 16, q_data_type="float16",
                 kv_data_type=fp8_dtype)
    out = wrapper.run(q, kv, k_scale=0.25, v_scale=3.0)
    k = to_torch(cache.k, torch.float32).to(fp8_dtype).float().numpy()
    v = to_torch(cache.v, torch.float32).to(fp8_dtype).float().numpy()
    expected, _ = reference_attention(q.float().numpy(), k, v, [0, 1, 2], cache.kv_indptr,
                                      k_scale=0.25, v_scale=3.0)
    assert max_abs_error(out.float().numpy(), expected) <= 1e-2


def test_merge_state_on_cpu_torch():
    rng = np.random.default_rng(34)
    v = torch.from_numpy(rng.standard_normal((6, 2, 4, 32)).astype(np.float32))
    s = torch.from_numpy(rng.standard_normal((6, 2, 4)).astype(np.float32))
    merged_v, merged_s = flare.merge_state(v[:, 0], s[:, 0], v[:, 1], s[:, 1])
    expected_v, expected_s = reference_merge(v.numpy(), s.numpy())
    assert max_abs_error(merged_v.numpy(), expected_v) <= 1e-5
    assert max_abs_error(merged_s.numpy(), expected_s) <= 1e-5
    mask = torch.tensor([True, False, True, False, True, True])
    target_v, target_s = v[:, 0].clone(), s[:, 0].clone()
    flare.merge_state_in_place(target_v, target_s, v[:, 1], s[:, 1], mask=mask)
    assert max_abs_error(target_v[mask].numpy(), expected_v[mask.numpy()]) <= 1e-5
    assert torch.equal(target_v[~mask], v[~mask, 0])


def test_get_batch_indices_positions_torch_matches_numpy():
    append_indptr = torch.tensor([0, 0, 3, 4, 9], dtype=torch.int32)
    seq_lens = torch.tensor([5, 3, 10, 6], dtype=torch.int32)
    got = flare.get_batch_indices_positions(append_indptr, seq_lens, 11)
    expected = flare.get_batch_indices_positions(append_indptr.numpy(), seq_lens.numpy(), 11)
    assert got[0].dtype == torch.int32 and got[1].dtype == torch.int32
    assert got[0].tolist() == expected[0].tolist() == [1, 1, 1, 2, 3, 3, 3, 3, 3, -1, -1]
    assert got[1].tolist() == expected[1].tolist() == [0, 1, 2, 9, 1, 2, 3, 4, 5, 0, 0]


def test_get_seq_lens_on_torch_tensors():
    indptr = torch.tensor([0, 2, 2, 7], dtype=torch.int32)
    last = torch.tensor([3, 0, 16], dtype=torch.int32)
    got = flare.get_seq_lens(indptr, last, 16)
    assert isinstance(got, torch.Tensor) and got.tolist() == [19, 0, 80]


def test_append_on_cpu_torch_bfloat16():
    cache = torch.full((4, 2, 3, 2, 64), float("nan"), dtype=torch.bfloat16)
    key = torch.randn(5, 2, 64).to(torch.bfloat16)
    value = torch.randn(5, 2, 64).to(torch.bfloat16)
    indices = torch.tensor([2, 0, 3], dtype=torch.int32)
    indptr = torch.tensor([0, 2, 3], dtype=torch.int32)
    last = torch.tensor([1, 1], dtype=torch.int32)
    batch_indices, positions = flare.get_batch_indices_positions(
        torch.tensor([0, 4, 5], dtype=torch.int32), torch.tensor([4, 1], dtype=torch.int32), 5)
    flare.append_paged_kv_cache(key, value, batch_indices, positions, cache, indices, indptr,
                                last)
    # Request 0 positions 0..3 -> page 2 slots 0..2, page 0 slot 0; request 1 -> page 3 slot 0.
    for token, (page, slot) in enumerate([(2, 0), (2, 1), (2, 2), (0, 0), (3, 0)]):
        assert torch.equal(cache[page, 0, slot], key[token])
        assert torch.equal(cache[page, 1, slot], value[token])
    assert torch.isnan(cache[1].float()).all()


class _Subclass(torch.Tensor):
    """A trivial subclass: flare reads it by attributes, not through torch's DLPack table."""


def test_dlpack_table_and_attribute_reads_give_the_same_views():
    """Plain tensors go through torch's DLPack C exchange table where torch has one (torch >=
    2.10), subclasses through five attribute reads: both give the same dtype, shape, strides,
    data pointer and device, on the layouts the wrappers take (slices, transposes, broadcasts,
    zero-size, scalars, every dtype flare reads, parameters, tensors that need grad)."""
    from flare import _flare
    base = torch.randn(4, 6, 8, generator=torch.Generator().manual_seed(40))
    cases = [base, base[1:, ::2], base.transpose(0, 2), base[:, 3], torch.zeros(1, 8).expand(5, 8),
             torch.zeros(0, 3), torch.tensor(2.5), base.bfloat16(), base.half(),
             base.to(torch.float8_e4m3fn), base.to(torch.float8_e5m2),
             torch.arange(7, dtype=torch.int32), torch.arange(7), torch.zeros(3, dtype=torch.uint8),
             torch.ones(3, dtype=torch.bool), torch.nn.Parameter(base.clone()),
             base.clone().requires_grad_()]
    for i, tensor in enumerate(cases):
        fast = _flare._object_view(tensor)
        slow = _flare._object_view(tensor.as_subclass(_Subclass))
        assert fast == slow, (i, fast, slow)
        assert fast[3] == tensor.data_ptr() and fast[4] == -1, i
    if hasattr(torch.Tensor, "__dlpack_c_exchange_api__"):
        # The rejection names the argument and the dtype, whichever path read it.
        with pytest.raises(ValueError, match="object has dtype torch.complex64"):
            _flare._object_view(torch.zeros(2, dtype=torch.complex64))
