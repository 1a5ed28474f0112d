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

Stop: SIGTERM or Ctrl-C. The batch in flight finishes and commits, no further batch writes anything (one that
starts meanwhile stops before writing, and is replayed at the next start), the report is written, exit 0.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from tank_log.errors import RunFailed, TankLogError
from tank_log.jobs.stopping import handling
from tank_log.lakehouse import LakeTable
from tank_spark.export.commit import ConcurrentExport, commit, remove_uncommitted
from tank_spark.export.files import FILE_META_SCHEMA, WrittenCounts, count_files, make_file_writer
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


class StopRequested(TankLogError):
    """A micro-batch began after the stop was asked for: it wrote nothing, and the next start replays it."""


@dataclass
class StreamTotals:
    """What the query has exported since the job started (the run report)."""

    batches: int = 0
    replayed_batches: int = 0  # batches with nothing above the recorded versions (replayed after a crash)
    rows: int = 0
    files: int = 0
    bytes: int = 0
    table_version: int | None = None
    partitions: dict[tuple[str, int], WrittenCounts] = field(default_factory=dict)
    data_loss: list[dict[str, Any]] = field(default_factory=list)

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

    def results(self) -> list[dict[str, Any]]:
        """The report's per-partition entries."""
        return [
            {"topic": t, "partition": p, "status": "exported", **asdict(c)}
            for (t, p), c in sorted(self.partitions.items())
        ]


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
        run_id = new_run_id()
        writer = make_file_writer(
            settings.location, self.schema, settings.partition_by, settings.target_file_bytes, run_id
        )
        # a micro-batch is many small ranges (a piece of each active segment): one task per core, not per range,
        # so a batch makes a few files, not one per range
        frame = table_frame(settings, rows.coalesce(spark.sparkContext.defaultParallelism))
        files = [r.asDict() for r in frame.mapInArrow(writer, FILE_META_SCHEMA).collect()]
        lost = self._lost_since(versions)
        if lost and settings.on_data_loss == "fail":
            remove_uncommitted(settings, files)
            raise DataLost(
                f"{_loss_kind(lost)}: {_ranges_text(lost)}; nothing of batch {batch_id} was committed; "
                f"restart with --on-data-loss skip to go on without them"
            )
        self._record_loss(lost)
        if not files:
            self.totals.replayed_batches += 1
            log.info("continuous export: batch %d: nothing above the recorded versions", batch_id)
            return
        counts = count_files(files)
        plans = [
            PartitionPlan("", t, p, table.app_id(t, p), versions.get((t, p)), c.last_row_seq)
            for (t, p), c in counts.items()
        ]
        hold(HOLD_BEFORE_COMMIT)
        try:
            check_run_age(run_id, settings.orphan_horizon_ms)
            version = commit(settings, self.schema, files, plans, run_id)
        except BaseException:
            remove_uncommitted(settings, files)
            raise
        hold(HOLD_AFTER_COMMIT)
        self.totals.add_batch(files, counts, version)
        log.info(
            "continuous export: batch %d: %s rows of %d partitions, %d files, table version %d in %.2fs",
            batch_id,
            f"{sum(c.rows for c in counts.values()):,}",
            len(counts),
            len(files),
            version,
            time.monotonic() - t0,
        )

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
    return totals.results(), summary


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
    query = (
        reader.load(",".join(ctx.data_dirs))
        .writeStream.foreachBatch(exporter)
        .queryName(f"tank-log-export-{uuid.uuid4().hex[:8]}")
        .option("checkpointLocation", settings.checkpoint)
        .trigger(processingTime=f"{settings.trigger_interval_ms} milliseconds")
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


def _reason(err: Exception) -> str:
    """The line of a query failure that says what happened (its message carries the whole Python traceback)."""
    text = str(err)
    for marker in ("deleted before they were read", HOLE_TEXT, "TankFormatError", "RunTooOld", "ConcurrentExport"):
        for line in text.splitlines():
            if marker in line:
                return line.strip()
    return text.strip().splitlines()[0] if text.strip() else type(err).__name__
