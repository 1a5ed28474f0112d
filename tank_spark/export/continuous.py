"""Continuous export (`--continuous`): a Structured Streaming query from the `tank` source (`tank_spark/stream.py`)
into the table (Delta, or Iceberg: by path or by name in a REST catalog), exactly once per (topic, partition).

Each micro-batch (`foreachBatch`, on the driver):
1. reads every partition's recorded version from the table (the same app transactions as the batch export's);
2. keeps only the batch's rows above it — a batch Spark replays after a crash between the Delta commit and its own
   commit log adds nothing;
3. writes Parquet files named by a fresh run id, and commits them with each partition's new version (its highest
   seq in the batch) in ONE commit (`commit.commit`, which also detects a concurrent export: then the files are
   removed and the batch is written again against the new versions);
4. returns; Spark records the batch in the checkpoint.
A kill at any point loses nothing and duplicates nothing: Spark replays the batch from the checkpointed offsets and
step 2 drops what is already in the table. The files of a killed attempt are orphans, removed by a later start once
older than the orphan horizon (`orphans.py`). The batch export and the continuous one may take turns on a table.

Data loss: the source reports every range retention deleted before a batch read it (option `dataLossLog`); the
exporter drops what the table already holds (a replayed batch sees its old range deleted) and, for the rest,
fails the query (`--on-data-loss fail`, before committing the batch) or records it and goes on (`skip`: the log,
the report's `data_loss`, and `tank-data-loss.jsonl` in a local checkpoint directory).

Typed values (`--value-format avro|protobuf|json --value-schema-file`, decoded keys) decode in the batch's tasks
(`typed_rows`, through `dead_letters.BadRecords` as the batch export's) into the table's columns (`evolved_schema`,
each batch: a newer schema of the values evolves the table or stops the query in one line, as the batch export).
Values that do not decode go by `--on-bad-record`: `dead_letter` commits them into the dead-letter table FIRST, with
each partition's version, then the table (a batch replayed after a kill between the two commits drops the dead
letters at or below that table's version: each message ends in exactly one table); `skip` counts them; `fail` stops
the query naming the file, seq and error, nothing of the batch committed. Each partition's version is the highest
seq the batch read of it, decoded or not. A schema registry out of reach is no bad value: it stops the query in one
line naming it, nothing of the batch committed (exit 1), and the next start reads the batch again.

Compaction gaps: a `cleanup` partition whose log now starts past what the table holds (our compaction removed the
seqs in between before they were exported) is reported as the batch export reports it: the seqs named in an ERROR
line, the partition's report entry `data-loss` with `lost_*`, the summary's `lost_before_export` (exit 1 at the end).
A `delete` partition's are retention's: `--on-data-loss` above.

Stop: SIGTERM or Ctrl-C. The batch in flight finishes and commits, no further batch writes anything (one that
starts meanwhile stops before writing, and is replayed at the next start), the report is written, exit 0.
With `TANK_LOG_STREAM_AVAILABLE_NOW` set (a test hook) the query reads what exists when it starts and ends.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from tank_log.errors import RunFailed, TankLogError
from tank_log.jobs.stopping import handling
from tank_log.lakehouse import LakeTable
from tank_spark.export.commit import ConcurrentExport, commit, remove_uncommitted
from tank_spark.export.dead_letters import (
    BadCounts,
    BadRun,
    commit_dead_letters,
    count_bad,
    dead_letter_settings,
    open_dead_letters,
)
from tank_spark.export.files import (
    FILE_META_SCHEMA,
    FileWriter,
    WrittenCounts,
    count_files,
    group_rows,
    make_file_writer,
)
from tank_spark.export.hooks import HOLD_AFTER_COMMIT, HOLD_BEFORE_COMMIT, hold
from tank_spark.export.orphans import check_run_age
from tank_spark.export.plan import ExportSettings, PartitionPlan, recorded_versions
from tank_spark.export.rows import table_frame
from tank_spark.export.run_id import new_run_id
from tank_spark.ranges import partition_key
from tank_spark.stream import HOLE_TEXT, DataLost, describe_lost

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from tank_spark.context import JobContext
    from tank_spark.runner import JobResult

log = logging.getLogger(__name__)

DATA_LOSS_FILE = "tank-data-loss.jsonl"  # in a local checkpoint directory: the ranges skipped with --on-data-loss skip
DETECTED_FILE = ".tank-data-loss-detected.jsonl"  # what the source saw, before the exporter's check against the table
COMMIT_ATTEMPTS = 3
AVAILABLE_NOW = "TANK_LOG_STREAM_AVAILABLE_NOW"  # test hook: set, the query reads what exists when it starts, and ends
TYPED_META_SCHEMA = "kind string, meta string"  # what a typed batch's tasks return (`typed_writer`)

Key = tuple[str, int]  # (topic, partition)


class StopRequested(TankLogError):
    """A micro-batch began after the stop was asked for: it wrote nothing, and the next start replays it."""


class BadRecordFailed(RunFailed):
    """A typed value of the batch does not decode and `--on-bad-record` is `fail`: nothing of the batch committed."""


@dataclass
class StreamTotals:
    """What the query has exported since the job started (the run report)."""

    batches: int = 0
    replayed_batches: int = 0  # batches with nothing above the recorded versions (replayed after a crash)
    rows: int = 0
    files: int = 0
    bytes: int = 0
    table_version: int | None = None
    partitions: dict[Key, WrittenCounts] = field(default_factory=dict)
    data_loss: list[dict[str, Any]] = field(default_factory=list)
    bad: dict[Key, BadCounts] = field(default_factory=dict)  # typed values that did not decode, committed batches'
    dead_letter_version: int | None = None
    gaps: dict[Key, list[tuple[int, int]]] = field(default_factory=dict)  # seqs compaction removed before export

    def add_batch(
        self, files: list[dict[str, Any]], counts: dict[tuple[str, int], WrittenCounts], version: int
    ) -> None:
        """Count a committed batch."""
        self.batches += 1
        self.files += len(files)
        self.bytes += sum(f["size"] for f in files)
        for key, c in counts.items():
            self.partitions.setdefault(key, WrittenCounts()).add(c)
            self.rows += c.rows
        self.table_version = version

    def add_bad(self, counts: dict[Key, BadCounts]) -> None:
        """Count a committed batch's values that did not decode (`count_bad`)."""
        for key, c in counts.items():
            total = self.bad.setdefault(key, BadCounts())
            total.bad += c.bad
            total.kept_before += c.kept_before
            total.first = total.first or c.first

    def results(self) -> list[dict[str, Any]]:
        """The report's per-partition entries; a partition that crossed a compaction gap names it as the batch
        export does (`lost_*`: from the first gap's first seq to the last one's last, `lost_ranges` each)."""
        out = []
        for (t, p), c in sorted(self.partitions.items()):
            entry = {"topic": t, "partition": p, "status": "exported", **asdict(c)}
            gaps = self.gaps.get((t, p))
            if gaps:
                entry.update(
                    lost_first_seq=gaps[0][0],
                    lost_last_seq=gaps[-1][1],
                    lost_messages=sum(hi - lo + 1 for lo, hi in gaps),
                    lost_ranges=[[lo, hi] for lo, hi in gaps],
                )
            out.append(entry)
        return out


