"""Which bundles pass 2 must decode: those that may hold a survivor (docs/FORMAT.md §6.2).

After pass 1 every keyed message of the round's seqs [start, round_end] is in the key map, so a bundle there whose
seq range holds none of the keys' latest seqs, no keyless message and no tombstone is dropped whole: pass 2 checks
its header and skips its message set. Everything else is decoded and decided message by message: bundles that
reach below `start` (earlier rounds' survivors) or past `round_end` (a later round decides), the one holding the
range's last seq (§4.4), and the stretches where pass 1 saw keyless messages or tombstones (so their counts in the
report stay exact).
"""

from __future__ import annotations

import numpy as np

from tank_log.format.decode import BundleTable

MARKED_BYTES = 16 << 10  # the most the marked stretches take of the key state budget (a 16th of a small one)


class MarkedStretches:
    """Seq stretches [lo, hi] holding keyless messages or tombstones, recorded by pass 1 per decoded chunk. Past
    `budget` bytes (16 per stretch), neighbouring stretches merge: a coarser, still complete, record."""

    def __init__(self, budget: int) -> None:
        self.most = max(2, budget // 16)
        self.los: list[int] = []
        self.his: list[int] = []

    @staticmethod
    def share(key_state_budget: int) -> int:
        """The part of the key state budget the marked stretches may use."""
        return min(MARKED_BYTES, key_state_budget // 16)

    @property
    def nbytes(self) -> int:
        return 16 * len(self.los)

    def mark(self, seq: np.ndarray, marked: np.ndarray) -> None:
        """Record the stretch from the first to the last marked message of one chunk (`seq` increases)."""
        where = np.flatnonzero(marked)
        if not len(where):
            return
        lo, hi = int(seq[where[0]]), int(seq[where[-1]])
        self.los.append(lo)
        self.his.append(hi)
        if len(self.los) > self.most:  # merge pairs: the memory stays bounded at any input size
            self.los = self.los[::2]
            self.his = self.his[1::2] + ([self.his[-1]] if len(self.his) % 2 else [])


class BundleFilter:
    """Pass 2's `select` for Segment.chunks: the bundles of a chunk that may hold a survivor of this round."""

    def __init__(
        self, latest: np.ndarray, marked: MarkedStretches, start: int, round_end: int | None, range_last: int
    ) -> None:
        self.latest = np.sort(latest)
        self.marked_los = np.array(marked.los, dtype=np.uint64)  # pass 1 is over: the stretches are final
        self.marked_his = np.array(marked.his, dtype=np.uint64)
        self.start, self.round_end, self.range_last = start, round_end, range_last
        self.messages = 0  # messages in the walked bundles, decoded or not
        self.skipped = 0  # bundles not decoded

    def __call__(self, table: BundleTable) -> np.ndarray:
        firsts, lasts = table.firsts, table.lasts
        self.messages += int(table.counts.sum())
        has_latest = np.searchsorted(self.latest, lasts, side="right") > np.searchsorted(self.latest, firsts)
        read = has_latest | (firsts < np.uint64(self.start)) | self._marked(firsts, lasts)
        if self.round_end is not None:
            read |= lasts > np.uint64(self.round_end)
        read |= (firsts <= np.uint64(self.range_last)) & (lasts >= np.uint64(self.range_last))
        rows = np.flatnonzero(read)
        self.skipped += len(firsts) - len(rows)
        return rows

    def _marked(self, firsts: np.ndarray, lasts: np.ndarray) -> np.ndarray:
        """Per bundle [first, last]: True when a marked stretch overlaps it."""
        if not len(self.marked_los):
            return np.zeros(len(firsts), dtype=bool)
        i = np.searchsorted(self.marked_los, lasts, side="right") - 1  # the last stretch starting by the bundle's end
        return (i >= 0) & (self.marked_his[np.maximum(i, 0)] >= firsts)
