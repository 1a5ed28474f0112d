"""Rows another writer put in the table: a partition's rows past the version this export records for it.

The export records each partition's last exported seq as an app transaction and exports what lies above it. A
writer that does not record it — a Spark Structured Streaming query writing `tank` rows through delta-spark's
streaming sink (its own `txn`: the query id and batch id), a batch `df.write` — leaves rows above that version, and
exporting them again would put them in the table twice. So the export looks before it writes: the files whose
statistics (topic, `partition` min/max, `seq` max) can hold such rows are read (their `partition` and `seq` columns,
filtered), and any row found refuses the run in one line naming the table, the partition, the seqs and the writer
(the commit that added the file: its operation, app id and engine). Our own files never hold rows above the version
they were committed with, so only files that span several partitions are read when no other writer wrote.

A table partitioned by `topic` or `partition` (Hive-style, as Delta writes it) holds no such column in its files:
its value is the file's (its add action's `partitionValues`, `partition.<column>` in `file_stats`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tank_log.errors import JobConfigError

if TYPE_CHECKING:
    from tank_log.lakehouse import LakeTable

log = logging.getLogger(__name__)

WRITER_LOOKBACK = 1000  # commits read back to name the writer of a file (only when rows were found)


class OtherWriter(JobConfigError):
    """Another writer added rows of a partition past the version this export records: refused before writing."""


@dataclass(frozen=True)
class ForeignRows:
    """Rows of one partition above its recorded version, and who added them."""

    topic: str
    partition: int
    recorded: int | None
    first_seq: int
    last_seq: int
    rows: int
    writer: str

    def __str__(self) -> str:
        at = "records none" if self.recorded is None else f"records seq {self.recorded}"
        return (
            f"{self.topic}/{self.partition} holds seqs {self.first_seq}..{self.last_seq} ({self.rows} rows) that this "
            f"export did not write (it {at}), written by {self.writer}"
        )


def other_rows(table: LakeTable, recorded: Mapping[tuple[str, int], int | None]) -> list[ForeignRows]:
    """Rows of each partition of `recorded` above its recorded version (None: any row), by file statistics and
    then a filtered read of only the files they cannot rule out."""
    if not recorded:
        return []
    adds = table.file_stats().to_pylist()
    found: dict[tuple[str, int], list[tuple[int, int, int, str]]] = {}
    filesystem, root = table.location.filesystem()
    by_topic: dict[str, dict[tuple[str, int], int | None]] = {}
    for (topic, partition), version in recorded.items():
        by_topic.setdefault(topic, {})[(topic, partition)] = version
    for add in adds:
        of_topic = by_topic.get(add["partition.topic"], {}) if "partition.topic" in add else recorded
        wanted = {k: v for k, v in of_topic.items() if _may_hold(add, k[0], k[1], v)}
        if wanted:  # one read of the file for every partition it may hold
            fixed = {c: add[f"partition.{c}"] for c in ("topic", "partition") if f"partition.{c}" in add}
            path = f"{root}/{unquote(add['path'])}"
            for key, got in _rows_above(filesystem, path, wanted, fixed, _source_of(table)).items():
                found.setdefault(key, []).append((*got, add["path"]))
    if not found:
        return []
    writers = table.file_writers({f[3] for files in found.values() for f in files}, WRITER_LOOKBACK)
    return [
        ForeignRows(
            t,
            p,
            recorded[(t, p)],
            min(f[0] for f in files),
            max(f[1] for f in files),
            sum(f[2] for f in files),
            "; ".join(sorted({writers.get(f[3], "an unknown writer") for f in files})),
        )
        for (t, p), files in sorted(found.items())
    ]


def check_other_writers(table_name: str, table: LakeTable, recorded: Mapping[tuple[str, int], int | None]) -> None:
    """Refuse an export into partitions another writer added rows to past their recorded versions.

    Raises:
        OtherWriter: one line naming the table, each such partition, its seqs and the writer.
    """
    found = other_rows(table, recorded)
    if found:
        raise OtherWriter(
            f"table {table_name}: {'; '.join(str(f) for f in found)}: exporting would write them twice; nothing was "
            "written (leave these partitions to that writer, or export into another table)"
        )


def _may_hold(add: dict[str, Any], topic: str, partition: int, version: int | None) -> bool:
    """Whether a file's partition values and statistics allow rows of `topic`/`partition` above `version` (a file
    without statistics may hold anything)."""
    if "partition.topic" in add:
        if add["partition.topic"] != topic:
            return False
    elif add.get("min.topic") is not None and not add["min.topic"] <= topic <= add["max.topic"]:
        return False
    if "partition.partition" in add:
        if add["partition.partition"] is None or int(add["partition.partition"]) != partition:
            return False
    elif (lo := add.get("min.partition")) is not None and (hi := add.get("max.partition")) is not None:
        if not lo <= partition <= hi:
            return False
    top = add.get("max.seq")
    return top is None or version is None or top > version


def _source_of(table: LakeTable) -> tuple[str, bool] | None:
    """(the source this export writes, whether rows without one are its own too); None: rows of any source count."""
    from tank_log.lakehouse import LEGACY_SOURCE_KEY
    from tank_log.lakehouse.table import owns_unsourced

    source = table.location.source
    if source is None:
        return None
    return source, owns_unsourced(source, table.properties().get(LEGACY_SOURCE_KEY))


def _rows_above(
    filesystem: Any,
    path: str,
    wanted: Mapping[tuple[str, int], int | None],
    fixed: Mapping[str, Any] | None = None,
    source: tuple[str, bool] | None = None,
) -> dict[tuple[str, int], tuple[int, int, int]]:
    """(first seq, last seq, rows) of each wanted partition above its version in one Parquet file. A column the
    file does not hold (a partition column of the table) has the file's partition value in `fixed`: a file that
    holds neither counts as possibly holding any topic or partition (refusing is safe; exporting twice is not)."""
    fixed = fixed or {}
    names = pq.read_schema(path, filesystem=filesystem).names
    in_file = [c for c in ("topic", "partition") if c in names]
    sourced = source is not None and "source" in names  # another broker's rows are not this export's partition's
    data = pq.read_table(path, filesystem=filesystem, columns=["seq", *in_file, *(["source"] if sourced else [])])
    # delta-rs's MERGE writes strings as string_view, which pyarrow's compute does not compare with a str
    data = data.cast(pa.schema([f.with_type(pa.string()) if f.type == pa.string_view() else f for f in data.schema]))
    if source is not None and not sourced and not source[1]:
        return {}  # a file of before sources: its rows are another source's
    out = {}
    for (topic, partition), version in wanted.items():
        if "topic" not in in_file and fixed.get("topic", topic) != topic:
            continue
        if "partition" not in in_file and fixed.get("partition") not in (None, partition):
            continue
        keep = pc.greater(data["seq"], version if version is not None else -1)
        if "partition" in in_file:
            keep = pc.and_(keep, pc.equal(data["partition"], partition))
        if "topic" in in_file:
            keep = pc.and_(keep, pc.equal(data["topic"], topic))
        if sourced and source is not None:
            ours = pc.fill_null(pc.equal(data["source"], source[0]), source[1])  # null: the owner's of old rows
            keep = pc.and_(keep, ours)
        seqs = data["seq"].filter(keep)
        if len(seqs):
            bounds = pc.min_max(seqs)
            out[(topic, partition)] = (bounds["min"].as_py(), bounds["max"].as_py(), len(seqs))
    return out
