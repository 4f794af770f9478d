"""The planned objects of single-request calls (single_decode_with_kv_cache,
single_prefill_with_kv_cache) by shape: created and planned at the first call of a shape and
kept, so that later calls only run(), which a CUDA graph (e.g. torch.compile(mode=
"reduce-overhead"), FlashInfer issue #541) can capture after an eager call of the same shapes.
Beyond `capacity` the least recently used leave first, except those a capture used: a replay
reads their plan and workspace for the life of the process."""

import collections


class PlannedByShape:
    def __init__(self, capacity):
        self._capacity = capacity
        self._entries = collections.OrderedDict()
        self._captured = set()

    def find(self, entry, capturing):
        """The object of `entry` when it is kept (marked used by a capture when `capturing`),
        else None: the fast path of a call whose arguments matched an earlier call's."""
        planned = self._entries.get(entry)
        if planned is not None:
            self._entries.move_to_end(entry)
            if capturing:
                self._captured.add(entry)
        return planned

    def get(self, where, entry, shape, make, capturing):
        """The object of `entry` (a hashable of the configuration and shape); make() creates and
        plans it at the first call, which is refused inside a capture (RuntimeError naming
        `shape`, e.g. "kv_len=300")."""
        planned = self._entries.get(entry)
        if planned is not None:
            self._entries.move_to_end(entry)
        else:
            if capturing:
                raise RuntimeError(
                    f"{where}: the first call with {shape} (and these heads, head dims, dtypes "
                    "and options) is inside a CUDA graph capture; it plans on the host when "
                    "first called: call it once with these shapes before capturing "
                    "(torch.compile's warm-up runs do)")
            planned = make()
            self._entries[entry] = planned
            for old in list(self._entries):
                if len(self._entries) <= self._capacity:
                    break
                if old not in self._captured:
                    del self._entries[old]
        if capturing:
            self._captured.add(entry)
        return planned


class CallMemo:
    """The planned entry of earlier single-request calls by their raw arguments (shapes,
    dtypes, device, options), so a repeated call skips the argument checks and the
    configuration key it passed before (~20 us of host time a call): hashing the arguments
    costs ~1 us. Holds no tensors (a torch.compile warm-up allocates from a CUDA graph's pool);
    at most `capacity` keys, forgotten all at once beyond."""

    def __init__(self, capacity=64):
        self._capacity = capacity
        self._entries = {}

    def get(self, key):
        """The remembered value, or None (also for a key that cannot be hashed, e.g. a list
        passed where a number goes: the checks then run and name it)."""
        try:
            return self._entries.get(key)
        except TypeError:
            return None

    def remember(self, key, value):
        if len(self._entries) >= self._capacity:
            self._entries.clear()
        try:
            self._entries[key] = value
        except TypeError:
            pass
