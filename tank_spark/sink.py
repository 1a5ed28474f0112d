"""Writing DataFrames into TANK partitions: `df.write.format("tank").mode("append").save(base_path)` (PySpark Python
Data Source writer API; `register` in source.py registers both directions).

Input columns: `topic string, partition int, seq long, ts timestamp, key binary, value binary` and optionally
`ts_raw decimal(20,0)` (the exact ms when `ts` could not hold it) — the rows `spark.read.format("tank")` and the
Delta export produce. Each task must hold whole partitions, sorted by seq: `df.repartition("topic", "partition")
.sortWithinPartitions("topic", "partition", "seq")` (rows of one partition in two tasks, or out of order, fail the
write with `ImportRefused`). Each partition is written as the broker lays it out (segments rolled per
`log.segment.bytes`, sparse bundles where seqs have gaps, indexes by the append rule, an active segment last) into
a staging directory; the driver's commit moves everything into place, the abort removes it
(`tank_log/storage/staging.py`): a failed write leaves nothing half-written.

Options: `existing` — `error` (default: a partition that already has segments fails the write) or `append` (its
active segment is sealed and the rows, all above its last seq, continue it); `segment_bytes` (default each topic's
`log.segment.bytes`, else 1 GiB); `bundle_messages` (default 100). Spark's "error"/"ignore" save modes are not
available to Python data sources, hence the `existing` option; `overwrite` is refused (delete partitions with the
broker's tools instead).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from tank_log.errors import ImportRefused
from tank_log.format.arrow import columns_from_arrow
from tank_log.format.broker_config import PartitionConfig, load_config
from tank_log.format.messages import MessageColumns
from tank_log.storage.staging import (
    MANIFEST,
    StagedPartition,
    abort_import,
    commit_import,
    new_run_id,
    open_import,
    stage_partition,
    stage_root,
)
from tank_log.storage.writer import BundlePolicy

EXISTING = ("error", "append")
REQUIRED = ("topic", "partition", "seq", "ts", "key", "value")  # input columns (ts_raw optional)


@dataclass
class Staged(WriterCommitMessage):
    partitions: list[StagedPartition]


class TankWriter(DataSourceArrowWriter):
    def __init__(self, options: Mapping[str, str], overwrite: bool):
        if overwrite:
            raise ValueError('tank data source: mode("overwrite") is not supported; use mode("append")')
        self.base = os.path.abspath(str(options.get("path") or ""))
        if not options.get("path") or not os.path.isdir(self.base):
            raise FileNotFoundError(f"tank data source: base path not found: {options.get('path')}")
        self.existing = str(options.get("existing", "error"))
        if self.existing not in EXISTING:
            raise ValueError(f"tank data source: existing={self.existing!r} (choose from {', '.join(EXISTING)})")
        self.segment_bytes = int(options["segment_bytes"]) if options.get("segment_bytes") else None
        self.policy = BundlePolicy(max_messages=int(options.get("bundle_messages", 100)))
        self.run_id = new_run_id()
        open_import(self.base, self.run_id)  # the driver; the tasks' writes and the abort meet at its lock

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Staged:
        append = self.existing == "append"
        return Staged(stage_rows(self.base, self.run_id, iterator, append, self.segment_bytes, self.policy))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        commit_staged(self.base, self.run_id, [p for m in messages if isinstance(m, Staged) for p in m.partitions])

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        abort_import(self.base, self.run_id)


def stage_rows(
    base: str,
    run_id: str,
    batches: Iterator[pa.RecordBatch],
    append: bool,
    segment_bytes: int | None = None,
    policy: BundlePolicy | None = None,
) -> list[StagedPartition]:
    """A Spark task's share of an import: its rows (each partition's contiguous and sorted by seq) staged as
    partitions (`staging.stage_partition`), segments rolled at `segment_bytes` or each topic's `log.segment.bytes`."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    writer_id = f"{ctx.partitionId()}-{ctx.attemptNumber()}" if ctx else "0-0"
    staged: list[StagedPartition] = []
    done: set[tuple[str, int]] = set()
    for (topic, partition), runs in itertools.groupby(_partition_chunks(batches), key=lambda r: r[0]):
        if (topic, partition) in done:
            raise ImportRefused(
                f"{topic}/{partition}: its rows are not contiguous in this task "
                "(repartition(topic, partition) and sortWithinPartitions(topic, partition, seq) first)"
            )
        done.add((topic, partition))
        staged.append(
            stage_partition(
                base,
                run_id,
                writer_id,
                topic,
                partition,
                (cols for _, cols in runs),
                append=append,
                segment_bytes=segment_bytes or _topic_segment_bytes(base, topic),
                policy=policy,
            )
        )
    return staged


