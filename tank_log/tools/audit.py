"""`tank-log audit`: does a table hold the log? Per partition, the messages on disk against the rows of an export's
table, every difference either accounted for or named.

Terms (docs/operations/audit.md):

- **recorded seq**: the last seq of the partition the table says it holds (its recorded version, the export's
  exactly-once watermark).
- **missing**: messages on disk at or below the recorded seq that the table does not hold: unaccounted.
- **pending**: messages on disk above the recorded seq: not exported yet, accounted for.
- **deleted since export**: rows the table holds whose message the log no longer has (retention or compaction ran
  after the export): accounted for.
- **duplicates**: seqs the table holds more than once: unaccounted.
- **past recorded**: rows above the recorded seq: a commit the watermark does not cover: unaccounted.
- **damaged**: the log itself cannot be read in full (`storage.completeness`): the comparison is incomplete.

A current-state table (`--mode latest` exports) holds one row per live key instead: the latest message of each key at
or below the recorded seq, by compaction's rule (`format.latest`). There, **stale** rows (a newer message of the key
is on disk at or below the recorded seq), **kept after a tombstone** and **missing keys** are unaccounted. A typed
value in the dead-letter table is **dead-lettered** (accounted for) and never a key's latest: the key's row is its
latest message that decoded.

The work is bulk Arrow and numpy per partition: the table is read a range of a topic's partitions at a time (its
seq, and for latest tables its key; the filter on topic and partition skips the files outside the range: a table
partitioned by topic reads only that topic's files), after one pass over its `partition` column that sizes the
ranges; the log is read once in Arrow batches. Memory is that of one range's rows (`ROW_BUDGET`, or one partition's
if it holds more), whatever the size of the table or of a topic.
"""

from __future__ import annotations

import os
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tank_log.errors import TankFormatError
from tank_log.format.latest import TOMBSTONE, latest_per_key
from tank_log.format.messages import tombstones
from tank_log.lakehouse import LEGACY_SOURCE_KEY, owns_unsourced, table_mode, text_column
from tank_log.storage.completeness import HoleError, SegmentAudit, audited, segment_loss
from tank_log.storage.datadir import Partition, Unread, classify_path, scan_partitions

if TYPE_CHECKING:
    import pyarrow.dataset as ds

    from tank_log.lakehouse import LakeTable

RANGES_SHOWN = 20  # seq ranges listed per finding; the counts are always whole
ROW_BUDGET = 1 << 20  # the table's rows read at once: a range of partitions holds at most these (or one partition)

OK, PENDING, UNACCOUNTED, DAMAGED = "ok", "pending", "unaccounted", "damaged"
Ranges = list[list[int]]


@dataclass
class Finding:
    """Seqs of one kind: how many, and their ranges (the first `RANGES_SHOWN`)."""

    count: int = 0
    ranges: Ranges = field(default_factory=list)
    runs: int = 0  # the number of ranges, of which `ranges` shows the first RANGES_SHOWN

    def __bool__(self) -> bool:
        return self.count > 0


@dataclass
class PartitionAudit:
    """What one partition's audit found; `verdict` is `ok`, `pending` (all accounted for, some not exported yet),
    `unaccounted` or `damaged`."""

    topic: str
    partition: int
    verdict: str = OK
    log_messages: int = 0
    table_rows: int = 0
    recorded_seq: int | None = None
    missing: Finding = field(default_factory=Finding)
    duplicates: Finding = field(default_factory=Finding)
    past_recorded: Finding = field(default_factory=Finding)
    stale: Finding = field(default_factory=Finding)  # latest tables: a newer message of the key is exported
    kept_after_tombstone: Finding = field(default_factory=Finding)  # latest tables
    pending: Finding = field(default_factory=Finding)
    deleted_since_export: Finding = field(default_factory=Finding)
    dead_lettered: Finding = field(default_factory=Finding)  # typed values in the dead-letter table: accounted for
    damaged: list[str] = field(default_factory=list)

    @property
    def unaccounted(self) -> int:
        return sum(f.count for f in (self.missing, self.duplicates, self.past_recorded, self.stale,
                                     self.kept_after_tombstone))  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["unaccounted"] = self.unaccounted
        return out


