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

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from tank_log.errors import ImportRefused
from tank_log.format.broker_config import PartitionConfig, load_config
from tank_log.format.bundle import Message
from tank_log.storage.staging import (
    MANIFEST,
    StagedPartition,
    abort_import,
    commit_import,
    stage_partition,
    stage_root,
)
from tank_log.storage.writer import BundlePolicy

EXISTING = ("error", "append")


@dataclass
class Staged(WriterCommitMessage):
    partitions: list[StagedPartition]


class TankWriter(DataSourceArrowWriter):
    def __init__(self, options: Mapping[str, str], overwrite: bool):
        import uuid

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
        self.run_id = uuid.uuid4().hex[:12]

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Staged:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        writer_id = f"{ctx.partitionId()}-{ctx.attemptNumber()}" if ctx else "0-0"
        staged: list[StagedPartition] = []
        done: set[tuple[str, int]] = set()
        for (topic, partition), rows in itertools.groupby(_rows(iterator), key=lambda r: r[0]):
            if (topic, partition) in done:
                raise ImportRefused(
                    f"{topic}/{partition}: its rows are not contiguous in this task "
                    "(repartition(topic, partition) and sortWithinPartitions(topic, partition, seq) first)"
                )
            done.add((topic, partition))
            staged.append(
                stage_partition(
                    self.base,
                    self.run_id,
                    writer_id,
                    topic,
                    partition,
                    (m for _, m in rows),
                    append=self.existing == "append",
                    segment_bytes=self.segment_bytes or self._topic_segment_bytes(topic),
                    policy=self.policy,
                )
            )
        return Staged(staged)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        staged = [p for m in messages if isinstance(m, Staged) for p in m.partitions]
        try:
            commit_import(self.base, self.run_id, staged)
        except BaseException:
            if not os.path.exists(
                os.path.join(stage_root(self.base, self.run_id), MANIFEST)
            ):  # before the commit point
                abort_import(self.base, self.run_id)
            raise

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        abort_import(self.base, self.run_id)

    def _topic_segment_bytes(self, topic: str) -> int:
        config, _ = load_config(os.path.join(self.base, topic, "config"))
        return config.segment_bytes or PartitionConfig().segment_bytes


def _rows(batches: Iterator[pa.RecordBatch]) -> Iterator[tuple[tuple[str, int], Message]]:
    """((topic, partition), Message) per row, in input order."""
    for batch in batches:
        if not batch.num_rows:
            continue
        cols = batch.to_pydict()
        missing = {"topic", "partition", "seq", "ts", "key", "value"} - set(cols)
        if missing:
            raise ValueError(f"tank data source: missing columns {sorted(missing)}")
        ts_us = batch.column("ts").cast(pa.int64()).to_pylist()
        raw = cols.get("ts_raw") or [None] * batch.num_rows
        for i in range(batch.num_rows):
            ts = int(raw[i]) if raw[i] is not None else (ts_us[i] // 1000 if ts_us[i] is not None else None)
            if ts is None or cols["seq"][i] is None or cols["value"][i] is None:
                raise ImportRefused(
                    f"{cols['topic'][i]}/{cols['partition'][i]} seq {cols['seq'][i]}: null seq, ts or value"
                )
            yield (
                (cols["topic"][i], cols["partition"][i]),
                Message(cols["seq"][i], ts, cols["key"][i], cols["value"][i]),
            )
