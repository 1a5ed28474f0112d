"""The Delta export job: new messages of the selected topics → a Delta table, exactly once per (topic, partition).

Exactly-once, incremental: the last exported seq of every partition lives in the Delta table's own log as an
application transaction (app id from table + topic + partition, version = last exported seq). A run exports
seq (version, end] where `end` is fixed when the run is planned; executors write Parquet files into the table
directory (or, for an export of at most `export.in_driver_max_bytes`, the driver writes them itself without starting
Spark); the driver commits all of them in ONE Delta transaction that also records every partition's new version.
A run that dies before the commit leaves only unreferenced files (invisible; the next run exports the same
messages once and, past the orphan horizon, removes them: `orphans.py`). A finished run re-run commits nothing.
delta-rs does not skip an already-recorded transaction version by itself, so the driver re-checks every version
right before committing.

Engines: `deltalake` (delta-rs; default, no JVM jars) commits as above. `spark` (delta-spark) writes through
`df.write.format("delta")` with `txnAppId`/`txnVersion` per partition (one commit per partition: idempotent per
partition but not atomic across partitions); its Spark loads Delta's jars (`tank_spark/jars.py`: those
scripts/setup.sh fetched, or the submission's own), which are checked first with a clear error. Typed values
(`--value-format avro`, ...) decode in its tasks (`rows.typed_frame`), after a first pass that finds the bad ones and
commits their dead letters (`decode_pre_pass`). With `--mode latest` (Delta) it applies the latest rows with
delta-spark's MERGE, one idempotent commit per partition (`latest.py`).

Table layout: partition columns (default `topic`, `date` — the UTC date of ts), target file size; values as
`binary` (default), `utf8`, or `json` with a schema (DDL) giving typed columns. Rows whose value cannot be decoded
are kept with the typed columns null, `decode_error` saying why and `raw_value` holding the bytes (a quarantine
column in the same atomic commit) — never dropped. Empty values (tombstones) decode to nulls without an error.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from tank_log.jobs.progress import describe
from tank_log.lakehouse import LEGACY_SOURCE_KEY, LakeTable, UpkeepStep
from tank_spark.context import JobContext, driver_cores
from tank_spark.export.commit import (
    ConcurrentExport,
    add_ts_raw,
    check_compatible,
    check_delta_spark,
    commit,
    create_table,
    remove_uncommitted,
    table_version,
    write_with_delta_spark,
)
from tank_spark.export.continuous import run_continuous
from tank_spark.export.corruption import Cut, RangeOutcome, cut_at_corruption, scan_ranges
from tank_spark.export.dead_letters import BadCounts, BadRun, dead_letter_orphans, replay
from tank_spark.export.files import (
    FILE_META_SCHEMA,
    count_files,
    make_file_writer,
    write_direct,
)
from tank_spark.export.hooks import HOLD_BEFORE_COMMIT, crash_before_commit, hold
from tank_spark.export.iceberg_spark import append_with_iceberg_spark, check_iceberg_spark
from tank_spark.export.latest import check_mode, merge_latest, table_configuration
from tank_spark.export.orphans import RunTooOld, check_run_age, sweep_orphans
from tank_spark.export.plan import (
    ExportSettings,
    PartitionPlan,
    Prepared,
    add_options,
    plan_export,
    prepare,
)
from tank_spark.export.rows import decoded_frame, direct_ranges
from tank_spark.export.run_id import new_run_id
from tank_spark.export.schema import EVOLVABLE, evolved_schema, table_schema
from tank_spark.report import count_by
from tank_spark.runner import JobResult, run_job
from tank_spark.tasks import Workers, is_connect

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


COMMIT_ATTEMPTS = 3  # re-plans after a concurrent commit before the run fails


def execute(ctx: JobContext, prepared: Prepared, spark: SparkSession | None) -> JobResult:
    """Sweep orphans of crashed runs, then export once (and optimize/vacuum as asked) or continuously."""
    settings, plans, table = prepared
    if settings.replay_dead_letters:
        return replay(settings, ctx.topics, new_run_id(), dry_run=ctx.dry_run)
    sweep = (
        None
        if table is None
        else sweep_orphans(settings.location, table, settings.orphan_horizon_ms, dry_run=ctx.dry_run)
    )
    if settings.continuous:
        assert spark is not None  # `needs_spark`: a stream runs on Spark
        results, summary = _continuous(ctx, spark, settings, table)
    else:
        results, summary = _export(ctx, spark, settings, plans, table)
        steps = _upkeep(settings, ctx.dry_run)
        if steps:
            summary["upkeep"] = [asdict(s) for s in steps]
    if sweep is not None:
        summary["orphans"] = asdict(sweep)
    dead_letter_orphans(settings, summary, ctx.dry_run)  # the dead-letter table's sweep (once per run)
    return results, summary


def _continuous(ctx: JobContext, spark: SparkSession, settings: ExportSettings, table: LakeTable | None) -> JobResult:
    """Make sure the table exists (and has `ts_raw`), then stream until stopped (`continuous.py`)."""
    schema = table_schema(settings)
    if table is not None and settings.typed:  # a newer schema of the values: evolve the table or refuse, as _export
        schema = evolved_schema(settings, table)
    if table is None:
        table = create_table(settings, schema)
    elif check_compatible(settings, schema, table):
        add_ts_raw(table)
    return run_continuous(ctx, settings, table, schema, spark)


def _upkeep(settings: ExportSettings, dry_run: bool) -> list[UpkeepStep]:
    if not settings.optimize and settings.vacuum_retention_ms is None:
        return []
    table = settings.location.open()
    if table is None:  # a dry run before the first export
        return []
    steps = []
    if settings.optimize:
        steps.append(table.compact_files(settings.target_file_bytes, dry_run=dry_run))
    if settings.vacuum_retention_ms is not None:  # the retention was checked against the table in `prepare`
        steps.append(table.remove_unreferenced(settings.vacuum_retention_ms, dry_run=dry_run))
    return steps


def needs_spark(ctx: JobContext, prepared: Prepared) -> bool:
    """Spark starts only for work on executors: an up-to-date run or an upkeep-only task (orphans, optimize, vacuum:
    delta-rs on the driver) runs without a JVM, and so does an export small enough for the driver (`in_driver`). A
    JSON value schema is parsed by Spark, so it checks the table."""
    settings, plans, _ = prepared
    if settings.replay_dead_letters:  # the driver alone
        return False
    json_check = settings.value_format == "json" and not settings.typed and not settings.upkeep_only
    if settings.continuous or json_check:
        return True
    return any(p.has_work for p in plans) and not in_driver(ctx, settings, plans)


def uses_delta_spark(ctx: JobContext, prepared: Prepared) -> bool:
    """The delta-spark engine writes through Spark: its session loads Delta's jars."""
    return prepared[0].engine == "spark"


