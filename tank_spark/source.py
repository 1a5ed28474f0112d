"""The Spark data source "tank": `spark.read.format("tank").load(base_path)` (PySpark Python Data Source API), and
`df.write.format("tank").mode("append").save(base_path)` (see sink.py).

    from tank_spark.source import register
    register(spark)
    df = spark.read.format("tank").option("topics", "orders").load("/var/lib/tank")

Schema: topic string, partition int, seq long, ts timestamp (from the producer's ms), key binary, value binary.
Options: `topics` (a,b), `partitions` (0,3), `min_seq`/`max_seq`, `min_ts`/`max_ts` (ms since the epoch or an ISO
date/time), `seq_ranges` (JSON `{"topic/partition": [min_seq, max_seq]}`: only these partitions, each its own range),
`include_active` (default true: the active segment up to its last complete bundle; a torn tail is not
an error), `split_bytes` (default 64 MiB). Several base paths: `load("a,b")` or option `paths`.
`spark.readStream.format("tank")` streams (see stream.py).

Parallelism: one input partition per segment, or per bounded byte range of a large segment cut at index entries
(docs/FORMAT.md §4.4). Pruning: the topic, partition and seq options skip whole segments by their names and start
reads at an index entry; `ts` bounds are applied per batch (segment names carry no message times); WHERE clauses are
evaluated by Spark. With option `pushdown=true`, WHERE clauses on topic/partition/seq prune too (see
TankPushdownReader for the caveat). The reader yields Arrow record batches.

The files must be readable at the same path on every executor (local disk in local mode, a shared filesystem on a
cluster). Reading while the broker runs is fine (docs/FORMAT.md §9 rule 2): a segment rolled or compacted since
planning is read under its new name; one retention deleted is skipped.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceWriter,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.types import StructType

from tank_spark.ranges import (
    DEFAULT_SPLIT_BYTES,
    Bounds,
    SegmentRange,
    parse_seq_ranges,
    parse_time_ms,
    plan_ranges,
    read_range,
)
from tank_spark.schema import ROW_STRUCT

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def register(spark: SparkSession) -> None:
    """Register the "tank" format on a session (and enable Python data source filter pushdown)."""
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    spark.dataSource.register(TankDataSource)


class TankDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "tank"

    def schema(self) -> StructType:
        return ROW_STRUCT

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from tank_spark.sink import TankWriter

        return TankWriter(self.options, overwrite)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from tank_spark.stream import TankStreamReader

        options = self.options
        bounds = read_bounds(options)
        if bounds.seq_ranges is not None or bounds.min_seq is not None or bounds.max_seq is not None:
            raise ValueError("tank stream: seq bounds are set by offsets (option startingOffsets), not min/max_seq")
        split = int(options.get("split_bytes", DEFAULT_SPLIT_BYTES))
        return TankStreamReader(base_paths(options), bounds, split, options)

    def reader(self, schema: StructType) -> DataSourceReader:
        if str(self.options.get("pushdown", "false")).lower() == "true":
            return TankPushdownReader(self.options)
        return TankReader(self.options)


def _csv(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def base_paths(options: Mapping[str, str]) -> list[str]:
    paths = _csv(options.get("path")) + _csv(options.get("paths"))
    if not paths:
        raise ValueError("tank data source: no base path (load(PATH) or option paths)")
    for p in paths:
        if not os.path.isdir(p):
            raise FileNotFoundError(f"tank data source: base path not found: {p}")
    return paths


def read_bounds(options: Mapping[str, str]) -> Bounds:
    """The row bounds the options ask for (topics, partitions, seqs, times)."""
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
    return b


class TankReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]):
        self.paths = base_paths(options)
        self.bounds = read_bounds(options)
        self.include_active = str(options.get("include_active", "true")).lower() != "false"
        self.split_bytes = int(options.get("split_bytes", DEFAULT_SPLIT_BYTES))

    def partitions(self) -> Sequence[InputPartition]:
        return plan_ranges(self.paths, self.bounds, self.include_active, self.split_bytes)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SegmentRange)  # what `partitions` plans
        if not partition.path:
            return
        yield from read_range(partition)


class TankPushdownReader(TankReader):
    """TankReader that also takes WHERE clauses on topic, partition and seq (option pushdown=true).

    Opt-in because Spark 4.2 reuses the planned scan of a DataFrame for later actions on the same DataFrame: the
    filters of one query would then restrict the next one (observed). Use a fresh DataFrame per query with it.
    """

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        """Take AND-ed comparisons on topic, partition, seq and ts; Spark still re-checks everything it is given
        back, and we return the ts filters too (applied per batch, not exactly pruned)."""
        b = self.bounds
        for f in filters:
            attribute: tuple[str, ...] = getattr(f, "attribute", ())  # the comparisons' column (not Not, And...)
            col = attribute[0] if len(attribute) == 1 else None
            value: Any = getattr(f, "value", None)  # EqualTo and the comparisons: a scalar; In: a tuple
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
