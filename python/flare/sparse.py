"""General sparse kernels (issue 23, SparseTIR): SpMM, SDDMM, and the ELL and hyb(c, k) formats
(COO, ELL and hyb as SpMM formats); and, under FlashInfer's module name, block-sparse attention (BlockSparseAttentionWrapper,
VariableBlockSparseAttentionWrapper: flare/_block_sparse.py, on the paged prefill) and
per-head sparse decode (PerHeadSparseDecodeWrapper, Quest: flare/_per_head_decode.py).

SpMM and SDDMM have CPU references (flare/sparse/csr.h, coo.h, ell.h, hyb.h: float32, float16
or bfloat16 operands, float64 accumulation, the result in the dense operands' dtype); SpMM with
a CUDA X runs the GPU CSR kernel (flare/sparse/spmm_gpu.h; format="hyb": the hyb(c, k) kernels of
flare/sparse/hyb_gpu.h) and SDDMM with a CUDA Q its GPU kernel
(flare/sparse/sddmm_gpu.h): float32, float16 or bfloat16 operands, float32 sums, the result in
the dense operands' dtype; d a multiple of 32 or a power of two below 32. A matrix is a torch
sparse CSR or COO tensor, or an (indptr, indices, values) triple of numpy arrays / torch tensors
with `shape=(rows, cols)`. Column indices must be sorted and unique within each row (torch's
CSR and coalesced COO tensors are); anything else raises ValueError naming the array and the
entry, before anything is written. The GPU SpMM does not check A on the device
(that would synchronize): there a column outside [0, cols) contributes nothing and no read
leaves the tensors, and unsorted or repeated columns are summed as given.
"""

import numpy as np

from . import _flare
from ._block_sparse import (BlockSparseAttentionWrapper,  # noqa: F401 (FlashInfer's names)
                            VariableBlockSparseAttentionWrapper)
from ._per_head_decode import PerHeadSparseDecodeWrapper  # noqa: F401
from ._sparse_args import _csr_arrays, _gpu_operand
from ._spmm_plan import SpmmPlan
from ._tensors import arg, is_cuda, is_torch, torch_module

_WHERE = "flare.sparse"


class _Csr:
    """rows, cols, and int32 / float32 host arrays of a CSR matrix (no copy where they already
    are)."""

    def __init__(self, rows, cols, indptr, indices, values, torch_layout=None):
        self.rows, self.cols = int(rows), int(cols)
        self.indptr, self.indices, self.values = indptr, indices, values
        self.torch_layout = torch_layout


def _to_host(x, dtype, name, where):
    if is_cuda(x):
        raise NotImplementedError(f"{where}: {name} is a CUDA tensor; this operation runs on the "
                                  f"CPU backend (the GPU has spmm with a CUDA X: issue 23)")
    if is_torch(x):
        return x.detach().to(getattr(torch_module(), dtype)).contiguous().numpy()
    return np.ascontiguousarray(x, dtype=dtype)


def _dense_host(x, name, where):
    """x as a contiguous host array the references take: float16 / bfloat16 kept (a torch
    tensor stays one: numpy has no bfloat16), anything else as float32."""
    if not is_cuda(x):  # _to_host refuses CUDA tensors
        if is_torch(x) and x.dtype in (torch_module().float16, torch_module().bfloat16):
            return x.detach().contiguous()
        if isinstance(x, np.ndarray) and x.dtype == np.float16:
            return np.ascontiguousarray(x)
    return _to_host(x, "float32", name, where)


def _empty_like_dtype(x, shape):
    """An uninitialized host array of x's dtype (a torch tensor for torch inputs)."""
    if is_torch(x):
        return torch_module().empty(shape, dtype=x.dtype)
    return np.empty(shape, x.dtype)


def _csr_of(a, shape, where):
    if is_torch(a) and a.layout != torch_module().strided and a.is_cuda:
        _to_host(a, "float32", "A", where)
    rows, cols, (indptr, indices, values), layout = _csr_arrays(a, shape, where)
    return _Csr(rows, cols, _to_host(indptr, "int32", "indptr", where),
                _to_host(indices, "int32", "indices", where),
                None if values is None else _to_host(values, "float32", "values", where), layout)