def not_through_connect(ctx: JobContext, prepared: Prepared) -> str | None:
    """Why this run cannot go through Spark Connect (`--remote`), or None: the files are written by `mapInArrow`
    (`tasks.through_connect`) and committed by the driver, but the runs below need the SparkContext or the
    driver's JVM."""
    settings = prepared[0]
    if settings.engine == "spark":
        return "--engine spark writes through delta-spark or Iceberg's runtime in the driver's JVM (use deltalake)"
    if settings.continuous:
        return "a continuous export streams on the driver's SparkContext"
    if settings.value_format == "json" and not settings.typed:
        return "--value-format json with a DDL schema decodes through Spark SQL on the driver's session"
    return None


def in_driver(ctx: JobContext, settings: ExportSettings, plans: list[PartitionPlan]) -> bool:
    """Whether this export reads at most `in_driver_max_bytes` of segment data (binary or utf8 values, delta-rs): then
    the driver reads and writes it itself. Starting Spark and its first job's Python workers costs seconds
    (bench/RESULTS.md), more than such an export takes on one core."""
    sql = settings.value_format == "json" and not settings.typed
    if not settings.in_driver_max_bytes or settings.engine != "deltalake" or sql:
        return False
    total = 0
    for r in direct_ranges(ctx, settings, plans):
        total += (r.stop if r.stop is not None else os.path.getsize(r.path)) - r.start
        if total > settings.in_driver_max_bytes:
            return False
    return True