@dataclass
class AuditReport:
    """Every partition's audit, in (topic, partition) order, and the verdict of the whole."""

    table: str
    mode: str
    source: str | None = None  # the broker whose rows were audited (None: every row)
    partitions: list[PartitionAudit] = field(default_factory=list)
    unread: list[str] = field(default_factory=list)  # what the log scan left out (partition directories, files)

    @property
    def verdict(self) -> str:
        verdicts = {p.verdict for p in self.partitions}
        if self.unread or DAMAGED in verdicts:
            return DAMAGED
        for v in (UNACCOUNTED, PENDING):
            if v in verdicts:
                return v
        return OK

    @property
    def exit_code(self) -> int:
        """0 when nothing is unaccounted (pending exports are accounted for), else 1."""
        return 0 if self.verdict in (OK, PENDING) else 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "mode": self.mode,
            "source": self.source,
            "verdict": self.verdict,
            "unread": self.unread,
            "partitions": [p.to_dict() for p in self.partitions],
        }


def audit_table(
    base: str | os.PathLike[str],
    table: LakeTable,
    uri: str,
    topics: list[str] | None = None,
    source: str | None = None,
    dead_letters: LakeTable | None = None,
) -> AuditReport:
    """Audit `table` (at `uri`, for the report) against the partitions under `base` (optionally of `topics` only),
    as the export of broker `source` wrote them (its rows and recorded versions; the rows written before sources
    too where the table says they are its own; None: every row). Partitions the table holds rows of but the base no
    longer has are audited too (all their rows were deleted since export). The rows of `dead_letters` (an
    export's of typed values: the values that did not decode) count as held by the table: `dead_lettered`; a seq in
    both tables is a duplicate (append); a latest table holds each key's latest message that is not one of them."""
    mode = table_mode(table)
    report = AuditReport(uri, mode, source)
    rows_of = _of_source(table, source)
    parts, left_out = scan_partitions(base, topics)
    in_partitions = {id(u) for p in parts for u in p.unread}  # named with their partition's audit
    report.unread = [str(u) for u in left_out if id(u) not in in_partitions]
    rows_ds = table.to_pyarrow_dataset()
    dead_ds = dead_letters.to_pyarrow_dataset() if dead_letters is not None else None
    by_topic: dict[str, list[Partition]] = {}
    for p in parts:
        by_topic.setdefault(p.topic, []).append(p)
    kind = classify_path(base)
    if kind == "base":  # the table's topics the base no longer has: every row was deleted since export
        held = _partition_rows(rows_ds, rows_of)
        scope = {t for t in held if topics is None or t in topics} | set(by_topic)
    else:  # a topic or partition directory: that topic (that partition) only
        scope = set(by_topic)
        held = {} if kind == "partition" else {t: _partition_rows(rows_ds, rows_of, t).get(t, {}) for t in scope}
    for topic in sorted(scope):
        on_disk = {p.id: p for p in by_topic.get(topic, [])}
        topic_ds = _files_of(rows_ds, topic)
        counts = held.get(topic, {})  # a partition directory's audit: one range
        ids = sorted(on_disk) if kind == "partition" else sorted(set(on_disk) | set(counts))
        empty = _EMPTY_LATEST if mode == "latest" else _EMPTY
        for lo, hi in _ranges(ids, counts):
            rows = _table_rows(topic_ds, topic, rows_of, (lo, hi), latest=mode == "latest")
            dead = _table_rows(dead_ds, topic, rows_of, (lo, hi), latest=False) if dead_ds is not None else {}
            for pid in ids[bisect_left(ids, lo) : bisect_right(ids, hi)]:
                res = PartitionAudit(topic, pid, recorded_seq=table.recorded_version(topic, pid))
                _compare(res, on_disk.get(pid), rows.pop(pid, empty), dead.get(pid), latest=mode == "latest")
                report.partitions.append(res)
    return report