def _result(array, like):
    if is_torch(array):
        return array
    return torch_module().from_numpy(array) if is_torch(like) else array


def _device_pattern(A, shape, device, where):
    """(rows, cols, indptr, indices, torch layout or None) of A, the arrays as contiguous int32
    tensors on `device` (SDDMM reads the pattern only)."""
    torch = torch_module()
    rows, cols, arrays, layout = _csr_arrays(A, shape, where)
    indptr, indices = (torch.as_tensor(x).to(device=device, dtype=torch.int32).contiguous()
                       for x in arrays[:2])
    return int(rows), int(cols), indptr, indices, layout


def _sddmm_cuda(A, Q, K, shape, where):
    """The GPU path: the nonzero-balanced CSR kernel in Q's dtype."""
    torch = torch_module()
    rows, cols, indptr, indices, layout = _device_pattern(A, shape, Q.device, where)
    if Q.ndim != 2 or Q.shape[0] != rows:
        raise ValueError(f"{where}: Q must have shape [rows = {rows}, d], got {list(Q.shape)}")
    if not is_cuda(K) or K.device != Q.device:
        raise ValueError(f"{where}: K must be a CUDA tensor on Q's device {Q.device}")
    if K.ndim != 2 or K.shape[0] != cols or K.shape[1] != Q.shape[1]:
        raise ValueError(f"{where}: K must have shape [cols = {cols}, d = {Q.shape[1]}], got "
                         f"{list(K.shape)}")
    if K.dtype != Q.dtype:
        raise ValueError(f"{where}: K must have Q's dtype {Q.dtype}, got {K.dtype}")
    q = _gpu_operand(Q, "Q", where)
    k = K.to(q.dtype)
    out = torch.empty(indices.shape[0], dtype=q.dtype, device=Q.device)
    _flare.sparse_sddmm_cuda(rows, cols, indptr, indices, q, k, out)
    if layout is None:
        return out
    return torch.sparse_csr_tensor(indptr, indices, out, (rows, cols))


def _spmm_cuda(A, X, format, shape, where):
    """The GPU path: a one-call SpmmPlan (tuned for "auto", the default schedule for "csr",
    hyb(1, 5) for "hyb")."""
    if format not in ("auto", "csr", "hyb"):
        raise NotImplementedError(f"{where}: format {format!r} runs on the CPU backend only; on "
                                  "CUDA tensors the GPU has 'csr', 'hyb' (or 'auto')")
    if X.ndim != 2:
        raise ValueError(f"{where}: X must be 2-D [cols, d], got {list(X.shape)}")
    plan = SpmmPlan(A, device=X.device, shape=shape, tune=format == "auto",
                    format="hyb" if format == "hyb" else "csr", where=where)
    return plan.run(X)


def graph(kind, nodes, edges, seed=0):
    """A seeded synthetic graph as (indptr, indices) int32 numpy arrays of its CSR adjacency
    (flare/sparse/generate.h): kind "rmat" (R-MAT, power-law degrees like arxiv and reddit) or
    "uniform" (near-uniform degrees like ogbn-proteins); `edges` distinct edges."""
    indptr, indices = _flare.sparse_graph(str(kind), int(nodes), int(edges), int(seed))
    return (np.frombuffer(indptr, dtype=np.int32).copy(),
            np.frombuffer(indices, dtype=np.int32).copy())


