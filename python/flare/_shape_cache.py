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
        self._calls = {}  # a call's raw arguments -> (entry, extra): remember_call()

    def for_call(self, call, capturing):
        """(object, extra) remembered for an earlier successful call with these raw arguments
        (shapes, dtypes, device, options: remember_call) while its object is kept, else None
        (also for arguments that cannot be hashed: the caller's checks then name them). A
        repeated call so skips the argument checks and key building it passed before (~20 us of
        host time a call; hashing the arguments ~1 us)."""
        try:
            known = self._calls.get(call)
        except TypeError:
            return None
        if known is None or known[0] not in self._entries:
            return None
        return self._touch(known[0], capturing), known[1]

    def remember_call(self, call, entry, extra):
        """Remembers that `call` (raw arguments) ran `entry`'s object; `extra` comes back with
        it. At most 64 calls, forgotten all at once beyond. Holds no tensors (a torch.compile
        warm-up allocates from a CUDA graph's pool)."""
        if len(self._calls) >= 64:
            self._calls.clear()
        try:
            self._calls[call] = (entry, extra)
        except TypeError:
            pass

    def _touch(self, entry, capturing):
        self._entries.move_to_end(entry)
        if capturing:
            self._captured.add(entry)
        return self._entries[entry]

    def get(self, where, entry, shape, make, capturing):
        """The object of `entry` (a hashable of the configuration and shape); make() creates and
        plans it at the first call, which is refused inside a capture (RuntimeError naming
        `shape`, e.g. "kv_len=300")."""
        if entry in self._entries:
            return self._touch(entry, capturing)
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
        return planned