def _compare(
    res: PartitionAudit, part: Partition | None, got: pa.Table, letters: pa.Table | None, *, latest: bool
) -> None:
    """One partition's audit: its log (`part`; None: the base no longer has it) against the table's rows of it
    (`got`) and its dead letters."""
    res.table_rows = len(got)
    log = _read_log(part, res, latest=latest) if part is not None else _EMPTY_LOG
    if latest:
        if letters is not None and len(letters):  # never a key's latest: the table holds the one before
            log = _dead_lettered(res, log, np.asarray(letters["seq"].to_numpy(), dtype=np.int64))
        _compare_latest(res, log, got)
    else:
        if letters is not None and len(letters):
            res.dead_lettered = _finding(np.asarray(letters["seq"].to_numpy(), dtype=np.int64))
            got = pa.concat_tables([got, letters]).sort_by("seq")
        _compare_append(res, log, got)
    res.verdict = _verdict(res)


def _ranges(ids: list[int], counts: dict[int, int]) -> Iterator[tuple[int, int]]:
    """`ids` (sorted) as ranges (first, last) of consecutive ones whose rows in the table (`counts`) add up to at most
    `ROW_BUDGET` (a partition that holds more is a range of its own)."""
    first, rows = None, 0
    for i, pid in enumerate(ids):
        n = counts.get(pid, 0)
        if first is not None and rows + n > ROW_BUDGET:
            yield first, ids[i - 1]
            first, rows = None, 0
        first = pid if first is None else first
        rows += n
    if first is not None:
        yield first, ids[-1]


# ---- the two sides ---------------------------------------------------------------------------------------------------

_EMPTY = pa.table({"seq": pa.array([], pa.int64())})
_EMPTY_LATEST = pa.table({"seq": pa.array([], pa.int64()), "key": pa.array([], pa.binary())})
_EMPTY_LOG = pa.table(
    {"seq": pa.array([], pa.int64()), "key": pa.array([], pa.binary()), TOMBSTONE: pa.array([], pa.bool_())}
)


def _of_source(table: LakeTable, source: str | None) -> tuple[str, bool] | None:
    """Which rows are `source`'s: (its name, whether the rows written before sources are its own too,
    `lakehouse.owns_unsourced`); None: every row (no source given, or a table without a `source` column)."""
    if source is None or "source" not in table.arrow_schema().names:
        return None
    return source, owns_unsourced(source, table.properties().get(LEGACY_SOURCE_KEY))


def _scan(
    dataset: ds.Dataset,
    columns: list[str],
    rows_of: tuple[str, bool] | None,
    topic: str | None = None,
    partitions: tuple[int, int] | None = None,
) -> Iterator[pa.RecordBatch]:
    """The table's rows of the source (and of `topic`, of partitions `partitions` (first, last)), `columns` only,
    filtered by the dataset (one the table made: `LakeTable.to_pyarrow_dataset`): a table partitioned by topic reads
    only that topic's files, others skip files by their statistics (the datasets' guarantees are sound:
    `lakehouse.delta`)."""
    import pyarrow.dataset as pads

    wanted: ds.Expression | None = None if topic is None else text_column("topic") == topic
    if partitions is not None:
        lo, hi = partitions
        in_range = (pads.field("partition") >= lo) & (pads.field("partition") <= hi)
        wanted = in_range if wanted is None else wanted & in_range
    if rows_of is not None:
        source, unsourced = rows_of
        mine = text_column("source") == source
        mine = mine | pads.field("source").is_null() if unsourced else mine
        wanted = mine if wanted is None else wanted & mine
    for batch in dataset.to_batches(columns=columns, filter=wanted):
        if batch.num_rows:
            yield batch


def _files_of(dataset: ds.Dataset, topic: str) -> ds.Dataset:
    """The files of `dataset` that may hold rows of `topic` (by their partition values and bounds), as a dataset: the
    scans of the topic's ranges then weigh only these (each file's guarantee is checked once per topic)."""
    import pyarrow.dataset as pads

    if not isinstance(dataset, pads.FileSystemDataset):
        return dataset
    files = list(dataset.get_fragments(filter=text_column("topic") == topic))
    return pads.FileSystemDataset(files, dataset.schema, dataset.format, dataset.filesystem)


