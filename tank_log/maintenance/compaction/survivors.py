"""What the first pass leaves for the second: which messages may survive (docs/FORMAT.md §6.2), by ordinal.

A message's ordinal is its position among the messages of the compaction's inputs. `Survivors` holds two bits per
input message: `latest` (a keyed message that is its key's latest) and `marked` (a keyless message or a tombstone,
which the rules decide without the key map). With them the second pass needs no key map: a keyed message survives
when its `latest` bit is set, and a bundle with neither bit set anywhere (and not holding the range's last seq, §4.4)
holds no survivor, so `BundleFilter` skips it whole, from its header, without decoding it, while the counts in the
report stay exact (every tombstone and keyless message is in a decoded bundle).
"""

from __future__ import annotations

import numpy as np

from tank_log.format.decode import BundleTable


class Bits:
    """A growable bit set over ordinals: bit o % 8 of byte o // 8."""

    def __init__(self) -> None:
        self.bytes = np.zeros(0, dtype=np.uint8)

    @property
    def nbytes(self) -> int:
        return int(self.bytes.nbytes)

    def reserve(self, nbits: int) -> None:
        need = (nbits + 7) // 8
        if need > len(self.bytes):
            grown = np.zeros(self._grown(need), dtype=np.uint8)
            grown[: len(self.bytes)] = self.bytes
            self.bytes = grown

    def growth(self, nbits: int) -> int:
        """The bytes that `reserve(nbits)` would add."""
        need = (nbits + 7) // 8
        return self._grown(need) - len(self.bytes) if need > len(self.bytes) else 0

    @staticmethod
    def _grown(need: int) -> int:
        return need + need // 8  # an eighth more: few copies, little slack

    def set_run(self, start: int, flags: np.ndarray) -> None:
        """Set bits start, start + 1, ... where `flags` (bool) is True."""
        if not len(flags) or not flags.any():
            return
        self.reserve(start + len(flags))
        pad = start & 7
        packed = np.packbits(np.concatenate((np.zeros(pad, dtype=bool), flags)), bitorder="little")
        first = start >> 3
        self.bytes[first : first + len(packed)] |= packed

    def get(self, ords: np.ndarray) -> np.ndarray:
        """Per ordinal: whether its bit is set."""
        ords = ords.astype(np.int64, copy=False)
        byte = ords >> 3
        inside = byte < len(self.bytes)
        out = np.zeros(len(ords), dtype=bool)
        out[inside] = (self.bytes[byte[inside]] >> (ords[inside] & 7)) & 1 == 1
        return out

    def counts(self, start: int, stop: int) -> np.ndarray:
        """Prefix counts of set bits over ordinals [start, stop): element i counts bits start .. start + i - 1."""
        lo, hi = start >> 3, min((stop + 7) >> 3, len(self.bytes))
        window = np.zeros(stop - start, dtype=bool)
        if hi > lo:
            bits = np.unpackbits(self.bytes[lo:hi], bitorder="little")[start - 8 * lo :][: stop - start].astype(bool)
            window[: len(bits)] = bits
        return np.concatenate(([0], np.cumsum(window, dtype=np.int64)))


class Survivors:
    """The first pass's result: `latest` and `marked` bits, and how many messages the inputs hold."""

    def __init__(self) -> None:
        self.latest = Bits()
        self.marked = Bits()
        self.messages = 0

    @property
    def nbytes(self) -> int:
        return self.latest.nbytes + self.marked.nbytes


class BundleFilter:
    """The second pass's `select` for Segment.chunks: the bundles of a chunk that may hold a survivor. Walked in the
    first pass's order, it numbers every bundle's messages (decoded or not) with their ordinals; `ordinals` gives the
    decoded messages theirs."""

    def __init__(self, survivors: Survivors, range_last: int) -> None:
        self.survivors = survivors
        self.range_last = range_last
        self.next_ordinal = 0  # the ordinal of the first message of the next bundle walked
        self.messages = 0  # messages in the walked bundles, decoded or not
        self.skipped = 0  # bundles not decoded
        self._bases = np.zeros(0, dtype=np.int64)  # first ordinal of each bundle the last call selected

    def __call__(self, table: BundleTable) -> np.ndarray:
        counts = table.counts.astype(np.int64)
        total = int(counts.sum())
        ends = np.cumsum(counts)
        starts = ends - counts
        s = self.survivors
        latest, marked = (
            s.latest.counts(self.next_ordinal, self.next_ordinal + total),
            s.marked.counts(self.next_ordinal, self.next_ordinal + total),
        )
        read = (latest[ends] > latest[starts]) | (marked[ends] > marked[starts])
        last = np.uint64(self.range_last)
        read |= (table.firsts <= last) & (table.lasts >= last)
        rows = np.flatnonzero(read)
        self._bases = self.next_ordinal + starts[rows]
        self.next_ordinal += total
        self.messages += total
        self.skipped += len(counts) - len(rows)
        return rows

    def ordinals(self, bundle: np.ndarray) -> np.ndarray:
        """The ordinals of a decoded chunk's messages, given each one's bundle (an index into the selected bundles,
        non-decreasing)."""
        n = len(bundle)
        if not n:
            return np.zeros(0, dtype=np.int64)
        first_row = np.searchsorted(bundle, np.arange(len(self._bases)))  # each bundle's first message
        ords: np.ndarray = self._bases[bundle] + (np.arange(n) - first_row[bundle])
        return ords
