"""FlashInfer's customized modules on the GPU: its FlashSigmoid and single-decode custom-mask
examples (tests/utils/test_jit_example.py), declarations and calls unchanged, through
flare.jit.gen_customize_*_module, the *_with_jit_module entries and the wrappers' jit_args,
against float32 torch references. Skipped visibly without PyTorch or a CUDA device."""

import functools
import math

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device (torch.cuda.is_available() is False)", allow_module_level=True)

import flare  # noqa: E402
from test_flashinfer_jit import FLASH_SIGMOID  # noqa: E402

DEVICE = torch.device("cuda:0")

CUSTOM_MASK = r"""
struct SingleDecodeWithCustomMask : AttentionVariantBase {
  static constexpr bool use_softmax = true;

  uint8_t* custom_mask_ptr;
  uint32_t window_left, qo_len, kv_len;
  float sm_scale_log2;

  // Create closure
  template <typename Params>
  __device__ __host__ SingleDecodeWithCustomMask(const Params& params, uint32_t batch_idx,
                                                 uint8_t* smem_ptr) {
    custom_mask_ptr = params.custom_mask;
    qo_len = 1;
    kv_len = params.get_kv_len(batch_idx);
    window_left = kv_len;
    sm_scale_log2 = params.sm_scale * math::log2e;
  }

  REGISTER_LOGITS_MASK(params, batch_idx, qo_idx, kv_idx, qo_head_idx, kv_head_idx, {
    const uint32_t offset = kv_idx;
    return ((custom_mask_ptr[offset / 8] >> (offset % 8)) & 1);
  })
};
"""


def sigmoid_reference(q, k, v, logits_scale, sigmoid_bias):
    p = torch.sigmoid(torch.einsum("mhd,nhd->hmn", q.float(), k.float()) * logits_scale
                      + sigmoid_bias)
    return torch.einsum("hmn,nhd->mhd", p, v.float())


def test_flash_sigmoid_single_prefill_as_flashinfer_runs_it():
    torch.manual_seed(42)
    jit_args = ("single_prefill_flash_sigmoid_hd128", torch.float16, torch.float16,
                torch.float16, 128, 128, [], [], ["logits_scale", "sigmoid_bias"],
                ["double", "double"], "FlashSigmoid", FLASH_SIGMOID)
    f = functools.partial(
        flare.prefill.single_prefill_with_kv_cache_with_jit_module,
        flare.jit.gen_customize_single_prefill_module("fa2", *jit_args).build_and_load())
    q = torch.randn(128, 8, 128, dtype=torch.float16, device=DEVICE)
    k = torch.randn(1027, 8, 128, dtype=torch.float16, device=DEVICE)
    v = torch.randn(1027, 8, 128, dtype=torch.float16, device=DEVICE)
    logits_scale = 1.0 / math.sqrt(128)
    sigmoid_bias = 0.25
    o = f(q, k, v, logits_scale, sigmoid_bias, mask_mode=0)
    o_ref = sigmoid_reference(q, k, v, logits_scale, sigmoid_bias).half()
    torch.testing.assert_close(o, o_ref, rtol=2e-2, atol=2e-2)
    with pytest.raises(TypeError, match=r"takes 2 additional argument\(s\)"):
        f(q, k, v, logits_scale)