def _partition_rows(
    dataset: ds.Dataset, rows_of: tuple[str, bool] | None, topic: str | None = None
) -> dict[str, dict[int, int]]:
    """How many rows the table holds of each topic's partitions (of `topic` only, if given): one pass over its
    `topic` and `partition` columns, a batch at a time."""
    counts: dict[str, dict[int, int]] = {}
    for batch in _scan(dataset, ["topic", "partition"], rows_of, topic):
        names = pc.unique(batch["topic"]).to_pylist()
        if len(names) == 1:  # a file of one topic: no row's topic is looked at again
            groups = [(names[0], batch["partition"])]
        else:
            of_row = batch["topic"].cast(pa.string())
            groups = [(t, batch["partition"].filter(pc.equal(of_row, t))) for t in names if t is not None]
        for t, pids in groups:
            if t is None:
                continue
            tally = pc.value_counts(pids)
            of = counts.setdefault(str(t), {})
            for pid, n in zip(tally.field("values").to_pylist(), tally.field("counts").to_pylist(), strict=True):
                if pid is not None:
                    of[int(pid)] = of.get(int(pid), 0) + n
    return counts


def _table_rows(
    dataset: ds.Dataset,
    topic: str,
    rows_of: tuple[str, bool] | None,
    partitions: tuple[int, int],
    *,
    latest: bool,
) -> dict[int, pa.Table]:
    """The table's rows of `topic`'s partitions `partitions` (first, last) by partition: their seqs (and keys for a
    latest table), sorted by seq."""
    columns = ["partition", "seq", "key"] if latest else ["partition", "seq"]
    kept = list(_scan(dataset, columns, rows_of, topic, partitions))
    schema = pa.schema([pa.field(c, _TYPES[c]) for c in columns])
    got = pa.Table.from_batches([b.cast(schema) for b in kept if b.num_rows], schema=schema)
    out: dict[int, pa.Table] = {}
    if not len(got):
        return out
    got = got.sort_by([("partition", "ascending"), ("seq", "ascending")])
    pids = got["partition"].to_numpy()
    starts = np.flatnonzero(np.r_[True, pids[1:] != pids[:-1]])
    ends = np.r_[starts[1:], len(pids)]
    for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
        out[int(pids[s])] = got.slice(s, e - s).drop_columns(["partition"])
    return out


_TYPES = {"partition": pa.int64(), "seq": pa.int64(), "key": pa.binary()}


def _read_log(part: Partition, res: PartitionAudit, *, latest: bool) -> pa.Table:
    """The partition's messages (seq; key and tombstone for a latest table), through the completeness check every
    reader uses: what it cannot return is named in `res.damaged`."""
    for u in part.unread:
        res.damaged.append(str(u))
    seqs: list[np.ndarray] = []
    keys: list[pa.Array] = []
    dead: list[np.ndarray] = []
    for sf in part.segments:
        audit = SegmentAudit(sf)
        walk = sf.batch_chunks()
        try:
            for chunk in audited(walk, audit):
                batch = chunk.batch
                seq = np.asarray(batch.column(0).to_numpy(), dtype=np.int64)
                if latest:
                    key, value = batch.column(2), batch.column(3)
                    lengths = np.asarray(pc.binary_length(value).fill_null(0).to_numpy(zero_copy_only=False))
                    keyed = np.asarray(pc.is_valid(key).to_numpy(zero_copy_only=False))
                    keys.append(key)
                    dead.append(tombstones(keyed, lengths))
                seqs.append(seq)
        except HoleError as err:
            res.damaged.append(str(err.hole))
            continue
        except (TankFormatError, OSError) as err:
            res.damaged.append(f"{sf.path}: {err}")
            continue
        loss = segment_loss(audit, walk.tail)
        if isinstance(loss, Unread):
            res.damaged.append(str(loss))
    seq = np.concatenate(seqs) if seqs else np.zeros(0, np.int64)
    res.log_messages = len(seq)
    if not latest:
        return pa.table({"seq": seq})
    key_arr = pa.concat_arrays([k.cast(pa.binary()) for k in keys]) if keys else pa.array([], pa.binary())
    return pa.table({"seq": seq, "key": key_arr, TOMBSTONE: np.concatenate(dead) if dead else np.zeros(0, bool)})


