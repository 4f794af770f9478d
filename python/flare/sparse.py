"""General sparse kernels (issue 23, SparseTIR): SpMM, SDDMM, and the ELL and hyb(c, k) formats
(COO, ELL and hyb as SpMM formats); and, under FlashInfer's module name, block-sparse attention (BlockSparseAttentionWrapper,
VariableBlockSparseAttentionWrapper: flare/_block_sparse.py, on the paged prefill) and
per-head sparse decode (PerHeadSparseDecodeWrapper, Quest: flare/_per_head_decode.py).

SpMM and SDDMM have CPU references (flare/sparse/csr.h, coo.h, ell.h, hyb.h: float32, float16
or bfloat16 operands, float64 accumulation, the result in the dense operands' dtype); SpMM with
a CUDA X runs the GPU CSR kernel (flare/sparse/spmm_gpu.h) and SDDMM with a CUDA Q its GPU kernel
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


def _csr_arrays(a, shape, where):
    """(rows, cols, (indptr, indices, values), torch layout or None) of A, a torch sparse CSR /
    COO tensor (COO coalesced into CSR, on its device) or an (indptr, indices, values) triple
    with shape=(rows, cols); the arrays as given (values may be None)."""
    if is_torch(a) and a.layout != torch_module().strided:
        torch = torch_module()
        layout = a.layout
        if layout == torch.sparse_coo:
            a = a.coalesce().to_sparse_csr()
        elif layout != torch.sparse_csr:
            raise ValueError(f"{where}: A must be a sparse CSR or COO tensor, got {layout}")
        return a.shape[0], a.shape[1], (a.crow_indices(), a.col_indices(), a.values()), layout
    if not isinstance(a, (tuple, list)) or len(a) != 3:
        raise ValueError(f"{where}: A must be a torch sparse CSR/COO tensor or an "
                         f"(indptr, indices, values) triple, got {type(a).__name__}")
    if shape is None or len(shape) != 2:
        raise ValueError(f"{where}: an (indptr, indices, values) triple needs shape=(rows, cols)")
    return shape[0], shape[1], tuple(a), None


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


def _gpu_operand(x, name, where):
    """x as the GPU kernels take it: float16 / bfloat16 / float32 kept, other dtypes as float32;
    checks the feature size."""
    torch = torch_module()
    d = x.shape[1]
    if d == 0 or (d % 32 != 0 and 32 % d != 0):
        raise NotImplementedError(f"{where}: on the GPU the feature size d ({name}'s last "
                                  f"dimension) must be a positive multiple of 32 or a power of "
                                  f"two below 32, got {d}")
    return x if x.dtype in (torch.float32, torch.float16, torch.bfloat16) else x.float()


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
    """The GPU path: a one-call SpmmPlan (tuned for "auto", the default schedule for "csr")."""
    if format not in ("auto", "csr"):
        raise NotImplementedError(f"{where}: format {format!r} runs on the CPU backend only; on "
                                  "CUDA tensors the GPU has 'csr' (or 'auto')")
    if X.ndim != 2:
        raise ValueError(f"{where}: X must be 2-D [cols, d], got {list(X.shape)}")
    plan = SpmmPlan(A, device=X.device, shape=shape, tune=format == "auto", where=where)
    return plan.run(X)


class SpmmPlan:
    """Y = A X on the GPU for one sparse matrix A and any number of X (flare/sparse/spmm_gpu.h,
    spmm_tune.h): A's arrays are moved to `device` once (int32 indices; values in each X's
    dtype, converted once per dtype), and each feature size and dtype gets a schedule (feature
    tiles, chunk size) at its first run(): with tune=True the auto-tuner's (every candidate timed
    on the device, the choice cached on disk under the JIT cache directory by A's structure, d,
    dtype and GPU; that first run synchronizes and cannot be captured in a CUDA graph: run once
    before capturing), else the default schedule. Later runs only launch (CUDA-graph safe). A
    plan keeps one workspace per feature size: one run at a time (not from two streams at once).
    A: as flare.sparse.spmm's (torch sparse CSR / COO or a triple with `shape`); cache=False
    skips the disk cache (always search)."""

    def __init__(self, A, device=None, shape=None, tune=True, cache=True,
                 where="flare.sparse.SpmmPlan"):
        torch = torch_module()
        self.device = torch.device(device) if device is not None else torch.device(
            "cuda", torch.cuda.current_device())
        if self.device.type != "cuda":
            raise ValueError(f"{where}: device must be a CUDA device, got {self.device}")
        rows, cols, arrays, _ = _csr_arrays(A, shape, where)
        if arrays[2] is None:
            raise ValueError(f"{where}: A needs values")
        self.rows, self.cols = int(rows), int(cols)
        self._indptr, self._indices = (
            torch.as_tensor(x).to(device=self.device, dtype=torch.int32).contiguous()
            for x in arrays[:2])
        self._values_given = torch.as_tensor(arrays[2]).to(device=self.device)
        self._values, self._workspaces, self._schedules = {}, {}, {}
        self.tune, self.cache = bool(tune), bool(cache)
        # run()'s errors: the plan's method, or the caller's name for a one-call plan (spmm).
        self._run_where = f"{where}.run" if where == "flare.sparse.SpmmPlan" else where

    def schedule(self, d, dtype):
        """The schedule of feature size d and dtype (a dict: feature_tile, chunk_items, and for a
        tuned one from_cache, search_ms and timings_us as (tile, chunk, us)), None before its
        first run."""
        return self._schedules.get((int(d), dtype))

    def run(self, X, out=None):
        """Y = A X in X's dtype (float16 / bfloat16 / float32 kept, others as float32) on torch's
        current stream; into `out` ([rows, d], X's kernel dtype, unit stride along d) when
        given."""
        torch = torch_module()
        where = self._run_where
        if not is_cuda(X) or X.device != self.device:
            raise ValueError(f"{where}: X must be a CUDA tensor on {self.device}, got "
                             f"{getattr(X, 'device', type(X).__name__)}")
        if X.ndim != 2 or X.shape[0] != self.cols:
            raise ValueError(f"{where}: X must have shape [cols = {self.cols}, d], got "
                             f"{list(X.shape)}")
        x = _gpu_operand(X, "X", where)
        d = x.shape[1]
        if out is None:
            out = torch.empty((self.rows, d), dtype=x.dtype, device=self.device)
        elif (not is_cuda(out) or out.device != self.device or out.dtype != x.dtype
              or tuple(out.shape) != (self.rows, d)):
            raise ValueError(f"{where}: out must be a {x.dtype} [{self.rows}, {d}] tensor on "
                             f"{self.device}, got {getattr(out, 'dtype', None)} "
                             f"{list(getattr(out, 'shape', []))}")
        values = self._values.get(x.dtype)
        if values is None:
            values = self._values[x.dtype] = self._values_given.to(x.dtype).contiguous()
        workspace = self._workspaces.get(d)
        if workspace is None:
            # From torch's caching allocator: a graph captured later keeps this buffer.
            workspace = self._workspaces[d] = torch.empty(
                _flare.sparse_spmm_workspace_bytes(self.rows, self._indices.shape[0], d),
                dtype=torch.uint8, device=self.device)
        arrays = (self.rows, self.cols, self._indptr, self._indices, values, x, out, workspace)
        key = (d, x.dtype)
        schedule = self._schedules.get(key)
        if schedule is None and self.tune:
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError(f"{where}: the first run of feature size {d} in {x.dtype} "
                                   "tunes the schedule on the device and cannot be captured in "
                                   "a CUDA graph: run once before capturing (or tune=False)")
            self._schedules[key] = _flare.sparse_spmm_tune(*arrays, use_cache=self.cache)
            return out  # the search left A X from the chosen schedule in out
        if schedule is None:
            tile, chunk = _flare.sparse_spmm_schedules(d)[0]
            schedule = self._schedules[key] = {"feature_tile": tile, "chunk_items": chunk}
        _flare.sparse_spmm_cuda(*arrays, schedule["feature_tile"], schedule["chunk_items"])
        return out


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
    synchronization, capturable)."""
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