def _export(
    ctx: JobContext,
    spark: SparkSession | None,
    settings: ExportSettings,
    plans: list[PartitionPlan],
    table: LakeTable | None,
) -> JobResult:
    t0 = time.monotonic()
    results = _results(plans)
    iceberg = settings.table_format == "iceberg" and settings.engine != "spark"  # pyiceberg writes and commits
    engine = "pyiceberg" if iceberg else settings.engine
    summary = {"partitions": len(plans), "table": settings.table, "engine": engine, "source": settings.source}
    if not settings.upkeep_only:  # the settings must still fit the table, work or not
        schema = table_schema(settings)
        if settings.typed and table is not None and not ctx.dry_run:
            schema = evolved_schema(settings, table)  # a new version of the values' schema
        evolve = table is not None and check_compatible(settings, schema, table)
    if not any(p.has_work for p in plans):
        summary.update(by_status=count_by(list(results.values())), rows=0, table_version=table_version(table))
        return _named_losses(list(results.values()), summary)
    summary["executed_on"] = "executors" if spark is not None else "driver"  # the driver: `in_driver`
    workers = _workers(ctx, spark)
    if settings.engine == "spark":
        assert spark is not None  # `in_driver`: only delta-rs exports run without Spark
        (check_iceberg_spark if settings.table_format == "iceberg" else check_delta_spark)(spark)
    if ctx.dry_run:
        return _named_losses(*_dry_run(ctx, workers, settings, plans, results, summary, table))
    if table is None:  # the table's id names the partitions' recorded versions (`lakehouse.app_id`)
        table = create_table(settings, schema, table_configuration(settings))
        plans = [replace(p, app_id=table.app_id(p.topic, p.partition)) for p in plans]
    if evolve:
        missing = [f.name for f in EVOLVABLE if f.name not in table.arrow_schema().names]
        log.info("export: adding column(s) %s to %s (schema evolution)", ", ".join(missing), settings.table)
        add_ts_raw(table)
    _claim_legacy_versions(settings, table, plans)
    if settings.mode == "latest":
        return _named_losses(*_latest(ctx, spark, workers, settings, schema, plans, summary, t0))
    if settings.engine == "spark" and settings.table_format == "iceberg":
        assert spark is not None
        run = append_with_iceberg_spark(ctx, spark, workers, settings, schema, plans)
    elif settings.engine == "spark":
        assert spark is not None
        run = _append_with_delta_spark(ctx, spark, workers, settings, schema, plans)
    else:
        run = _append_with_delta_rs(ctx, spark, workers, settings, schema, plans, t0)
    if run.cut is None:  # a re-plan after a concurrent commit found nothing left to export
        summary.update(by_status=count_by(list(run.results.values())), rows=0, table_version=run.version)
        return _named_losses(list(run.results.values()), summary)
    return _named_losses(*_appended_report(run, run.cut, summary, t0))


def _claim_legacy_versions(settings: ExportSettings, table: LakeTable, plans: list[PartitionPlan]) -> None:
    """A table written before sources: its recorded versions (and rows with a null `source`) become this run's
    source's, the first sourced export that finds one of them (`LEGACY_SOURCE_KEY`; docs/guides/export.md,
    "Sources")."""
    found = any(p.recorded is not None and p.recorded.unsourced for p in plans)
    if settings.source and found and LEGACY_SOURCE_KEY not in table.properties():
        log.warning(
            "export: table %s was written before sources: its recorded versions and rows become source %s's",
            settings.table,
            settings.source,
        )
        table.claim_legacy_versions(settings.source)


