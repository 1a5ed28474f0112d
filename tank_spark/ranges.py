"""Read tasks over segment files, shared by the `tank` data source and the Delta export: which byte ranges of which
segments hold the rows within some bounds (pruned by names, started at index entries, docs/FORMAT.md §4.4), and
reading one range into Arrow batches of the row schema (`tank_spark.schema.ROW_SCHEMA`)."""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import InputPartition

from tank_log.errors import TankFormatError, UnrepresentableData
from tank_log.format.arrow import skip_pandas_detection
from tank_log.format.index import usable_entries
from tank_log.jobs.allocator import reuse_freed_buffers
from tank_log.jobs.planning import select_partitions
from tank_log.storage.completeness import Hole, SegmentAudit, audited, layout_hole, range_hole
from tank_log.storage.datadir import MOVE_RETRIES, OVERLAP, Partition, Unread, rescan_partition
from tank_log.storage.segment import Segment, seq_mask
from tank_spark.schema import MAX_TS_MS, ROW_SCHEMA, TS_RAW

DEFAULT_SPLIT_BYTES = 64 << 20
SPARK_LONG_MAX = (1 << 63) - 1

LostRange = tuple[str, int, int, int]  # topic, partition, first and last seq deleted before they could be read


def parse_time_ms(value: str) -> int:
    """ms since the epoch, or an ISO date/time (UTC unless it says otherwise)."""
    value = value.strip()
    if value.lstrip("-").isdigit():
        return int(value)
    t = dt.datetime.fromisoformat(value)
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return int(t.timestamp() * 1000)


@dataclass(frozen=True)
class SegmentRange(InputPartition):
    """One read task: a whole segment or a byte range [start, stop) of it starting at an indexed bundle."""

    topic: str
    partition: int
    path: str
    base: int
    start: int
    next_seq: int
    stop: int | None
    min_seq: int | None
    max_seq: int | None
    min_ts: int | None
    max_ts: int | None
    error: str | None = None  # planning found the segment inconsistent: reading raises this error
    error_path: str | None = None
    error_offset: int | None = None
    stop_seq: int | None = None  # the seq after the range's last (None: to the end of the active segment)
    hole: Hole | None = None  # planning found these seqs missing (`completeness.layout_hole`): reading raises it

    @property
    def seqs(self) -> tuple[int, int | None]:
        """The first and last seq this range covers (last None: open-ended)."""
        lo = self.next_seq if self.min_seq is None else max(self.next_seq, self.min_seq)
        his = [v for v in (self.max_seq, None if self.stop_seq is None else self.stop_seq - 1) if v is not None]
        return lo, min(his) if his else None


@dataclass
class Bounds:
    """Row bounds of a read; `seq_ranges` (topic, partition) → (min_seq, max_seq) restricts to those partitions."""

    seq_ranges: dict[tuple[str, int], tuple[int | None, int | None]] | None = None
    topics: set[str] | None = None
    partitions: set[int] | None = None
    min_seq: int | None = None
    max_seq: int | None = None
    min_ts: int | None = None
    max_ts: int | None = None

    def seq_lo(self, v: int) -> None:
        self.min_seq = v if self.min_seq is None else max(self.min_seq, v)

    def seq_hi(self, v: int) -> None:
        self.max_seq = v if self.max_seq is None else min(self.max_seq, v)

    def ts_lo(self, v: int) -> None:
        self.min_ts = v if self.min_ts is None else max(self.min_ts, v)

    def ts_hi(self, v: int) -> None:
        self.max_ts = v if self.max_ts is None else min(self.max_ts, v)


def partition_key(topic: str, partition: int) -> str:
    """`topic/partition`: how JSON options, stream offsets and file counts name a partition."""
    return f"{topic}/{partition}"


def parse_partition_key(text: str) -> tuple[str, int]:
    """(topic, partition) of a `partition_key` (a topic may contain `/`: the partition follows the last one)."""
    topic, _, pid = text.rpartition("/")
    return topic, int(pid)


def parse_seq_ranges(text: str) -> dict[tuple[str, int], tuple[int | None, int | None]]:
    """`{"topic/partition": [min_seq, max_seq], ...}` (JSON; null = open)."""
    return {parse_partition_key(key): (lo, hi) for key, (lo, hi) in json.loads(text).items()}


def format_seq_ranges(ranges: dict[tuple[str, int], tuple[int | None, int | None]]) -> str:
    return json.dumps({partition_key(t, p): [lo, hi] for (t, p), (lo, hi) in ranges.items()})


