"""Whether a read returned everything a segment claims: the one completeness check every reader goes through (the
CLI's dump and stats, the export in the driver and on executors, the `tank` data source batch and stream) and the
segment checks `verify` reports (docs/FORMAT.md §2.1, §3.11, §4.4).

A segment claims seqs by its name (an RO segment `<base>-<last>` holds base..last; the active one starts at its base)
and by its index (each entry says which seq the bundle at an offset starts with). A read walks the bundles and
derives seqs from the base (§3.6), so a whole bundle cut out or duplicated, or a file truncated at a bundle boundary,
decodes without an error: the messages after it are numbered differently than the broker numbered them. What gives
such a loss away is the evidence `verify` uses: the content's last seq against the name's, the index entries
against the bundles found at their offsets, bytes after the last complete bundle of an RO segment, and a
non-regular file under a segment name (`datadir.NOT_A_FILE`). `SegmentAudit` collects that evidence while a read
decodes (a few numpy operations per decoded chunk: nothing per message) and says, when the read ends, what is
missing (`Hole`: file, offset, seq range) and which of the seqs read can be trusted (`Hole.trusted_through`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Protocol, TypeVar

import numpy as np

from tank_log.errors import TankFormatError
from tank_log.format.bundle import SPARSE
from tank_log.format.decode import BundleTable
from tank_log.format.index import disagreeing_entries, usable_entry_array, verify_index
from tank_log.format.names import FileName, Kind, parse_name
from tank_log.format.varint import decode_varint
from tank_log.problems import Problem
from tank_log.storage.datadir import NOT_A_FILE, Unread
from tank_log.storage.salvage import data_beyond_break
from tank_log.storage.segment import Segment, SegmentWalk, Tail

log = logging.getLogger(__name__)


class Walked(Protocol):
    """A walked chunk the audit observes: `Chunk` (decoded columns) or `BatchChunk` (an Arrow batch)."""

    @property
    def file_offset(self) -> int: ...
    @property
    def table(self) -> BundleTable: ...
    @property
    def seq(self) -> np.ndarray: ...


C = TypeVar("C", bound=Walked)


@dataclass(frozen=True)
class Hole:
    """Seqs a partition claims that a read could not return: `first_seq`..`last_seq` (None: up to an end nobody
    knows) of the file `path`, from byte `offset`. `trusted_through` is the last seq a reader may keep before it
    (the seqs read after it may be numbered wrongly: a cut or duplicated bundle shifts everything after it)."""

    path: str
    offset: int | None
    first_seq: int
    last_seq: int | None
    code: str  # verify's problem code for the same evidence
    reason: str
    trusted_through: int

    @property
    def seqs(self) -> str:
        if self.last_seq is None:
            return f"seqs {self.first_seq}.. (end unknown)"
        if self.last_seq < self.first_seq:
            return "no seqs missing, later seqs misnumbered"
        return f"seqs {self.first_seq}..{self.last_seq}"

    def __str__(self) -> str:
        where = self.path if self.offset is None else f"{self.path} @{self.offset}"
        return f"{where}: {self.seqs} not read ([{self.code}] {self.reason})"

    def error(self) -> HoleError:
        return HoleError(self)

    def unread(self, file_size: int | None = None) -> Unread:
        """The hole as the CLI reports what a read left out."""
        size = None if file_size is None or self.offset is None else max(file_size - self.offset, 0) or None
        last = self.last_seq if self.last_seq is None or self.last_seq >= self.first_seq else None
        first = self.first_seq if last is not None or self.last_seq is None else None
        return Unread(self.path, f"[{self.code}] {self.reason}", self.offset, size, first, last)


class HoleError(TankFormatError):
    """A read that cannot return every seq the partition claims (`hole` says which and where)."""

    def __init__(self, hole: Hole):
        super().__init__(f"{hole.seqs} not read ([{hole.code}] {hole.reason})", hole.path, hole.offset)
        self.hole = hole

    def __reduce__(self) -> tuple[type[HoleError], tuple[Hole]]:  # Spark ships a task's error to the driver
        return (HoleError, (self.hole,))

    def located(self, path: str | os.PathLike[str] | None, base_offset: int = 0) -> TankFormatError:
        return self  # a hole is located in files already


def non_file_hole(path: str, first_seq: int, last_seq: int | None) -> Hole:
    """A non-regular file (a directory, a FIFO) under a segment name: none of its seqs can be read."""
    reason = "not a regular file under a segment name: the broker fails opening it; nothing of it is read"
    return Hole(path, None, first_seq, last_seq, "not-a-file", reason, first_seq - 1)


def layout_hole(u: Unread) -> Hole:
    """The seqs a scan found the partition cannot return (`Unread` with a `first_seq`): a non-regular file under a
    segment name, a segment file lost beside its index, or seqs two files claim at once (`datadir.OVERLAP`)."""
    assert u.first_seq is not None
    if u.code in (None, NOT_A_FILE):
        return non_file_hole(u.path, u.first_seq, u.last_seq)
    reason = u.reason.removeprefix(f"[{u.code}] ")
    return Hole(u.path, u.offset, u.first_seq, u.last_seq, u.code, reason, u.first_seq - 1)


class SegmentAudit:
    """The completeness evidence of one read of a segment, or of a byte range of it that starts at an index entry
    (`start`, `next_seq`) and ends before `stop_offset` (the next range's entry, whose seq is `stop_seq`).

    Feed it every decoded chunk in order (`observe`), then `finish` with how the walk ended."""

    def __init__(
        self,
        seg: Segment,
        *,
        start: int = 0,
        next_seq: int | None = None,
        stop_offset: int | None = None,
        stop_seq: int | None = None,
    ):
        self.seg = seg
        self.start = start
        self.start_seq = seg.base if next_seq is None else next_seq
        self.stop_offset, self.stop_seq = stop_offset, stop_seq
        entries = usable_entry_array(seg.index_path, seg.size)
        if start or stop_offset is not None:
            keep = entries[:, 1] >= start
            if stop_offset is not None:
                keep &= entries[:, 1] < stop_offset
            entries = entries[keep]
        self.entries = entries
        self._offsets = np.ascontiguousarray(self.entries[:, 1])
        # a valid index's offsets increase: a chunk's entries are then a slice (else a mask picks them)
        self._increasing = bool(np.all(self._offsets[1:] > self._offsets[:-1]))
        self.first_seq: int | None = None
        self.last_seq: int | None = None
        self.end = start  # file offset after the last complete bundle read
        self.messages = 0
        self.bundles = 0
        self.last_bundle_offset = start
        self.last_bundle_first: int | None = None  # the first seq of the last bundle read
        self.mismatch: tuple[int, int, str] | None = None  # (seq, offset, why) of the first entry that did not

    def observe(self, file_offset: int, table: BundleTable, seq: np.ndarray | None = None) -> None:
        """One walked chunk: its bundles (`file_offset`: the file position of their buffer's offset 0) and the seqs
        of their messages (None: not decoded, the bundle headers' counts say)."""
        n = len(table)
        if not n:
            return
        if seq is None:
            counts = table.counts
            count = int(np.add.reduce(counts))  # no numpy dispatch: once per walked chunk of every read
            if not count:
                lo, hi = None, None
            elif counts[0] and counts[-1]:
                lo, hi = int(table.firsts[0]), int(table.lasts[-1])
            else:
                held = np.flatnonzero(counts > 0)
                lo, hi = int(table.firsts[held[0]]), int(table.lasts[held[-1]])
        else:
            count = len(seq)
            lo, hi = (int(seq[0]), int(seq[-1])) if count else (None, None)
        if lo is not None:
            if self.first_seq is None:
                self.first_seq = lo
            self.last_seq = hi
        self.messages += count
        self.bundles += n
        self.last_bundle_offset = file_offset + int(table.offsets[-1])
        self.last_bundle_first = int(table.firsts[-1])
        lo, self.end = file_offset + int(table.offsets[0]), file_offset + int(table.ends[-1])
        if self.mismatch is not None or not len(self.entries):
            return
        offs = self._offsets
        if self._increasing:
            first, stop = offs.searchsorted((lo, self.end)).tolist()
            inside = self.entries[first:stop]
        else:
            inside = self.entries[(offs >= lo) & (offs < self.end)]
        if not len(inside):
            return
        starts = table.offsets + file_offset
        bad = disagreeing_entries(inside, starts, table.firsts, self.seg.base)
        if len(bad):
            rel, off = (int(v) for v in inside[bad[0]])
            self.mismatch = (
                self.seg.base + rel,
                off,
                f"the index says a bundle with seq {self.seg.base + rel} starts here",
            )

    # ---- when the read ends ---------------------------------------------------------------------------------------

    def _renumbered(self, at: int | None, code: str, why: str) -> Hole:
        """The name or index contradicts the bundles without a torn tail: a bundle cut out or duplicated renumbers
        every message after it, and where it happened nothing tells for sure (bundles of one size and count keep
        later index entries agreeing). None of the segment is trusted."""
        reason = f"{why}: a bundle cut out or duplicated renumbers the messages after it; none of the file is trusted"
        return Hole(self.seg.path, at, self.seg.base, self.seg.last, code, reason, self.seg.base - 1)

    def _claimed_last(self) -> int | None:
        if self.stop_seq is not None:
            return self.stop_seq - 1
        return self.seg.last

    def finish(self, tail: Tail | None, *, limit_seq: int | None = None, rest_checked: bool = False) -> Hole | None:
        """What the read could not return (None: everything it covered). `tail`: the walk's end of file (None when it
        stopped at `stop_offset` or at `limit_seq`, the highest seq it was asked for).

        A read stopped by `limit_seq` has not reached the evidence after it (the name's last seq, the next range's
        index entry), yet a bundle cut out or duplicated before the bound renumbers the seqs it returned: the rest
        of its range is walked here, headers only (no decompression), and checked like a whole read (unless
        `rest_checked`: a headers-only pass over the whole range came first, `range_hole`)."""
        bounded = limit_seq is not None and tail is None and self.last_seq is not None and self.last_seq >= limit_seq
        if bounded and rest_checked:
            return self._head_hole()
        return self._zero_trim(self._finish(tail, walk_rest=bounded))

    def _finish(self, tail: Tail | None, *, walk_rest: bool = False) -> Hole | None:
        if walk_rest:
            try:
                tail = self._walk_rest()
            except TankFormatError as err:  # past the bound: the seqs returned are trusted, the rest is a hole
                return self._failed(err)
        head = self._head_hole()
        if head is not None:
            return head
        if tail is None:  # stopped at `stop_offset`: the next entry's bundle must start exactly there
            if self.stop_offset is None or self.stop_seq is None:
                return None
            nxt = self.start_seq if self.last_seq is None else self.last_seq + 1
            if self.end == self.stop_offset and (nxt == self.stop_seq or self._sparse_at(self.stop_offset)):
                return None  # a sparse bundle carries its own first seq: the next range checks it (§3.3)
            why = (
                f"the index says seq {self.stop_seq} starts at offset {self.stop_offset}; the bundles read end at "
                f"offset {self.end} before seq {nxt}"
            )
            return self._renumbered(self.end, "index-data", why)
        return self._end_of_file(tail)

    def _walk_rest(self) -> Tail | None:
        """Observe the bundle headers after the last one read, to the end of the range; the walk's tail."""
        assert self.last_seq is not None
        walk = self.seg.tables(start=self.end, next_seq=self.last_seq + 1, stop_offset=self.stop_offset, continued=True)
        for file_offset, table in walk:
            self.observe(file_offset, table)
        return walk.tail

    def failed(self, err: TankFormatError) -> Hole:
        """The read stopped at malformed data (`err`): everything after the last message it returned is missing (a
        malformed bundle fails the whole decoded chunk it is in, so the hole starts after the last chunk out)."""
        hole = self._zero_trim(self._failed(err))
        assert hole is not None
        return hole

    def _head_hole(self) -> Hole | None:
        """The checks of a read's start alone: an index entry or the first seq the bundles contradict."""
        if self.mismatch is not None:
            _, off, why = self.mismatch
            return self._renumbered(off, "index-data", f"index entry at offset {off}: {why}, the data disagrees")
        if self.start == 0 and self.first_seq is not None and self.first_seq != self.seg.base:
            reason = f"name says base {self.seg.base}, first message has seq {self.first_seq}"
            return Hole(self.seg.path, 0, self.seg.base, self._claimed_last(), "name-base", reason, self.seg.base - 1)
        return None

    def _zero_trim(self, hole: Hole | None) -> Hole | None:
        """A hole that starts at zero bytes right after a bundle whose own last byte is zero: the zeros (a crash
        that extended the file without writing it, or a zeroed page) may start inside that bundle, which then
        decodes with part of a value zeroed (no checksums, §11.18). That bundle is not trusted either."""
        first = self.last_bundle_first
        if hole is None or first is None or hole.trusted_through < first or hole.offset != self.end:
            return hole
        with open(self.seg.path, "rb") as fh:
            fh.seek(max(self.end - 1, 0))
            around = fh.read(2)
        if around != b"\0\0":
            return hole
        at = self.last_bundle_offset
        reason = f"{hole.reason}; the zeros there may start inside the bundle at offset {at} (seqs from {first})"
        return replace(hole, offset=at, first_seq=first, trusted_through=first - 1, reason=reason)

    def _failed(self, err: TankFormatError) -> Hole:
        if self.mismatch is not None:
            hole = self._finish(None)
            assert hole is not None
            return hole
        got = self.start_seq - 1 if self.last_seq is None else self.last_seq
        claimed = self._claimed_last()
        at = err.offset if err.path in (None, self.seg.path) else self.end
        return Hole(self.seg.path, at, got + 1, claimed, "format", err.message, got)

    def _sparse_at(self, offset: int) -> bool:
        """Whether the bundle starting at `offset` is sparse (its header's flags byte, after the length varint)."""
        with open(self.seg.path, "rb") as fh:
            fh.seek(offset)
            head = fh.read(6)
        try:
            _, pos = decode_varint(head, 0)
        except TankFormatError:
            return False
        return pos < len(head) and bool(head[pos] & SPARSE)

    def _end_of_file(self, tail: Tail) -> Hole | None:
        seg = self.seg
        got = self.start_seq - 1 if self.last_seq is None else self.last_seq
        if tail.torn_bytes:
            beyond = data_beyond_break(seg, tail)
            if beyond is not None:
                reason = f"corrupt bytes inside the file, data follows ({beyond}); the rest of the file is not read"
                return Hole(seg.path, tail.valid_end, got + 1, seg.last, "mid-file-corruption", reason, got)
        if seg.is_active:
            return None  # a torn tail of the active segment is an append in flight (§3.11)
        assert seg.last is not None  # an RO name carries its last seq
        if got < seg.last:
            if tail.torn_bytes:  # cut inside a bundle: a truncation, what precedes it is as written
                code, reason = "torn-tail", f"RO segment truncated: {tail.torn_bytes} bytes after the last bundle"
                return Hole(seg.path, tail.valid_end, got + 1, seg.last, code, reason, got)
            if self.last_seq is None and self.start == 0:
                code, reason = "empty-segment", "RO segment without any complete bundle"
                return Hole(seg.path, 0, seg.base, seg.last, code, reason, seg.base - 1)
            # truncated at a bundle boundary, or a bundle cut out anywhere (the ones after it renumbered)
            why = f"name says last {seg.last}, the content ends at seq {got} (truncated at a bundle boundary or not)"
            return self._renumbered(tail.valid_end, "name-last", why)
        if got > seg.last:  # more than the name says: a bundle duplicated somewhere
            why = f"name says last {seg.last}, the content ends at seq {got}"
            return self._renumbered(self.last_bundle_offset, "name-last", why)
        return None


def audited(walk: SegmentWalk[C], audit: SegmentAudit) -> Iterator[C]:
    """The walk's chunks, each shown to `audit` first; malformed data raises the hole it leaves instead (`HoleError`:
    file, offset, the seqs from the last chunk out)."""
    try:
        for chunk in walk:
            audit.observe(chunk.file_offset, chunk.table, chunk.seq)
            yield chunk
    except TankFormatError as err:
        if isinstance(err, HoleError):
            raise
        raise audit.failed(err).error() from None


def range_hole(
    seg: Segment,
    *,
    start: int = 0,
    next_seq: int | None = None,
    stop_offset: int | None = None,
    stop_seq: int | None = None,
) -> Hole | None:
    """A headers-only pass over a segment, or over a range of it as `SegmentAudit` takes it (no decompression: cheap
    beside a decode): the hole a read of it would meet, or None. A reader that hands rows on as it decodes asks
    first and stops at `Hole.trusted_through`: a bundle cut out or duplicated renumbers what follows it, and zeros
    may run into the bundle before a break, so the decoding read alone would hand on rows before it knows. What only
    a decode finds (a message set that does not decompress) fails the whole decoded chunk it is in."""
    audit = SegmentAudit(seg, start=start, next_seq=next_seq, stop_offset=stop_offset, stop_seq=stop_seq)
    walk = seg.tables(start=start, next_seq=next_seq, stop_offset=stop_offset)
    try:
        for file_offset, table in walk:
            audit.observe(file_offset, table)
    except TankFormatError as err:
        return audit.failed(err)
    return audit.finish(walk.tail)


def segment_problems(audit: SegmentAudit, tail: Tail) -> list[Problem]:
    """What `verify` reports about a whole segment read with `audit` (name against content, torn tails, corruption
    inside the file), in its words; the index is checked by `format.index.verify_index`."""
    seg = audit.seg
    problems = []
    beyond = data_beyond_break(seg, tail) if tail.torn_bytes else None
    if beyond is not None:
        problems.append(
            Problem(
                seg.path,
                tail.valid_end,
                "mid-file-corruption",
                f"the bytes here do not form a bundle, but data follows ({beyond}): corruption inside the file, "
                f"not a torn tail; readers stop here and salvage cuts nothing; needs a human",
                aborts=seg.is_active,
            )
        )
    elif tail.torn_bytes:
        if seg.is_active:
            msg = (
                f"torn tail: {tail.torn_bytes} bytes after the last complete bundle (an append in flight if the "
                f"broker runs; offline the broker exits at open, §3.11; `rebuild_indexes --salvage` fixes it)"
            )
        else:
            msg = f"torn tail in an RO segment: {tail.torn_bytes} bytes after the last complete bundle (§3.11)"
        problems.append(Problem(seg.path, tail.valid_end, "torn-tail", msg, aborts=seg.is_active))
    if not audit.bundles:
        if not seg.is_active:
            problems.append(Problem(seg.path, 0, "empty-segment", "RO segment without any complete bundle"))
        return problems
    if audit.first_seq != seg.base:
        problems.append(
            Problem(seg.path, 0, "name-base", f"name says base {seg.base}, first message has seq {audit.first_seq}")
        )
    if not seg.is_active and audit.last_seq != seg.last:
        problems.append(
            Problem(
                seg.path,
                audit.last_bundle_offset,
                "name-last",
                f"name says last {seg.last}, last message has seq {audit.last_seq} (routing uses the name, §4.4)",
            )
        )
    return problems


def segment_loss(audit: SegmentAudit, tail: Tail | None) -> Unread | None:
    """After a whole segment was read with `audit`: what the read could not return (a `Hole`), or the bytes it left
    unread after the last complete bundle of an RO segment that still reached the name's last seq. A torn tail of
    the active segment is an append in flight while the broker runs (§3.11): a warning, nothing lost."""
    hole = audit.finish(tail)
    if hole is not None:
        return hole.unread(tail.file_size if tail is not None else None)
    if tail is None or not tail.torn_bytes:
        return None
    if not audit.seg.is_active:
        reason = "torn tail after the last complete bundle of an RO segment: bytes after the name's last seq"
        return Unread(audit.seg.path, reason, tail.valid_end, tail.torn_bytes)
    log.warning(
        "%s @%d: torn tail of %d bytes after the last complete bundle (an append in flight if the broker runs)",
        audit.seg.path,
        tail.valid_end,
        tail.torn_bytes,
    )
    return None


@dataclass
class SegmentCheck:
    """What verifying one segment found: its derived seq range and problems."""

    path: str
    first_seq: int | None = None
    last_seq: int | None = None
    messages: int = 0
    bundles: int = 0
    valid_end: int = 0
    problems: list[Problem] = field(default_factory=list)


def check_segment(seg: Segment | str, *, check_index: bool = True) -> SegmentCheck:
    """Decode every bundle and message of a segment; compare with its name and index (the evidence every reader's
    completeness check uses, `storage.completeness`)."""
    if isinstance(seg, str):
        parsed = parse_name(os.path.basename(seg), seg)
        if not isinstance(parsed, FileName) or parsed.kind is Kind.INDEX:
            return SegmentCheck(seg, problems=[Problem(seg, None, "bad-name", "not a segment file name")])
        seg = Segment(seg, name=parsed)
    result = SegmentCheck(seg.path)
    audit = SegmentAudit(seg)
    starts: list[np.ndarray] = []
    firsts: list[np.ndarray] = []
    walk = seg.chunks()
    try:
        for chunk in walk:
            audit.observe(chunk.file_offset, chunk.table, chunk.cols.seq)
            starts.append(chunk.table.offsets + chunk.file_offset)
            firsts.append(chunk.table.firsts)
    except TankFormatError as err:
        result.problems.append(Problem(seg.path, err.offset, "format", err.message))
        return result
    except OSError as err:
        result.problems.append(Problem(seg.path, None, "io", str(err)))
        return result
    result.first_seq, result.last_seq = audit.first_seq, audit.last_seq
    result.messages, result.bundles = audit.messages, audit.bundles
    tail = walk.tail
    assert tail is not None
    result.valid_end = tail.valid_end
    result.problems += segment_problems(audit, tail)
    if not audit.bundles:
        return result
    if check_index:
        index_path = seg.index_path
        try:
            with open(index_path, "rb") as fh:
                data: bytes | None = fh.read()
        except FileNotFoundError:
            data = None
        bundles = (np.concatenate(starts), np.concatenate(firsts))
        result.problems += verify_index(index_path, data, bundles, seg.base, seg.size, active=seg.is_active)
    return result
