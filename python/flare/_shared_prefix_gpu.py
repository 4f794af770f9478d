"""The GPU forward() of FlashInfer's shared-prefix wrappers (BatchDecodeWithSharedPrefixPaged-
KVCacheWrapper, BatchPrefillWithSharedPrefixPagedKVCacheWrapper; flare/_cascade_wrappers.py):
the prefix, one non-causal request of every query row over the contiguous k_shared / v_shared,
runs its planned single prefill straight into the output; the requests' own pages run the
wrapper's batch decode or prefill into scratch rows the wrapper keeps; the merge kernel folds
those into the output in place. Three launches and one allocation (two with return_lse) a call:
the prefix plan is looked up by the shapes of the call before (issue 17: each torch call costs
~1.5-5 us of host time, single_prefill_with_kv_cache's own lookup ~10).

The scratch rows are the wrapper's, like FlashInfer's workspace: calls of one wrapper on
different streams must be ordered by the caller.
"""

from . import _flare
from ._prefill_gpu import launch
from ._single_prefill import planned_single_prefill
from ._tensors import torch_module

_NO_SCALES = (None, None, None)


class SharedPrefixRun:
    def __init__(self, where, kv_layout):
        self._where = where
        self._hnd = kv_layout == "HND"
        self._kv_layout = kv_layout
        self._prefix_key = None
        self._prefix = None  # (planned BatchPrefill or None, (H_qo, D_vo))
        self._scratch_key = None
        self._scratch = None  # (own rows' o, own rows' lse, the prefix's lse without return_lse)

    def _planned_prefix(self, q, k_shared, v_shared, use_fp16_qk_reduction, params):
        key = (q.shape, k_shared.shape, v_shared.shape, q.dtype, k_shared.dtype, v_shared.dtype,
               q.device, k_shared.device, use_fp16_qk_reduction, params)
        if key != self._prefix_key:
            self._prefix = planned_single_prefill(self._where, q, k_shared, v_shared,
                                                  self._kv_layout, use_fp16_qk_reduction,
                                                  dict(params))
            self._prefix_key = key
        return self._prefix

    def _scratch_for(self, q, heads, head_dim_vo):
        key = (q.shape[0], heads, head_dim_vo, q.dtype, q.device)
        if key != self._scratch_key:
            torch = torch_module()
            rows = q.shape[0]
            self._scratch = (q.new_empty((rows, heads, head_dim_vo)),
                             q.new_empty((rows, heads), dtype=torch.float32),
                             q.new_empty((rows, heads), dtype=torch.float32))
            self._scratch_key = key
        return self._scratch

    def forward(self, q, k_shared, v_shared, run_own, use_fp16_qk_reduction, params,
                return_lse):
        """o [rows, H_qo, D_vo] (and the merged base-2 lse with return_lse): run_own(out, lse)
        writes the requests' own states (the wrapper's decode or prefill run()); params: the
        (name, value) pairs of sm_scale, rope_scale, rope_theta."""
        prefill, (heads, head_dim_vo) = self._planned_prefix(q, k_shared, v_shared,
                                                             use_fp16_qk_reduction, params)
        rows = q.shape[0]
        out = q.new_empty((rows, heads, head_dim_vo))
        if prefill is None:  # no query row
            lse = q.new_empty((0, heads), dtype=torch_module().float32)
            return (out, lse) if return_lse else out
        own_o, own_lse, prefix_lse = self._scratch_for(q, heads, head_dim_vo)
        lse = q.new_empty((rows, heads), dtype=torch_module().float32) if return_lse \
            else prefix_lse
        launch(prefill, q, (k_shared, v_shared), None, self._hnd, out, lse, None, _NO_SCALES,
               "log2", None, None, None, None)
        run_own(own_o, own_lse)
        _flare.merge_state_in_place(out, lse, own_o, own_lse, None, True)
        return (out, lse) if return_lse else out