def _named_losses(results: list[dict[str, Any]], summary: dict[str, Any]) -> JobResult:
    """Name the seqs that are in neither place: after what the table holds, before what the log still has (deleted
    before they were exported). Each such partition's rows are committed and its version moves past the gap, so the
    run that crosses it says so: status data-loss (exit 1), an ERROR line, and `lost_*` in its report entry and the
    summary (`lost_before_export`); the next run finds nothing missing."""
    lost = 0
    for r in results:
        if r.get("lost_messages") and r["status"] in ("exported", "dry-run", "pending", "up-to-date"):
            if r["status"] != "dry-run":
                r["status"] = "data-loss"
            r["reason"] = (
                f"seqs {r['lost_first_seq']}..{r['lost_last_seq']} ({r['lost_messages']} seqs) are in neither the "
                f"table nor the log: deleted before they were exported (the log now starts at "
                f"{r['lost_last_seq'] + 1})"
            )
            log.error("export: %s/%s: %s", r["topic"], r["partition"], r["reason"])
        lost += r.get("lost_messages") or 0
    if lost:
        summary["lost_before_export"] = lost
        summary["by_status"] = count_by(results)
    return results, summary


@dataclass
class _Appended:
    """What an append run committed: the partitions' report rows, the files of the commit (delta-rs), the plans
    after malformed ranges, and the table's version after it."""

    results: dict[tuple[str, int], dict[str, Any]]
    files: list[dict[str, Any]]
    cut: Cut | None  # None: a re-plan after a concurrent commit found nothing left to export
    version: int | None
    bad: BadRun | None = None  # typed values: those that did not decode


def _dry_run(
    ctx: JobContext,
    workers: Workers,
    settings: ExportSettings,
    plans: list[PartitionPlan],
    results: dict[tuple[str, int], dict[str, Any]],
    summary: dict[str, Any],
    table: LakeTable | None,
) -> JobResult:
    """--dry-run: read every range, write nothing; the rows each partition would export, and what would fail."""
    outcomes, cut = _pre_pass(workers, ctx, settings, plans)
    for o in outcomes:
        if o.index in cut.kept and o.rows:
            _count(results[o.key], o.rows, o.min_seq, o.max_seq)
    for p in plans:
        if p.has_work:
            results[(p.topic, p.partition)]["status"] = "dry-run"
    _record_failures(results, cut)
    summary.update(
        by_status=count_by(list(results.values())),
        rows=sum(r["rows"] for r in results.values()),
        table_version=table_version(table),
    )
    return list(results.values()), summary


def _append_with_delta_spark(
    ctx: JobContext,
    spark: SparkSession,
    workers: Workers,
    settings: ExportSettings,
    schema: pa.Schema,
    plans: list[PartitionPlan],
) -> _Appended:
    """The delta-spark engine: one idempotent commit per partition (`txnAppId`/`txnVersion`), after the dead letters'
    commit (typed values); a concurrent commit re-plans, keeping the partitions already committed."""
    written: dict[tuple[str, int], list[RangeOutcome]] = {}  # the partitions committed, over the attempts
    committed: dict[tuple[str, int], tuple[int, int]] = {}  # their commits' files and bytes
    refused: dict[tuple[str, int], str] = {}  # the partitions whose rows a constraint of the table refused
    bad_counts: dict[tuple[str, int], BadCounts] = {}  # typed values: the committed partitions' bad values
    for attempt in range(1, COMMIT_ATTEMPTS + 1):
        run_id = new_run_id()
        outcomes, cut, bad = decode_pre_pass(workers, ctx, settings, schema, plans, run_id)
        hold(HOLD_BEFORE_COMMIT)  # test hook
        done: list[PartitionPlan] = []
        try:
            if bad is not None:
                bad.commit(settings, cut.plans, run_id)  # first: dead_letters.py
            version = write_with_delta_spark(
                lambda p: decoded_frame(spark, ctx, settings, [p], schema),
                settings,
                [p for p in cut.plans if p.has_work],
                run_id,
                done,
                committed,
                refused,
            )
        except ConcurrentExport as conflict:
            if attempt == COMMIT_ATTEMPTS:
                raise _out_of_attempts(conflict, f"{COMMIT_ATTEMPTS} attempts") from None
            log.warning("export: %s; re-planning (attempt %d)", conflict, attempt + 1)
            plans, _ = plan_export(ctx, settings)
            continue
        finally:
            keys = {(p.topic, p.partition) for p in done}
            written.update({k: [o for o in outcomes if o.key == k and o.index in cut.kept] for k in keys})
            if bad is not None:
                bad_counts.update({k: c for k, c in bad.counts.items() if k in keys})
        break
    results = _results(plans)
    for key, kept in written.items():
        for o in kept:
            _count(results[key], o.rows, o.min_seq, o.max_seq)
        if key in bad_counts:  # the rows read that did not decode: not in the table
            results[key]["rows"] -= bad_counts[key].bad
        results[key]["status"] = "exported"
        results[key]["files"], results[key]["bytes"] = committed.get(key, (0, 0))
    for key, violation in refused.items():
        reason = "a constraint of the table refuses its rows: nothing of this partition was written"
        results[key].update(status="failed", error=violation, reason=reason)
    if bad is not None:
        bad.counts = bad_counts  # the report's: those of the partitions committed, over the attempts
    return _Appended(results, [], cut, version, bad)


