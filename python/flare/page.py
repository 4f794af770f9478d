"""Paged KV cache maintenance with FlashInfer's interface: append_paged_kv_cache,
get_batch_indices_positions, get_seq_lens and the NVFP4 quantizing appends
(nvfp4_quantize_append_paged_kv_cache, ..._with_slot_mapping: flare/_nvfp4_append.py).

append_paged_kv_cache runs flare's append (api/append_paged_kv.h): a GPU kernel on the
caller's CUDA stream for CUDA tensors (no synchronization; CUDA-graph safe), the validated CPU
version for numpy arrays and CPU torch tensors.
"""

import numpy as np

from . import _flare
from ._args import check_kv_layout
from ._nvfp4_append import (nvfp4_quantize_append_paged_kv_cache,
                            nvfp4_quantize_append_paged_kv_cache_with_slot_mapping)
from ._tensors import is_torch, split_paged_kv_cache, torch_module

__all__ = ["append_paged_kv_cache", "check_append_paged_kv_cache", "get_batch_indices_positions",
           "get_seq_lens", "nvfp4_quantize_append_paged_kv_cache",
           "nvfp4_quantize_append_paged_kv_cache_with_slot_mapping"]


def append_paged_kv_cache(append_key, append_value, batch_indices, positions, paged_kv_cache,
                          kv_indices, kv_indptr, kv_last_page_len, kv_layout="NHD"):
    """Writes token i of append_key/append_value [nnz, H_kv, D] to request batch_indices[i] at
    position positions[i]: page kv_indices[kv_indptr[b] + pos // page_size], slot
    pos % page_size. A negative batch index marks a padding token, which is skipped.

    paged_kv_cache: [pages, 2, page_size, H_kv, D] (NHD) / [pages, 2, H_kv, page_size, D] (HND)
    or a (k_cache, v_cache) tuple; every index array int32 on the cache's device. On the CPU
    every index is validated first (ValueError, nothing written); on the GPU out-of-range
    tokens are skipped by the kernel, never written outside the cache, and recorded:
    check_append_paged_kv_cache() raises for them.
    """
    check_kv_layout(kv_layout)
    k_cache, v_cache = split_paged_kv_cache(paged_kv_cache)
    _flare.append_paged_kv(append_key, append_value, batch_indices, positions, k_cache, v_cache,
                           kv_layout, kv_indptr, kv_indices, kv_last_page_len)


def check_append_paged_kv_cache(device=None):
    """Synchronizes the CUDA device (torch's current one by default) and raises IndexError
    naming the first token whose indices append_paged_kv_cache found out of range there (a
    position past its request's pages, a batch index past the batch, a page id outside the
    cache) since the last check; clears it. Such tokens are skipped: nothing is written
    outside the cache."""
    torch = torch_module()
    index = torch.cuda.current_device() if device is None else torch.device(device).index or 0
    _flare.check_append_paged_kv(index)


def get_batch_indices_positions(append_indptr, seq_lens, nnz):
    """(batch_indices, positions), int32 [nnz], for appending append_indptr's tokens to
    requests whose lengths after the append are seq_lens: token j of request b's new tokens
    gets batch index b and position seq_lens[b] - appended_b + j. Entries past
    append_indptr[-1] (nnz larger than the tokens) get batch index -1 (padding, skipped by
    append_paged_kv_cache) and position 0. CUDA tensors stay on the device: nothing syncs.
    """
    nnz = int(nnz)
    if is_torch(append_indptr):
        torch = torch_module()
        device = append_indptr.device
        indptr = append_indptr.to(torch.int64)
        lengths = seq_lens.to(device=device, dtype=torch.int64)
        tokens = torch.arange(nnz, device=device, dtype=torch.int64)
        batch = indptr.shape[0] - 1
        request = torch.searchsorted(indptr[1:], tokens, right=True)
        valid = request < batch
        safe = torch.clamp(request, max=max(batch - 1, 0))
        if batch == 0:
            return (torch.full((nnz,), -1, dtype=torch.int32, device=device),
                    torch.zeros(nnz, dtype=torch.int32, device=device))
        appended = indptr[safe + 1] - indptr[safe]
        position = lengths[safe] - appended + (tokens - indptr[safe])
        return (torch.where(valid, request, -1).to(torch.int32),
                torch.where(valid, position, 0).to(torch.int32))
    indptr = np.asarray(append_indptr, dtype=np.int64)
    lengths = np.asarray(seq_lens, dtype=np.int64)
    batch = indptr.shape[0] - 1
    tokens = np.arange(nnz, dtype=np.int64)
    request = np.searchsorted(indptr[1:], tokens, side="right")
    valid = request < batch
    if batch == 0:
        return np.full(nnz, -1, dtype=np.int32), np.zeros(nnz, dtype=np.int32)
    safe = np.minimum(request, batch - 1)
    appended = indptr[safe + 1] - indptr[safe]
    position = lengths[safe] - appended + (tokens - indptr[safe])
    return (np.where(valid, request, -1).astype(np.int32),
            np.where(valid, position, 0).astype(np.int32))


def get_seq_lens(kv_indptr, kv_last_page_len, page_size):
    """Token count of each request of a paged KV cache: (pages - 1) * page_size + last page's
    entries, 0 for a request without pages (FlashInfer's page.get_seq_lens). kv_indptr
    [batch + 1] and kv_last_page_len [batch]: torch tensors (a torch tensor back, on their
    device) or numpy arrays."""
    if int(page_size) < 1:
        raise ValueError(f"get_seq_lens: page_size must be >= 1, got {page_size}")
    if len(kv_indptr) != len(kv_last_page_len) + 1:
        raise ValueError(f"get_seq_lens: kv_indptr must have len(kv_last_page_len) + 1 = "
                         f"{len(kv_last_page_len) + 1} entries, got {len(kv_indptr)}")
    pages = kv_indptr[1:] - kv_indptr[:-1]
    if is_torch(kv_indptr):
        full = torch_module().clamp(pages - 1, min=0)
    else:
        full = np.maximum(np.asarray(pages) - 1, 0)
        kv_last_page_len = np.asarray(kv_last_page_len)
    return full * int(page_size) + kv_last_page_len
