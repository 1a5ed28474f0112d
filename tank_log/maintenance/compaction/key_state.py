"""Pass 1 state: exact key → its latest seq, within a memory budget (no digests, so no collisions).

The compiled core's `KeyMap` (open addressing, 16-byte slots plus the key bytes, plus 8 bytes for pass 2's sorted
copy of the latest seqs: ~38 bytes per 11-byte key) when it is built; otherwise `PureKeyMap`, a dict whose bytes are
estimated. Both stop taking messages at the first new key that does not fit, which is where a compaction round ends
(`passes.map_keys`).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from tank_log.format import native


class KeyMap(Protocol):
    budget: int

    def __len__(self) -> int: ...

    @property
    def nbytes(self) -> int: ...

    def add(self, data: bytes, key_off: np.ndarray, key_len: np.ndarray, seq: np.ndarray) -> int:
        """Record each keyed message's seq as its key's latest (seqs increase); returns how many messages were
        taken: all, or up to the first new key that does not fit in the budget."""
        ...

    def superseded(self, data: bytes, key_off: np.ndarray, key_len: np.ndarray, seq: np.ndarray) -> np.ndarray:
        """Per message: True when its key is mapped to a later seq."""
        ...

    def latest_seqs(self) -> np.ndarray:
        """The mapped keys' latest seqs (uint64, any order; its 8 bytes per key are within the budget)."""
        ...


class PureKeyMap:
    """A dict from key bytes to seq; each key is charged its length + PER_KEY bytes (dict slot, bytes and int
    objects, and latest_seqs' 8 bytes)."""

    PER_KEY = 128

    def __init__(self, budget: int):
        self.budget = budget
        self._latest: dict[bytes, int] = {}
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._latest)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def add(self, data: bytes, key_off: np.ndarray, key_len: np.ndarray, seq: np.ndarray) -> int:
        latest, used = self._latest, self._bytes
        try:
            for i, (off, n, s) in enumerate(zip(key_off.tolist(), key_len.tolist(), seq.tolist(), strict=True)):
                if off < 0:
                    continue
                key = data[off : off + n]
                if key not in latest:
                    if used + n + self.PER_KEY > self.budget:
                        return i
                    used += n + self.PER_KEY
                latest[key] = s
            return len(seq)
        finally:
            self._bytes = used

    def superseded(self, data: bytes, key_off: np.ndarray, key_len: np.ndarray, seq: np.ndarray) -> np.ndarray:
        latest = self._latest
        out = np.zeros(len(seq), dtype=bool)
        for i, (off, n, s) in enumerate(zip(key_off.tolist(), key_len.tolist(), seq.tolist(), strict=True)):
            if off >= 0 and latest.get(data[off : off + n], 0) > s:
                out[i] = True
        return out

    def latest_seqs(self) -> np.ndarray:
        return np.fromiter(self._latest.values(), dtype=np.uint64, count=len(self._latest))


def new_key_map(budget: int) -> KeyMap:
    core: Any = native.core()
    return core.KeyMap(budget) if core is not None else PureKeyMap(budget)
