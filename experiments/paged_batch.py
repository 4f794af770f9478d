"""The paged batches of the planner experiments (issue 17): `batch` requests of q_len query
tokens over kv_len KV tokens each, 32 / 8 heads, D 128, pages of 16 tokens; indptr and
last_page_len on the host as serving engines pass them, page ids on the GPU, shuffled or in
allocation order."""
import torch

HQ, HK, DIM, PS = 32, 8, 128, 16


def paged_indices(batch, q_len, kv_len, shuffled=True, device="cuda:0"):
    """(qo_indptr, kv_indptr, kv_indices, kv_last_page_len) of the batch."""
    pages_per = (kv_len + PS - 1) // PS
    pages = batch * pages_per
    order = torch.randperm(pages) if shuffled else torch.arange(pages)
    return (torch.arange(batch + 1, dtype=torch.int32) * q_len,
            torch.arange(batch + 1, dtype=torch.int32) * pages_per,
            order.to(torch.int32).to(device),
            torch.full((batch,), (kv_len - 1) % PS + 1, dtype=torch.int32))
