"""_flare.IndexStaging (the use_cuda_graph wrappers' plan() refills FlashInfer's fixed index
buffers through it) checks every entry before touching the device: without a GPU, a buffer that
is not an int32 CUDA tensor and a source of another dtype are refused by name, and an empty
batch of entries does nothing. Its copies run in python/tests/test_user_path_cuda.py."""

import numpy as np
import pytest

from flare import _flare


def test_entries_are_checked_before_any_copy():
    staging = _flare.IndexStaging()
    source = np.arange(3, dtype=np.int32)
    with pytest.raises(ValueError, match="paged_kv_indptr_buffer must be a contiguous int32 CUDA "
                                         "tensor"):
        staging.fill(0, ((np.zeros(4, np.int32), "paged_kv_indptr_buffer", source, "indptr",
                          -1),), False)
    staging.fill(0, (), False)  # nothing to copy: no device needed


def test_a_malformed_entry_is_refused():
    staging = _flare.IndexStaging()
    for entry in (("not an entry",), "text", [1, 2, 3, 4, 5]):
        with pytest.raises(ValueError, match="each entry is a"):
            staging.fill(0, (entry,), False)