def deleted_range(part: Partition | None, topic: str, pid: int, lo: int, hi: int) -> LostRange | None:
    """The seqs of [lo, hi] retention deleted (§5): those below the first segment of a `delete`-policy partition, or
    all of them when the partition is gone. A `cleanup` partition's missing seqs are compaction's: never lost."""
    if part is not None and part.config.cleanup_policy != "delete":
        return None
    first = part.segments[0].base if part is not None and part.segments else None
    if first is not None and first <= lo:
        return None
    return topic, pid, lo, hi if first is None else min(hi, first - 1)


def _partition_bounds(b: Bounds, key: tuple[str, int]) -> Bounds | None:
    """The bounds for one partition (None: not selected)."""
    if b.seq_ranges is None:
        return b
    if key not in b.seq_ranges:
        return None
    lo, hi = b.seq_ranges[key]
    pb = Bounds(None, b.topics, b.partitions, b.min_seq, b.max_seq, b.min_ts, b.max_ts)
    if lo is not None:
        pb.seq_lo(lo)
    if hi is not None:
        pb.seq_hi(hi)
    return pb


EMPTY_RANGE = SegmentRange("", 0, "", 1, 0, 1, 0, None, None, None, None)  # a read of nothing (Spark wants a task)


def plan_ranges(paths: list[str], b: Bounds, include_active: bool, split_bytes: int) -> list[SegmentRange]:
    """Read tasks for the segments that can hold rows within the bounds (pruned by names, seeked by indexes)."""
    parts = [sel.partition for sel in select_partitions(paths, b.topics, require_match=False)]
    return partition_ranges(parts, b, include_active, split_bytes) or [EMPTY_RANGE]


def partition_ranges(parts: list[Partition], b: Bounds, include_active: bool, split_bytes: int) -> list[SegmentRange]:
    """`plan_ranges` over partitions already scanned."""
    out = []
    for part in parts:
        if b.topics is not None and part.topic not in b.topics:
            continue
        if b.partitions is not None and part.id not in b.partitions:
            continue
        pb = _partition_bounds(b, part.key)
        if pb is None:
            continue
        holes = [u for u in part.unread if u.first_seq is not None]
        if part.overlaps:  # two files claim the same seqs: nothing of the partition is read (datadir.OVERLAP)
            out.append(_hole_range(part, part.overlaps[0], pb))
            continue
        segments: list[Segment | Unread] = [*part.ro, *holes]
        segments.sort(key=lambda s: s.base if isinstance(s, Segment) else s.first_seq or 0)
        segments += [part.active] if part.active and include_active else []
        for sf in segments:
            base, last = (sf.base, sf.last) if isinstance(sf, Segment) else (sf.first_seq or 0, sf.last_seq)
            if pb.max_seq is not None and base > pb.max_seq:
                continue
            if pb.min_seq is not None and last is not None and last < pb.min_seq:
                continue
            if isinstance(sf, Unread):  # a segment no reader can open (a directory, a FIFO, a lost file): a hole
                out.append(_hole_range(part, sf, pb))
                continue
            out += segment_ranges(part.topic, part.id, sf, pb, split_bytes)
    return out


def _hole_range(part: Partition, u: Unread, b: Bounds) -> SegmentRange:
    """A read task that fails with the seqs a scan found missing (`completeness.layout_hole`), within the bounds. An
    overlap leaves nothing of the partition readable: its hole is every seq the read asked for."""
    hole = layout_hole(u)
    if u.code == OVERLAP:
        last = part.segments[-1].last if part.segments else None
        hole = replace(hole, first_seq=part.segments[0].base, last_seq=last)
    first = hole.first_seq if b.min_seq is None else max(hole.first_seq, b.min_seq)
    last = hole.last_seq if b.max_seq is None else b.max_seq if hole.last_seq is None else min(hole.last_seq, b.max_seq)
    hole = replace(hole, first_seq=first, last_seq=last, trusted_through=first - 1)
    stop_seq = None if last is None else last + 1
    message = str(hole.error().message)
    return SegmentRange(
        part.topic,
        part.id,
        u.path,
        first,
        0,
        first,
        None,
        b.min_seq,
        b.max_seq,
        None,
        None,
        message,
        u.path,
        None,
        stop_seq,
        hole,
    )


