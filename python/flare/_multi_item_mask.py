"""FlashInfer's multi-item scoring (batch prefill's prefix_len_ptr, token_pos_in_items_ptr,
token_pos_in_items_len, max_item_len_ptr) as the custom mask it stands for.

A request's query rows are the tail of its sequence: row i sits at position s = kv_len - qo_len
+ i. Its first prefix_len tokens are a shared prefix; after it come items, each a delimiter
(position in item 0) followed by its tokens (1, 2, ...), token_pos_in_items giving the position
of each token after the prefix (request b's entries start at b * token_pos_in_items_len). Row s
sees key j <= s when s is in the prefix, else when j is in the prefix or in its own item up to
itself: j > s - token_pos (a delimiter sees only the prefix). That is FlashInfer's
kMultiItemScoring mask (prefill.cuh logits_mask_multi_item_scoring); flare runs it as a custom
mask over the same positions (max_item_len_ptr, FlashInfer's tile-skipping bound, is not needed
for it).
"""

import numpy as np

from ._tensors import is_torch, torch_module


def _host_ints(x, where, name):
    if is_torch(x):  # uint16 / uint32 (FlashInfer's) widened by a copy: few ops take them
        x = x.detach().to("cpu").to(torch_module().int64).numpy()
    x = np.asarray(x)
    if x.ndim == 0:  # one request's value as a scalar tensor (FlashInfer's tests pass that)
        x = x.reshape(1)
    if x.ndim != 1 or not np.issubdtype(x.dtype, np.integer):
        raise ValueError(f"{where}: {name} must be a 1-D integer array, got "
                         f"{x.dtype} of shape {x.shape}")
    return x.astype(np.int64)


def multi_item_mask(where, qo_indptr, kv_len, prefix_len_ptr, token_pos_in_items_ptr,
                    token_pos_in_items_len):
    """The flat bool custom mask (request by request, [qo_len, kv_len] each, row-major) of the
    multi-item arguments, on token_pos_in_items_ptr's device (numpy for host arrays).
    qo_indptr, kv_len: host int arrays of the plan. Raises ValueError naming the argument for
    a prefix longer than its request's KV, rows past token_pos_in_items_ptr's entries, or a
    negative token_pos_in_items_len."""
    if prefix_len_ptr is None or token_pos_in_items_ptr is None:
        raise ValueError(f"{where}: multi-item scoring needs prefix_len_ptr and "
                         "token_pos_in_items_ptr (and token_pos_in_items_len for batch > 1)")
    batch = qo_indptr.shape[0] - 1
    prefix = _host_ints(prefix_len_ptr, where, "prefix_len_ptr")
    stride = int(token_pos_in_items_len)
    if stride < 0:
        raise ValueError(f"{where}: token_pos_in_items_len must be >= 0, got {stride}")
    if prefix.shape[0] != batch:
        raise ValueError(f"{where}: prefix_len_ptr must have one entry a request ({batch}), got "
                         f"{prefix.shape[0]}")
    entries = token_pos_in_items_ptr.shape[0]
    if is_torch(token_pos_in_items_ptr):  # the mask is built on the positions' device
        torch = torch_module()
        device = token_pos_in_items_ptr.device
        positions = token_pos_in_items_ptr.to(torch.int32)

        def arange(n):
            return torch.arange(n, device=device)

        concatenate = torch.cat
    else:
        positions = _host_ints(token_pos_in_items_ptr, where, "token_pos_in_items_ptr")
        arange, concatenate = np.arange, np.concatenate
    masks = [arange(0) > 0]  # bool, so that an empty batch concatenates
    for b in range(batch):
        qo_len = int(qo_indptr[b + 1] - qo_indptr[b])
        kv = int(kv_len[b])
        p = int(prefix[b])
        if not 0 <= p <= kv:
            raise ValueError(f"{where}: prefix_len_ptr[{b}]={p} must lie in [0, kv_len={kv}] "
                             f"of request {b}")
        s = arange(qo_len) + (kv - qo_len)  # the rows' positions in the sequence
        j = arange(kv)
        if qo_len > 0 and kv - 1 >= p:  # rows after the prefix: entries [first, last] read
            first = max(kv - qo_len - p, 0)
            last = kv - 1 - p
            if b * stride + last >= entries:
                raise ValueError(
                    f"{where}: request {b}'s rows after its prefix read token_pos_in_items_ptr"
                    f"[{b * stride + first}:{b * stride + last + 1}], past its {entries} "
                    "entries")
            pos = positions[(s - p).clip(first) + b * stride]  # prefix rows: any entry read
        else:
            pos = s * 0
        visible = (s[:, None] < p) | (j[None, :] < p) | (s[:, None] < j[None, :] + pos[:, None])
        masks.append(((j[None, :] <= s[:, None]) & visible).reshape(-1))
    return concatenate(masks)


def is_multi_item(prefix_len_ptr, token_pos_in_items_ptr, max_item_len_ptr):
    return any(x is not None for x in (prefix_len_ptr, token_pos_in_items_ptr, max_item_len_ptr))

