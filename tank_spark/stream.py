"""Structured Streaming from TANK: `spark.readStream.format("tank").load(base_path)` (PySpark streaming data source).

    df = spark.readStream.format("tank").option("topics", "orders").load("/var/lib/tank")

Rows have the batch reader's schema (`tank_spark.schema.ROW_STRUCT`). An offset is `{"topic/partition": next seq}`
(JSON in the checkpoint); a partition missing from an offset is read from its first segment. The latest offset of a
partition is its last complete bundle + 1 (an append in flight waits for the next trigger, §3.11). A micro-batch is
planned as segment ranges like a batch read (index seeks, byte-range splits); partitions and topics that appear are
picked up at the next trigger. `trigger(availableNow=True)` reads what exists when the query starts (Spark 4.1 asks
a Python source for its latest offset once, at the start of such a query, and reads up to it in one micro-batch).

Options: `topics`, `partitions`, `min_ts`, `split_bytes` as the batch reader; `startingOffsets` = `earliest`
(default), `latest`, or JSON `{"topic/partition": next_seq}` (used only by a query without a checkpoint);
`failOnDataLoss` (default true, as Kafka's source); `dataLossLog` = a local file that gets one JSON line per lost range;
`startAfterTable` = a Delta table the export wrote (a path or URI; credentials from the environment): a query without a
checkpoint starts each partition after the last seq the table records for it (the export's app transactions), so a
streaming query writing to that table continues where the export stopped; the other partitions start as
`startingOffsets` says.

Data loss: messages of a `delete`-policy partition that retention (§5) deleted before the query read them — the
partition's first segment now starts above the offset, or a planned segment vanished before its task read it — and
holes: seqs a segment's name or index claims that a read cannot return (a truncated RO segment, a bundle cut out or
duplicated, a directory in place of a segment; `storage/completeness.py`). With `failOnDataLoss=true` the query fails
(`DataLost`, naming the partition and seqs, and for a hole the file and offset); with `false` the lost range is
logged and written to `dataLossLog`, and the query goes on. A `cleanup`-policy partition's missing seqs are
compaction's doing (superseded keys), never a loss. Segments rolled or compacted between planning and reading are
read under their new names (`ranges.read_range`).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from tank_log.errors import TankLogError
from tank_log.jobs.planning import select_partitions
from tank_log.lakehouse import ExportedSeqs
from tank_log.storage.completeness import HoleError
from tank_log.storage.datadir import Partition, last_complete_seq
from tank_spark.ranges import (
    Bounds,
    LostRange,
    SegmentRange,
    deleted_range,
    parse_partition_key,
    partition_key,
    partition_ranges,
    read_range,
)

log = logging.getLogger(__name__)

Offset = dict[str, int]  # "topic/partition" → next seq to read


HOLE_TEXT = "could not be read (a hole)"  # how a hole is told from retention's deletions in messages


class DataLost(TankLogError, RuntimeError):
    """Messages were deleted (retention) before the stream read them, and `failOnDataLoss` is true."""


class TankStreamReader(DataSourceStreamReader):
    def __init__(self, paths: list[str], bounds: Bounds, split_bytes: int, options: Mapping[str, str]):
        self.paths = paths
        self.bounds = bounds
        self.split_bytes = split_bytes
        self.starting = str(options.get("startingOffsets", "earliest"))
        self.fail_on_data_loss = str(options.get("failOnDataLoss", "true")).lower() != "false"
        self.data_loss_log = options.get("dataLossLog")
        self.high: Offset = {}  # the furthest offset this reader has seen per partition: offsets never go back
        self.after_table = options.get("startAfterTable")
        if self.starting not in ("earliest", "latest"):
            self._parse_offset(self.starting)  # a bad JSON fails when the query is defined

    # ---- offsets (driver) --------------------------------------------------------------------------------------

    def initialOffset(self) -> Offset:
        if self.starting == "earliest":
            offset: Offset = {}
        elif self.starting == "latest":
            offset = self._latest(self._scan())
        else:
            offset = self._parse_offset(self.starting)
        if self.after_table:
            offset.update(self._after_table(self.after_table))
        self._advance(offset)
        return offset

    def _advance(self, offset: Offset) -> None:
        for key, nxt in offset.items():
            self.high[key] = max(nxt, self.high.get(key, 0))

    def _after_table(self, table: str) -> Offset:
        """Each partition's next seq after the last one `table` records (the export's app transactions).

        Raises:
            TableUnreadable: the table is missing, unreachable or not a tank-log export.
        """
        exported = ExportedSeqs(table)
        out = {}
        for topic, pid in self._scan():
            last = exported.last_seq(topic, pid)
            if last is not None:
                out[partition_key(topic, pid)] = last + 1
        return out

    def latestOffset(self) -> Offset:
        """Each partition's last complete bundle + 1, never below an offset this reader has seen (a partition that
        vanished keeps its position): Spark 4.1 passes a Python source neither the start nor a read limit."""
        self._advance(self._latest(self._scan()))
        return dict(self.high)

    def commit(self, end: Offset) -> None:
        self._advance(end)  # a query restarted from its checkpoint commits its last batch's end first

    def partitions(self, start: Offset, end: Offset) -> list[SegmentRange]:
        """Ranges for seqs [start, end) of every partition; a range retention deleted is reported first."""
        self._advance(start)
        parts = self._scan()
        seq_ranges: dict[tuple[str, int], tuple[int | None, int | None]] = {}
        lost: list[LostRange] = []
        for key, nxt in end.items():
            topic, pid = parse_partition_key(key)
            lo = start.get(key)
            if lo is not None and lo >= nxt:
                continue
            seq_ranges[(topic, pid)] = (lo, nxt - 1)
            gone = None if lo is None else deleted_range(parts.get((topic, pid)), topic, pid, lo, nxt - 1)
            if gone is not None:  # deleted (or the partition is gone) before the stream got to it
                lost.append(gone)
        if lost:
            self._lost(lost, "planning")
        bounds = Bounds(seq_ranges, None, None, None, None, self.bounds.min_ts, self.bounds.max_ts)
        return partition_ranges(list(parts.values()), bounds, True, self.split_bytes)

    def _scan(self) -> dict[tuple[str, int], Partition]:
        parts: dict[tuple[str, int], Partition] = {}
        for sel in select_partitions(self.paths, self.bounds.topics, require_match=False):
            p = sel.partition
            if self.bounds.partitions is not None and p.id not in self.bounds.partitions:
                continue
            if p.key in parts:
                raise ValueError(f"tank stream: {p.topic}/{p.id} is in {parts[p.key].path} and {p.path}")
            parts[p.key] = p
        return parts

    @staticmethod
    def _latest(parts: Mapping[tuple[str, int], Partition]) -> Offset:
        out = {}
        for (topic, pid), part in parts.items():
            last = last_complete_seq(part)
            if last is not None:
                out[partition_key(topic, pid)] = last + 1
        return out

    @staticmethod
    def _parse_offset(text: str) -> Offset:
        try:
            raw = json.loads(text)
            out = {partition_key(*parse_partition_key(k)): int(v) for k, v in raw.items()}
        except (ValueError, TypeError, AttributeError):
            raise ValueError(
                f'tank stream: startingOffsets {text!r}: expected earliest, latest or {{"topic/partition": seq}}'
            ) from None
        return out

    # ---- reading (executors) -----------------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SegmentRange)  # what `partitions` plans
        lost: list[LostRange] = []
        try:
            yield from read_range(partition, lost=lost, trusted_only=True)  # nothing a skipped hole distrusts
        except HoleError as err:  # seqs the partition claims that cannot be read (storage/completeness.py)
            h = err.hole
            last = h.last_seq if h.last_seq is not None else partition.seqs[1]
            gone = (partition.topic, partition.partition, h.first_seq, h.first_seq if last is None else last)
            self._lost([gone], "reading", hole=str(err))
        if lost:
            self._lost(lost, "reading")

    def _lost(self, lost: list[LostRange], when: str, hole: str | None = None) -> None:
        """Report lost ranges (deleted by retention, or a `hole`: the file, offset and why): fail the query, or log
        them (and append them to `dataLossLog`) and go on."""
        text = describe_lost(lost)
        what = "deleted before they were read" if hole is None else f"{HOLE_TEXT}: {hole}"
        if self.fail_on_data_loss:
            raise DataLost(
                f"tank stream: {what} ({when}): {text}; restart with option failOnDataLoss=false to skip them "
                f"(they are then logged)"
            )
        log.warning("tank stream: data loss, %s (%s): %s", what, when, text)
        if self.data_loss_log:
            os.makedirs(os.path.dirname(os.path.abspath(self.data_loss_log)), exist_ok=True)
            with open(self.data_loss_log, "a") as fh:
                for t, p, lo, hi in lost:
                    record = {"topic": t, "partition": p, "from_seq": lo, "to_seq": hi, "detected": when}
                    if hole is not None:
                        record["hole"] = hole
                    fh.write(json.dumps({**record, "at_ms": int(time.time() * 1000)}) + "\n")


def describe_lost(lost: Iterable[LostRange]) -> str:
    return ", ".join(f"{partition_key(t, p)} seqs {lo}..{hi}" for t, p, lo, hi in lost)


def read_data_loss_log(path: str) -> list[dict[str, Any]]:
    """The distinct lost ranges of a `dataLossLog` (a batch planned again after a restart reports its loss again)."""
    seen: dict[tuple[str, int, int, int], dict[str, Any]] = {}
    try:
        with open(path) as fh:
            for line in fh:
                r = json.loads(line)
                seen.setdefault((r["topic"], r["partition"], r["from_seq"], r["to_seq"]), r)
    except FileNotFoundError:
        return []
    return sorted(seen.values(), key=lambda r: (r["topic"], r["partition"], r["from_seq"]))
