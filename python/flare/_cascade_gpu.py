"""MultiLevelCascadeAttentionWrapper's one-launch path on the GPU (issue 20, composable formats):
every level's groups planned as one batch by flare's BatchPrefill.plan_cascade, run as one
prefill launch plus one merge launch over the pieces of rows several levels cover
(include/flare/plan/cascade.h). The levels' page ids are put back to back in one device buffer
at plan() by one IndexStaging.fill (device arrays copied on the device, host arrays through its
pinned memory: no synchronization; under CUDA graphs the buffer's address stays fixed).
Reached only with CUDA tensors.
"""

import numpy as np

from . import _flare, _tensors
from ._prefill_gpu import _Prefills, config_key, launch, new_batch_prefill
from ._tensors import StagedIndexBuffer, is_torch, next_power_of_two, scratch_of, torch_module


class GpuCascade:
    """One cascade wrapper's GPU state: BatchPrefill objects of max_levels = num_levels by
    configuration, the joined page ids, run() through one extension call.

    Under use_cuda_graph the first plan() fixes the configuration, the groups of every level
    (the lengths of qo_indptr_buf_arr) and the largest query count, and the joined page ids
    live in one buffer as long as the wrapper's paged_kv_indices buffers together."""

    def __init__(self, where, workspace, kv_layout, num_levels, use_cuda_graph, indices_bufs):
        self._where = where
        self._workspace = workspace
        self._device = workspace.device.index or 0
        self._kv_layout = kv_layout
        self._num_levels = num_levels
        self._use_cuda_graph = use_cuda_graph
        # The levels' partial states: every tile a level shares writes one, so a plan may need
        # more than the SM-count bound the float workspace is sized by (FlashInfer's cascade
        # allocates each level's output and lse instead). Outside CUDA graphs the engine keeps
        # them in memory of its own, grown with the plans (FlashInfer's own cascade tests at
        # head dim 256 needed 368 slots of a 32 MB buffer's 255); a graph's fixed addresses
        # stay in float_workspace_buffer, bounded at the first plan.
        scratch = scratch_of(workspace, where)  # the workspace checked either way
        self._scratch = scratch if use_cuda_graph else (0, 0)
        self._prefills = _Prefills()
        self._graph = None  # (key, max_batch, max_total_qo) of the first graph plan
        # The levels' page ids back to back: a fixed buffer under CUDA graphs, else one grown
        # with the plans (StagedIndexBuffer.room); filled through _staging.
        self._page_ids_buf = None
        self._page_ids = StagedIndexBuffer(workspace)
        self._staging = _flare.IndexStaging()
        if use_cuda_graph:
            if indices_bufs is None or any(b is None for b in indices_bufs):
                raise ValueError(f"{where}: use_cuda_graph=True needs "
                                 "paged_kv_indices_buf_arr (fixed for the wrapper's life)")
            torch = torch_module()
            capacity = sum(int(b.shape[0]) for b in indices_bufs)
            self._page_ids_buf = torch.zeros(max(capacity, 1), dtype=torch.int32,
                                             device=workspace.device)
        self.planned = None  # (prefill, page ids, rows, (heads, head_dim))

    def plan(self, qo_host, kv_host, last_host, indices_arr, config):
        """qo_host / kv_host / last_host: each level's host int32 arrays (kv_indptr relative to
        the level's own page ids, as FlashInfer takes them); config: the BatchPrefill keywords
        that are not capacities (GpuPrefill.plan's)."""
        levels, offset = [], 0  # each level's page ids follow the earlier levels'
        for qo, kv, last in zip(qo_host, kv_host, last_host):
            levels.append((qo, kv if offset == 0 else kv + np.int32(offset), last))
            offset += int(kv[-1])
        groups = sum(qo.shape[0] - 1 for qo in qo_host)
        total_qo = int(qo_host[0][-1])
        key = config_key(config) + (self._num_levels,)
        page_ids = self._join_page_ids(indices_arr, [int(kv[-1]) for kv in kv_host])
        if self._use_cuda_graph:
            if self._graph is None:
                capacity = (max(groups, 1), max(total_qo, 1))
            elif key != self._graph[0]:
                raise ValueError(f"a use_cuda_graph {self._where} keeps the configuration of its "
                                 "first plan(); create another wrapper for a different one")
            elif groups > self._graph[1] or total_qo > self._graph[2]:
                raise ValueError(
                    f"{self._where}: {groups} groups and {total_qo} query tokens exceed the "
                    f"{self._graph[1]} and {self._graph[2]} of the first plan() of this "
                    "use_cuda_graph wrapper (plan the largest batch first)")
            else:
                capacity = self._graph[1:]
        else:
            capacity = (next_power_of_two(groups), next_power_of_two(total_qo))
        prefill = self._prefills.fitting(key, *capacity)
        if prefill is None:
            prefill = self._prefills.get(key, *capacity, 0, self._make(config))
        prefill.plan_cascade(levels, _flare.current_stream(self._device))
        if self._use_cuda_graph and self._graph is None:
            self._graph = (key,) + tuple(capacity)
        rows = None if self._use_cuda_graph else total_qo
        self.planned = (prefill, page_ids, rows, (config["num_qo_heads"], config["head_dim_vo"]))

    def _join_page_ids(self, indices_arr, counts):
        """The levels' first counts[l] page ids back to back in one device buffer, by one
        IndexStaging.fill (device arrays copied on the device, host arrays through its pinned
        memory: no torch.cat, no synchronization). Outside CUDA graphs the buffer grows with the
        plans (stream order keeps the runs of earlier plans ahead of the next plan's copies)."""
        total = sum(counts)
        buffer = self._page_ids_buf if self._use_cuda_graph else self._page_ids.room(total)
        if total > buffer.shape[0]:
            raise ValueError(f"{self._where}: the levels list {total} page ids, more than "
                             f"their paged_kv_indices buffers hold together ({buffer.shape[0]})")
        entries, offset = [], 0
        for i, (x, n) in enumerate(zip(indices_arr, counts)):
            name = f"paged_kv_indices_arr[{i}]"
            entries.append((buffer, "the levels' joined page ids",
                            _tensors.index_source(x, name), name, n, offset))
            offset += n
        self._staging.fill(_flare.current_stream(self._device), tuple(entries), False)
        return buffer

    def _make(self, config):
        def make(max_batch, max_total_qo, max_total_kv):
            return new_batch_prefill(self._device, config, self._kv_layout, True,
                                     self._use_cuda_graph, self._scratch, False, "auto",
                                     (max_batch, max_total_qo, max_total_kv),
                                     max_levels=self._num_levels)

        return make

    def run(self, q, paged_kv_cache, return_lse):
        """o [tokens, H_qo, D] (and the base-2 lse) of the planned cascade: one extension call."""
        if self.planned is None:
            raise RuntimeError(f"{self._where}.run() needs a plan(): call plan() first")
        prefill, page_ids, rows, (heads, head_dim) = self.planned
        if not is_torch(q):
            raise TypeError(f"{self._where}.run: q must be a torch tensor on "
                            f"{self._workspace.device}, got {type(q).__name__}")
        rows = q.shape[0] if rows is None else rows
        out = q.new_empty((rows, heads, head_dim))
        lse = q.new_empty((rows, heads), dtype=torch_module().float32) if return_lse else None
        launch(prefill, q, paged_kv_cache, page_ids, self._kv_layout == "HND", out, lse, None,
               (None, None, None), "log2", None, None, None, None)
        return (out, lse) if return_lse else out

    def check(self):
        for prefill in self._prefills.values():
            prefill.check(self._where, "paged_kv_indices_arr")
