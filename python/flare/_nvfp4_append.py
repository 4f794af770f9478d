"""NVFP4 quantizing appends with FlashInfer's interface (nvfp4_quantize_append_paged_kv_cache and
its slot-mapping variant), over flare's append (include/flare/api/append_paged_kv_nvfp4.h): each
appended float16 / bfloat16 K / V row is quantized in blocks of 16 (E2M1 codes, an e4m3 scale a
block, x = e2m1 * block scale * global scale) into its page slot. CUDA tensors run one kernel
on the caller's stream (no synchronization, CUDA-graph safe given device scales); CPU tensors
the validated host path."""

import math

from . import _flare
from ._args import check_kv_layout
from ._tensors import is_cuda, split_paged_kv_cache, torch_module


def _check_rows(append_key, append_value):
    torch = torch_module()
    if append_key.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"append_key must be float16 or bfloat16, got {append_key.dtype}")
    if append_value.dtype != append_key.dtype:
        raise ValueError(f"append_key and append_value must have the same dtype, got "
                         f"{append_key.dtype} and {append_value.dtype}")


def _caches(paged_kv_cache, kv_cache_sf):
    torch = torch_module()
    k_codes, v_codes = split_paged_kv_cache(paged_kv_cache)
    k_scales, v_scales = split_paged_kv_cache(kv_cache_sf)
    if k_codes.dtype != torch.uint8 or v_codes.dtype != torch.uint8:
        raise ValueError("NVFP4 paged K/V cache tensors must have dtype torch.uint8, got "
                         f"{k_codes.dtype} and {v_codes.dtype}")
    if k_scales.dtype != torch.float8_e4m3fn or v_scales.dtype != torch.float8_e4m3fn:
        raise ValueError("NVFP4 scale cache tensors must have dtype torch.float8_e4m3fn, got "
                         f"{k_scales.dtype} and {v_scales.dtype}")
    return k_codes, v_codes, k_scales, v_scales


def _int32(x):
    """Index arrays as the kernel reads them: int64 tensors (FlashInfer accepts them, e.g. an
    indptr built with torch.cumsum) narrowed to int32, a copy on their device."""
    torch = torch_module()
    return x.to(torch.int32) if isinstance(x, torch.Tensor) and x.dtype == torch.int64 else x


def _host_scale(name, value):
    value = float(value)
    if not math.isfinite(value) or value <= 0.0:
        raise ValueError(f"{name} must be a positive finite global decode scale, got {value}")
    return torch_module().tensor([value], dtype=torch_module().float32)


def nvfp4_quantize_append_paged_kv_cache(append_key, append_value, batch_indices, positions,
                                         paged_kv_cache, kv_cache_sf, kv_indices, kv_indptr,
                                         kv_last_page_len, k_scale, v_scale, kv_layout="NHD"):
    """Quantizes token i of append_key / append_value [nnz, H_kv, D] (float16 / bfloat16, D a
    multiple of 16) into request batch_indices[i] at position positions[i] of an NVFP4 paged
    cache: paged_kv_cache (k, v) uint8 [pages, page_size, H_kv, D / 2] (NHD; HND [pages, H_kv,
    page_size, D / 2]) or stacked [pages, 2, ...]; kv_cache_sf the same in float8_e4m3fn with D
    / 16. k_scale, v_scale: positive finite global decode scales (floats: passed by value, so a
    captured append keeps them). Index arrays int32, or int64 (narrowed to int32 on their
    device). Out-of-range indices are skipped on the GPU and recorded
    (check_append_paged_kv_cache raises); on the CPU they raise ValueError, nothing written."""
    check_kv_layout(kv_layout)
    _check_rows(append_key, append_value)
    k_codes, v_codes, k_scales, v_scales = _caches(paged_kv_cache, kv_cache_sf)
    k_value, v_value = _host_scale("k_scale", k_scale), _host_scale("v_scale", v_scale)
    page_size = k_codes.shape[1] if kv_layout == "NHD" else k_codes.shape[2]
    _flare.append_paged_kv_nvfp4(
        append_key, append_value, _int32(batch_indices), _int32(positions), k_codes, v_codes,
        k_scales, v_scales, kv_layout, _int32(kv_indptr), _int32(kv_indices),
        _int32(kv_last_page_len), int(page_size), k_value, v_value)


def _scale_tensor(name, value, device):
    """FlashInfer's rules for the slot-mapped append's scales: during a CUDA graph capture a
    contiguous float32 CUDA tensor on the append's device (a temporary would be gone at
    replay); otherwise a float or a one-element float32 tensor, checked positive and finite
    (a CUDA tensor by one device-to-host read)."""
    torch = torch_module()
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    if not isinstance(value, torch.Tensor):
        if capturing:
            raise ValueError(f"{name} must be a contiguous float32 CUDA tensor on {device} "
                             "during CUDA graph capture")
        return _host_scale(name, value)
    if value.numel() != 1:
        raise ValueError(f"{name} must have exactly one element, got {value.numel()}")
    if value.dtype != torch.float32:
        raise ValueError(f"{name} must be torch.float32, got {value.dtype}")
    if capturing:
        if not value.is_cuda or value.device != device or not value.is_contiguous():
            raise ValueError(f"{name} must be a contiguous float32 CUDA tensor on {device} "
                             "during CUDA graph capture")
        return value
    scalar = float(value.reshape(()).item())  # one read, as FlashInfer validates
    if not math.isfinite(scalar) or scalar <= 0.0:
        raise ValueError(f"{name} must be a positive finite global decode scale, got {scalar}")
    return value.contiguous() if value.device == device else _host_scale(name, scalar)


def nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(append_key, append_value,
                                                           slot_mapping, paged_kv_cache,
                                                           kv_cache_sf, k_scale, v_scale,
                                                           kv_layout="NHD"):
    """Quantizes row i < len(slot_mapping) of append_key / append_value [rows, H_kv, D] into
    flat cache slot slot_mapping[i] (page * page_size + entry; int32 or int64; negative:
    padding, skipped) of an NVFP4 paged cache (as nvfp4_quantize_append_paged_kv_cache).
    k_scale, v_scale: floats or one-element float32 tensors; during a CUDA graph capture
    contiguous CUDA tensors on the append's device, read by the kernel at each replay (a bad
    value then writes nothing and is recorded for check_append_paged_kv_cache). A slot past
    the cache is skipped and recorded (CPU: ValueError)."""
    torch = torch_module()
    check_kv_layout(kv_layout)
    _check_rows(append_key, append_value)
    if slot_mapping.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"slot_mapping must be int32 or int64, got {slot_mapping.dtype}")
    if append_key.shape[0] < slot_mapping.shape[0] or append_value.shape[0] < slot_mapping.shape[0]:
        raise ValueError("append_key and append_value must have at least slot_mapping.shape[0] "
                         "rows")
    k_codes, v_codes, k_scales, v_scales = _caches(paged_kv_cache, kv_cache_sf)
    device = append_key.device
    k_value = _scale_tensor("k_scale", k_scale, device)
    v_value = _scale_tensor("v_scale", v_scale, device)
    if is_cuda(append_key) and slot_mapping.device != device:
        raise ValueError(f"slot_mapping must be on {device}, got {slot_mapping.device}")
    _flare.append_paged_kv_nvfp4_by_slot(
        append_key, append_value, slot_mapping, k_codes, v_codes, k_scales, v_scales, kv_layout,
        k_value, v_value)