def test_flash_sigmoid_through_the_wrappers_jit_args():
    torch.manual_seed(7)
    jit_args = ("batch_flash_sigmoid_hd128", torch.float16, torch.float16, torch.float16,
                torch.int32, 128, 128, [], [], ["logits_scale", "sigmoid_bias"],
                ["double", "double"], "FlashSigmoid", FLASH_SIGMOID)
    workspace = torch.empty(128 << 20, dtype=torch.uint8, device=DEVICE)
    qo_lens, kv_lens = [5, 130, 1], [300, 130, 77]
    q = torch.randn(sum(qo_lens), 8, 128, dtype=torch.float16, device=DEVICE)
    k = torch.randn(sum(kv_lens), 8, 128, dtype=torch.float16, device=DEVICE)
    v = torch.randn(sum(kv_lens), 8, 128, dtype=torch.float16, device=DEVICE)
    qo = torch.tensor([0, 5, 135, 136], dtype=torch.int32)
    kv = torch.tensor([0, 300, 430, 507], dtype=torch.int32)
    wrapper = flare.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", backend="fa2",
                                                         jit_args=jit_args)
    wrapper.plan(qo, kv, 8, 8, 128, causal=False, q_data_type=torch.float16)
    scale = 1.0 / math.sqrt(128)
    o = wrapper.run(q, k, v, scale, 0.25)
    for r in range(3):
        qs, ks = slice(int(qo[r]), int(qo[r + 1])), slice(int(kv[r]), int(kv[r + 1]))
        expected = sigmoid_reference(q[qs], k[ks], v[ks], scale, 0.25)
        torch.testing.assert_close(o[qs].float(), expected, rtol=2e-2, atol=2e-2)

    # Decode: requests' last positions, both loops, pages of 16.
    kv_lens = [1, 40, 1000]
    pages = [(n + 15) // 16 for n in kv_lens]
    cache = torch.randn(sum(pages), 2, 16, 8, 128, dtype=torch.float16, device=DEVICE)
    indptr = torch.tensor([0, pages[0], pages[0] + pages[1], sum(pages)], dtype=torch.int32)
    indices = torch.arange(sum(pages), dtype=torch.int32, device=DEVICE)
    last = torch.tensor([(n - 1) % 16 + 1 for n in kv_lens], dtype=torch.int32)
    qd = torch.randn(3, 8, 128, dtype=torch.float16, device=DEVICE)
    for use_tensor_cores in (False, True):
        decode = flare.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD",
                                                          use_tensor_cores=use_tensor_cores,
                                                          jit_args=jit_args)
        decode.plan(indptr, indices, last, 8, 8, 128, 16, q_data_type=torch.float16)
        o = decode.run(qd, cache, scale, 0.25)
        for r in range(3):
            rows = cache[int(indptr[r]):int(indptr[r + 1])]
            keys = rows[:, 0].reshape(-1, 8, 128)[:kv_lens[r]]
            values = rows[:, 1].reshape(-1, 8, 128)[:kv_lens[r]]
            expected = sigmoid_reference(qd[r:r + 1], keys, values, scale, 0.25)[0]
            torch.testing.assert_close(o[r].float(), expected, rtol=2e-2, atol=2e-2)


def test_single_decode_custom_mask_as_flashinfer_runs_it():
    torch.manual_seed(3)
    jit_module = flare.jit.gen_customize_single_decode_module(
        "single_decode_custom_mask", torch.float16, torch.float16, torch.float16, 128, 128,
        ["custom_mask"], ["uint8_t"], ["sm_scale"], ["double"], "SingleDecodeWithCustomMask",
        CUSTOM_MASK).build_and_load()
    f = functools.partial(flare.decode.single_decode_with_kv_cache_with_jit_module, jit_module)
    q = torch.randn(32, 128, dtype=torch.float16, device=DEVICE)
    k = torch.randn(254, 32, 128, dtype=torch.float16, device=DEVICE)
    v = torch.randn(254, 32, 128, dtype=torch.float16, device=DEVICE)
    sm_scale = 1.0 / math.sqrt(128)
    mask = torch.rand(254, device=DEVICE) > 0.5
    mask[0] = True
    packed = torch.zeros(32, dtype=torch.uint8, device=DEVICE)
    for j in range(254):  # little bit order, as FlashInfer's packbits
        if mask[j]:
            packed[j // 8] |= 1 << (j % 8)
    o = f(q, k, v, packed, sm_scale)
    s = torch.einsum("hd,nhd->hn", q.float(), k.float()) * sm_scale
    s = s.masked_fill(~mask[None, :], float("-inf"))
    o_ref = torch.einsum("hn,nhd->hd", torch.softmax(s, -1), v.float())
    torch.testing.assert_close(o.float(), o_ref, rtol=1e-2, atol=1e-2)