def decode_pre_pass(
    workers: Workers,
    ctx: JobContext,
    settings: ExportSettings,
    schema: pa.Schema,
    plans: list[PartitionPlan],
    run_id: str,
) -> tuple[list[RangeOutcome], Cut, BadRun | None]:
    """The first pass of the spark engine, whose writer commits on its own: `_pre_pass`, and for typed values the
    values decoded too (`files.write_direct` without the table's files), the bad ones by `on_bad_record` (with
    `dead_letter`, written as the dead-letter table's files) for the run to commit BEFORE Spark's writer writes the
    good ones, which Spark's tasks decode again (`rows.typed_frame`)."""
    bad = BadRun.start(settings, plans)
    if bad is None:
        outcomes, cut = _pre_pass(workers, ctx, settings, plans)
        return outcomes, cut, None
    w = write_direct(workers, direct_ranges(ctx, settings, plans), settings, schema, run_id, bad.dead_after, False)
    cut = bad.settle(settings, w, cut_at_corruption(plans, w.outcomes, settings.on_corruption))
    return w.outcomes, cut, bad


def _append_with_delta_rs(
    ctx: JobContext,
    spark: SparkSession | None,
    workers: Workers,
    settings: ExportSettings,
    schema: pa.Schema,
    plans: list[PartitionPlan],
    t0: float,
) -> _Appended:
    """The delta-rs engine: write every range's files, then ONE commit with every partition's new version; a
    concurrent commit removes this attempt's files and re-plans."""
    sql_path = settings.value_format == "json" and not settings.typed
    for attempt in range(1, COMMIT_ATTEMPTS + 1):
        run_id = new_run_id()
        bad = BadRun.start(settings, plans)
        files, cut = _write_files(ctx, spark, workers, settings, schema, plans, sql_path, t0, run_id, bad)
        if not any(p.has_work for p in cut.plans):  # every partition with work turned out malformed
            return _Appended(_results(plans), files, cut, table_version(settings.location.open()), bad)
        hold(HOLD_BEFORE_COMMIT)  # test hook
        t_commit = time.monotonic()
        try:
            check_run_age(run_id, settings.orphan_horizon_ms)
        except RunTooOld:
            remove_uncommitted(settings, files)
            raise
        try:
            if bad is not None:
                bad.commit(settings, cut.plans, run_id)  # first: dead_letters.py
            version = commit(settings, schema, files, cut.plans, run_id)
        except ConcurrentExport as conflict:
            remove_uncommitted(settings, files)
            if attempt == COMMIT_ATTEMPTS:
                raise _out_of_attempts(conflict, f"nothing committed after {COMMIT_ATTEMPTS} attempts") from None
            log.warning("export: %s; nothing committed, re-planning (attempt %d)", conflict, attempt + 1)
            plans, _ = plan_export(ctx, settings)
            if not any(p.has_work for p in plans):
                return _Appended(_results(plans), [], None, table_version(settings.location.open()))
            continue
        log.info("export: committed table version %s in %.2fs", version, time.monotonic() - t_commit)
        return _Appended(_results(plans), files, cut, version, bad)
    raise AssertionError("unreachable: the last attempt returns or raises")


def _out_of_attempts(conflict: ConcurrentExport, attempts: str) -> ConcurrentExport:
    """The error of a run whose every commit attempt met another export's commit."""
    return ConcurrentExport(
        f"{conflict}; {attempts}: another export commits to these partitions meanwhile (a continuous export of the "
        "same topics?)"
    )


