"""NVFP4 KV caches through the Python API on PyTorch CUDA tensors: the quantizing appends
(page table and slot mapping, tuple and stacked caches, NHD / HND, float16 / bfloat16) write
bit for bit what flare's CPU path writes for the same rows, and dequantize
(fp4_quantization.e2m1_and_ufp8sf_scale_to_float) to within NVFP4's rounding of the input;
FlashInfer's argument errors; swizzled and linear scale layouts agree. Skipped visibly without
PyTorch or a CUDA device."""

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device (torch.cuda.is_available() is False)", allow_module_level=True)

import flare  # noqa: E402
from flare.fp4_quantization import e2m1_and_ufp8sf_scale_to_float  # noqa: E402

DEVICE = torch.device("cuda:0")


def empty_cache(pages, page_size, heads, dim, layout, device, stacked):
    shape = (pages, page_size, heads) if layout == "NHD" else (pages, heads, page_size)
    if stacked:
        codes = torch.full((pages, 2, *shape[1:], dim // 2), 0x5A, dtype=torch.uint8,
                           device=device)
        scales = torch.zeros((pages, 2, *shape[1:], dim // 16), dtype=torch.uint8,
                             device=device).view(torch.float8_e4m3fn)
        return codes, scales
    codes = tuple(torch.full((*shape, dim // 2), 0x5A, dtype=torch.uint8, device=device)
                  for _ in range(2))
    scales = tuple(torch.zeros((*shape, dim // 16), dtype=torch.uint8, device=device).view(
        torch.float8_e4m3fn) for _ in range(2))
    return codes, scales


def as_bytes(cache):
    parts = cache if isinstance(cache, tuple) else (cache,)
    return [p.view(torch.uint8).cpu() for p in parts]


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("stacked", [False, True])
def test_page_table_append_matches_the_cpu_and_dequantizes_close(layout, dtype, stacked):
    heads, dim, page_size, pages = 4, 128, 16, 12
    lengths = [45, 8, 25]
    indptr = torch.tensor([0, 3, 4, 6], dtype=torch.int32)
    indices = torch.tensor([7, 2, 9, 0, 11, 5], dtype=torch.int32)
    last = torch.tensor([13, 8, 9], dtype=torch.int32)
    append_indptr = torch.tensor([0, 45, 53, 78], dtype=torch.int32)
    seq_lens = flare.get_seq_lens(indptr, last, page_size)
    batch, positions = flare.get_batch_indices_positions(append_indptr, seq_lens, sum(lengths))
    key = torch.randn(sum(lengths), heads, dim).to(dtype)
    value = (torch.randn(sum(lengths), heads, dim) * 30).to(dtype)
    results = []
    for device in ("cpu", DEVICE):
        codes, scales = empty_cache(pages, page_size, heads, dim, layout, device, stacked)
        flare.nvfp4_quantize_append_paged_kv_cache(
            key.to(device), value.to(device), batch.to(device), positions.to(device), codes,
            scales, indices.to(device), indptr.to(device, torch.int64 if stacked else torch.int32),
            last.to(device), 0.5, 2.0, kv_layout=layout)  # int64 indptr: narrowed, as FlashInfer
        results.append((as_bytes(codes), as_bytes(scales), codes, scales))
    flare.check_append_paged_kv_cache()
    for cpu, gpu in zip(results[0][:2], results[1][:2]):
        for a, b in zip(cpu, gpu):
            assert torch.equal(a, b)
    # Dequantized rows against the input: within half a grid step of each block (<= 1/6 of
    # its largest magnitude, plus e4m3's rounding of the scale).
    codes, scales = results[1][2], results[1][3]
    k_codes = codes[0] if isinstance(codes, tuple) else codes[:, 0]
    k_scales = scales[0] if isinstance(scales, tuple) else scales[:, 0]
    for token in (0, 44, 50, 77):
        request = int(batch[token])
        pos = int(positions[token])
        page = int(indices[int(indptr[request]) + pos // page_size])
        slot = pos % page_size
        row_codes = k_codes[page, slot] if layout == "NHD" else k_codes[page, :, slot]
        row_scales = k_scales[page, slot] if layout == "NHD" else k_scales[page, :, slot]
        back = e2m1_and_ufp8sf_scale_to_float(row_codes.contiguous(), row_scales.contiguous(),
                                              torch.tensor([0.5], device=DEVICE),
                                              is_sf_swizzled_layout=False)
        want = key[token].float().to(DEVICE)
        blocks = want.reshape(heads, dim // 16, 16).abs().amax(-1, keepdim=True)
        error = (back - want).reshape(heads, dim // 16, 16).abs()
        assert (error <= blocks / 6 * 1.07 + 1e-6).all()


@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
def test_slot_mapping_append_matches_the_cpu_with_padding_and_device_scales(slot_dtype):
    heads, dim, page_size, pages = 2, 64, 3, 5
    key = torch.randn(7, heads, dim, dtype=torch.float16)
    value = torch.randn(7, heads, dim, dtype=torch.float16)
    slots = torch.tensor([14, -1, 0, 5, 9, -3], dtype=slot_dtype)
    outputs = []
    for device in ("cpu", DEVICE):
        codes, scales = empty_cache(pages, page_size, heads, dim, "NHD", device, False)
        k_scale = torch.tensor([0.25], dtype=torch.float32, device=device)
        flare.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(
            key.to(device), value.to(device), slots.to(device), codes, scales, k_scale, 1.0)
        outputs.append(as_bytes(codes) + as_bytes(scales))
    for a, b in zip(*outputs):
        assert torch.equal(a, b)


def test_slot_mapping_append_in_a_cuda_graph_reads_the_current_scales(monkeypatch):
    heads, dim = 1, 64
    key = torch.randn(2, heads, dim, dtype=torch.float16, device=DEVICE)
    value = torch.randn_like(key)
    slots = torch.tensor([0, 1], dtype=torch.int32, device=DEVICE)
    codes, scales = empty_cache(1, 2, heads, dim, "NHD", DEVICE, False)
    k_scale = torch.ones(1, dtype=torch.float32, device=DEVICE)
    v_scale = torch.ones(1, dtype=torch.float32, device=DEVICE)
    flare.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(
        key, value, slots, codes, scales, k_scale, v_scale)  # warm-up (compiles the kernel)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        flare.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(
            key, value, slots, codes, scales, k_scale, v_scale)
    k_scale.fill_(4.0)
    graph.replay()
    torch.cuda.synchronize()
    back = e2m1_and_ufp8sf_scale_to_float(codes[0][0, 0].reshape(1, -1),
                                          scales[0][0, 0].reshape(1, -1),
                                          torch.tensor([4.0], device=DEVICE),
                                          is_sf_swizzled_layout=False)
    assert (back[0] - key[0, 0].float()).abs().max() <= key[0, 0].float().abs().max() / 5
    # A float scale while capturing would be gone at replay: refused, as FlashInfer does.
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(ValueError, match="CUDA graph capture"):
        flare.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(
            key, value, slots, codes, scales, 1.0, v_scale)


def test_flashinfer_argument_errors():
    key = torch.randn(1, 1, 64, dtype=torch.float16, device=DEVICE)
    codes, scales = empty_cache(1, 1, 1, 64, "NHD", DEVICE, False)
    slots = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    append = flare.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping
    with pytest.raises(ValueError, match="positive finite global decode scale"):
        append(key, key, slots, codes, scales, torch.zeros(1, device=DEVICE), 1.0)
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        append(key.float(), key.float(), slots, codes, scales, 1.0, 1.0)
    with pytest.raises(ValueError, match="torch.uint8"):
        append(key, key, slots, (codes[0].float(), codes[1]), scales, 1.0, 1.0)
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        append(key, key, slots, codes, (codes[0], codes[1]), 1.0, 1.0)
    with pytest.raises(ValueError, match="int32 or int64"):
        append(key, key, slots.float(), codes, scales, 1.0, 1.0)


def test_swizzled_and_linear_scale_layouts_agree():
    m, k = 200, 96  # 6 blocks a row: rows padded to 256, blocks to 8 in the swizzled layout
    codes = torch.randint(0, 256, (m, k // 2), dtype=torch.uint8, device=DEVICE)
    linear = torch.randint(0, 126, (m, k // 16), dtype=torch.uint8, device=DEVICE)
    padded = torch.zeros(256, 8, dtype=torch.uint8, device=DEVICE)
    padded[:m, :k // 16] = linear
    swizzled = padded.reshape(2, 4, 32, 2, 4).permute(0, 3, 2, 1, 4).contiguous()
    a = e2m1_and_ufp8sf_scale_to_float(codes, linear, is_sf_swizzled_layout=False)
    b = e2m1_and_ufp8sf_scale_to_float(codes, swizzled.reshape(-1), is_sf_swizzled_layout=True)
    assert torch.equal(a, b)
    assert a[3, 5] == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0][int(codes[3, 2]) >> 4 & 7] * (
        -1 if int(codes[3, 2]) & 0x80 else 1) * linear[3, 0].view(torch.float8_e4m3fn).float()
