"""A random paged KV cache on a CUDA device for the GPU tests (imported after their
importorskip("torch") and CUDA checks)."""

import numpy as np
import torch


class GpuPagedCache:
    """A random paged cache on the GPU: [pages, 2, ...] with a permuted page table; unused
    pages and slots hold NaN so over-reads show up."""

    def __init__(self, kv_lens, num_kv_heads, head_dim, page_size, layout, dtype, seed,
                 extra_pages=5, device="cuda:0"):
        generator = torch.Generator().manual_seed(seed)
        self.kv_lens = list(kv_lens)
        self.page_size, self.layout, self.device = page_size, layout, device
        pages = [(n + page_size - 1) // page_size for n in kv_lens]
        self.indptr = torch.tensor([0] + list(np.cumsum(pages)), dtype=torch.int32)
        pool = int(self.indptr[-1]) + extra_pages
        self.indices = torch.randperm(pool, generator=generator)[: int(self.indptr[-1])].to(
            torch.int32)
        self.last_page_len = torch.tensor(
            [(n - 1) % page_size + 1 if n else 0 for n in kv_lens], dtype=torch.int32)
        shape = ((pool, 2, page_size, num_kv_heads, head_dim) if layout == "NHD" else
                 (pool, 2, num_kv_heads, page_size, head_dim))
        values = torch.randn(shape, generator=generator)
        self.cache = values.to(dtype).to(device)
        valid = torch.zeros(pool, page_size, dtype=torch.bool)
        for b, n in enumerate(kv_lens):
            for pos in range(n):
                valid[self.indices[self.indptr[b] + pos // page_size], pos % page_size] = True
        mask = valid[:, None, :, None, None] if layout == "NHD" else valid[:, None, None, :,
                                                                            None]
        if dtype.is_floating_point and dtype.itemsize > 1:
            self.cache.masked_fill_(~mask.to(device), float("nan"))

    @property
    def batch(self):
        return len(self.kv_lens)

    def tokens(self, b):
        """K and V [kv_len, H_kv, D] of request b in float64."""
        n = self.kv_lens[b]
        rows = torch.arange(n)
        pages = self.indices[self.indptr[b] + rows // self.page_size].long().to(self.device)
        slots = (rows % self.page_size).to(self.device)
        if self.layout == "NHD":
            k, v = self.cache[pages, 0, slots], self.cache[pages, 1, slots]
        else:
            k, v = self.cache[pages, 0, :, slots], self.cache[pages, 1, :, slots]
        return k.double(), v.double()

    def ragged(self, kv_cache=None):
        """(k, v, kv_indptr): each request's tokens gathered from its pages, as float64-ready
        numpy [total_kv, H_kv, D] arrays (NHD order), of this cache or of kv_cache laid out
        like it."""
        kv = (self.cache if kv_cache is None else kv_cache).float().cpu().numpy()
        if self.layout == "HND":
            kv = kv.transpose(0, 1, 3, 2, 4)
        ks, vs = [], []
        for b, n in enumerate(self.kv_lens):
            pages = self.indices[int(self.indptr[b]):int(self.indptr[b + 1])].numpy()
            ks.append(kv[pages, 0].reshape(-1, *kv.shape[3:])[:n])
            vs.append(kv[pages, 1].reshape(-1, *kv.shape[3:])[:n])
        return np.concatenate(ks), np.concatenate(vs), np.concatenate([[0], np.cumsum(self.kv_lens)])
