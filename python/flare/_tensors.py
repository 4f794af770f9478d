"""Framework-neutral tensor helpers for the wrappers.

Inputs are numpy arrays or torch tensors (CPU or CUDA); they reach the extension through
DLPack without a copy. Outputs are allocated in the caller's framework on the caller's device.
torch is never imported here: a torch tensor can only be passed once the caller imported it.
"""

import os
import re
import sys

import numpy as np

from . import _flare

# torch fp8 dtypes travel as uint8 views (not every torch exports fp8 through DLPack) and are
# reinterpreted by the extension.
_TORCH_FP8 = {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}

# Canonical flare dtype names for the names FlashInfer accepts ("float16", torch.float16, ...).
_DTYPE_NAMES = {
    "float16": "float16",
    "half": "float16",
    "bfloat16": "bfloat16",
    "float32": "float32",
    "float": "float32",
    "float8_e4m3fn": "e4m3",
    "float8_e4m3": "e4m3",
    "e4m3": "e4m3",
    "float8_e5m2": "e5m2",
    "e5m2": "e5m2",
    "uint8": "uint8",  # KV: NVFP4 codes (include/flare/format/nvfp4.h), with kv_cache_sf
}


def torch_module():
    """The torch module when the caller has imported it, else None."""
    return sys.modules.get("torch")


def is_torch(x):
    torch = torch_module()
    return torch is not None and isinstance(x, torch.Tensor)


def is_cuda(x):
    return is_torch(x) and x.is_cuda


_NAME_OF = {}  # dtype_name's answers by argument: plan() asks every step


def dtype_name(dtype):
    """flare's name for a dtype given as a string, torch.dtype or numpy dtype."""
    if dtype is None:
        return None
    try:
        return _NAME_OF[dtype]
    except (KeyError, TypeError):
        pass
    name = _dtype_name(dtype)
    try:
        _NAME_OF[dtype] = name
    except TypeError:  # unhashable: not remembered
        pass
    return name


def _dtype_name(dtype):
    if isinstance(dtype, np.dtype) or (isinstance(dtype, type) and issubclass(dtype, np.generic)):
        text = np.dtype(dtype).name
    else:
        text = str(dtype)
        text = text[len("torch."):] if text.startswith("torch.") else text
    name = _DTYPE_NAMES.get(text)
    if name is None:
        raise ValueError(
            f"unsupported data type {dtype!r}: flare takes float16, bfloat16, float32, "
            "float8_e4m3fn, float8_e5m2, uint8 (NVFP4 KV)")
    return name


def tensor_dtype(x):
    """flare's dtype name of a tensor (torch or numpy)."""
    return dtype_name(x.dtype)


def arg(x):
    """The extension's view of x (no copy), or None."""
    if x is None:
        return None
    if is_torch(x):
        torch = torch_module()
        x = x.detach()
        reinterpret = None
        name = str(x.dtype)[len("torch."):]
        if name in _TORCH_FP8:
            reinterpret = _TORCH_FP8[name]
            x = x.view(torch.uint8)
        elif x.dtype == torch.bool:
            x = x.view(torch.uint8)
        if x.is_cuda:
            # stream=-1: no synchronization; flare runs on the stream the wrapper passes down,
            # and the default (None) would make torch record an event on the legacy default
            # stream, which breaks CUDA-graph capture.
            return _flare.Tensor(x.__dlpack__(stream=-1), reinterpret)
        return _flare.Tensor(x, reinterpret)
    if isinstance(x, np.ndarray) and x.dtype == np.bool_:
        x = x.view(np.uint8)
    return _flare.Tensor(x)


def host_index(x, name):
    """An index array plan() reads on the host, in a form the extension reads without a copy
    (it checks dtype, rank and contiguity, naming the engine's argument: engine_names()): a CPU
    torch tensor or a numpy array of int32 as given; anything else converted (a CUDA tensor is
    copied to the host, which synchronizes with its stream, as FlashInfer's plan() does)."""
    if isinstance(x, np.ndarray):
        if x.dtype == np.int32:
            return x
    elif is_torch(x) and not x.is_cuda and x.dtype == torch_module().int32:
        return x
    return host_int32(x, name)


def engine_names(error, renames):
    """`error` (a ValueError from the engine) with the engine's argument names replaced by the
    caller's (e.g. kv_indptr -> indptr), so the message names what the caller passed."""
    message = str(error)
    for engine, caller in renames.items():
        message = re.sub(rf"\b{engine}\b", caller, message)
    return ValueError(message)


def index_on_device(x, like, name):
    """Index array x as a contiguous int32 tensor on like's CUDA device: x itself when it
    already is one (the serving loop's page table), else a copy (asynchronous from pinned
    memory, synchronous from pageable host memory)."""
    torch = torch_module()
    if is_torch(x):
        if x.is_cuda and x.dtype == torch.int32 and x.device == like.device and (
                x.ndim == 1 and (x.shape[0] <= 1 or x.stride(0) == 1)):
            return x
        x = x.detach()
    else:
        x = torch.from_numpy(host_int32(x, name))
    if x.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(x.shape)}")
    return x.to(device=like.device, dtype=torch.int32, non_blocking=True).contiguous()


def next_power_of_two(n):
    """The least power of two >= n (1 for n <= 1): capacities that grow by doubling."""
    return 1 << max(0, int(n) - 1).bit_length()