def _appended_report(run: _Appended, cut: Cut, summary: dict[str, Any], t0: float) -> JobResult:
    """The report of an append run: each partition's rows, files and bytes committed, and the run's totals."""
    results, files = run.results, run.files
    for key, c in count_files(files).items():
        r = results[key]
        _count(r, c.rows, c.first_row_seq, c.last_row_seq)
        r["quarantined"] += c.quarantined
        r["files"] += c.files
        r["bytes"] += c.bytes
    for p in cut.plans:
        if p.has_work and results[(p.topic, p.partition)]["status"] in ("pending", "exported"):
            results[(p.topic, p.partition)]["status"] = "exported"
    _record_failures(results, cut)
    if run.bad is not None:
        run.bad.report(results, summary)
    for r in results.values():
        if r["status"] == "exported":
            log.info("export: %s", describe(r))
    rows = sum(r["rows"] for r in results.values())
    elapsed = time.monotonic() - t0
    summary.update(
        by_status=count_by(list(results.values())),
        rows=rows,
        # delta-rs: the commit's files (one may hold several partitions); delta-spark: one commit per partition
        bytes=sum(f["size"] for f in files) if files else sum(r["bytes"] for r in results.values()),
        files=len(files) if files else sum(r["files"] for r in results.values()),
        table_version=run.version,
        quarantined=sum(r["quarantined"] for r in results.values()),
        export_s=round(elapsed, 3),
        rows_per_s=round(rows / elapsed) if elapsed else None,
    )
    return list(results.values()), summary


def _latest(
    ctx: JobContext,
    spark: SparkSession | None,
    workers: Workers,
    settings: ExportSettings,
    schema: pa.Schema,
    plans: list[PartitionPlan],
    summary: dict[str, Any],
    t0: float,
) -> JobResult:
    """--mode latest (`latest.py`): read, reduce to the latest per key and MERGE in one commit; the same report, with
    each partition's keys merged, tombstones among them and keyless messages skipped."""
    run = merge_latest(ctx, spark, workers, settings, schema, plans, COMMIT_ATTEMPTS)
    results = _results(run.plans)
    for o in run.outcomes:
        _count(results[o.key], o.rows, o.min_seq, o.max_seq)
    for p in run.cut.plans:
        k = (p.topic, p.partition)
        if p.has_work:
            results[k].update(status="exported", keys=run.keys.get(k, 0), tombstones=run.tombstones.get(k, 0))
        results[k]["keyless_skipped"] = run.keyless.get(k, 0)
    _record_failures(results, run.cut)
    if run.bad is not None:
        run.bad.report(results, summary)
    for r in results.values():
        if r["status"] == "exported":
            log.info("export: %s", describe(r))
    keyless = sum(run.keyless.values())
    if keyless:
        log.warning("export: %d keyless messages skipped: a latest table holds keyed messages only", keyless)
    summary.update(
        by_status=count_by(list(results.values())),
        rows=sum(r["rows"] for r in results.values()),
        keys=sum(run.keys.values()),
        keyless_skipped=keyless,
        merge=run.metrics,
        table_version=run.version if run.version is not None else table_version(settings.location.open()),
        export_s=round(time.monotonic() - t0, 3),
    )
    return list(results.values()), summary


def _count(r: dict[str, Any], rows: int, lo: int | None, hi: int | None) -> None:
    r["rows"] += rows
    if lo is not None:
        r["first_row_seq"] = min(lo, r.get("first_row_seq") or lo)
    if hi is not None:
        r["last_row_seq"] = max(hi, r.get("last_row_seq") or hi)


def _record_failures(results: dict[tuple[str, int], dict[str, Any]], cut: Cut) -> None:
    for key, fields in cut.failures.items():
        results[key].update(fields)
        log.error("export: %s/%s failed: %s (%s)", key[0], key[1], fields["error"], fields["reason"])


def _results(plans: list[PartitionPlan]) -> dict[tuple[str, int], dict[str, Any]]:
    """The report row of each partition, before anything is written."""
    return {(p.topic, p.partition): _result(p) for p in plans}


