"""Compaction past its key budget in one extra pass: key records spilled to bucket files by key hash.

When the first pass's key map is full, its keys (each with its latest ordinal) and the key of every later keyed
message go to one of B bucket files, chosen by the key's hash, so all of a key's records land in one bucket and in
ordinal order. Each bucket then gets a key map of its own, within the same budget, that finds its keys' latest
ordinals exactly (full keys compared: no digest, no collision); a bucket that still does not fit is split again by
other bits of the hash. The input is read once for this, whatever the key count, instead of once per round.

The bucket files are temporaries in the partition's directory (`fsutil.temp_path`: a leading `.` keeps the broker
away from them, docs/FORMAT.md §1.7; `repair` deletes any a killed run leaves); they are deleted as soon as their
bucket is done, and all of them on every way out. Their size is bounded by the keyed messages after the map filled:
6 bytes + the key per message.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
from collections.abc import Iterator
from typing import BinaryIO

import numpy as np

from tank_log.errors import NeedsAttention
from tank_log.maintenance.compaction.key_state import (
    NARROW_MAX_ORDINAL,
    RECORD_HEAD,
    Buffer,
    key_hashes,
    new_key_map,
    pack_records,
    unpack_records,
)
from tank_log.maintenance.compaction.survivors import Bits
from tank_log.storage.fsutil import temp_path

log = logging.getLogger(__name__)

HASH_BITS = 25  # bucket choice: bits 32..56 of the key hash (the map's slots use bits 0..31, its tags 57..63)
WRITE_BUFFER = 64 << 10  # a bucket's buffer is written past this
BUFFERED_MAX = 1 << 20  # ... and every buffer past this in all (the spill's memory stays small beside the budget)
READ_BYTES = 1 << 20  # a bucket is read back this much at a time
SPLIT = 4  # a bucket whose keys do not fit is split this many ways
MAX_DEPTH = 4  # ... this many times at most (4**4 = 256 times fewer keys: more means the budget cannot hold a key)


def bucket_count(fraction_read: float) -> int:
    """Buckets for all the keys when the map filled after `fraction_read` of the input: keys grow at most linearly
    with the input read, so each bucket holds at most about what the map held, with a quarter to spare; a bucket
    that still does not fit is split later."""
    return max(2, min(4096, math.ceil(1.25 / max(fraction_read, 1e-6))))


class KeySpill:
    """Key records partitioned into bucket files by key hash (bits `HASH_BITS` of it, divided by `divisor` first:
    a split bucket uses the next bits)."""

    def __init__(self, directory: str, buckets: int, *, divisor: int = 1, name: str = "compaction-spill") -> None:
        self.directory = directory
        self.divisor = divisor
        self.paths = [temp_path(directory, f"{name}-{i}") for i in range(buckets)]
        self._files: list[BinaryIO | None] = [None] * buckets
        self._buffers = [bytearray() for _ in range(buckets)]
        self._buffered = 0
        self.bytes = 0  # written or buffered

    def __len__(self) -> int:
        return len(self.paths)

    def _buckets(self, hashes: np.ndarray) -> np.ndarray:
        return (
            ((hashes >> np.uint64(32)) & np.uint64((1 << HASH_BITS) - 1))
            // np.uint64(self.divisor)
            % np.uint64(len(self.paths))
        )

    def add(self, data: Buffer, key_off: np.ndarray, key_len: np.ndarray, ords: np.ndarray) -> None:
        """The key records of the keyed messages among these columns."""
        keyed = np.flatnonzero(key_off >= 0)
        if not len(keyed):
            return
        hashes = key_hashes(data, key_off[keyed], key_len[keyed])
        bucket = self._buckets(hashes).astype(np.int64)
        order = np.argsort(bucket, kind="stable")  # within a bucket: ordinal order, as the map needs
        packed = memoryview(pack_records(data, key_off, key_len, ords, keyed[order]))
        sizes = np.bincount(bucket, weights=(RECORD_HEAD + key_len[keyed]).astype(np.float64), minlength=len(self))
        ends = np.cumsum(sizes.astype(np.int64))
        for b in np.flatnonzero(sizes).tolist():
            self._append(b, packed[int(ends[b] - sizes[b]) : int(ends[b])])

    def add_records(self, records: bytes) -> None:
        key_off, key_len, ords, _ = unpack_records(records)
        self.add(records, key_off, key_len, ords)

    def _append(self, b: int, piece: memoryview) -> None:
        self._buffers[b] += piece
        self._buffered += len(piece)
        self.bytes += len(piece)
        if len(self._buffers[b]) >= WRITE_BUFFER:
            self._write(b)
        if self._buffered >= BUFFERED_MAX:
            for i in range(len(self)):
                self._write(i)

    def _write(self, b: int) -> None:
        buf = self._buffers[b]
        if not buf:
            return
        try:
            fh = self._files[b]
            if fh is None:
                # unbuffered: the buffers are ours, and a close never writes (nor fails) later
                fh = self._files[b] = open(self.paths[b], "xb", buffering=0)  # noqa: SIM115 (finish or remove closes)
            fh.write(buf)
        except OSError as err:
            raise _spill_error(err, self.paths[b]) from err
        self._buffered -= len(buf)
        self._buffers[b] = bytearray()

    def finish(self) -> None:
        """Everything written; the files closed."""
        for b in range(len(self)):
            self._write(b)
            fh = self._files[b]
            if fh is not None:
                try:
                    fh.close()
                except OSError as err:
                    raise _spill_error(err, self.paths[b]) from err
                self._files[b] = None

    def read(self, b: int) -> Iterator[tuple[memoryview, np.ndarray, np.ndarray, np.ndarray]]:
        """Bucket b's records, a block at a time: (buffer, key_off, key_len, ords)."""
        if not os.path.exists(self.paths[b]):
            return
        with open(self.paths[b], "rb") as fh:
            rest = b""
            while block := fh.read(READ_BYTES):
                buf = memoryview(rest + block if rest else block)
                key_off, key_len, ords, end = unpack_records(buf)
                if len(ords):
                    yield buf, key_off, key_len, ords
                rest = bytes(buf[end:])
            if rest:
                raise RuntimeError(f"{self.paths[b]}: {len(rest)} bytes of a cut key record at its end")

    def discard(self, b: int) -> None:
        if os.path.exists(self.paths[b]):
            os.unlink(self.paths[b])

    def remove(self) -> None:
        """Every bucket file gone (on every way out)."""
        for b, fh in enumerate(self._files):
            if fh is not None:
                with contextlib.suppress(OSError):
                    fh.close()
                self._files[b] = None
        for b in range(len(self)):
            try:
                self.discard(b)
            except OSError:  # the next `repair` deletes it
                log.warning("could not delete %s", self.paths[b])