class StagedIndexBuffer:
    """Outside CUDA graphs, the device copy of a wrapper's page ids for run(). A CUDA int32
    array is used in place (index_on_device); a host array goes through the wrapper's
    IndexStaging (page-locked memory, a copy queued on the plan's stream) into a buffer kept
    here, grown to the next power of two. A copy from pageable memory (torch's .to) first waits
    for all GPU work queued on the stream (CUDA's rule for pageable transfers), so plan() would
    wait for the kernels of earlier calls. The buffer is reused by the next plan(): its copy is
    queued on the stream after the runs of this one (calls of one wrapper on one stream, as
    FlashInfer's workspace assumes)."""

    def __init__(self, like):
        self._like = like
        self._buffer = None

    def __call__(self, x, name, staging, stream, non_blocking):
        if is_torch(x) and x.is_cuda:
            return index_on_device(x, self._like, name)
        values = host_index(x, name)
        if values.ndim != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(values.shape)}")
        count = values.shape[0]
        buffer = self.room(count)
        staging.fill(stream, ((buffer, f"{name}'s device copy", values, name, count),),
                     not non_blocking)
        return buffer

    def room(self, count):
        """The buffer, grown (to the next power of two) to hold `count` entries."""
        if self._buffer is None or self._buffer.shape[0] < count:
            torch = torch_module()
            self._buffer = torch.zeros(next_power_of_two(count), dtype=torch.int32,
                                       device=self._like.device)
        return self._buffer


def refill_buffers(entries, non_blocking, staging, stream):
    """Copies each (buffer, buffer_name, source, name, count) entry's index array `source` (host
    or device, any integer form; its first `count` entries, or all with count -1) into the
    front of `buffer`, a fixed CUDA-graph buffer, in place, on `stream` (an int, as
    _flare.current_stream gives it), through `staging` (an _flare.IndexStaging: one extension
    call; host arrays through its page-locked memory, so the copies are asynchronous). Nothing
    when source is that buffer. ValueError naming `name` (the caller's argument) and
    `buffer_name` when it has more entries, before anything is copied. non_blocking=False: the
    host waits for the copies (FlashInfer's meaning)."""
    staging.fill(stream, tuple((buffer, buffer_name, index_source(source, name), name, count)
                               for buffer, buffer_name, source, name, count in entries),
                 not non_blocking)


def index_source(x, name):
    """x as IndexStaging.fill reads it: an int32 CUDA tensor as it is (contiguous), another
    CUDA tensor converted on its device, anything else an int32 host array (host_index)."""
    if is_torch(x) and x.is_cuda:
        torch = torch_module()
        if x.dtype != torch.int32 or not x.is_contiguous():
            x = x.to(torch.int32).contiguous()
        return x
    return host_index(x, name)


def scratch_of(buffer, where):
    """(device pointer, bytes) of a CUDA float_workspace_buffer: where flare keeps partial
    attention states during run()."""
    if buffer.ndim < 1 or not buffer.is_contiguous():
        raise ValueError(f"{where}: float_workspace_buffer must be a contiguous tensor")
    return buffer.data_ptr(), buffer.numel() * buffer.element_size()


def validate_default(validate):
    """A wrapper's validate argument (None: the FLARE_VALIDATE environment variable)."""
    if validate is not None:
        return bool(validate)
    value = os.environ.get("FLARE_VALIDATE", "")
    return value not in ("", "0")


def empty(shape, dtype, like):
    """An uninitialized tensor in like's framework and on like's device."""
    name = dtype_name(dtype)
    if is_torch(like):
        torch = torch_module()
        torch_dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16,
                       "float32": torch.float32}[name]
        return torch.empty(shape, dtype=torch_dtype, device=like.device)
    if name == "bfloat16":
        raise ValueError("numpy has no bfloat16: pass torch tensors for bfloat16 outputs")
    return np.empty(shape, dtype=np.dtype(name))


def host_int32(x, name):
    """x as a contiguous int32 numpy array on the host.

    A CUDA tensor is copied to the host, which synchronizes with its stream (as FlashInfer's
    plan() does); pass host tensors to keep plan() free of device synchronization.
    """
    if x is None:
        raise ValueError(f"{name} is required")
    if is_torch(x):
        if x.dtype == torch_module().int32 and not x.is_cuda and x.ndim == 1 and \
                x.is_contiguous():
            return x.numpy()  # what plan() usually gets (an integer tensor has no grad to drop)
        x = x.detach()
        if x.is_cuda:
            x = x.cpu()
        x = x.numpy()
    elif isinstance(x, np.ndarray) and x.dtype == np.int32 and x.ndim == 1 and (
            x.flags.c_contiguous):
        return x  # what plan() usually gets: nothing to convert (plan() runs every step)
    array = np.asarray(x)
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(array.shape)}")
    if array.dtype != np.int32 and array.size and not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{name} must hold integers, got {array.dtype}")
    return np.ascontiguousarray(array, dtype=np.int32)


def split_paged_kv_cache(paged_kv_cache):
    """(k, v) page tensors from a (k, v) tuple or a combined [pages, 2, ...] tensor."""
    if isinstance(paged_kv_cache, (tuple, list)):
        if len(paged_kv_cache) != 2:
            raise ValueError(
                f"paged_kv_cache as a tuple must be (k_cache, v_cache), got {len(paged_kv_cache)}"
                " tensors")
        return paged_kv_cache[0], paged_kv_cache[1]
    if paged_kv_cache.ndim != 5 or paged_kv_cache.shape[1] != 2:
        raise ValueError(
            "paged_kv_cache must be [pages, 2, page_size, H_kv, D] (NHD) or [pages, 2, H_kv, "
            f"page_size, D] (HND), or a (k_cache, v_cache) tuple; got shape "
            f"{tuple(paged_kv_cache.shape)}")
    return paged_kv_cache[:, 0], paged_kv_cache[:, 1]
