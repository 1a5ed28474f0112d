"""Typed values that do not decode (`on_bad_record`, docs/guides/typed-tables.md): into a dead-letter table beside
the table (`dead_letter`, the default), counted and left out (`skip`), or their partition fails (`fail`).

Every message ends in exactly one of the two tables, across kills and reruns. The dead-letter table records its own
version per partition (an app id of its own, `tank_log.lakehouse`), and a run commits it FIRST, then the table:

- a run killed before the first commit committed nothing: the next run does it all again;
- a run killed between the two commits left the dead letters of seqs up to `end` committed and the table's version
  where it was: the next run exports the same range again, and drops the bad values at or below the dead-letter
  table's version (they are there already); the good ones go to the table as before. Decoding is a function of the
  value and the schema settings: a rerun with other settings may decode a value the first run dead-lettered (it is
  then in both tables; `replay` says how to leave it in one).

The files of a run killed before the dead-letter commit are orphans of the dead-letter table: the first time a later
run opens it (batch, continuous or replay), it sweeps them by the table's rules and horizon (`orphans.py`), once per
run, and reports the sweep as `dead_letter_orphans` beside the table's `orphans`.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from tank_log.lakehouse import text_column
from tank_spark.export.hooks import hold
from tank_spark.export.orphans import OrphanSweep, RunTooOld, check_run_age, sweep_orphans
from tank_spark.export.plan import ExportSettings, PartitionPlan

if TYPE_CHECKING:
    from tank_log.lakehouse import LakeTable
    from tank_spark.export.corruption import Cut
    from tank_spark.export.files import Written
    from tank_spark.runner import JobResult

log = logging.getLogger(__name__)

HOLD_AFTER_DEAD_LETTERS = "TANK_LOG_EXPORT_HOLD_DEAD_LETTERS"  # test hook: PATH: wait between the two commits


def dead_letter_settings(settings: ExportSettings) -> ExportSettings:
    """The settings of the dead-letter table: same format, catalog, storage and partitioning as the table."""
    from tank_log.jobs.config.models import default_dead_letter_table

    table = settings.dead_letter_table or default_dead_letter_table(settings.table)
    return replace(
        settings, table=table, value_spec=None, key_spec=None, value_format="binary", value_schema=None, mode="append"
    )


def open_dead_letters(settings: ExportSettings, create: bool, *, dry_run: bool = False) -> LakeTable | None:
    """The dead-letter table (created when `create` and missing), its orphans swept the first time a run opens it
    (`sweep_dead_letters`)."""
    from tank_spark.export.schema import DEAD_LETTER_SCHEMA

    dead = dead_letter_settings(settings)
    table = dead.location.open()
    if table is None and create:
        table = dead.location.create(DEAD_LETTER_SCHEMA, dead.partition_by, None)
        log.info("export: created the dead-letter table %s", dead.table)
    if table is not None:
        sweep_dead_letters(settings, table, dry_run)
    return table


# Per dead-letter table, the settings of the last run that swept it (a run's settings are one object, over its
# commit attempts: `plan.prepare`) and its sweep.
_SWEPT: dict[str, tuple[ExportSettings, OrphanSweep]] = {}


def sweep_dead_letters(settings: ExportSettings, table: LakeTable, dry_run: bool = False) -> OrphanSweep:
    """Remove the dead-letter table's orphans: files of runs killed before their dead-letter commit, by the rules and
    horizon of the table's own (`orphans.py`). Once per run: later calls return the run's first sweep."""
    dead = dead_letter_settings(settings)
    done = _SWEPT.get(dead.table)
    if done is not None and done[0] is settings:
        return done[1]
    where = f"the dead-letter table {dead.table}: "
    sweep = sweep_orphans(dead.location, table, settings.orphan_horizon_ms, dry_run=dry_run, where=where)
    _SWEPT[dead.table] = (settings, sweep)
    return sweep


def dead_letter_orphans(settings: ExportSettings, summary: dict[str, Any], dry_run: bool) -> None:
    """The run's sweep of the dead-letter table (made now when the run has not opened it: a dry run, nothing to
    export) into `summary`, as `dead_letter_orphans` beside the table's `orphans`; nothing for values not typed or
    no dead-letter table."""
    if settings.typed and open_dead_letters(settings, create=False, dry_run=dry_run) is not None:
        summary["dead_letter_orphans"] = asdict(_SWEPT[dead_letter_settings(settings).table][1])


def recorded(table: LakeTable | None, plans: Iterable[PartitionPlan]) -> dict[tuple[str, int], int | None]:
    """Per partition, the last seq whose dead letters the dead-letter table holds (None: none recorded)."""
    return {
        (p.topic, p.partition): None if table is None else table.recorded_version(p.topic, p.partition) for p in plans
    }


@dataclass
class BadRecords:
    """A range's bad values as its rows are decoded (executor side): `split` passes the good rows on and keeps the
    dead letters to write (those at or below `after`, the dead-letter table's recorded version, are there already);
    `summary` is what the driver reports and acts on."""

    index: int
    path: str
    topic: str
    partition: int
    mode: str  # on_bad_record
    after: int | None  # the dead-letter table's recorded version of this partition
    dead: list[pa.RecordBatch] = field(default_factory=list)
    bad: int = 0
    kept_before: int = 0  # bad values a previous run's dead-letter commit already holds
    first: tuple[int, str] | None = None  # (seq, error) of the first bad value

    def split(
        self, batches: Iterable[pa.RecordBatch], settings: ExportSettings, schema: pa.Schema
    ) -> Iterator[pa.RecordBatch]:
        import pyarrow.compute as pc

        from tank_spark.export.rows import typed_rows

        for b in batches:
            rows = typed_rows(b, settings, schema)
            yield rows.good
            n = rows.bad.num_rows
            if not n:
                continue
            self.bad += n
            if self.first is None:
                self.first = (rows.bad.column("seq")[0].as_py(), rows.bad.column("error")[0].as_py())
            if self.mode != "dead_letter":
                continue
            new = rows.bad
            if self.after is not None:
                new = new.filter(pc.greater(new.column("seq"), self.after))
                self.kept_before += n - new.num_rows
            if new.num_rows:
                self.dead.append(new)

    def summary(self) -> dict[str, Any]:
        return {
            "range": self.index,
            "topic": self.topic,
            "partition": self.partition,
            "bad": self.bad,
            "kept_before": self.kept_before,
            "first_seq": self.first[0] if self.first else None,
            "first_error": self.first[1] if self.first else None,
            "file": self.path,
        }


@dataclass
class BadCounts:
    """One partition's bad values in a run."""

    bad: int = 0
    kept_before: int = 0
    first: tuple[int, str, str] | None = None  # (seq, error, file) of the first


def count_bad(summaries: list[dict[str, Any]], kept: set[int]) -> dict[tuple[str, int], BadCounts]:
    """Per partition, the bad values of the kept ranges (`BadRecords.summary`)."""
    out: dict[tuple[str, int], BadCounts] = {}
    for s in sorted(summaries, key=lambda s: s["range"]):
        if s["range"] not in kept or not s["bad"]:
            continue
        c = out.setdefault((s["topic"], s["partition"]), BadCounts())
        c.bad += s["bad"]
        c.kept_before += s["kept_before"]
        if c.first is None:
            c.first = (s["first_seq"], s["first_error"], s["file"])
    return out


def commit_dead_letters(
    settings: ExportSettings, table: LakeTable, files: list[dict[str, Any]], plans: list[PartitionPlan], run_id: str
) -> int | None:
    """Commit the dead letters' files with each partition's new version in the dead-letter table (before the table's
    own commit: module doc), skipping partitions it already records up to their end. Returns its version."""
    from tank_spark.export.commit import commit
    from tank_spark.export.schema import DEAD_LETTER_SCHEMA

    dead = dead_letter_settings(settings)
    now = recorded(table, plans)
    work = [
        replace(p, app_id=table.app_id(p.topic, p.partition), previous=now[(p.topic, p.partition)])
        for p in plans
        if p.has_work and p.end is not None and (now[(p.topic, p.partition)] or 0) < p.end
    ]
    if not work:
        return None
    check_run_age(run_id, settings.orphan_horizon_ms)  # past it, a sweep may have taken the files: `orphans.py`
    version = commit(dead, DEAD_LETTER_SCHEMA, files, work, run_id)
    log.info("export: committed %d dead-letter file(s): %s version %s", len(files), dead.table, version)
    hold(HOLD_AFTER_DEAD_LETTERS)  # test hook
    return version


@dataclass
class BadRun:
    """A run's bad values, from its start (the dead-letter table and what it records) to its report."""

    table: LakeTable | None  # the dead-letter table (None: on_bad_record skip or fail)
    dead_after: dict[tuple[str, int], int | None]
    counts: dict[tuple[str, int], BadCounts] = field(default_factory=dict)
    dead_files: list[dict[str, Any]] = field(default_factory=list)
    version: int | None = None
    mode: str = "dead_letter"
    name: str | None = None  # the dead-letter table's path or name, for the report

    @classmethod
    def start(cls, settings: ExportSettings, plans: list[PartitionPlan]) -> BadRun | None:
        """None for values that are not typed."""
        if not settings.typed:
            return None
        table = open_dead_letters(settings, create=settings.on_bad_record == "dead_letter")
        name = dead_letter_settings(settings).table
        return cls(table, recorded(table, plans), mode=settings.on_bad_record, name=name)

    def settle(self, settings: ExportSettings, written: Written, cut: Cut) -> Cut:
        """Count the kept ranges' bad values; with `fail`, fail each partition holding one (nothing of it
        committed: its ranges are not kept, its version stays); keep the dead letters of the kept ranges."""
        from tank_spark.export.corruption import Cut

        self.counts = count_bad(written.bad, cut.kept)
        plans, failures = list(cut.plans), dict(cut.failures)
        failed: set[tuple[str, int]] = set()
        if self.mode == "fail":
            for key, c in self.counts.items():
                assert c.first is not None
                seq, error, path = c.first
                failed.add(key)
                failures[key] = {
                    "status": "failed",
                    "error": f"{path}: seq {seq}: {error}",
                    "on_bad_record": "fail",
                    "bad_records": c.bad,
                    "reason": "a value does not decode (on_bad_record fail): nothing of this partition exported",
                }
            plans = [replace(p, end=p.first - 1) if (p.topic, p.partition) in failed else p for p in plans]
        ranges = {o.index: o.key for o in written.outcomes}
        kept = {i for i in cut.kept if ranges.get(i) not in failed}
        self.dead_files = [f for f in written.dead_files if f["range"] in kept]
        _remove_dead(settings, [f for f in written.dead_files if f["range"] not in kept])
        return Cut(plans, kept, failures)

    def commit(self, settings: ExportSettings, plans: list[PartitionPlan], run_id: str) -> None:
        """Commit the dead letters (before the table: module doc); a conflict, or a run past the orphan horizon,
        removes their files."""
        from tank_spark.export.commit import ConcurrentExport

        if self.table is None:
            return
        try:
            self.version = commit_dead_letters(settings, self.table, self.dead_files, plans, run_id)
        except (ConcurrentExport, RunTooOld):
            _remove_dead(settings, self.dead_files)
            raise

    def discard(self, settings: ExportSettings) -> None:
        """Remove the dead letters' files of a run that commits nothing."""
        _remove_dead(settings, self.dead_files)

    def report(self, results: dict[tuple[str, int], dict[str, Any]], summary: dict[str, Any]) -> None:
        """Each partition's `dead_lettered` (new in the dead-letter table) or `skipped_bad_records`, and the run's
        totals; a WARNING line per partition naming its first bad value."""
        field_of = {"dead_letter": "dead_lettered", "skip": "skipped_bad_records"}.get(self.mode)
        total = 0
        for key, c in self.counts.items():
            if field_of is None or key not in results:
                continue
            n = c.bad - c.kept_before
            results[key][field_of] = n
            total += n
            if c.first is not None and n:
                seq, error, path = c.first
                what = "dead-lettered" if self.mode == "dead_letter" else "skipped"
                log.warning("export: %s/%s: %d value(s) %s; the first: %s: seq %s: %s", *key, n, what, path, seq, error)
        if field_of is not None:
            summary[field_of] = total
        if self.table is not None:
            summary["dead_letter_table"] = self.name
            summary["dead_letter_version"] = self.version
            swept = _SWEPT.get(self.name or "")  # this run's: it opened the table (`open_dead_letters`)
            if swept is not None:
                summary["dead_letter_orphans"] = asdict(swept[1])


def _remove_dead(settings: ExportSettings, files: list[dict[str, Any]]) -> None:
    if files:
        dead_letter_settings(settings).location.delete([f["path"] for f in files])


# ---- replay ----------------------------------------------------------------------------------------------------------

HOLD_AFTER_REPLAY = "TANK_LOG_REPLAY_HOLD"  # test hook: PATH: wait between the table's commit and the removal


def replay(
    settings: ExportSettings, topics: Collection[str] | None, run_id: str, *, dry_run: bool = False
) -> JobResult:
    """`--replay-dead-letters`: decode the dead letters again with the current settings (a fixed schema), append
    those that now decode to the table and remove them from the dead-letter table; the others stay. With `dry_run`,
    the same counts and nothing written (no table made, no orphan removed, no letter removed).

    The table's commit comes first, then the removal: a run killed between them leaves the replayed rows in both
    tables, and the next replay finds them in the table and only removes them (every message ends in exactly one
    table; nothing is appended twice). The table's recorded versions do not move: the replayed rows are at or below
    them already.
    """
    import numpy as np

    from tank_spark.export.commit import commit
    from tank_spark.export.files import make_file_writer
    from tank_spark.export.rows import typed_rows
    from tank_spark.export.schema import evolved_schema, table_schema

    dead = open_dead_letters(settings, create=False, dry_run=dry_run)
    summary: dict[str, Any] = {"dead_letter_table": dead_letter_settings(settings).table, "table": settings.table}
    if dry_run:
        summary["dry_run"] = True
    letters = _letters(dead, topics, settings.source) if dead is not None else None
    if dead is not None:
        summary["dead_letter_orphans"] = asdict(sweep_dead_letters(settings, dead, dry_run))  # swept as it opened
    if dead is None or letters is None or not letters.num_rows:
        summary.update(replayed=0, still_bad=0, settled=0)
        return [], summary
    table = settings.location.open()
    if table is None and not dry_run:
        table = settings.location.create(table_schema(settings), settings.partition_by, None)
    # a dry run evolves nothing: it decodes into the decoder's own columns (what decodes does not depend on the table)
    schema = evolved_schema(settings, table) if table is not None and not dry_run else table_schema(settings)
    held = _held_by(table, letters, settings.source) if table is not None else np.zeros(letters.num_rows, bool)
    settled = letters.filter(pa.array(held))  # a previous replay appended them, then died before the removal
    todo = letters.filter(pa.array(~held))
    good: list[pa.RecordBatch] = []
    bad: list[pa.RecordBatch] = []
    for b in todo.to_batches():
        rows = typed_rows(b, settings, schema)
        good.append(rows.good)
        bad.append(rows.bad)
    decoded = pa.Table.from_batches(good, schema) if good else schema.empty_table()
    if dry_run:
        results = [
            {"topic": topic, "partition": partition, "status": "dry-run", "rows": n}
            for (topic, partition), n in _count(decoded).items()
        ]
        still = sum(b.num_rows for b in bad)
        summary.update(replayed=decoded.num_rows, still_bad=still, settled=settled.num_rows)
        log.info(
            "export: --dry-run: %d dead letters would be replayed, %d removed as held already, %d still do not decode",
            decoded.num_rows, settled.num_rows, still,
        )  # fmt: skip
        return results, summary
    assert table is not None
    if decoded.num_rows:
        writer = make_file_writer(settings.location, schema, settings.partition_by, settings.target_file_bytes, run_id)
        files = [m for meta in writer(decoded.to_batches()) for m in meta.to_pylist()]
        version = commit(settings, schema, files, [], run_id)
        log.info("export: replayed %d dead letters into %s version %s", decoded.num_rows, settings.table, version)
        hold(HOLD_AFTER_REPLAY)  # test hook
    done = pa.concat_tables(
        [settled.select(["topic", "partition", "seq"]), decoded.select(["topic", "partition", "seq"])]
    )
    _remove_letters(dead, done, settings.source)  # `letters` came from it: it exists
    still = sum(b.num_rows for b in bad)
    results = []
    for (topic, partition), n in _count(decoded).items():
        results.append({"topic": topic, "partition": partition, "status": "replayed", "rows": n})
    summary.update(replayed=decoded.num_rows, still_bad=still, settled=settled.num_rows)
    if still:
        first = pa.concat_tables([pa.Table.from_batches([b]) for b in bad if b.num_rows]).slice(0, 1).to_pylist()[0]
        log.warning(
            "export: %d dead letters still do not decode (they stay); the first: %s/%s seq %s: %s",
            still, first["topic"], first["partition"], first["seq"], first["error"],
        )  # fmt: skip
    return results, summary


def _letters(dead: LakeTable, topics: Collection[str] | None, source: str | None) -> pa.Table:
    """The dead letters of `topics` (all: None) of this source, as the export's row batches hold them."""
    import pyarrow.dataset as ds

    from tank_spark.export.schema import DEAD_LETTER_SCHEMA

    wanted: ds.Expression | None = None
    if topics:
        wanted = text_column("topic").isin(sorted(topics))
    if source is not None:
        mine = text_column("source") == source
        wanted = mine if wanted is None else wanted & mine
    got = dead.to_pyarrow_dataset().to_table(columns=DEAD_LETTER_SCHEMA.names, filter=wanted)
    return got.cast(DEAD_LETTER_SCHEMA).sort_by(
        [("topic", "ascending"), ("partition", "ascending"), ("seq", "ascending")]
    )


def _held_by(table: LakeTable, letters: pa.Table, source: str | None) -> Any:
    """Which dead letters the table holds a row of (same topic, partition, seq and source): a numpy bool mask."""
    import numpy as np
    import pyarrow.dataset as ds

    held = np.zeros(letters.num_rows, dtype=bool)
    keys = letters.select(["topic", "partition", "seq"]).to_pydict()
    by_part: dict[tuple[str, int], list[int]] = {}
    for i, (t, p) in enumerate(zip(keys["topic"], keys["partition"], strict=True)):
        by_part.setdefault((t, p), []).append(i)
    for (t, p), idx in by_part.items():
        seqs = [keys["seq"][i] for i in idx]
        wanted = (text_column("topic") == t) & (ds.field("partition") == p) & ds.field("seq").isin(seqs)
        if source is not None:
            wanted = wanted & (text_column("source") == source)
        found = set(table.to_pyarrow_dataset().to_table(columns=["seq"], filter=wanted)["seq"].to_pylist())
        for i in idx:
            held[i] = keys["seq"][i] in found
    return held


def _remove_letters(dead: LakeTable, done: pa.Table, source: str | None) -> None:
    """Delete the rows of `done` (topic, partition, seq) of this source from the dead-letter table, one delete per
    partition (`LakeTable.delete_rows`)."""
    by_part: dict[tuple[str, int], list[int]] = {}
    d = done.to_pydict()
    for t, p, s in zip(d["topic"], d["partition"], d["seq"], strict=True):
        by_part.setdefault((t, p), []).append(s)
    for (t, p), seqs in by_part.items():
        where = f"topic = '{_quoted(t)}' AND partition = {int(p)} AND seq IN ({', '.join(str(int(s)) for s in seqs)})"
        if source is not None:
            where += f" AND source = '{_quoted(source)}'"
        dead.delete_rows(where)
    dead.refresh()


def _quoted(text: str) -> str:
    return text.replace("'", "''")


def _count(rows: pa.Table) -> dict[tuple[str, int], int]:
    if not rows.num_rows:
        return {}
    g = rows.group_by(["topic", "partition"]).aggregate([("seq", "count")]).to_pydict()
    return {(t, p): n for t, p, n in zip(g["topic"], g["partition"], g["seq_count"], strict=True)}
