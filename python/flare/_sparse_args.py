"""Argument helpers of flare.sparse shared with its GPU SpMM plan (flare/_spmm_plan.py): a sparse
matrix's CSR arrays as given, and a dense operand as the GPU kernels take it."""

from ._tensors import is_torch, torch_module


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
