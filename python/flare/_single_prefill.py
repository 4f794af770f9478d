"""single_prefill_with_kv_cache on the GPU: one request as a ragged batch prefill, planned once
per shape so that later calls only run() and a CUDA graph can capture them (FlashInfer issue
#541: torch.compile(mode="reduce-overhead") captures after an eager warm-up).

Each (configuration, qo_len, kv_len) gets its own use_cuda_graph BatchPrefill, planned at its
first call: a captured graph replays that plan for the life of the process, so no other shape
may replan it. A custom mask is packed on the device at every call (device operations only,
which a capture records).
"""

import numpy as np

from . import _flare
from ._cpu import pack_custom_mask
from ._prefill_gpu import (checked_packed_mask, config_key, launch, new_batch_prefill,
                           pack_bits_on_device)
from ._shape_cache import PlannedByShape
from ._tensors import is_cuda, torch_module

# At most 8 shapes (flare/_shape_cache.py): each owns a workspace of partial states for two CTAs
# a resident slot (~35 MB at head_dim 128 on an H100).
_prefills = PlannedByShape(8)


def _mask_bits(where, custom_mask, packed_custom_mask, qo_len, kv_len, device, capturing):
    """The request's mask bits (uint8, at least one byte, FlashInfer's packed layout, little bit
    order) on the device: packed there from a CUDA mask (capturable), else on the host (not
    inside a capture)."""
    torch = torch_module()
    num_bits = qo_len * kv_len
    num_bytes = (num_bits + 7) // 8
    source = packed_custom_mask if packed_custom_mask is not None else custom_mask
    name = "packed_custom_mask" if packed_custom_mask is not None else "custom_mask"
    if not is_cuda(source):
        if capturing:
            raise RuntimeError(f"{where}: {name} is on the host; inside a CUDA graph capture it "
                               "must be a CUDA tensor")
        bits, _ = pack_custom_mask(custom_mask, packed_custom_mask, np.array([qo_len]),
                                   np.array([kv_len]))
        packed = torch.from_numpy(bits[:num_bytes]).to(device)
    elif packed_custom_mask is not None:
        packed = checked_packed_mask(packed_custom_mask, num_bytes)[:num_bytes]
    else:
        flat = custom_mask.reshape(-1)
        if flat.shape[0] != num_bits:
            raise ValueError(f"{where}: custom_mask must have qo_len x kv_len = {num_bits} "
                             f"entries, got {flat.shape[0]} (shape {tuple(custom_mask.shape)})")
        return pack_bits_on_device(flat, num_bytes)
    # The kernel takes a non-null pointer: a mask of no bits is one zero byte.
    return packed if num_bytes > 0 else torch.zeros(1, dtype=torch.uint8, device=device)


def single_prefill_gpu(where, q, k, v, kv_layout, backend, config, mask, scales, return_lse,
                       lse_base, variant_args, kv_cache_sf):
    """o (and lse) of one request: q [qo_len, H_qo, D], k / v ragged rows in kv_layout.
    config: GpuPrefill.plan's configuration; mask: (custom_mask, packed_custom_mask) or None;
    scales: (q_scale, k_scale, v_scale), None meaning 1; variant_args: variant_arguments()'s
    (scalars, tensors)."""
    torch = torch_module()
    capturing = torch.cuda.is_current_stream_capturing()
    qo_len = q.shape[0]
    kv_len = k.shape[0] if kv_layout == "NHD" else k.shape[1]
    heads, head_dim_vo = config["num_qo_heads"], config["head_dim_vo"]
    if qo_len == 0:  # nothing to compute
        out = q.new_empty((0, heads, head_dim_vo))
        lse = q.new_empty((0, heads), dtype=torch.float32)
        return (out, lse) if return_lse else out
    device = q.device.index or 0

    def make():
        # Device memory of its own (C++), no torch tensor that outlives the call: a warm-up
        # under torch.compile allocates torch tensors from the graph's pool.
        staged_kv = max(kv_len, 1) if config["kv_dtype"] == "uint8" else 0  # NVFP4's copy
        prefill = new_batch_prefill(device, config, kv_layout, False, True, (0, 0), False,
                                    backend, (1, qo_len, staged_kv))
        prefill.plan(np.array([0, qo_len], dtype=np.int32),
                     np.array([0, kv_len], dtype=np.int32), None, _flare.current_stream(device))
        return prefill

    prefill = _prefills.get(where, (device, kv_layout, backend, config_key(config), qo_len,
                                    kv_len), f"qo_len={qo_len}, kv_len={kv_len}", make, capturing)
    # The mask bits live for the call: a capture keeps them in its pool for the replays.
    bits = None if mask is None else _mask_bits(where, *mask, qo_len, kv_len, q.device,
                                                capturing)
    out = q.new_empty((qo_len, heads, head_dim_vo))
    lse = q.new_empty((qo_len, heads), dtype=torch.float32) if return_lse else None
    launch(prefill, q, (k, v), None, kv_layout == "HND", out, lse, bits, scales, lse_base, None,
           *variant_args, kv_cache_sf)
    return (out, lse) if return_lse else out