def commit_staged(base: str, run_id: str, staged: list[StagedPartition]) -> None:
    """The driver's commit of every task's staged partitions (`staging.commit_import`); a failure before the commit
    point removes the staging directory, one after it is finished by the next import or `tank-log repair`."""
    try:
        commit_import(base, run_id, staged)
    except BaseException:
        if not os.path.exists(os.path.join(stage_root(base, run_id), MANIFEST)):  # before the commit point
            abort_import(base, run_id)
        raise


def _topic_segment_bytes(base: str, topic: str) -> int:
    config, _ = load_config(os.path.join(base, topic, "config"))
    return config.segment_bytes or PartitionConfig().segment_bytes


def _partition_chunks(batches: Iterator[pa.RecordBatch]) -> Iterator[tuple[tuple[str, int], MessageColumns]]:
    """((topic, partition), columns) per run of one partition's rows in a batch, in input order: Arrow columns
    straight into the segment writer's encoder, no Python object per row."""
    for batch in batches:
        n = batch.num_rows
        if not n:
            continue
        missing = sorted(set(REQUIRED) - set(batch.schema.names))
        if missing:
            raise ValueError(f"tank data source: missing columns {missing}")
        topic, partition, value = batch.column("topic"), batch.column("partition"), batch.column("value")
        seq_col = batch.column("seq").cast(pa.int64())
        seq = seq_col.fill_null(0).to_numpy()
        ts, ts_bad = _ts_ms(batch)
        null = pc.or_(pc.or_(topic.is_null(), partition.is_null()), pc.or_(seq_col.is_null(), value.is_null()))
        bad = null.to_numpy(zero_copy_only=False) | ts_bad | (seq < 1)
        if bad.any():
            r = int(np.flatnonzero(bad)[0])
            raise ImportRefused(
                f"{topic[r].as_py()}/{partition[r].as_py()} seq {seq_col[r].as_py()}: null seq, ts or value, a seq "
                "below 1 (§3.6) or a ts before 1970 (ts is a u64 of ms)"
            )
        changes = pc.or_(
            pc.not_equal(topic.slice(1), topic.slice(0, n - 1)),
            pc.not_equal(partition.slice(1), partition.slice(0, n - 1)),
        )
        bounds = [0, *(np.flatnonzero(changes.to_numpy(zero_copy_only=False)) + 1).tolist(), n]
        key = batch.column("key")
        for a, b in zip(bounds, bounds[1:], strict=False):
            yield (
                (topic[a].as_py(), partition[a].as_py()),
                columns_from_arrow(seq[a:b].view(np.uint64), ts[a:b], key.slice(a, b - a), value.slice(a, b - a)),
            )


def _ts_ms(batch: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray]:
    """(ms since the epoch as uint64, rows without a valid one): from `ts` (µs), or from `ts_raw` where set (the
    exact u64 of ms that `ts` could not hold)."""
    us = batch.column("ts").cast(pa.int64())
    ms = np.floor_divide(us.fill_null(0).to_numpy(), 1000)
    bad = us.is_null().to_numpy(zero_copy_only=False) | (ms < 0)
    out = ms.astype(np.uint64)  # negatives wrap here but are flagged bad
    if "ts_raw" in batch.schema.names:
        raw = batch.column("ts_raw")
        has = raw.is_valid().to_numpy(zero_copy_only=False)
        if has.any():
            try:
                exact = raw.cast(pa.uint64()).fill_null(0).to_numpy()
            except pa.ArrowInvalid:
                raise ImportRefused("ts_raw holds a value outside 0..2**64-1") from None
            out = np.where(has, exact, out)
            bad &= ~has
    return out, bad