# ---- the comparisons -------------------------------------------------------------------------------------------------


def _compare_append(res: PartitionAudit, log: pa.Table, rows: pa.Table) -> None:
    """An append table holds every message up to its recorded seq once."""
    recorded = res.recorded_seq or 0
    on_disk = np.asarray(log["seq"].to_numpy(), dtype=np.int64)
    held = np.asarray(rows["seq"].to_numpy(), dtype=np.int64)  # sorted
    repeated = held[1:][held[1:] == held[:-1]]
    res.duplicates = _finding(np.unique(repeated))
    unique = np.unique(held)
    in_table = _members(on_disk, unique)
    res.missing = _finding_along(on_disk, ~in_table & (on_disk <= recorded))
    res.pending = _finding_along(on_disk, ~in_table & (on_disk > recorded))
    res.past_recorded = _finding(unique[unique > recorded])
    res.deleted_since_export = _finding(unique[~_members(unique, on_disk) & (unique <= recorded)])


def _dead_lettered(res: PartitionAudit, log: pa.Table, letters: np.ndarray) -> pa.Table:
    """A latest table's partition: its dead letters at or below the recorded seq are accounted for (`dead_lettered`)
    and left out of the log it is compared with; those past it are pending, as the table's rows would be."""
    letters = np.unique(letters[letters <= (res.recorded_seq or 0)])
    res.dead_lettered = _finding(letters)
    on_disk = np.asarray(log["seq"].to_numpy(), dtype=np.int64)
    return log.filter(pa.array(~_members(on_disk, letters)))


def _compare_latest(res: PartitionAudit, log: pa.Table, rows: pa.Table) -> None:
    """A latest table holds, for each key, its latest message at or below the recorded seq unless that is a
    tombstone; a newer row than the log's latest of its key is a message deleted since export."""
    recorded = res.recorded_seq or 0
    on_disk = np.asarray(log["seq"].to_numpy(), dtype=np.int64)
    res.pending = _finding_along(on_disk, on_disk > recorded)
    exported = log.filter(pc.less_equal(log["seq"], recorded))
    expected = latest_per_key(exported.append_column("value", pa.nulls(len(exported), pa.binary()))).rows
    expected = expected.select(["key", "seq", TOMBSTONE]).rename_columns(["key", "want_seq", TOMBSTONE])
    held = np.asarray(rows["seq"].to_numpy(), dtype=np.int64)
    res.past_recorded = _finding(np.unique(held[held > recorded]))
    keys = rows.group_by("key").aggregate([("seq", "count")])
    res.duplicates = _finding(
        np.unique(held[_members_keys(rows, keys.filter(pc.greater(keys["seq_count"], 1))["key"])])
    )
    joined = rows.join(expected, keys="key", join_type="full outer")
    has_row = np.asarray(pc.is_valid(joined["seq"]).to_numpy(zero_copy_only=False))
    has_want = np.asarray(pc.is_valid(joined["want_seq"]).to_numpy(zero_copy_only=False))
    have_i = np.asarray(pc.fill_null(joined["seq"], -1).to_numpy(), dtype=np.int64)
    want_i = np.asarray(pc.fill_null(joined["want_seq"], -1).to_numpy(), dtype=np.int64)
    dead_b = np.asarray(pc.fill_null(joined[TOMBSTONE], False).to_numpy(zero_copy_only=False), dtype=bool)
    live = has_want & ~dead_b
    res.missing = _finding(np.unique(want_i[live & ~has_row]))
    res.stale = _finding(np.unique(have_i[has_row & live & (have_i < want_i)]))
    res.kept_after_tombstone = _finding(np.unique(have_i[has_row & has_want & dead_b & (have_i < want_i)]))
    newer = has_row & (~has_want | (have_i > want_i))
    res.deleted_since_export = _finding(np.unique(have_i[newer & (have_i <= recorded)]))


