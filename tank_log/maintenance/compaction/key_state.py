"""The first pass's state: exact key → the ordinal of its latest message, within a memory budget, and key records.

A message's ordinal is its position among the messages of the compaction's inputs (0, 1, 2, ... in seq order), the
same in both passes; the second pass keeps a keyed message when its ordinal is its key's latest (`Survivors`).

A key record is a key with an ordinal: u8 key length, the ordinal as 5 bytes little-endian, the key bytes. The
compiled key map holds each key as one (in blocks: `records` gives them back) and the spill writes them to its bucket
files, so both speak the same format.

The compiled core's `KeyMap` when it is built (open addressing over control bytes and record references, exact:
22-24 B per 11- or 12-byte key); otherwise `PureKeyMap`, a dict whose bytes are estimated (`KEYS` holds the one in
use: `CompiledKeys` or `PureKeys`, see `format.native`). Both stop taking
messages at the first new key that does not fit in the budget: where compaction starts to spill (`spill.KeySpill`).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Protocol, TypeAlias

import numpy as np

from tank_log.format import native
from tank_log.format.decode import NATIVE_CODECS, BundleTable

try:
    from tank_log.maintenance.compaction import _key_map
except ImportError:  # not built (no C compiler at install), or not for this Python: the pure-Python code runs
    native.failed("tank_log.maintenance.compaction._key_map")

Buffer: TypeAlias = bytes | memoryview  # what messages or key records are read from

RECORD_HEAD = 6  # key length (1 byte) + ordinal (5 bytes)
MAX_ORDINAL = (1 << 40) - 1
NARROW_MAX_ORDINAL = (1 << 32) - 1  # a map that is not `wide` holds 4-byte ordinals


class KeyMap(Protocol):
    budget: int

    def __len__(self) -> int: ...

    @property
    def nbytes(self) -> int: ...

    def add(self, data: Buffer, key_off: np.ndarray, key_len: np.ndarray, ords: np.ndarray) -> int:
        """Record each keyed message's ordinal as its key's latest (ordinals increase; keyless rows have key_off
        -1); returns how many messages were taken: all, or up to the first new key that does not fit in the budget."""
        ...

    def mark(self, bits: np.ndarray) -> None:
        """Set the bit of every key's latest ordinal (bit o % 8 of byte o // 8 of a uint8 array)."""
        ...

    def records(self) -> Iterator[bytes]:
        """Every key with its latest ordinal, as key records, a block at a time."""
        ...


class PureKeyMap:
    """A dict from key bytes to ordinal; each key is charged its length + PER_KEY bytes (dict slot, bytes and int
    objects)."""

    PER_KEY = 120

    def __init__(self, budget: int, wide: bool = False):
        self.budget = budget
        self.max_ord = MAX_ORDINAL if wide else NARROW_MAX_ORDINAL
        self._latest: dict[bytes, int] = {}
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._latest)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def add(self, data: Buffer, key_off: np.ndarray, key_len: np.ndarray, ords: np.ndarray) -> int:
        latest, used = self._latest, self._bytes
        try:
            for i, (off, n, o) in enumerate(zip(key_off.tolist(), key_len.tolist(), ords.tolist(), strict=True)):
                if off < 0:
                    continue
                if o > self.max_ord:
                    if o > MAX_ORDINAL:
                        raise ValueError("ordinal beyond 2**40")
                    return i
                key = bytes(data[off : off + n])
                if key not in latest:
                    if used + n + self.PER_KEY > self.budget:
                        return i
                    used += n + self.PER_KEY
                latest[key] = o
            return len(ords)
        finally:
            self._bytes = used

    def mark(self, bits: np.ndarray) -> None:
        ords = np.fromiter(self._latest.values(), dtype=np.int64, count=len(self._latest))
        np.bitwise_or.at(bits, ords >> 3, (1 << (ords & 7)).astype(np.uint8))

    def records(self) -> Iterator[bytes]:
        yield b"".join(bytes([len(k)]) + o.to_bytes(RECORD_HEAD - 1, "little") + k for k, o in self._latest.items())


def new_key_map(budget: int, wide: bool = False) -> KeyMap:
    """A key map within `budget` bytes; `wide` for inputs of 2**32 messages or more (5-byte ordinals)."""
    return KEYS.impl.new_map(budget, wide)


def add_walked(key_map: KeyMap, table: BundleTable, first: int, marked: np.ndarray) -> int:
    """`key_map.add` straight from a headers-only walk's `table`, without decoding it into columns, where the
    compiled core can (each message set unpacked and parsed in a small buffer, in cache for its keys); ordinals
    first, first + 1, ... Returns how many messages were taken, `marked[:taken]` (bool) telling the keyless messages
    and tombstones among them. Fewer than all (none on the pure-Python core) where a message set is malformed or the
    budget limits a step of the map (it stops rather than shrink the step to fit); the caller then decodes the table
    and goes on from there with `add`."""
    return KEYS.impl.add_walked(key_map, table, first, marked)


