"""Reading one segment log file (`.ilog` RO or `.log` active): bundles, messages, Arrow batches, torn tails.

Sequence numbers are derived exactly as docs/FORMAT.md §3.6 from the base in the file name. A torn tail (an
incomplete last bundle, §3.11) is data, not a crash: iteration stops at the last complete bundle and the walk's
`tail` tells where that is.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar

import numpy as np

from tank_log.errors import TankFormatError
from tank_log.format import decode as decoding
from tank_log.format.bundle import SPARSE, BundleHeader, Message, messages_of
from tank_log.format.decode import (
    BUDGET,
    COMPLETE,
    INCOMPLETE,
    LIMIT,
    ZERO,
    BundleTable,
    WalkResult,
    collect_bundles,
    decode_messages,
    walk_bundles,
)
from tank_log.format.index import lookup, usable_entries
from tank_log.format.messages import MessageColumns
from tank_log.format.names import FileName, Kind, format_index_name, parse_name

if TYPE_CHECKING:  # pyarrow is imported by the Arrow views only: ~50 MiB of RSS a compaction or the CLI never needs
    import pyarrow as pa

DEFAULT_CHUNK_BYTES = 4 << 20
T = TypeVar("T")


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

    @property
    def seq(self) -> np.ndarray:
        """The messages' seqs."""
        return self.cols.seq


@dataclass
class BatchChunk:
    """Consecutive complete bundles of a file, with their messages as an Arrow batch (`format.arrow.MESSAGE_SCHEMA`)."""

    file_offset: int  # file position of table offset 0
    table: BundleTable
    batch: pa.RecordBatch

    @property
    def seq(self) -> np.ndarray:
        """The messages' seqs (a view of the batch's column)."""
        seq: np.ndarray = self.batch.column(0).to_numpy()
        return seq


class SegmentWalk(Iterator[T]):
    """One pass over a segment's bundles (headers, decoded chunks, batches or messages). Once exhausted, `tail`
    says where the complete bundles end (docs/FORMAT.md §3.11); it stays None if the pass stopped early."""

    def __init__(self, gen: Generator[T, None, Tail | None]):
        self._gen = gen
        self.tail: Tail | None = None

    def __iter__(self) -> SegmentWalk[T]:
        return self

    def __next__(self) -> T:
        try:
            return next(self._gen)
        except StopIteration as stop:
            self.tail = stop.value
            raise


