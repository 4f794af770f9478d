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
    for entry in (("not an entry",), "text", [1, 2, 3, 4, 5], (1, 2, 3, 4, 5, 6, 7)):
        with pytest.raises(ValueError, match="each entry is a"):
            staging.fill(0, (entry,), False)


def test_refill_buffers_hands_int32_host_arrays_and_the_stream_to_one_fill():
    """flare._tensors.refill_buffers (both graph wrappers' plan()): every entry's source in the
    form fill reads (lists and int64 arrays as int32 host arrays, int32 arrays as they are), the
    caller's stream, and non_blocking=False as a synchronous fill."""
    from flare._tensors import refill_buffers

    class Recorder:
        def fill(self, stream, entries, synchronous):
            self.call = (stream, entries, synchronous)

    int32 = np.arange(4, dtype=np.int32)
    recorder = Recorder()
    refill_buffers((("buf_a", "a_buffer", [0, 2, 5], "a", -1),
                    ("buf_b", "b_buffer", np.array([7, 8], dtype=np.int64), "b", 1),
                    ("buf_c", "c_buffer", int32, "c", -1)), False, recorder, 1234)
    stream, entries, synchronous = recorder.call
    assert stream == 1234 and synchronous
    assert [(e[0], e[1], e[3], e[4]) for e in entries] == [
        ("buf_a", "a_buffer", "a", -1), ("buf_b", "b_buffer", "b", 1),
        ("buf_c", "c_buffer", "c", -1)]
    assert all(e[2].dtype == np.int32 for e in entries)
    assert entries[0][2].tolist() == [0, 2, 5] and entries[1][2].tolist() == [7, 8]
    assert entries[2][2] is int32
    refill_buffers((("buf", "buffer", int32, "x", -1),), True, recorder, 0)
    assert recorder.call[2] is False
