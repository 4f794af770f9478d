"""What the decode wrappers (decode.py) and single-request decode (_single_decode.py) share:
plan()'s dtype resolution, the per-configuration BatchDecode objects and the loop choice."""

from ._tensors import dtype_name


def _plan_dtypes(q_data_type, kv_data_type, data_type):
    """flare's names of q's and the KV cache's dtypes from plan()'s arguments, as FlashInfer
    resolves them: data_type (its deprecated alias) fills q_data_type and kv_data_type where they
    were not given; q defaults to float16, the KV cache to q's dtype."""
    if data_type is not None:
        q_data_type = data_type if q_data_type is None else q_data_type
        kv_data_type = data_type if kv_data_type is None else kv_data_type
    q_dtype = dtype_name("float16" if q_data_type is None else q_data_type)
    return q_dtype, dtype_name(kv_data_type) if kv_data_type is not None else q_dtype


class _GpuDecoders:
    """flare BatchDecode objects by configuration: each compiles its kernels once and keeps its
    plan region at a fixed address (what a captured CUDA graph replays against)."""

    def __init__(self):
        self._by_key = {}

    def values(self):
        return self._by_key.values()

    def get(self, key, max_batch, make):
        decoder = self._by_key.get(key)
        if decoder is None or decoder.max_batch < max_batch:
            decoder = make(max_batch)
            self._by_key[key] = decoder
        return decoder


def _tensor_core_loop(use_tensor_cores, q_dtype, kv_dtype, head_dim):
    """Whether the use_tensor_cores hint selects the tensor-core loop: it takes q and KV of one
    float16 / bfloat16 type, and fp8 KV with either q, at head dims up to 256; mixed 16-bit pairs
    and head dim 512 run on CUDA cores (FlashInfer's flag selects kernels, not results)."""
    sixteen_bit = ("float16", "bfloat16")
    fp8 = kv_dtype in ("e4m3", "e5m2") and q_dtype in sixteen_bit
    return (bool(use_tensor_cores) and int(head_dim) <= 256 and
            ((q_dtype == kv_dtype and kv_dtype in sixteen_bit) or fp8))