def key_hashes(data: Buffer, key_off: np.ndarray, key_len: np.ndarray) -> np.ndarray:
    """Each message's key hash (uint64; 0 for a keyless one): what the spill's buckets are chosen by."""
    return KEYS.impl.key_hashes(data, key_off, key_len)


def pack_records(data: Buffer, key_off: np.ndarray, key_len: np.ndarray, ords: np.ndarray, rows: np.ndarray) -> bytes:
    """The key records of messages `rows` (keyed ones), in that order."""
    return KEYS.impl.pack_records(data, key_off, key_len, ords, rows)


def unpack_records(data: Buffer) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The complete key records at the start of `data`: (key_off, key_len, ords, end); a record cut at the end of
    `data` is left for the next read (it starts at `end`)."""
    return KEYS.impl.unpack_records(data)


class Keys(Protocol):
    """The key map and key records of this module, compiled or pure Python: the same survivors and records."""

    def new_map(self, budget: int, wide: bool) -> KeyMap: ...

    def add_walked(self, key_map: KeyMap, table: BundleTable, first: int, marked: np.ndarray) -> int: ...

    def key_hashes(self, data: Buffer, key_off: np.ndarray, key_len: np.ndarray) -> np.ndarray: ...

    def pack_records(
        self, data: Buffer, key_off: np.ndarray, key_len: np.ndarray, ords: np.ndarray, rows: np.ndarray
    ) -> bytes: ...

    def unpack_records(self, data: Buffer) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]: ...


class PureKeys:
    """`PureKeyMap`, and key hashes and records one key at a time."""

    def new_map(self, budget: int, wide: bool) -> KeyMap:
        return PureKeyMap(budget, wide)

    def add_walked(self, key_map: KeyMap, table: BundleTable, first: int, marked: np.ndarray) -> int:
        return 0  # the pure decoder is fast on whole chunks only: the caller decodes the columns

    def key_hashes(self, data: Buffer, key_off: np.ndarray, key_len: np.ndarray) -> np.ndarray:
        out = np.zeros(len(key_off), dtype=np.uint64)
        for i, (off, n) in enumerate(zip(key_off.tolist(), key_len.tolist(), strict=True)):
            if off >= 0:
                key = bytes(data[off : off + n])
                out[i] = (zlib.crc32(key) << 32) | zlib.adler32(key)
        return out

    def pack_records(
        self, data: Buffer, key_off: np.ndarray, key_len: np.ndarray, ords: np.ndarray, rows: np.ndarray
    ) -> bytes:
        parts = []
        for r in rows.tolist():
            off, n, o = int(key_off[r]), int(key_len[r]), int(ords[r])
            if o > MAX_ORDINAL:
                raise ValueError("ordinal beyond 2**40")
            parts.append(bytes([n]) + o.to_bytes(RECORD_HEAD - 1, "little") + bytes(data[off : off + n]))
        return b"".join(parts)

    def unpack_records(self, data: Buffer) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        offs, lens, ords = [], [], []
        p, size = 0, len(data)
        while p + RECORD_HEAD <= size and p + RECORD_HEAD + data[p] <= size:
            offs.append(p + RECORD_HEAD)
            lens.append(data[p])
            ords.append(int.from_bytes(bytes(data[p + 1 : p + RECORD_HEAD]), "little"))
            p += RECORD_HEAD + data[p]
        return np.array(offs, np.int64), np.array(lens, np.int64), np.array(ords, np.uint64), p


class CompiledKeys:
    """The compiled key map, key hashes and records (`_key_map.pyx`)."""

    def new_map(self, budget: int, wide: bool) -> KeyMap:
        return _key_map.KeyMap(budget, wide)

    def add_walked(self, key_map: KeyMap, table: BundleTable, first: int, marked: np.ndarray) -> int:
        assert isinstance(key_map, _key_map.KeyMap)
        t = table
        columns = (t.set_offsets, t.ends, t.flags, t.counts, t.firsts, t.lasts)
        return key_map.add_sets(t.walked, *columns, first, NATIVE_CODECS, marked.view(np.uint8))

    def key_hashes(self, data: Buffer, key_off: np.ndarray, key_len: np.ndarray) -> np.ndarray:
        return _key_map.key_hashes(data, key_off, key_len)

    def pack_records(
        self, data: Buffer, key_off: np.ndarray, key_len: np.ndarray, ords: np.ndarray, rows: np.ndarray
    ) -> bytes:
        return _key_map.pack_records(data, key_off, key_len, ords, rows.astype(np.int64))

    def unpack_records(self, data: Buffer) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        return _key_map.unpack_records(data)


KEYS: native.Choice[Keys] = native.Choice(PureKeys(), CompiledKeys)
