"""FlashInfer's flashinfer.triton names, where flare has the operators: `cascade` (the merge
operators). FlashInfer implements these in Triton; flare serves them from its CUDA merge kernels
(kernels/merge_state.cuh) and its CPU operator, so nothing here needs Triton."""

from . import cascade  # noqa: F401