def _spill_error(err: OSError, path: str) -> OSError:
    what = "no space left for the key spill" if err.errno == errno.ENOSPC else err.strerror
    return OSError(err.errno, f"{what} (compaction past compaction.key_state_budget; nothing was changed)", path)


def mark_latest(spill: KeySpill, budget: int, bits: Bits, messages: int, depth: int = 0) -> tuple[int, int]:
    """For every bucket of `spill`, a key map within `budget` finds its keys' latest ordinals and sets their bits;
    a bucket that does not fit is split again. Returns the keys found and the largest map's bytes. The bucket files
    are gone afterwards.

    Raises:
        NeedsAttention: the budget cannot hold the keys of a bucket split MAX_DEPTH times.
    """
    keys = largest = 0
    for b in range(len(spill)):
        key_map = new_key_map(budget, wide=messages > NARROW_MAX_ORDINAL + 1)
        full = False
        for buf, key_off, key_len, ords in spill.read(b):
            if key_map.add(buf, key_off, key_len, ords) < len(ords):
                full = True
                break
        largest = max(largest, key_map.nbytes)
        if not full:
            key_map.mark(bits.bytes)
            keys += len(key_map)
            del key_map
            spill.discard(b)
            continue
        del key_map
        if depth + 1 >= MAX_DEPTH:
            raise NeedsAttention(f"compaction.key_state_budget ({budget} bytes) cannot hold the keys of one bucket")
        log.info("%s: keys past the budget, split %d ways", spill.paths[b], SPLIT)
        sub = KeySpill(spill.directory, SPLIT, divisor=spill.divisor * len(spill), name=f"compaction-spill-{depth + 1}")
        try:
            for buf, key_off, key_len, ords in spill.read(b):
                sub.add(buf, key_off, key_len, ords)
            sub.finish()
            spill.discard(b)
            sub_keys, sub_largest = mark_latest(sub, budget, bits, messages, depth + 1)
            keys, largest = keys + sub_keys, max(largest, sub_largest)
        finally:
            sub.remove()
    return keys, largest