@dataclass
class BatchWritten:
    """A micro-batch's files, before its commits: the table's and the dead letters' (typed values), the bad values'
    summaries (`BadRecords.summary`), and per partition the (first, last) seq the batch read above the table's
    version (decoded or not: the partition's new version is the last)."""

    schema: pa.Schema
    files: list[dict[str, Any]]
    dead_files: list[dict[str, Any]] = field(default_factory=list)
    bad: list[dict[str, Any]] = field(default_factory=list)
    seen: dict[Key, tuple[int, int]] = field(default_factory=dict)

    def discard(self, settings: ExportSettings) -> None:
        """Remove the files of a batch that commits nothing."""
        remove_uncommitted(settings, self.files)
        if self.dead_files:
            dead_letter_settings(settings).location.delete([f["path"] for f in self.dead_files])


def typed_writer(
    settings: ExportSettings, schema: pa.Schema, dead_after: dict[Key, int | None], run_id: str
) -> FileWriter:
    """mapInArrow function of a micro-batch of typed values (executor side): decode each partition's rows through
    a `BadRecords` of its own (its dead-letter table's version `dead_after`: the bad values at or below it are there
    already), write the good rows as the table's files and the dead letters as the dead-letter table's; return, as
    `TYPED_META_SCHEMA` rows, each file's metadata, each partition's bad-value summary and the seqs it read."""
    from tank_spark.export.schema import DEAD_LETTER_SCHEMA

    writer = make_file_writer(settings.location, schema, settings.partition_by, settings.target_file_bytes, run_id)
    dead_writer = None
    if settings.on_bad_record == "dead_letter":
        dead = dead_letter_settings(settings)
        dead_writer = make_file_writer(
            dead.location, DEAD_LETTER_SCHEMA, dead.partition_by, dead.target_file_bytes, run_id
        )

    def write(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow.compute as pc
        from pyspark import TaskContext

        from tank_spark.export.dead_letters import BadRecords
        from tank_spark.schema import ROW_SCHEMA

        task = TaskContext.get()
        index = task.partitionId() if task else 0
        bad: dict[Key, BadRecords] = {}
        seen: dict[Key, tuple[int, int]] = {}

        def good_rows() -> Iterator[pa.RecordBatch]:
            for batch in batches:
                b = batch.select(ROW_SCHEMA.names).cast(ROW_SCHEMA)  # `ts` comes in the session's time zone
                for (topic, pid), take in group_rows(b, ("topic", "partition")):
                    rows = b if take is None else b.take(take)
                    key = (str(topic), int(str(pid)))
                    bounds = pc.min_max(rows.column("seq"))
                    lo, hi = bounds["min"].as_py(), bounds["max"].as_py()
                    was = seen.get(key, (lo, hi))
                    seen[key] = (min(was[0], lo), max(was[1], hi))
                    if key not in bad:
                        mode = settings.on_bad_record
                        bad[key] = BadRecords(index, "", key[0], key[1], mode, dead_after.get(key))
                    yield from bad[key].split([rows], settings, schema)

        out: list[tuple[str, dict[str, Any]]] = [("file", m) for meta in writer(good_rows()) for m in meta.to_pylist()]
        letters = [d for b in bad.values() for d in b.dead]
        if letters and dead_writer is not None:
            out += [("dead", m) for meta in dead_writer(letters) for m in meta.to_pylist()]
        out += [("bad", b.summary()) for b in bad.values() if b.bad]
        out += [("seen", {"topic": t, "partition": p, "first": lo, "last": hi}) for (t, p), (lo, hi) in seen.items()]
        if out:
            yield pa.RecordBatch.from_pydict({"kind": [k for k, _ in out], "meta": [json.dumps(m) for _, m in out]})

    return write


class BatchExporter:
    """The `foreachBatch` function: one micro-batch → one Delta commit (see the module docstring)."""

    def __init__(
        self, ctx: JobContext, settings: ExportSettings, schema: pa.Schema, detected: str, loss_file: str | None
    ):
        self.ctx, self.settings, self.schema = ctx, settings, schema
        self.lock = threading.Lock()  # held while a batch is written: a stop waits for it
        self.stopping = threading.Event()
        self.totals = StreamTotals()
        self.detected, self.loss_file = detected, loss_file
        self._detected_at = os.path.getsize(detected) if os.path.exists(detected) else 0

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        with self.lock:
            if self.stopping.is_set():
                raise StopRequested(f"batch {batch_id} began after the stop was asked for: replayed at the next start")
            t0 = time.monotonic()
            for attempt in range(1, COMMIT_ATTEMPTS + 1):
                try:
                    self._export(batch_df, batch_id, t0)
                    return
                except ConcurrentExport as conflict:
                    if attempt == COMMIT_ATTEMPTS:
                        raise
                    log.warning("continuous export: batch %d: %s; writing it again", batch_id, conflict)

    def _export(self, batch_df: DataFrame, batch_id: int, t0: float) -> None:
        from pyspark.sql import functions as F

        settings, spark = self.settings, batch_df.sparkSession
        table = settings.location.existing()  # made before the query started
        versions = recorded_versions(table, settings, self.ctx.data_dirs, self.ctx.topics)
        done = [(t, p, v) for (t, p), v in versions.items() if v is not None]
        rows = batch_df
        if done:
            recorded = spark.createDataFrame(done, "topic string, partition int, _done long")
            rows = (
                batch_df.join(F.broadcast(recorded), ["topic", "partition"], "left")
                .where(F.col("_done").isNull() | (F.col("seq") > F.col("_done")))
                .drop("_done")
            )
        # a micro-batch is many small ranges (a piece of each active segment): one task per core, not per range,
        # so a batch makes a few files, not one per range
        rows = rows.coalesce(spark.sparkContext.defaultParallelism)
        run_id = new_run_id()
        w = self._write_typed(rows, table, versions, run_id) if settings.typed else self._write(rows, run_id)
        lost = self._lost_since(versions)
        if lost and settings.on_data_loss == "fail":
            w.discard(settings)
            raise DataLost(
                f"{_loss_kind(lost)}: {_ranges_text(lost)}; nothing of batch {batch_id} was committed; "
                f"restart with --on-data-loss skip to go on without them"
            )
        self._record_loss(lost)
        bad = self._settle_bad(w, batch_id)
        if not w.seen:
            self.totals.replayed_batches += 1
            log.info("continuous export: batch %d: nothing above the recorded versions", batch_id)
            return
        plans = [
            PartitionPlan("", t, p, table.app_id(t, p), versions.get((t, p)), last)
            for (t, p), (_, last) in w.seen.items()
        ]
        gaps = self._gaps(versions, {k: first for k, (first, _) in w.seen.items()})
        hold(HOLD_BEFORE_COMMIT)
        try:
            check_run_age(run_id, settings.orphan_horizon_ms)
            self._commit_dead_letters(w, plans, run_id)  # first: dead_letters.py
        except BaseException:
            w.discard(settings)
            raise
        try:
            version = commit(settings, w.schema, w.files, plans, run_id)
        except BaseException:
            remove_uncommitted(settings, w.files)
            raise
        hold(HOLD_AFTER_COMMIT)
        counts = count_files(w.files)
        self.totals.add_batch(w.files, counts, version)
        for key in w.seen:  # a partition of bad values only is reported too
            self.totals.partitions.setdefault(key, WrittenCounts())
        self.totals.add_bad(bad)
        for key, gap in gaps:
            self.totals.gaps.setdefault(key, []).append(gap)
        log.info(
            "continuous export: batch %d: %s rows of %d partitions, %d files, table version %d in %.2fs%s",
            batch_id,
            f"{sum(c.rows for c in counts.values()):,}",
            len(w.seen),
            len(w.files),
            version,
            time.monotonic() - t0,
            _bad_text(settings, bad),
        )

    def _write(self, rows: DataFrame, run_id: str) -> BatchWritten:
        """The batch's rows as the table's files (binary, utf8 or JSON by DDL: `table_frame`)."""
        writer = make_file_writer(
            self.settings.location, self.schema, self.settings.partition_by, self.settings.target_file_bytes, run_id
        )
        frame = table_frame(self.settings, rows)
        files = [r.asDict() for r in frame.mapInArrow(writer, FILE_META_SCHEMA).collect()]
        seen = {}
        for key, c in count_files(files).items():
            assert c.first_row_seq is not None and c.last_row_seq is not None  # a file holds rows
            seen[key] = (c.first_row_seq, c.last_row_seq)
        return BatchWritten(self.schema, files, seen=seen)

    def _write_typed(
        self, rows: DataFrame, table: LakeTable, versions: dict[Key, int | None], run_id: str
    ) -> BatchWritten:
        """The batch's typed values decoded into the table's files and the dead letters' (`typed_writer`), in the
        columns of the table as the values' schema evolves it (or refuses: `evolved_schema`, as the batch export)."""
        from tank_spark.export.schema import evolved_schema

        settings = self.settings
        schema = evolved_schema(settings, table)
        dead_after: dict[Key, int | None] = {}
        if settings.on_bad_record == "dead_letter":
            dead = dead_letter_settings(settings).location.existing()  # made before the query started
            dead_after = {key: dead.recorded_version(*key) for key in versions}
        fn = typed_writer(settings, schema, dead_after, run_id)
        w = BatchWritten(schema, [])
        for r in rows.mapInArrow(fn, TYPED_META_SCHEMA).collect():
            meta = json.loads(r.meta)
            if r.kind == "file":
                w.files.append(meta)
            elif r.kind == "dead":
                w.dead_files.append(meta)
            elif r.kind == "bad":
                w.bad.append(meta)
            else:
                key = (meta["topic"], meta["partition"])
                was = w.seen.get(key, (meta["first"], meta["last"]))
                w.seen[key] = (min(was[0], meta["first"]), max(was[1], meta["last"]))
        return w

    def _settle_bad(self, w: BatchWritten, batch_id: int) -> dict[Key, BadCounts]:
        """Per partition, the batch's values that did not decode (the first of each named by its segment file);
        with `--on-bad-record fail`, the batch's files removed and the query stopped naming the first.

        Raises:
            BadRecordFailed: on_bad_record fail and a value does not decode.
        """
        if not w.bad:
            return {}
        summaries = sorted(w.bad, key=lambda s: (s["topic"], s["partition"], s["first_seq"]))
        for i, s in enumerate(summaries):
            s["range"] = i  # `count_bad` takes each partition's first from its lowest range: its lowest seq
        counts = count_bad(summaries, set(range(len(summaries))))
        for key, c in counts.items():
            assert c.first is not None  # a partition with bad values
            c.first = (c.first[0], c.first[1], self._file_of(key, c.first[0]))
        if self.settings.on_bad_record == "fail":
            w.discard(self.settings)
            key, c = next(iter(sorted(counts.items())))
            assert c.first is not None
            seq, error, path = c.first
            raise BadRecordFailed(
                f"{path}: seq {seq}: {error}: a value does not decode (on_bad_record fail): nothing of batch "
                f"{batch_id} was committed ({sum(c.bad for c in counts.values())} such value(s) in it)"
            )
        return counts

    def _file_of(self, key: Key, seq: int) -> str:
        """The segment file holding `seq` of a partition now (else the partition's directory)."""
        from tank_log.jobs.planning import select_partitions

        for sel in select_partitions(self.ctx.data_dirs, [key[0]], require_match=False):
            part = sel.partition
            if part.key != key:
                continue
            for seg in part.segments:
                if seg.base <= seq and (seg.last is None or seq <= seg.last):
                    return str(seg.path)
            return str(part.path)
        return "/".join(map(str, key))

    def _commit_dead_letters(self, w: BatchWritten, plans: list[PartitionPlan], run_id: str) -> None:
        """Commit the batch's dead letters with their partitions' versions (before the table's commit)."""
        if not w.dead_files:
            return
        dead = dead_letter_settings(self.settings).location.existing()
        keys = set(count_files(w.dead_files))
        version = commit_dead_letters(
            self.settings, dead, w.dead_files, [p for p in plans if (p.topic, p.partition) in keys], run_id
        )
        if version is not None:
            self.totals.dead_letter_version = version

    def _gaps(self, versions: dict[Key, int | None], firsts: dict[Key, int]) -> list[tuple[Key, tuple[int, int]]]:
        """The seqs compaction removed from `cleanup` partitions before the batch read them: after the table's
        version, before the log's start now and the batch's first row (`PartitionPlan.lost`, as the batch export
        names them; a `delete` partition's are retention's, which the source reports). Each is logged."""
        from tank_log.jobs.planning import select_partitions

        maybe = {k: f for k, f in firsts.items() if (v := versions.get(k)) is not None and f > v + 1}
        if not maybe:
            return []
        out = []
        for sel in select_partitions(self.ctx.data_dirs, {t for t, _ in maybe}, require_match=False):
            part = sel.partition
            if part.key not in maybe or part.config.cleanup_policy == "delete" or not part.readable:
                continue
            start = min(part.readable[0].base, maybe[part.key])  # compacted after the read: the rows say
            lost = PartitionPlan(sel.base_path, part.topic, part.id, None, versions[part.key], None, start).lost
            if lost is None:
                continue
            lo, hi = lost
            log.error(
                "continuous export: %s/%s: seqs %d..%d (%d seqs) are in neither the table nor the log: deleted before "
                "they were exported (the log now starts at %d)",
                part.topic,
                part.id,
                lo,
                hi,
                hi - lo + 1,
                hi + 1,
            )
            out.append((part.key, lost))
        return out

    def _lost_since(self, versions: dict[tuple[str, int], int | None]) -> list[dict[str, Any]]:
        """Ranges the source reported lost since the last look, less the seqs the table already holds."""
        try:
            with open(self.detected) as fh:
                fh.seek(self._detected_at)
                lines = fh.readlines()
                self._detected_at = fh.tell()
        except FileNotFoundError:
            return []
        out = []
        for line in lines:
            r = json.loads(line)
            done = versions.get((r["topic"], r["partition"]))
            lo = r["from_seq"] if done is None else max(r["from_seq"], done + 1)
            if lo <= r["to_seq"]:
                out.append({**r, "from_seq": lo})
            else:
                log.info(
                    "continuous export: %s/%s seqs %s..%s were exported before retention deleted them",
                    r["topic"],
                    r["partition"],
                    r["from_seq"],
                    r["to_seq"],
                )
        return out

    def _record_loss(self, lost: list[dict[str, Any]]) -> None:
        if not lost:
            return
        log.warning("continuous export: skipping messages %s: %s", _loss_kind(lost), _ranges_text(lost))
        self.totals.data_loss += lost
        if self.loss_file:
            with open(self.loss_file, "a") as fh:
                fh.writelines(json.dumps(r) + "\n" for r in lost)


def _bad_text(settings: ExportSettings, bad: dict[Key, BadCounts]) -> str:
    """The batch line's account of its values that did not decode."""
    n = sum(c.bad - c.kept_before for c in bad.values())
    if not n:
        return ""
    what = "dead-lettered" if settings.on_bad_record == "dead_letter" else "skipped"
    return f"; {n:,} value(s) that do not decode {what}"


def _ranges_text(lost: list[dict[str, Any]]) -> str:
    text = describe_lost((r["topic"], r["partition"], r["from_seq"], r["to_seq"]) for r in lost)
    holes = sorted({r["hole"] for r in lost if r.get("hole")})
    return text + (f" ({'; '.join(holes)})" if holes else "")


def _loss_kind(lost: list[dict[str, Any]]) -> str:
    kinds = {HOLE_TEXT if r.get("hole") else "deleted before they were read" for r in lost}
    return " or ".join(sorted(kinds))


def starting_offsets(ctx: JobContext, settings: ExportSettings, table: LakeTable) -> dict[str, int]:
    """Where a query without a checkpoint starts: after each partition's recorded version (else its first seq)."""
    versions = recorded_versions(table, settings, ctx.data_dirs, ctx.topics)
    return {partition_key(t, p): v + 1 for (t, p), v in versions.items() if v is not None}


def local_checkpoint(settings: ExportSettings) -> str | None:
    """The checkpoint directory when it is on the local filesystem (the data loss files go there)."""
    cp = settings.checkpoint or ""
    if "://" in cp and not cp.startswith("file://"):
        return None
    path = os.path.abspath(cp.removeprefix("file://"))
    os.makedirs(path, exist_ok=True)
    return path


def run_continuous(
    ctx: JobContext, settings: ExportSettings, table: LakeTable, schema: pa.Schema, spark: SparkSession
) -> JobResult:
    """Start the query and run it until a stop signal (clean: exit 0) or a failure (`RunFailed`)."""
    from tank_spark.export.job import _named_losses  # the batch export's words for a gap: one home

    dead = open_dead_letters(settings, create=settings.on_bad_record == "dead_letter") if settings.typed else None
    query, exporter = _start_query(ctx, settings, table, schema, spark)
    log.info(
        "continuous export: streaming into %s every %.1fs (checkpoint %s); SIGTERM or Ctrl-C stops it",
        settings.table,
        settings.trigger_interval_ms / 1000,
        settings.checkpoint,
    )
    stopped, failure = _run_until_stopped(query, exporter)
    if failure is not None:
        raise RunFailed(f"continuous export stopped: {_reason(failure)}")
    totals = exporter.totals
    summary = {
        "mode": "continuous",
        "table": settings.table,
        "batches": totals.batches,
        "replayed_batches": totals.replayed_batches,
        "rows": totals.rows,
        "files": totals.files,
        "bytes": totals.bytes,
        "table_version": totals.table_version,
        "data_loss": totals.data_loss,
        "stopped": "signal" if stopped else "query ended",
    }
    results = totals.results()
    if settings.typed:  # each partition's `dead_lettered` or `skipped_bad_records`, as the batch export reports them
        by_key = {(r["topic"], r["partition"]): r for r in results}
        name = dead_letter_settings(settings).table
        bad = BadRun(dead, {}, totals.bad, version=totals.dead_letter_version, mode=settings.on_bad_record, name=name)
        bad.report(by_key, summary)
    return _named_losses(results, summary)


def _start_query(
    ctx: JobContext, settings: ExportSettings, table: LakeTable, schema: pa.Schema, spark: SparkSession
) -> tuple[StreamingQuery, BatchExporter]:
    """The `tank` stream from where the table's recorded versions end, each micro-batch exported by a
    `BatchExporter`, started."""
    from tank_spark.source import register

    register(spark)
    local = local_checkpoint(settings)
    detected = os.path.join(local or tempfile.mkdtemp(prefix="tank-log-stream-"), DETECTED_FILE)
    loss_file = os.path.join(local, DATA_LOSS_FILE) if local else None
    reader = (
        spark.readStream.format("tank")
        .option("startingOffsets", json.dumps(starting_offsets(ctx, settings, table)))
        .option("failOnDataLoss", "false")  # the exporter decides, after checking the table (BatchExporter)
        .option("dataLossLog", detected)
    )
    if ctx.topics:
        reader = reader.option("topics", ",".join(sorted(ctx.topics)))
    if settings.since_ms is not None:
        reader = reader.option("min_ts", str(settings.since_ms))
    exporter = BatchExporter(ctx, settings, schema, detected, loss_file)
    every = f"{settings.trigger_interval_ms} milliseconds"
    trigger: dict[str, Any] = {"availableNow": True} if os.environ.get(AVAILABLE_NOW) else {"processingTime": every}
    query = (
        reader.load(",".join(ctx.data_dirs))
        .writeStream.foreachBatch(exporter)
        .queryName(f"tank-log-export-{uuid.uuid4().hex[:8]}")
        .option("checkpointLocation", settings.checkpoint)
        .trigger(**trigger)
        .start()
    )
    return query, exporter


def _run_until_stopped(query: StreamingQuery, exporter: BatchExporter) -> tuple[bool, Exception | None]:
    """Wait for SIGTERM/SIGINT (then let the batch in flight commit and stop the query) or the query's end: whether
    a signal stopped it, and the failure that ended it, if any."""
    from pyspark.errors import StreamingQueryException

    stop = threading.Event()
    failure: Exception | None = None
    with handling(lambda signum, frame: stop.set(), signal.SIGTERM, signal.SIGINT):
        while query.isActive and not stop.is_set():
            try:
                query.awaitTermination(1)
            except StreamingQueryException as err:
                failure = err
                break
        if stop.is_set():
            log.info("continuous export: stop asked for; finishing the batch in flight")
            exporter.stopping.set()
            with exporter.lock:
                pass  # the batch in flight has committed
            query.stop()
            ended = query.exception()
            if ended is not None and "StopRequested" not in str(ended):
                failure = ended
    return stop.is_set(), failure


_RAISED = re.compile(r"^\s*(?:\w+\.)*(BadRecordFailed|IncompatibleSchema|RunFailed): (.+)$")  # a raised error's line
_OURS = re.compile(r"^\s*(?:tank_log|tank_spark)(?:\.\w+)+: (.+)$")  # any other error of ours, by its module path


def _reason(err: Exception) -> str:
    """The line of a query failure that says what happened (its message carries the whole Python traceback)."""
    text = str(err)
    for line in text.splitlines():
        raised = _RAISED.match(line)
        if raised:
            return raised.group(2).strip()
    for marker in ("deleted before they were read", HOLE_TEXT, "TankFormatError", "RunTooOld", "ConcurrentExport"):
        for line in text.splitlines():
            if marker in line:
                return line.strip()
    for line in text.splitlines():  # e.g. a schema registry out of reach in a task (`RegistryUnavailable`)
        ours = _OURS.match(line)
        if ours:
            return ours.group(1).strip()
    return text.strip().splitlines()[0] if text.strip() else type(err).__name__
