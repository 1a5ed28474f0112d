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
evaluated by Spark, never pushed down: option `pushdown=true` is refused (`PUSHDOWN_REFUSED`). The reader yields
Arrow record batches.

The files must be readable at the same path on every executor (local disk in local mode, a shared filesystem on a
cluster). Reading while the broker runs is fine (docs/FORMAT.md §9 rule 2): a segment rolled or compacted since
planning is read under its new name; one retention deleted is skipped.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceWriter,
    InputPartition,
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


PUSHDOWN_REFUSED = (
    "tank data source: option pushdown=true is refused: Spark keeps the scan planned for a DataFrame's filtered "
    "query and reuses it for the DataFrame's later unfiltered ones, which then return the filtered rows without an "
    "error; prune with the options topics, partitions, min_seq/max_seq or seq_ranges (exact for every query)"
)


def register(spark: SparkSession) -> None:
    """Register the "tank" format on a session."""
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
        if str(self.options.get("pushdown", "false")).lower() != "false":
            raise ValueError(PUSHDOWN_REFUSED)
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