def _verdict(res: PartitionAudit) -> str:
    if res.damaged:
        return DAMAGED
    if res.unaccounted:
        return UNACCOUNTED
    return PENDING if res.pending else OK


# ---- seq sets --------------------------------------------------------------------------------------------------------


def _members(values: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    """Which of `values` are in `sorted_set` (sorted, unique)."""
    if not len(sorted_set):
        return np.zeros(len(values), bool)
    at = np.searchsorted(sorted_set, values).clip(0, len(sorted_set) - 1)
    return np.asarray(sorted_set[at] == values)


def _members_keys(rows: pa.Table, keys: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return np.asarray(pc.is_in(rows["key"], value_set=pa.array(keys, pa.binary())).to_numpy(zero_copy_only=False))


def _finding(seqs: np.ndarray) -> Finding:
    """Sorted unique seqs as a count and runs of consecutive seqs."""
    if not len(seqs):
        return Finding()
    breaks = np.flatnonzero(np.diff(seqs) != 1)
    return Finding(len(seqs), _runs(seqs, np.r_[0, breaks + 1], np.r_[breaks, len(seqs) - 1]), len(breaks) + 1)


def _finding_along(on_disk: np.ndarray, selected: np.ndarray) -> Finding:
    """The selected messages of the log as runs of messages next to each other in the log (a sparse producer's or a
    compaction's gaps in the seqs do not split a run)."""
    at = np.flatnonzero(selected)
    if not len(at):
        return Finding()
    breaks = np.flatnonzero(np.diff(at) != 1)
    return Finding(len(at), _runs(on_disk[at], np.r_[0, breaks + 1], np.r_[breaks, len(at) - 1]), len(breaks) + 1)


def _runs(seqs: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> Ranges:
    return [[int(seqs[s]), int(seqs[e])] for s, e in zip(starts[:RANGES_SHOWN], ends[:RANGES_SHOWN], strict=True)]


# ---- output ----------------------------------------------------------------------------------------------------------

COLUMNS = ("topic", "partition", "verdict", "log", "table", "recorded", "missing", "dup", "pending", "deleted")


def format_table(report: AuditReport) -> str:
    """A human table, one line per partition, then what each unaccounted or damaged partition lacks."""
    rows = [list(COLUMNS)]
    for p in report.partitions:
        rows.append(
            [
                p.topic,
                str(p.partition),
                p.verdict,
                str(p.log_messages),
                str(p.table_rows),
                "" if p.recorded_seq is None else str(p.recorded_seq),
                str(p.missing.count + p.stale.count + p.kept_after_tombstone.count + p.past_recorded.count),
                str(p.duplicates.count),
                str(p.pending.count),
                str(p.deleted_since_export.count),
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(v.ljust(w) if i < 3 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths, strict=True)))
             for r in rows]  # fmt: skip
    lines += list(_details(report))
    of = "" if report.source is None else f", source {report.source}"
    lines.append(f"verdict: {report.verdict} ({len(report.partitions)} partition(s), table {report.table}{of})")
    return "\n".join(lines)


def _details(report: AuditReport) -> Iterator[str]:
    for u in report.unread:
        yield f"  not read: {u}"
    for p in report.partitions:
        for name in ("missing", "duplicates", "past_recorded", "stale", "kept_after_tombstone"):
            f: Finding = getattr(p, name)
            if f:
                yield f"  {p.topic}/{p.partition}: {name.replace('_', ' ')}: {f.count} seq(s) {_show(f)}"
        for d in p.damaged:
            yield f"  {p.topic}/{p.partition}: damaged: {d}"


def _show(f: Finding) -> str:
    shown = ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in f.ranges)
    return shown + (f" and {f.runs - len(f.ranges)} more range(s)" if f.runs > len(f.ranges) else "")
