"""Reading one segment log file (`.ilog` RO or `.log` active): bundles, messages, Arrow batches, torn tails.

Sequence numbers are derived exactly as TANK_FORMAT.md §3.6 from the base in the file name. A torn tail (an
incomplete last bundle, §3.11) is data, not a crash: iteration stops at the last complete bundle and `tail` tells
where that is.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from tank_log.errors import TankFormatError
from tank_log.format.arrow import SCHEMA, to_record_batch
from tank_log.format.bundle import BundleHeader, Message
from tank_log.format.decode import (
    COMPLETE,
    INCOMPLETE,
    LIMIT,
    ZERO,
    BundleTable,
    MessageColumns,
    decode_messages,
    walk_bundles,
)
from tank_log.format.names import FileName, Kind, format_index_name, parse_name

DEFAULT_CHUNK_BYTES = 4 << 20


@dataclass(frozen=True)
class Tail:
    """Where the complete bundles end. `torn_bytes` > 0 means an incomplete last bundle (§3.11)."""

    valid_end: int
    file_size: int
    next_seq: int  # the seq the next bundle would get (= derived last seq + 1)

    @property
    def torn_bytes(self) -> int:
        return self.file_size - self.valid_end


@dataclass
class Chunk:
    """Consecutive complete bundles of a file, with their messages decoded."""

    file_offset: int  # file position of table offset 0
    table: BundleTable
    cols: MessageColumns


class Segment:
    """A segment log. `base` comes from the file name unless given (TANK_FORMAT.md §2.1)."""

    def __init__(self, path: str | os.PathLike, base: int | None = None):
        self.path = os.fspath(path)
        parsed = parse_name(os.path.basename(self.path))
        if isinstance(parsed, FileName) and parsed.kind is not Kind.INDEX:
            self.name: FileName | None = parsed
        else:
            self.name = None
        if base is None:
            if self.name is None:
                raise TankFormatError("not a segment file name; pass base= explicitly", self.path)
            base = self.name.base
        self.base = base
        self.tail: Tail | None = None

    def __repr__(self) -> str:
        return f"Segment({self.path!r})"

    @property
    def is_active(self) -> bool:
        return self.name is not None and self.name.kind is Kind.ACTIVE

    @property
    def index_path(self) -> str:
        return os.path.join(os.path.dirname(self.path), format_index_name(self.base))

    def size(self) -> int:
        return os.stat(self.path).st_size

    # ---- walking -------------------------------------------------------------------------------------------------

    def _walk(
        self,
        *,
        collect: bool,
        start: int = 0,
        next_seq: int | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        stop_seq: int | None = None,
        stop_offset: int | None = None,
    ):
        """Yield (WalkResult, file offset of its buffer) per chunk; sets `self.tail` at the end of the file.

        `stop_seq`: stop after the bundle holding it. `stop_offset`: only bundles starting before this offset.
        """
        next_seq = self.base if next_seq is None else next_seq
        self.tail = None
        with open(self.path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            pos = start
            want = chunk_bytes
            while pos < size:
                if stop_offset is not None and pos >= stop_offset:
                    return
                fh.seek(pos)
                buf = fh.read(min(want, size - pos))
                at_eof = pos + len(buf) >= size
                max_bytes = None if stop_offset is None else stop_offset - pos
                try:
                    res = walk_bundles(buf, 0, next_seq, collect=collect, stop_seq=stop_seq, max_bytes=max_bytes)
                except TankFormatError as err:
                    raise err.located(self.path, pos) from None
                if len(res.table):
                    yield res, pos
                pos += res.stop
                next_seq = res.next_seq
                if res.reason == LIMIT:
                    return
                if res.reason == INCOMPLETE:
                    if at_eof:
                        break
                    want = max(chunk_bytes, res.need - res.stop if res.need else len(buf) - res.stop + 16)
                elif res.reason == ZERO:
                    if not _zeros_to_eof(fh, pos, size):
                        raise TankFormatError("zero-length bundle", self.path, pos)
                    break
                else:
                    assert res.reason == COMPLETE
                    want = chunk_bytes
            self.tail = Tail(pos, size, next_seq)

    def bundles(self, *, start: int = 0, next_seq: int | None = None) -> Iterator[BundleHeader]:
        """Bundle headers in file order (no decompression)."""
        for res, base in self._walk(collect=False, start=start, next_seq=next_seq):
            yield from res.table.headers(base)

    def chunks(
        self,
        *,
        start: int = 0,
        next_seq: int | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        stop_seq: int | None = None,
        stop_offset: int | None = None,
    ) -> Iterator[Chunk]:
        """Decoded chunks of complete bundles (from `start`, before `stop_offset`, up to the one with `stop_seq`)."""
        for res, base in self._walk(
            collect=True,
            start=start,
            next_seq=next_seq,
            chunk_bytes=chunk_bytes,
            stop_seq=stop_seq,
            stop_offset=stop_offset,
        ):
            try:
                cols = decode_messages(res.table)
            except TankFormatError as err:
                raise err.located(self.path, base) from None
            yield Chunk(base, res.table, cols)

    # ---- convenient views ----------------------------------------------------------------------------------------

    def batches(
        self,
        *,
        min_seq: int | None = None,
        max_seq: int | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        use_index: bool = True,
    ) -> Iterator[pa.RecordBatch]:
        """Messages as Arrow batches (schema `arrow_batch.SCHEMA`), optionally restricted to a seq range.

        With `min_seq` the index is used to seek (TANK_FORMAT.md §4.4 step 3) when `use_index` and it exists.
        """
        start, next_seq = 0, None
        if min_seq is not None and use_index:
            start, next_seq = self.seek(min_seq)
        for chunk in self.chunks(start=start, next_seq=next_seq, chunk_bytes=chunk_bytes, stop_seq=max_seq):
            seq = chunk.cols.seq
            select = None
            if min_seq is not None or max_seq is not None:
                select = np.ones(len(seq), dtype=bool)
                if min_seq is not None:
                    select &= seq >= np.uint64(min_seq)
                if max_seq is not None:
                    select &= seq <= np.uint64(max_seq)
                if not select.any():
                    continue
            yield to_record_batch(chunk.cols, select)

    def read_table(self, **kwargs) -> pa.Table:
        return pa.Table.from_batches(list(self.batches(**kwargs)), schema=SCHEMA)

    def messages(self, **kwargs) -> Iterator[Message]:
        """Messages as Python objects (convenience; use `batches`/`chunks` on hot paths)."""
        for chunk in self.chunks(**kwargs):
            c = chunk.cols
            for i in range(len(c)):
                yield Message(int(c.seq[i]), int(c.ts[i]), c.key(i), c.value(i))

    def seek(self, seq: int) -> tuple[int, int]:
        """(file offset, next_seq) of the indexed bundle to start scanning from for `seq` (§4.4 step 3).

        Falls back to (0, base) when there is no usable index entry.
        """
        from tank_log.format.index import lookup, usable_entries

        entries = usable_entries(self.index_path, self.size())
        if seq <= self.base or not entries:
            return 0, self.base
        rel, off = lookup(entries, seq - self.base)
        return off, self.base + rel


def _zeros_to_eof(fh, pos: int, size: int) -> bool:
    fh.seek(pos)
    while pos < size:
        block = fh.read(min(1 << 20, size - pos))
        if not block or block.count(0) != len(block):
            return False
        pos += len(block)
    return True