def _result(p: PartitionPlan) -> dict[str, Any]:
    out: dict[str, Any] = {
        "topic": p.topic,
        "partition": p.partition,
        "path": p.base_path,
        "app_id": p.app_id,
        "previous_version": p.previous,
        "from_seq": p.first if p.has_work else None,
        "to_seq": p.end if p.has_work else None,
        "status": "pending" if p.has_work else "up-to-date",
        "rows": 0,
        "quarantined": 0,
        "files": 0,
        "bytes": 0,
    }
    if p.recorded is not None and p.recorded.undone:  # the table's history undid its recorded version
        out.update(recorded_version=p.recorded.recorded, undone=p.recorded.undone)
    if p.lost is not None:
        out.update(lost_first_seq=p.lost[0], lost_last_seq=p.lost[1], lost_messages=p.lost[1] - p.lost[0] + 1)
    return out


def _workers(ctx: JobContext, spark: SparkSession | None) -> Workers:
    """Spark's executors, or for an export small enough for the driver (`in_driver`) as many of its threads as the
    master has cores (`context.driver_cores`: local[1] gives one), as the partition jobs' processes."""
    if spark is not None:  # a Spark Connect session has no SparkContext: `tasks.through_connect`
        return spark if is_connect(spark) else spark.sparkContext
    threads = driver_cores(ctx)
    log.info("export: in %d thread(s) of the driver's", threads)
    return threads


def _pre_pass(
    workers: Workers, ctx: JobContext, settings: ExportSettings, plans: list[PartitionPlan]
) -> tuple[list[RangeOutcome], Cut]:
    """Read every range once, writing nothing, and cut the plans at malformed data (`corruption.py`): the dry run,
    and the first pass of exports that decode through Spark SQL (the data source cannot report per range)."""
    outcomes = scan_ranges(workers, direct_ranges(ctx, settings, plans))
    return outcomes, cut_at_corruption(plans, outcomes, settings.on_corruption)


def _write_files(
    ctx: JobContext,
    spark: SparkSession | None,
    workers: Workers,
    settings: ExportSettings,
    schema: pa.Schema,
    plans: list[PartitionPlan],
    sql_path: bool,
    t0: float,
    run_id: str,
    bad: BadRun | None = None,
) -> tuple[list[dict[str, Any]], Cut]:
    """Write every partition's range as Parquet files under the table (not committed), named by `run_id`; return the
    metadata of the files to commit and the run's plans after malformed ranges (files past a corruption are
    removed)."""
    if sql_path:
        assert spark is not None  # `in_driver`: JSON values are decoded by Spark SQL
        _, cut = _pre_pass(workers, ctx, settings, plans)
        writer = make_file_writer(settings.location, schema, settings.partition_by, settings.target_file_bytes, run_id)
        df = decoded_frame(spark, ctx, settings, cut.plans)
        files = [r.asDict() for r in df.mapInArrow(writer, FILE_META_SCHEMA).collect()]
    else:
        ranges = direct_ranges(ctx, settings, plans)
        log.info("export: %d partitions with new messages, %d read tasks", sum(p.has_work for p in plans), len(ranges))
        w = write_direct(workers, ranges, settings, schema, run_id, bad.dead_after if bad else None)
        cut = cut_at_corruption(plans, w.outcomes, settings.on_corruption)
        if bad is not None:
            cut = bad.settle(settings, w, cut)  # on_bad_record fail: those partitions fail
        files = [f for f in w.files if f["range"] in cut.kept]
        remove_uncommitted(settings, [f for f in w.files if f["range"] not in cut.kept])
    log.info("export: %d Parquet files written in %.2fs; committing", len(files), time.monotonic() - t0)
    crash_before_commit(len(files))  # test hook
    return files, cut


def _prepare(ctx: JobContext, args: Any) -> Prepared:
    prepared = prepare(ctx, args)
    check_mode(prepared)  # latest.py: the table's mode, what --mode latest does not take
    return prepared


def main(argv: list[str] | None = None) -> int:
    return run_job(
        "export_delta",
        "Export new messages to a Delta table, exactly once per partition.",
        add_options,
        _prepare,
        execute,
        argv,
        needs_spark=needs_spark,
        needs_delta=uses_delta_spark,
        not_through_connect=not_through_connect,
    )
