"""What does not depend on a table's format: the ids each partition's recorded version is kept under, the storage
options, the errors, and the typed results of the interface every format implements (`location.LakeTable`).

The export commits every partition's rows together with its new version (the last seq exported) under an id naming
the table, topic and partition (`app_id`); retention reads the same versions to keep what the table has not
received. `app_id` is the one place that id is computed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tank_log.errors import JobConfigError, RunFailed, TankLogError

if TYPE_CHECKING:
    import pyarrow.dataset as ds

REQUIRED_COLUMNS = ("topic", "partition", "seq")  # what makes a table a tank-log export
APP_ID_PREFIX = "tank-log:"  # every recorded version's id starts so (`app_id`, `legacy_app_id`)
RUN_KEY = "tank-log.run"  # the commit metadata field holding the id of the export run that made the commit
# The commit summary a person reads (`commit_summary`; docs/reference/watermarks.md): beside `RUN_KEY`, the source
# whose partitions the commit exported, and per partition the range of seqs it took the recorded version across.
SOURCE_KEY = "tank-log.source"
RANGES_KEY = "tank-log.ranges"
SUMMARY_KEYS = (RUN_KEY, SOURCE_KEY, RANGES_KEY)
USER_METADATA = "userMetadata"  # the field of Delta's commitInfo that Spark's DESCRIBE HISTORY shows
SOURCE_COLUMN = "source"  # the column naming the broker (`source`) a row came from (null: written before sources)
# The table property naming the source that owns the versions recorded before sources existed (absent: a table
# written before sources whose first sourced export has not run yet; `candidate_ids`).
LEGACY_SOURCE_KEY = "tank_log.export.legacy_source"
MODE_KEY = "tank_log.export.mode"  # the table property recording the mode the export created it with (absent: append)
SOURCE_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def text_column(name: str) -> ds.Expression:
    """A string column (`topic`, `source`) in a filter over a table's dataset (`pyarrow.dataset.Expression`), cast to
    string: files written by a DataFusion-based writer (delta-rs's MERGE, which the latest-mode export runs) store
    their strings as `string_view`, and pyarrow compares a `string_view` column with a string value by no kernel
    ("Function 'equal' has no kernel matching input types (string, string_view)"). The cast is a no-op on string
    files and keeps the pruning by partition values."""
    import pyarrow as pa
    import pyarrow.dataset as pads

    return pads.field(name).cast(pa.string())


class TableUnreadable(TankLogError):
    """The table cannot be read (missing, unreachable, not a tank-log export): what it holds is unknown."""


class HistoryUntold(TableUnreadable, JobConfigError):
    """What the table holds of a partition cannot be told: its history undid the recorded version, and what would
    say what it left is gone (expired). The export refuses the table before writing anything (a usage error: exit 2,
    one line); for retention's guard it is a table that cannot be read."""


class CommitConflict(RunFailed):
    """Another writer committed first and the format refused this commit: nothing of it is in the table."""


def app_id(table_uuid: str, topic: str, partition: int, source: str | None = None) -> str:
    """The id one partition's recorded version is kept under in one table. `table_uuid` is the table's own id
    (`LakeTable.table_id`, kept when the table is moved, copied or reached through another path or a symlink),
    so exactly-once belongs to the table, not to the path used to reach it. `source` names the broker the
    partition is on (two brokers' same-named partitions are two partitions of the table); None: the id of the
    versions recorded before sources existed (read, never written by a sourced export)."""
    if source is None:
        return f"{APP_ID_PREFIX}{table_uuid}:{topic}:{partition}"
    return f"{APP_ID_PREFIX}{table_uuid}@{source}:{topic}:{partition}"


def parse_app_id(aid: str) -> tuple[str, str | None, str, int] | None:
    """(table uuid, source — None: unsourced —, topic, partition) of an id `app_id` made; None for any other id
    (the path-hashed ids of `legacy_app_id` parse as a table uuid of 12 hex digits)."""
    if not aid.startswith(APP_ID_PREFIX):
        return None
    table, sep, rest = aid.removeprefix(APP_ID_PREFIX).partition(":")
    topic, _, partition = rest.rpartition(":")
    if not sep or not topic or not partition.isdigit():
        return None
    uuid, at, source = table.partition("@")
    return uuid, source if at else None, topic, int(partition)


def summary(run_id: str, source: str, ranges: dict[tuple[str, int], tuple[int, int]]) -> dict[str, str]:
    """The keys of one commit's summary: its run, its source and `RANGES_KEY`, the compact JSON object
    `{"topic/partition": [first, last], ...}` (sorted) of the seqs it took each partition's recorded version across."""
    shown = {f"{t}/{p}": [first, last] for (t, p), (first, last) in sorted(ranges.items())}
    return {RUN_KEY: run_id, SOURCE_KEY: source, RANGES_KEY: json.dumps(shown, separators=(",", ":"))}


def summary_json(fields: dict[str, str]) -> str:
    """A commit's `summary` as one compact JSON object (`RANGES_KEY` an object in it, not a string): Delta's
    `userMetadata`."""
    shown: dict[str, Any] = dict(fields)
    if RANGES_KEY in shown:
        shown[RANGES_KEY] = json.loads(shown[RANGES_KEY])
    return json.dumps(shown, separators=(",", ":"))


def commit_summary(table: Any, run_id: str, versions: dict[str, int]) -> dict[str, str]:
    """`summary` of a commit of `table` (a `LakeTable`) recording `versions` (`app_id` → last seq), before it is made:
    each partition's range runs from the seq after the version the table records now (1: none) to the new one."""
    source = table.location.source or default_source()
    ranges = {}
    for aid, last in versions.items():
        parsed = parse_app_id(aid)
        if parsed is None:
            continue
        _, source_of, topic, partition = parsed
        source = source_of or source
        ranges[(topic, partition)] = ((table.recorded_version(topic, partition) or 0) + 1, last)
    return summary(run_id, source, ranges)


def candidate_ids(
    table_uuid: str, table_path: str | None, topic: str, partition: int, source: str | None, owner: str | None
) -> list[str]:
    """The ids a partition's recorded version may be kept under, the first found wins: its source's, then (for the
    source that owns the table's versions from before sources, `owner`, or any source while none claimed them yet)
    the unsourced one and the path-hashed one of older tables (`table_path`: None for formats that never wrote it)."""
    ids = [] if source is None else [app_id(table_uuid, topic, partition, source)]
    if source is None or owner is None or owner == source:
        ids.append(app_id(table_uuid, topic, partition))
        if table_path is not None:
            ids.append(legacy_app_id(table_path, topic, partition))
    return ids


def owns_unsourced(source: str | None, owner: str | None) -> bool:
    """Whether `source` owns what was written before sources: the versions recorded without one and the rows whose
    `source` is null (`owner`: `LEGACY_SOURCE_KEY`; None: unclaimed, taken by the first sourced export)."""
    return source is not None and owner in (None, source)


def merge_match(column: str, unsourced_too: bool) -> str:
    """A latest table's MERGE match on one key column (target `t`, source `s`), in any engine's SQL: on `source`,
    rows written before sources (null) are the owner's (`owns_unsourced`)."""
    if column == SOURCE_COLUMN and unsourced_too:
        return f"(t.{column} = s.{column} OR t.{column} IS NULL)"
    return f"t.{column} = s.{column}"


def default_source() -> str:
    """The source of a run that declares none: this host's name."""
    return socket.gethostname().split(".")[0] or "localhost"


def check_source(source: str, where: str) -> str:
    """Raises:
    JobConfigError: a source that is not 1-128 letters, digits, `.`, `_` or `-` (it is part of every recorded
        version's id, which `:` and `@` delimit).
    """
    if not SOURCE_PATTERN.fullmatch(source):
        raise JobConfigError(
            f"{where} {source!r}: a source is 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return source


@dataclass(frozen=True)
class Recorded:
    """A partition's recorded version, checked against the table's history: `version` is the last seq the table
    holds (None: none), `recorded` the one its recorded version says; they differ when the commit that recorded it
    was undone (a Delta RESTORE, an Iceberg rollback), which `undone` then names."""

    version: int | None
    recorded: int | None = None
    undone: str | None = None
    unsourced: bool = False  # recorded under the id of before sources (`candidate_ids`), not the source's own


def table_key(table: str) -> str:
    return table if "://" in table else os.path.abspath(table)


def legacy_app_id(table: str, topic: str, partition: int) -> str:
    """The id of tables exported before `app_id` used the table's id (a hash of the path): read, never written."""
    digest = hashlib.sha1(table_key(table).encode()).hexdigest()[:12]
    return f"{APP_ID_PREFIX}{digest}:{topic}:{partition}"


def storage_options(configured: dict[str, str], flags: list[str]) -> dict[str, str]:
    """`export.storage_options` with `--storage-option KEY=VALUE` flags over them.

    Raises:
        JobConfigError: a flag without `=`.
    """
    options = dict(configured)
    for item in flags:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise JobConfigError(f"--storage-option {item!r}: expected KEY=VALUE")
        options[key] = value
    return options


@dataclass(frozen=True)
class DataFile:
    """A Parquet file written under the table, to be committed: its path relative to the table, size, partition
    values (as strings, None for null), modification time (ms since the epoch), row count and column statistics (the
    Delta `stats` JSON the writer computed)."""

    path: str
    size: int
    partition_values: dict[str, str | None]
    modification_time: int
    num_records: int
    stats: str


@dataclass(frozen=True)
class RunCommit:
    """One commit of the table's history: its version, time (ms since the epoch) and the `RUN_KEY` it recorded."""

    version: int
    timestamp_ms: int
    run: str | None


@dataclass(frozen=True)
class UpkeepStep:
    """One upkeep operation: files and bytes before and after (or, in a dry run, what it would leave). `files_after`
    is the table as the operation left it, with what other writers committed meanwhile (a continuous export);
    `files_removed` and `files_written` are the operation's own."""

    operation: str  # optimize | vacuum
    files_before: int
    bytes_before: int
    files_after: int
    bytes_after: int
    dry_run: bool = False
    files_removed: int | None = None
    files_written: int | None = None


def lacks_only(have: list[tuple[Any, ...]], want: list[tuple[Any, ...]], evolvable: tuple[str, ...]) -> bool:
    """Whether columns `have` (name first) are `want` but for trailing columns named in `evolvable`."""
    n = len(have)
    return n < len(want) and have == want[:n] and all(w[0] in evolvable for w in want[n:])