def segment_ranges(topic: str, pid: int, sf: Segment, b: Bounds, split_bytes: int) -> list[SegmentRange]:
    """Split a segment at index entries into ranges of about split_bytes; start at the entry for min_seq."""
    entries = usable_entries(sf.index_path, sf.size) or [(0, 0)]  # no usable index: the whole segment
    if b.min_seq is not None and b.min_seq > sf.base:  # §4.4 step 3: greatest entry with rel <= target
        target = b.min_seq - sf.base
        entries = [e for e in entries if e[0] <= target][-1:] + [e for e in entries if e[0] > target]
    cuts = [entries[0]]
    for e in entries[1:]:
        if e[1] - cuts[-1][1] >= split_bytes:
            cuts.append(e)
    if cuts != [(0, 0)]:  # read from index entries: they must agree with the data, or seqs would differ from a scan
        try:
            sf.check_headers()
        except TankFormatError as err:  # none of the segment is read: its seqs are the hole
            seqs = f"seqs {sf.base}..{'' if sf.last is None else sf.last}"
            at = (f"{seqs} not read: {err.message}", err.path, err.offset)
            return [SegmentRange(topic, pid, sf.path, sf.base, 0, sf.base, None, None, None, None, None, *at)]
        except FileNotFoundError:  # rolled, compacted or deleted since the scan: the read follows it (§9 rule 2)
            cuts = [(0, 0)]
    return [
        SegmentRange(
            topic,
            pid,
            sf.path,
            sf.base,
            off,
            sf.base + rel,
            cuts[i + 1][1] if i + 1 < len(cuts) else None,
            b.min_seq,
            b.max_seq,
            b.min_ts,
            b.max_ts,
            stop_seq=sf.base + cuts[i + 1][0] if i + 1 < len(cuts) else None if sf.last is None else sf.last + 1,
        )
        for i, (rel, off) in enumerate(cuts)
    ]


def spark_ts(ts_ms: np.ndarray) -> tuple[pa.Array, pa.Array]:
    """(ts, ts_raw) row columns of u64 producer timestamps: see `tank_spark.schema.MAX_TS_MS`."""
    out = ts_ms > np.uint64(MAX_TS_MS)
    if not out.any():
        us = ts_ms.astype(np.int64) * 1000
        return pa.array(us, pa.timestamp("us", tz="UTC")), pa.nulls(len(ts_ms), TS_RAW.type)
    us = np.where(out, 0, ts_ms).astype(np.int64) * 1000
    raw = pc.cast(pa.array(ts_ms, pa.uint64()), TS_RAW.type)
    keep = pa.array(out)
    return (
        pa.array(us, pa.timestamp("us", tz="UTC"), mask=out),
        pc.if_else(keep, raw, pa.nulls(len(ts_ms), TS_RAW.type)),
    )


def read_range(
    r: SegmentRange,
    stopped_by: list[TankFormatError] | None = None,
    lost: list[LostRange] | None = None,
    *,
    trusted_only: bool = False,
) -> Iterator[pa.RecordBatch]:
    """Arrow batches of ROW_SCHEMA for one range (library code only; also used by the export job).

    A segment that vanished since planning was rolled (§2.5), replaced by compaction (§6.4) or deleted by retention
    (§5) while the broker ran (§9 rule 2): its seqs are read from the partition as it is now, and those deleted
    (below the first segment of a `delete`-policy partition) are appended to `lost`.

    Every read goes through the completeness check (`storage.completeness.SegmentAudit`): a range that cannot return
    every seq its segment's name and index claim raises `HoleError` (file, offset, seq range) once its batches are
    out; the error says up to which seq they can be trusted (`Hole.trusted_through`). With `trusted_only` (for a
    reader that keeps what a failed range handed on: a stream that skips holes), a headers-only pass over the range
    comes first (`completeness.range_hole`) and no row past that seq is handed on; a Spark job fails whole on the
    error and the export drops what a range read past it (`export.corruption`), so they need not pay for it.

    Raises:
        TankFormatError: malformed data or a hole (file and offset) — unless `stopped_by` is given: then the read
            stops at the first malformed chunk and the error is appended there (the batches before it were complete;
            with a `HoleError`, up to its `trusted_through`).
        FileNotFoundError: the range's segment vanished again on every one of `MOVE_RETRIES` re-plans.
    """
    reuse_freed_buffers()  # an executor's Python worker decodes chunk after chunk (jobs/allocator.py)
    skip_pandas_detection()  # and builds Arrow arrays: pyarrow would import pandas (format/arrow.py)
    try:
        yield from _read_checked(r, lost, 0, trusted_only)
    except TankFormatError as err:
        if stopped_by is None:
            raise
        stopped_by.append(err)


def _read_checked(
    r: SegmentRange, lost: list[LostRange] | None, moves: int, trusted_only: bool
) -> Iterator[pa.RecordBatch]:
    if r.hole is not None:
        raise r.hole.error()
    if r.error is not None:
        raise TankFormatError(r.error, r.error_path, r.error_offset)
    try:
        yield from _read_range(r, trusted_only)
    except FileNotFoundError:
        if moves >= MOVE_RETRIES:
            raise FileNotFoundError(f"{r.path}: segment vanished on {MOVE_RETRIES} re-plans of its range") from None
        yield from _read_moved(r, lost, moves + 1, trusted_only)


