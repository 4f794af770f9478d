"""flare: FLexible Attention Runtime Engine.

FlashInfer's Python interface (names and plan()/run() arguments of FlashInfer 0.6) over
flare's C++/CUDA engine, so a serving framework switches with an import change. Tensors are
torch tensors (CUDA: GPU kernels on the caller's current stream; CPU) or numpy arrays (the CPU
backend), passed through DLPack without copies. An argument flare does not support yet raises
NotImplementedError naming it.
"""

from . import _flare, attention, fp4_quantization, jit, rope, sparse, utils, variants
from .attention import BatchAttentionWithAttentionSinkWrapper
from .cascade import (BatchDecodeWithSharedPrefixPagedKVCacheWrapper,
                      BatchPrefillWithSharedPrefixPagedKVCacheWrapper,
                      MultiLevelCascadeAttentionWrapper, merge_state, merge_state_in_place,
                      merge_states)
from .decode import (BatchDecodeWithPagedKVCacheWrapper,
                     CUDAGraphBatchDecodeWithPagedKVCacheWrapper, fast_decode_plan,
                     single_decode_with_kv_cache)
from .page import (append_paged_kv_cache, check_append_paged_kv_cache,
                   get_batch_indices_positions, get_seq_lens,
                   nvfp4_quantize_append_paged_kv_cache,
                   nvfp4_quantize_append_paged_kv_cache_with_slot_mapping)
from .prefill import (BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper,
                      single_prefill_with_kv_cache)
from .rope import (apply_llama31_rope, apply_llama31_rope_inplace, apply_llama31_rope_pos_ids,
                   apply_llama31_rope_pos_ids_inplace, apply_rope, apply_rope_inplace,
                   apply_rope_pos_ids, apply_rope_pos_ids_inplace, apply_rope_with_cos_sin_cache,
                   apply_rope_with_cos_sin_cache_inplace)
from .sparse import BlockSparseAttentionWrapper, VariableBlockSparseAttentionWrapper
from .variant import AttentionVariant

__version__ = "0.1.0"


def cuda_available():
    """True when flare can reach a CUDA device (driver loaded, a device present)."""
    return _flare.cuda_available()


__all__ = [
    "AttentionVariant",
    "BatchAttentionWithAttentionSinkWrapper",
    "BatchDecodeWithPagedKVCacheWrapper",
    "BatchDecodeWithSharedPrefixPagedKVCacheWrapper",
    "BatchPrefillWithPagedKVCacheWrapper",
    "BatchPrefillWithRaggedKVCacheWrapper",
    "BatchPrefillWithSharedPrefixPagedKVCacheWrapper",
    "BlockSparseAttentionWrapper",
    "CUDAGraphBatchDecodeWithPagedKVCacheWrapper",
    "MultiLevelCascadeAttentionWrapper",
    "VariableBlockSparseAttentionWrapper",
    "append_paged_kv_cache",
    "apply_llama31_rope",
    "apply_llama31_rope_inplace",
    "apply_llama31_rope_pos_ids",
    "apply_llama31_rope_pos_ids_inplace",
    "apply_rope",
    "apply_rope_inplace",
    "apply_rope_pos_ids",
    "apply_rope_pos_ids_inplace",
    "apply_rope_with_cos_sin_cache",
    "apply_rope_with_cos_sin_cache_inplace",
    "attention",
    "check_append_paged_kv_cache",
    "cuda_available",
    "fast_decode_plan",
    "fp4_quantization",
    "get_batch_indices_positions",
    "get_seq_lens",
    "jit",
    "merge_state",
    "merge_state_in_place",
    "merge_states",
    "nvfp4_quantize_append_paged_kv_cache",
    "nvfp4_quantize_append_paged_kv_cache_with_slot_mapping",
    "rope",
    "single_decode_with_kv_cache",
    "single_prefill_with_kv_cache",
    "sparse",
    "utils",
    "variants",
]