def spmm(A, X, format="auto", shape=None):
    """Y = A X: A sparse [rows, cols], X dense [cols, d] -> Y [rows, d] in X's dtype (float16 or
    bfloat16 kept, anything else float32; accumulated in float64 on the CPU). format: "auto"
    or "csr" (the CSR reference), "coo", "ell" (through A's COO or ELL form) or "hyb" (the sum
    over hyb(1, 5)'s sub-matrices): the same values up to summation order. X a CUDA tensor:
    the GPU kernels (flare/sparse/spmm_gpu.h; float32 sums; d a multiple of 32 or a power of two
    below 32) on torch's current stream, A's arrays moved to X's device as int32 and its values
    in X's dtype: "auto" with the auto-tuner's schedule (a SpmmPlan for this call: A's structure
    hashed, the disk cache read or the candidates timed; it synchronizes and cannot be captured
    in a CUDA graph: keep a SpmmPlan to do this once), "csr" with the default schedule (no
    synchronization, capturable), "hyb" over hyb(1, 5) (decomposed on the host for this call;
    SpmmPlan(A, format="hyb", hyb=(c, k)) keeps it)."""
    where = "flare.sparse.spmm"
    if format not in ("auto", "csr", "coo", "ell", "hyb"):
        raise ValueError(f"{where}: format must be 'auto', 'csr', 'coo', 'ell' or 'hyb', got "
                         f"{format!r}")
    if is_cuda(X):
        return _spmm_cuda(A, X, format, shape, where)
    csr = _csr_of(A, shape, where)
    x = _dense_host(X, "X", where)
    if csr.values is None:
        raise ValueError(f"{where}: A needs values")
    y = _empty_like_dtype(x, (csr.rows, x.shape[1] if x.ndim == 2 else 0))
    if format in ("coo", "ell"):
        _flare.sparse_spmm_format(csr.rows, csr.cols, arg(csr.indptr), arg(csr.indices),
                                  arg(csr.values), format, arg(x), arg(y))
    elif format == "hyb":
        _flare.sparse_spmm_hyb(csr.rows, csr.cols, arg(csr.indptr), arg(csr.indices),
                               arg(csr.values), 1, 5, arg(x), arg(y))
    else:
        _flare.sparse_spmm(csr.rows, csr.cols, arg(csr.indptr), arg(csr.indices),
                           arg(csr.values), arg(x), arg(y))
    return _result(y, X)


def sddmm(A, Q, K, shape=None):
    """(Q K^T) sampled at A's nonzeros (A's values unused): Q [rows, d], K [cols, d], one dtype
    (float16 or bfloat16 kept, anything else float32). Returns the values [nnz] in Q's dtype
    in A's nonzero order; for a torch sparse A, a torch sparse CSR tensor of A's pattern
    holding them."""
    where = "flare.sparse.sddmm"
    if is_cuda(Q):
        return _sddmm_cuda(A, Q, K, shape, where)
    csr = _csr_of(A, shape, where)
    q = _dense_host(Q, "Q", where)
    k = _dense_host(K, "K", where)
    out = _empty_like_dtype(q, (csr.indices.shape[0],))
    _flare.sparse_sddmm(csr.rows, csr.cols, arg(csr.indptr), arg(csr.indices), arg(q), arg(k),
                        arg(out))
    if csr.torch_layout is None:
        return out
    torch = torch_module()
    values = out if is_torch(out) else torch.from_numpy(out)
    return torch.sparse_csr_tensor(torch.from_numpy(csr.indptr), torch.from_numpy(csr.indices),
                                   values, (csr.rows, csr.cols))


def hyb(A, c, k, shape=None):
    """The hyb(c, k) decomposition (SparseTIR §3.4): a dict with rows, cols, nnz,
    padding_ratio and per column partition its ELL buckets (widths 1..2^k: rows, columns,
    values, source = the nonzero's index in A or -1 for padding) and its CSR remainder."""
    where = "flare.sparse.hyb"
    csr = _csr_of(A, shape, where)
    if csr.values is None:
        raise ValueError(f"{where}: A needs values")
    return _flare.sparse_hyb(csr.rows, csr.cols, arg(csr.indptr), arg(csr.indices),
                             arg(csr.values), int(c), int(k))


def ell(A, width=0, shape=None):
    """A's ELL form (every row padded to `width` slots; 0: the longest row's length): a dict
    with width, rows, columns and values [rows x width], source (the nonzero's index in A, -1
    for padding), nnz and padding_ratio (slots over nnz)."""
    where = "flare.sparse.ell"
    csr = _csr_of(A, shape, where)
    if csr.values is None:
        raise ValueError(f"{where}: A needs values")
    return _flare.sparse_ell(csr.rows, csr.cols, arg(csr.indptr), arg(csr.indices),
                             arg(csr.values), int(width))
