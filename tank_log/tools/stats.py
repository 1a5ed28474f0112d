"""`tank-log stats`: per-partition figures (segments, bytes, messages, seq/time ranges, key kinds, bundle kinds)."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from tank_log.errors import TankFormatError
from tank_log.format.bundle import CODEC_MASK, SPARSE
from tank_log.format.messages import MessageColumns, tombstones
from tank_log.lakehouse import ExportedSeqs
from tank_log.maintenance.compaction.passes import dirty_ratio
from tank_log.storage.cleanup_marks import read_cleanup_log
from tank_log.storage.completeness import SegmentAudit, audited, segment_loss
from tank_log.storage.datadir import Partition, Unread, scan_partitions

log = logging.getLogger(__name__)


@dataclass
class PartitionStats:
    topic: str
    partition: int
    segments: int = 0
    ro_segments: int = 0
    bytes: int = 0
    messages: int = 0
    first_seq: int | None = None
    last_seq: int | None = None
    min_ts: int | None = None
    max_ts: int | None = None
    keyed: int = 0
    keyless: int = 0
    keyless_empty: int = 0
    tombstones: int = 0
    distinct_keys: int = 0
    bundles: int = 0
    snappy_bundles: int = 0
    sparse_bundles: int = 0
    torn_bytes: int = 0
    dirty_ratio: float | None = None  # cleanup-policy partitions: RO bytes after the .cleanup.log mark ÷ RO bytes
    export_lag_messages: int | None = None  # with an export table: messages it has not received
    export_lag_seconds: float | None = None  # ... and the age of the oldest of them (0: none)
    error: str | None = None  # why the figures stop early (malformed data, I/O error)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def partition_stats(
    part: Partition,
    *,
    distinct_keys: bool = True,
    unread: list[Unread] | None = None,
    exported: ExportedSeqs | None = None,
    now_s: float | None = None,
) -> PartitionStats:
    """The figures of one partition; the torn tails of its segments that lose data (RO segments, or data after
    corrupt bytes) are appended to `unread`. With `exported`, the lag of that Delta table behind the partition.

    Raises:
        TableUnreadable: `exported`'s table cannot be read.
    """
    st = PartitionStats(part.topic, part.id, segments=len(part.segments), ro_segments=len(part.ro))
    if part.overlaps:  # two files claim the same seqs: no figure of the partition can be trusted
        st.error = f"nothing counted: {part.overlaps[0]}"
        return st
    keys: set[bytes] = set()
    after = None if exported is None else (exported.last_seq(part.topic, part.id) or 0)
    oldest_unexported_ms: int | None = None
    if after is not None:
        st.export_lag_messages = 0
    for sf in part.segments:
        st.bytes += sf.size
        audit = SegmentAudit(sf)
        walk = sf.chunks()
        for chunk in audited(walk, audit):
            c = chunk.cols
            if not len(c):
                continue
            keyed = _add_chunk(st, chunk.table.flags, c)
            if after is not None:
                behind = c.seq > after
                if behind.any():
                    st.export_lag_messages = (st.export_lag_messages or 0) + int(behind.sum())
                    oldest = int(c.ts[behind].min())
                    oldest_unexported_ms = oldest if oldest_unexported_ms is None else min(oldest, oldest_unexported_ms)
            if distinct_keys:
                for i in np.flatnonzero(keyed).tolist():
                    keys.add(c.key(i))  # type: ignore[arg-type]
        st.torn_bytes += walk.tail.torn_bytes if walk.tail else 0
        loss = segment_loss(audit, walk.tail)
        if loss is not None and unread is not None:
            unread.append(loss)
    st.distinct_keys = len(keys)
    if after is not None:
        now = time.time() if now_s is None else now_s
        st.export_lag_seconds = 0.0 if oldest_unexported_ms is None else max(0.0, now - oldest_unexported_ms / 1000)
    if part.config.cleanup_policy == "cleanup":
        base = os.path.dirname(os.path.dirname(part.path))
        st.dirty_ratio = round(dirty_ratio(part, read_cleanup_log(base).get(part.key, 0)), 6)
    return st


def _add_chunk(st: PartitionStats, bundle_flags: np.ndarray, c: MessageColumns) -> np.ndarray:
    """Count a decoded chunk's bundles and messages into `st`: codecs, sparse bundles, seqs, timestamps, keys and
    tombstones; returns which messages have a key."""
    flags = np.array(bundle_flags, dtype=np.uint8)
    st.bundles += len(flags)
    st.snappy_bundles += int(((flags & CODEC_MASK) != 0).sum())
    st.sparse_bundles += int(((flags & SPARSE) != 0).sum())
    st.messages += len(c)
    st.first_seq = int(c.seq[0]) if st.first_seq is None else st.first_seq
    st.last_seq = int(c.seq[-1])
    lo, hi = int(c.ts.min()), int(c.ts.max())
    st.min_ts = lo if st.min_ts is None else min(st.min_ts, lo)
    st.max_ts = hi if st.max_ts is None else max(st.max_ts, hi)
    keyed = c.key_off >= 0
    empty = c.val_len == 0
    st.keyed += int(keyed.sum())
    st.keyless += int((~keyed).sum())
    st.keyless_empty += int((~keyed & empty).sum())
    st.tombstones += int(tombstones(keyed, c.val_len).sum())
    return keyed


def stats_path(
    path: str | os.PathLike[str],
    topics: list[str] | None = None,
    *,
    unread: list[Unread] | None = None,
    exported: ExportedSeqs | None = None,
) -> list[PartitionStats]:
    """Figures of every partition; one malformed partition gets its `error`, the others are still counted. What the
    figures leave out (partition directories and segment files the broker never reads, data lost in torn tails of RO
    segments) is appended to `unread`."""
    out = []
    parts, left_out = scan_partitions(path, topics)
    for u in left_out:
        log.warning("%s", u)
    if unread is not None:
        unread += left_out
    for p in parts:
        try:
            out.append(partition_stats(p, unread=unread, exported=exported))
        except (TankFormatError, OSError) as err:
            out.append(PartitionStats(p.topic, p.id, segments=len(p.segments), error=str(err)))
    return out


def format_table(rows: list[PartitionStats]) -> str:
    cols = [
        "topic",
        "partition",
        "segments",
        "bytes",
        "messages",
        "first_seq",
        "last_seq",
        "keyed",
        "keyless",
        "tombstones",
        "distinct_keys",
        "bundles",
        "snappy_bundles",
        "sparse_bundles",
        "torn_bytes",
    ]
    table = [cols] + [["" if getattr(r, c) is None else str(getattr(r, c)) for c in cols] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
    return "\n".join(
        "  ".join(v.ljust(w) if i < 1 else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths, strict=True)))
        for row in table
    )