class Segment:
    """One segment log file: an RO `<base>-<last>[_<ts>].ilog` or the active `<base>[_<ts>].log` (docs/FORMAT.md
    §2.1), with the numbers of its name. `base` comes from the name unless given (a file under another name).

    Raises:
        SegmentNameError: a segment/index extension with a name the broker would mis-parse.
        TankFormatError: no segment name and no `base`.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        base: int | None = None,
        *,
        name: FileName | None = None,
        size: int | None = None,
    ):
        self.path = os.fspath(path)
        if name is None:
            parsed = parse_name(os.path.basename(self.path), self.path)
            if isinstance(parsed, FileName) and parsed.kind is not Kind.INDEX:
                name = parsed
        self.name = name
        if base is None:
            if name is None:
                raise TankFormatError("not a segment file name; pass base= explicitly", self.path)
            base = name.base
        self.base = base
        self._size = size

    def __repr__(self) -> str:
        return f"Segment({self.path!r})"

    @property
    def size(self) -> int:
        """File size in bytes (as listed by the partition scan, else stat'ed once)."""
        if self._size is None:
            self._size = os.stat(self.path).st_size
        return self._size

    @property
    def last(self) -> int | None:
        """The last seq of an RO segment's name (None for the active segment)."""
        return None if self.name is None else self.name.last

    @property
    def ts(self) -> int | None:
        """The name's timestamp in seconds (None: legacy name without one, §2.1)."""
        return None if self.name is None else self.name.ts

    @property
    def is_active(self) -> bool:
        return self.name is not None and self.name.kind is Kind.ACTIVE

    @property
    def file_name(self) -> str:
        return os.path.basename(self.path)

    @property
    def index_path(self) -> str:
        """`<base>.index` beside the log (§4)."""
        return os.path.join(os.path.dirname(self.path), format_index_name(self.base))

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
        as_collected: bool = False,
        continued: bool = False,
    ) -> Generator[tuple[WalkResult, int], None, Tail | None]:
        """Yield (WalkResult, file offset of its buffer) per chunk; return the Tail at the end of the file (None
        when stopped early by `stop_seq` / `stop_offset`).

        `as_collected`: a headers-only walk whose chunks end where a collecting walk's do (its message budget), and
        whose error is the one a collecting walk meets first (a message set before a bad header that does not
        decompress), so that reading the chunks' sets afterwards gives the same chunks and errors.

        `continued`: `start` is where an earlier walk stopped, not an index entry (a sparse bundle there may start
        above `next_seq`)."""
        next_seq = self.base if next_seq is None else next_seq
        at_entry = start > 0 and not continued  # from an index entry: it says which seq the bundle there starts with
        with open(self.path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            pos = start
            want = chunk_bytes
            while pos < size:
                if stop_offset is not None and pos >= stop_offset:
                    return None
                fh.seek(pos)
                buf = fh.read(min(want, size - pos))
                at_eof = pos + len(buf) >= size
                max_bytes = None if stop_offset is None else stop_offset - pos
                budget = decoding.DEFAULT_MAX_MESSAGES if as_collected else None
                try:
                    res = walk_bundles(
                        buf, 0, next_seq, collect=collect, stop_seq=stop_seq, max_bytes=max_bytes, max_messages=budget
                    )
                except TankFormatError as err:
                    if as_collected and not collect:
                        err = _collecting_error(buf, next_seq, stop_seq, max_bytes) or err
                    raise err.located(self.path, pos) from None
                if len(res.table):
                    if at_entry:
                        _check_entry_bundle(res, self.path, pos, next_seq)
                        at_entry = False
                    yield res, pos
                pos += res.stop
                next_seq = res.next_seq
                if res.reason == LIMIT:
                    return None
                if res.reason == BUDGET:
                    want = chunk_bytes
                    continue
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
            return Tail(pos, size, next_seq)

    def bundles(self, *, start: int = 0, next_seq: int | None = None) -> SegmentWalk[BundleHeader]:
        """Bundle headers in file order (no decompression).

        Raises:
            TankFormatError: a malformed bundle (file and offset).
        """

        walk = self._walk(collect=False, start=start, next_seq=next_seq)
        return SegmentWalk(_flat_map(walk, lambda res, base: res.table.headers(base)))

    def tables(
        self,
        *,
        start: int = 0,
        next_seq: int | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        stop_offset: int | None = None,
        continued: bool = False,
    ) -> SegmentWalk[tuple[int, BundleTable]]:
        """Bundle headers in bulk, a walked chunk at a time: (file offset of the table's offset 0, its table); no
        decompression (`table.walked` holds the chunk's bytes). From `start` (an index entry, or where an earlier
        walk stopped when `continued`), before `stop_offset`.

        Raises:
            TankFormatError: a malformed bundle (file and offset).
        """
        walk = self._walk(
            collect=False,
            start=start,
            next_seq=next_seq,
            chunk_bytes=chunk_bytes,
            stop_offset=stop_offset,
            continued=continued,
        )
        return SegmentWalk(_flat_map(walk, lambda res, base: [(base, res.table)]))

    def chunks(
        self,
        *,
        start: int = 0,
        next_seq: int | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        stop_seq: int | None = None,
        stop_offset: int | None = None,
        select: Callable[[BundleTable], np.ndarray] | None = None,
    ) -> SegmentWalk[Chunk]:
        """Decoded chunks of complete bundles (from `start`, before `stop_offset`, up to the one with `stop_seq`).

        `select`: given each chunk's headers, the indices of the bundles to decode; the others are walked (their
        headers checked) but not decompressed, and the chunk's table holds the selected bundles only.

        Raises:
            TankFormatError: a malformed bundle or message (file and offset).
        """

        def decode(res: WalkResult, base: int) -> list[Chunk]:
            try:
                table = res.table if select is None else collect_bundles(res.table, select(res.table))
                return [Chunk(base, table, decode_messages(table))]
            except TankFormatError as err:
                raise err.located(self.path, base) from None

        walk = self._walk(
            collect=select is None,
            start=start,
            next_seq=next_seq,
            chunk_bytes=chunk_bytes,
            stop_seq=stop_seq,
            stop_offset=stop_offset,
        )
        return SegmentWalk(_flat_map(walk, decode))

    def batch_chunks(
        self,
        *,
        start: int = 0,
        next_seq: int | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        stop_seq: int | None = None,
        stop_offset: int | None = None,
    ) -> SegmentWalk[BatchChunk]:
        """`chunks` with the messages as Arrow batches (`format.arrow.walked_batch`), read from each walked chunk's
        message sets in one pass, without decoded columns: the same chunks, messages and errors.

        Raises:
            TankFormatError: a malformed bundle or message (file and offset).
        """
        from tank_log.format.arrow import skip_pandas_detection, walked_batch

        skip_pandas_detection()  # pyarrow would import pandas at its first conversion (format/arrow.py)

        def read(res: WalkResult, base: int) -> list[BatchChunk]:
            try:
                return [BatchChunk(base, res.table, walked_batch(res.table))]
            except TankFormatError as err:
                raise err.located(self.path, base) from None

        walk = self._walk(
            collect=False,
            start=start,
            next_seq=next_seq,
            chunk_bytes=chunk_bytes,
            stop_seq=stop_seq,
            stop_offset=stop_offset,
            as_collected=True,
        )
        return SegmentWalk(_flat_map(walk, read))

    # ---- convenient views ----------------------------------------------------------------------------------------

    def batches(
        self,
        *,
        min_seq: int | None = None,
        max_seq: int | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        use_index: bool = True,
    ) -> SegmentWalk[pa.RecordBatch]:
        """Messages as Arrow batches (schema `format.arrow.MESSAGE_SCHEMA`), optionally restricted to a seq range.

        With `min_seq` the index is used to seek (docs/FORMAT.md §4.4 step 3) when `use_index` and it exists.
        """
        start, next_seq = 0, None
        if min_seq is not None and use_index:
            start, next_seq = self.seek(min_seq)

        def gen() -> Generator[pa.RecordBatch, None, Tail | None]:
            walk = self.batch_chunks(start=start, next_seq=next_seq, chunk_bytes=chunk_bytes, stop_seq=max_seq)
            for chunk in walk:
                select = seq_mask(chunk.seq, min_seq, max_seq)
                if select is None or select.all():
                    yield chunk.batch
                elif select.any():
                    yield chunk.batch.filter(select)
            return walk.tail

        return SegmentWalk(gen())

    def max_ts(self) -> int:
        """The newest message timestamp (0 for a segment without messages).

        Raises:
            TankFormatError: a malformed segment.
        """
        return max((int(c.cols.ts.max()) for c in self.chunks() if len(c.cols)), default=0)

    def read_table(self, **kwargs: Any) -> pa.Table:
        import pyarrow as pa

        from tank_log.format.arrow import MESSAGE_SCHEMA

        return pa.Table.from_batches(list(self.batches(**kwargs)), schema=MESSAGE_SCHEMA)

    def messages(self, **kwargs: Any) -> SegmentWalk[Message]:
        """Messages as Python objects (convenience; use `batches`/`chunks` on hot paths)."""

        def gen() -> Generator[Message, None, Tail | None]:
            walk = self.chunks(**kwargs)
            for chunk in walk:
                yield from messages_of(chunk.cols)
            return walk.tail

        return SegmentWalk(gen())

    def check_headers(self) -> None:
        """The header-level consistency an index-guided read relies on (no message decoding): the bundles' seqs
        agree with the name (first = base; RO: last = the name's last) and every usable index entry points at a
        bundle start with the entry's seq (§4.4). A read from an index entry of a segment that fails this would
        number messages differently from a full scan.

        Raises:
            TankFormatError: the first contradiction (file and offset), or a malformed bundle.
        """
        starts: dict[int, int] = {}
        first = last = None
        for h in self.bundles():
            starts[h.offset] = h.first_seq
            first = h.first_seq if first is None else first
            last = h.last_seq
        if first is None:
            return
        if first != self.base:
            raise TankFormatError(f"name says base {self.base}, the first bundle starts at seq {first}", self.path, 0)
        if not self.is_active and last != self.last:
            raise TankFormatError(f"name says last {self.last}, the bundles end at seq {last}", self.path, None)
        for rel, off in usable_entries(self.index_path, self.size):
            if starts.get(off) != self.base + rel:
                found = "no bundle starts there" if off not in starts else f"the bundle there starts at {starts[off]}"
                raise TankFormatError(
                    f"index entry (rel {rel}, offset {off}) says seq {self.base + rel}, but {found} (§4.4)",
                    self.index_path,
                    off,
                )

    def seek(self, seq: int) -> tuple[int, int]:
        """(file offset, next_seq) of the indexed bundle to start scanning from for `seq` (§4.4 step 3).

        Falls back to (0, base) when there is no usable index entry.
        """
        entries = usable_entries(self.index_path, self.size)
        if seq <= self.base or not entries:
            return 0, self.base
        rel, off = lookup(entries, seq - self.base)
        return off, self.base + rel


def _check_entry_bundle(res: WalkResult, path: str, pos: int, expected: int) -> None:
    """A sparse bundle carries its absolute first seq (§3.3): at an index entry it must be the entry's seq."""
    first = int(res.table.firsts[0])
    if res.table.flags[0] & SPARSE and first != expected:
        raise TankFormatError(
            f"the index entry for this offset says seq {expected}, the sparse bundle here starts at "
            f"{first} (index and data disagree, §4.4)",
            path,
            pos + int(res.table.offsets[0]),
        )


def seq_mask(seq: np.ndarray, min_seq: int | None, max_seq: int | None) -> np.ndarray | None:
    """Rows with min_seq <= seq <= max_seq (None: no bound, every row)."""
    if min_seq is None and max_seq is None:
        return None
    select = np.ones(len(seq), dtype=bool)
    if min_seq is not None:
        select &= seq >= np.uint64(max(min_seq, 0))
    if max_seq is not None:
        select &= seq <= np.uint64(max(max_seq, 0))
    return select


def _flat_map(
    walk: Generator[tuple[WalkResult, int], None, Tail | None],
    items: Callable[[WalkResult, int], Iterable[T]],
) -> Generator[T, None, Tail | None]:
    """The items of each walked chunk (`items(result, file offset)`), returning the walk's tail."""
    while True:
        try:
            res, base = next(walk)
        except StopIteration as stop:
            tail: Tail | None = stop.value
            return tail
        yield from items(res, base)


def _collecting_error(buf: bytes, next_seq: int, stop_seq: int | None, max_bytes: int | None) -> TankFormatError | None:
    """The error a collecting walk of `buf` meets first, as `Segment.chunks` meets it; None where it stops before
    any."""
    try:
        walk_bundles(buf, 0, next_seq, collect=True, stop_seq=stop_seq, max_bytes=max_bytes)
    except TankFormatError as err:
        return err
    return None


def _zeros_to_eof(fh: BinaryIO, pos: int, size: int) -> bool:
    fh.seek(pos)
    while pos < size:
        block = fh.read(min(1 << 20, size - pos))
        if not block or block.count(0) != len(block):
            return False
        pos += len(block)
    return True