def _read_moved(
    r: SegmentRange, lost: list[LostRange] | None, moves: int, trusted_only: bool
) -> Iterator[pa.RecordBatch]:
    """Read the seqs of a range whose segment vanished since planning from the partition's segments now."""
    lo, hi = r.seqs
    try:
        part: Partition | None = rescan_partition(os.path.dirname(r.path), r.topic, r.partition)
    except FileNotFoundError:
        part = None  # the partition directory itself is gone
    now = part.segments if part is not None else []
    if hi is None:  # an open-ended read of the active segment follows it to its RO name (§2.5)
        segments = [sf for sf in now if sf.base == r.base]
    else:
        segments = [sf for sf in now if sf.base <= hi and (sf.last is None or sf.last >= lo)]
        gone = deleted_range(part, r.topic, r.partition, lo, hi)
        if lost is not None and gone is not None:
            lost.append(gone)
    bounds = Bounds(min_seq=lo, max_seq=hi, min_ts=r.min_ts, max_ts=r.max_ts)
    for sf in segments:
        for sub in segment_ranges(r.topic, r.partition, sf, bounds, split_bytes=1 << 62):
            yield from _read_checked(sub, lost, moves, trusted_only)


def _read_range(r: SegmentRange, trusted_only: bool) -> Iterator[pa.RecordBatch]:
    """The range's rows; with `trusted_only`, none past what the evidence trusts: a headers-only pass over the range
    comes first (`completeness.range_hole`), so a hole that renumbers the rows before it fails the range before they
    are out."""
    seg = Segment(r.path, r.base)
    topic = pa.array([r.topic], pa.string())
    stop_seq = r.stop_seq if r.stop is not None else None
    found = None
    if trusted_only:
        found = range_hole(seg, start=r.start, next_seq=r.next_seq, stop_offset=r.stop, stop_seq=stop_seq)
    max_seq = r.max_seq
    if found is not None:
        if found.trusted_through < r.seqs[0]:
            raise found.error()
        max_seq = found.trusted_through if max_seq is None else min(max_seq, found.trusted_through)
    audit = SegmentAudit(seg, start=r.start, next_seq=r.next_seq, stop_offset=r.stop, stop_seq=stop_seq)
    chunks = seg.batch_chunks(start=r.start, next_seq=r.next_seq, stop_seq=max_seq, stop_offset=r.stop)
    for chunk in audited(chunks, audit):
        seq, ts = chunk.seq, chunk.batch.column(1).to_numpy()
        in_seqs = seq_mask(seq, r.min_seq, max_seq)
        sel = np.ones(len(seq), dtype=bool) if in_seqs is None else in_seqs
        if r.min_ts is not None:
            sel &= ts >= np.uint64(max(r.min_ts, 0))
        if r.max_ts is not None:
            sel &= ts <= np.uint64(max(r.max_ts, 0)) if r.max_ts >= 0 else np.zeros(len(seq), bool)
        if not sel.any():
            continue
        if int(seq[-1]) > SPARK_LONG_MAX:  # seqs increase: the last is the largest
            i = next(k for k, last in enumerate(chunk.table.lasts) if last > SPARK_LONG_MAX)
            at = chunk.file_offset + int(chunk.table.offsets[i])  # the first bundle holding such a seq
            raise UnrepresentableData(
                f"seq {int(seq[-1])} exceeds Spark's long (2**63-1): valid TANK data (§3.6, u64) that rows cannot hold",
                r.path,
                at,
            )
        batch = chunk.batch if sel.all() else chunk.batch.filter(sel)
        n = batch.num_rows
        ts, ts_raw = spark_ts(batch.column("ts").to_numpy())
        yield pa.RecordBatch.from_arrays(
            [
                topic.take(pa.array(np.zeros(n, dtype=np.int32))),
                pa.array(np.full(n, r.partition, dtype=np.int32)),
                pc.cast(batch.column("seq"), pa.int64()),
                ts,
                batch.column("key"),
                batch.column("value"),
                ts_raw,
            ],
            schema=ROW_SCHEMA,
        )
    if found is not None:
        raise found.error()
    hole = audit.finish(chunks.tail, limit_seq=r.max_seq, rest_checked=trusted_only)
    if hole is not None:  # the read could not return every seq the segment claims (storage/completeness.py)
        raise hole.error()
