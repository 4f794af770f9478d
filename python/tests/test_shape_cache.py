"""flare/_shape_cache.py without a GPU: PlannedByShape keeps the planned objects of single_*
calls by shape (least recently used leave first beyond the capacity, except those a capture
used) and remembers which object a call's raw arguments ran, so a repeated call skips its
checks."""

import pytest

from flare._shape_cache import PlannedByShape


def test_a_remembered_call_finds_its_object_while_it_is_kept():
    cache = PlannedByShape(2)
    made = []

    def make(name):
        return lambda: made.append(name) or name

    assert cache.get("w", "a", "a", make("a"), False) == "a"
    cache.remember_call(("args", 1), "a", (8, 128))
    assert cache.for_call(("args", 1), False) == ("a", (8, 128))
    assert cache.for_call(("args", 2), False) is None
    assert cache.for_call((["unhashable"],), False) is None
    cache.remember_call((["unhashable"],), "a", None)  # ignored, not raised
    cache.get("w", "b", "b", make("b"), False)
    cache.get("w", "c", "c", make("c"), False)  # "a" leaves: least recently used
    assert cache.for_call(("args", 1), False) is None
    assert made == ["a", "b", "c"]


def test_objects_a_capture_used_stay_and_new_shapes_are_refused_inside_one():
    cache = PlannedByShape(1)
    cache.get("w", "a", "a", lambda: "a", False)
    cache.remember_call("call a", "a", None)
    assert cache.for_call("call a", True) == ("a", None)  # marks "a" captured
    cache.get("w", "b", "b", lambda: "b", False)
    assert cache.for_call("call a", False) == ("a", None)  # kept beyond the capacity
    with pytest.raises(RuntimeError, match="first call with kv_len=3"):
        cache.get("w", "c", "kv_len=3", lambda: "c", True)
