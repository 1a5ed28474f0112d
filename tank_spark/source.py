"""The Spark data source "tank": `spark.read.format("tank").load(base_path)` (PySpark Python Data Source API).

    from tank_spark.source import register
    register(spark)
    df = spark.read.format("tank").option("topics", "orders").load("/var/lib/tank")

Schema: topic string, partition int, seq long, ts timestamp (from the producer's ms), key binary, value binary.
Options: `topics` (a,b), `partitions` (0,3), `min_seq`/`max_seq`, `min_ts`/`max_ts` (ms since the epoch or an ISO
date/time), `seq_ranges` (JSON `{"topic/partition": [min_seq, max_seq]}`: only these partitions, each its own range),
`include_active` (default true: the active segment up to its last complete bundle; a torn tail is not
an error), `split_bytes` (default 64 MiB). Several base paths: `load("a,b")` or option `paths`.

Parallelism: one input partition per segment, or per bounded byte range of a large segment cut at index entries
(TANK_FORMAT.md §4.4). Pruning: the topic, partition and seq options skip whole segments by their names and start
reads at an index entry; `ts` bounds are applied per batch (segment names carry no message times); WHERE clauses are
evaluated by Spark. With option `pushdown=true`, WHERE clauses on topic/partition/seq prune too (see
TankPushdownReader for the caveat). The reader yields Arrow record batches.

The files must be readable at the same path on every executor (local disk in local mode, a shared filesystem on a
cluster). Reading while the broker runs is fine (TANK_FORMAT.md §9 rule 2): files that vanish are skipped.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)

SCHEMA_DDL = "topic string, partition int, seq long, ts timestamp, key binary, value binary"
ARROW_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("seq", pa.int64()),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("key", pa.binary()),
        ("value", pa.binary()),
    ]
)
DEFAULT_SPLIT_BYTES = 64 << 20


def register(spark) -> None:
    """Register the "tank" format on a session (and enable Python data source filter pushdown)."""
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    spark.dataSource.register(TankDataSource)


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


class TankDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "tank"

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema) -> DataSourceReader:
        if str(self.options.get("pushdown", "false")).lower() == "true":
            return TankPushdownReader(self.options)
        return TankReader(self.options)


def _csv(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


class TankReader(DataSourceReader):
    def __init__(self, options: dict):
        paths = _csv(options.get("path")) + _csv(options.get("paths"))
        if not paths:
            raise ValueError("tank data source: no base path (load(PATH) or option paths)")
        for p in paths:
            if not os.path.isdir(p):
                raise FileNotFoundError(f"tank data source: base path not found: {p}")
        self.paths = paths
        b = Bounds()
        if options.get("topics"):
            b.topics = set(_csv(options["topics"]))
        if options.get("partitions"):
            b.partitions = {int(p) for p in _csv(options["partitions"])}
        for key, setter in (("min_seq", b.seq_lo), ("max_seq", b.seq_hi)):
            if options.get(key):
                setter(int(options[key]))
        for key, setter in (("min_ts", b.ts_lo), ("max_ts", b.ts_hi)):
            if options.get(key):
                setter(parse_time_ms(options[key]))
        if options.get("seq_ranges"):
            b.seq_ranges = parse_seq_ranges(options["seq_ranges"])
        self.bounds = b
        self.include_active = str(options.get("include_active", "true")).lower() != "false"
        self.split_bytes = int(options.get("split_bytes", DEFAULT_SPLIT_BYTES))

    def partitions(self):
        return plan_ranges(self.paths, self.bounds, self.include_active, self.split_bytes)

    def read(self, partition: SegmentRange) -> Iterator[pa.RecordBatch]:
        if not partition.path:
            return
        yield from read_range(partition)


class TankPushdownReader(TankReader):
    """TankReader that also takes WHERE clauses on topic, partition and seq (option pushdown=true).

    Opt-in because Spark 4.2 reuses the planned scan of a DataFrame for later actions on the same DataFrame: the
    filters of one query would then restrict the next one (observed). Use a fresh DataFrame per query with it.
    """

    def pushFilters(self, filters):
        """Take AND-ed comparisons on topic, partition, seq and ts; Spark still re-checks everything it is given
        back, and we return the ts filters too (applied per batch, not exactly pruned)."""
        b = self.bounds
        for f in filters:
            col = f.attribute[0] if len(f.attribute) == 1 else None
            value = getattr(f, "value", None)
            if col == "topic" and isinstance(f, EqualTo):
                b.topics = {value} if b.topics is None else b.topics & {value}
            elif col == "topic" and isinstance(f, In):
                b.topics = set(value) if b.topics is None else b.topics & set(value)
            elif col == "partition" and isinstance(f, EqualTo):
                b.partitions = {value} if b.partitions is None else b.partitions & {value}
            elif col == "partition" and isinstance(f, In):
                b.partitions = set(value) if b.partitions is None else b.partitions & set(value)
            elif col == "seq" and isinstance(f, (EqualTo, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual)):
                if isinstance(f, (EqualTo, GreaterThanOrEqual)):
                    b.seq_lo(value)
                if isinstance(f, GreaterThan):
                    b.seq_lo(value + 1)
                if isinstance(f, (EqualTo, LessThanOrEqual)):
                    b.seq_hi(value)
                if isinstance(f, LessThan):
                    b.seq_hi(value - 1)
            else:
                yield f


def parse_seq_ranges(text: str) -> dict[tuple[str, int], tuple[int | None, int | None]]:
    """`{"topic/partition": [min_seq, max_seq], ...}` (JSON; null = open)."""
    import json

    out = {}
    for key, (lo, hi) in json.loads(text).items():
        topic, _, pid = key.rpartition("/")
        out[(topic, int(pid))] = (lo, hi)
    return out


def format_seq_ranges(ranges: dict[tuple[str, int], tuple[int | None, int | None]]) -> str:
    import json

    return json.dumps({f"{t}/{p}": [lo, hi] for (t, p), (lo, hi) in ranges.items()})


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


def plan_ranges(paths: list[str], b: Bounds, include_active: bool, split_bytes: int) -> list[SegmentRange]:
    """Read tasks for the segments that can hold rows within the bounds (pruned by names, seeked by indexes)."""
    from tank_log.storage.datadir import scan_data_dir

    out = []
    for base in paths:
        for topic in scan_data_dir(base).topics:
            if b.topics is not None and topic.name not in b.topics:
                continue
            for part in topic.partitions:
                if b.partitions is not None and part.id not in b.partitions:
                    continue
                pb = _partition_bounds(b, part.key)
                if pb is None:
                    continue
                segments = part.ro + ([part.active] if part.active and include_active else [])
                for sf in segments:
                    if pb.max_seq is not None and sf.base > pb.max_seq:
                        continue
                    if pb.min_seq is not None and sf.last is not None and sf.last < pb.min_seq:
                        continue
                    out += segment_ranges(part.topic, part.id, sf, pb, split_bytes)
    return out or [SegmentRange("", 0, "", 1, 0, 1, 0, None, None, None, None)]


def segment_ranges(topic: str, pid: int, sf, b: Bounds, split_bytes: int) -> list[SegmentRange]:
    """Split a segment at index entries into ranges of about split_bytes; start at the entry for min_seq."""
    from tank_log.format.index import usable_entries

    entries = usable_entries(sf.index_path, sf.size) or [(0, 0)]  # no usable index: the whole segment
    if b.min_seq is not None and b.min_seq > sf.base:  # §4.4 step 3: greatest entry with rel <= target
        target = b.min_seq - sf.base
        entries = [e for e in entries if e[0] <= target][-1:] + [e for e in entries if e[0] > target]
    cuts = [entries[0]]
    for e in entries[1:]:
        if e[1] - cuts[-1][1] >= split_bytes:
            cuts.append(e)
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
        )
        for i, (rel, off) in enumerate(cuts)
    ]


def read_range(r: SegmentRange) -> Iterator[pa.RecordBatch]:
    """Arrow batches of ARROW_SCHEMA for one range (library code only; also used by the export job)."""
    from tank_log.format.arrow import to_record_batch
    from tank_log.storage.segment import Segment

    seg = Segment(r.path, r.base)
    topic = pa.array([r.topic], pa.string())
    try:
        chunks = seg.chunks(start=r.start, next_seq=r.next_seq, stop_seq=r.max_seq, stop_offset=r.stop)
        for chunk in chunks:
            c = chunk.cols
            sel = np.ones(len(c), dtype=bool)
            if r.min_seq is not None:
                sel &= c.seq >= np.uint64(max(r.min_seq, 0))
            if r.max_seq is not None:
                sel &= c.seq <= np.uint64(max(r.max_seq, 0))
            if r.min_ts is not None:
                sel &= c.ts >= np.uint64(max(r.min_ts, 0))
            if r.max_ts is not None:
                sel &= c.ts <= np.uint64(max(r.max_ts, 0)) if r.max_ts >= 0 else np.zeros(len(c), bool)
            if not sel.any():
                continue
            batch = to_record_batch(c, None if sel.all() else sel)
            n = batch.num_rows
            ts_ms = pc.cast(batch.column("ts"), pa.int64())
            yield pa.RecordBatch.from_arrays(
                [
                    topic.take(pa.array(np.zeros(n, dtype=np.int32))),
                    pa.array(np.full(n, r.partition, dtype=np.int32)),
                    pc.cast(batch.column("seq"), pa.int64()),
                    pc.cast(pc.multiply(ts_ms, 1000), pa.timestamp("us", tz="UTC")),
                    batch.column("key"),
                    batch.column("value"),
                ],
                schema=ARROW_SCHEMA,
            )
    except FileNotFoundError:
        return  # removed by retention/compaction since planning (§9 rule 2)
