"""Partition specs: `export.partition_by` as Iceberg's partition transforms, and what each table format makes of them.

A spec is a tuple of terms, each a column of today's (`topic`, `partition`, `date`: identity partitions, as before)
or an Iceberg transform: `identity(COL)`, `hour(ts)`, `day(ts)`, `month(ts)`, `bucket(N, COL)` (COL: `key`, `topic`
or `partition`). Terms are kept in a canonical spelling (`identity(topic)` is `topic`, `bucket(16,key)` is
`bucket(16, key)`), which is also how an existing table's spec is named (`spec_terms`).

- Iceberg: the terms become the table's partition spec at creation (hidden partitioning, the data files hold only
  the table's columns: `iceberg.py`, the one module that speaks pyiceberg, makes the spec from `terms`); each data
  file holds one value of every term (`partition_keys`, which the file writer groups rows by; a bucket's value is
  Iceberg's Murmur3 bucket, which the commit gives pyiceberg, since no file bounds can tell it).
- Delta has no transforms (generated columns are refused by this export's own commits: its files would have to
  honour the expressions): `day(ts)` is the `date` column (the UTC date of ts, as before) and `identity(COL)` the
  column; `hour`, `month` and `bucket` are refused in one line naming the term and the format (`for_format`).

An existing table's spec wins over nothing: a `partition_by` other than the table's is refused before anything is
written, naming both (the check of each format's `check_compatible`), since files laid out by another spec than the
configured one would surprise whoever set it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tank_log.errors import JobConfigError

if TYPE_CHECKING:
    import pyarrow as pa

COLUMNS = ("topic", "partition", "date")  # today's partition columns (identity)
TIME_TRANSFORMS = ("hour", "day", "month")  # of ts
TIME_SOURCE = "ts"
BUCKET_SOURCES = ("key", "topic", "partition")
MAX_BUCKETS = 1 << 16
_TERM = re.compile(r"(?P<transform>\w+)\(\s*(?:(?P<width>\d+)\s*,\s*)?(?P<source>\w+)\s*\)")
DIRECTORY_FORMATS = {"hour": "%Y-%m-%d-%H", "day": "%Y-%m-%d", "month": "%Y-%m"}  # as Iceberg prints them


@dataclass(frozen=True)
class Term:
    """One term of a spec: `transform` (identity, hour, day, month, bucket) of column `source`; `width`: buckets."""

    transform: str
    source: str
    width: int | None = None

    def __str__(self) -> str:
        if self.transform == "identity":
            return self.source
        if self.transform == "bucket":
            return f"bucket({self.width}, {self.source})"
        return f"{self.transform}({self.source})"

    @property
    def name(self) -> str:
        """The partition field's name (Iceberg's default names: `ts_day`, `key_bucket`), a directory's prefix."""
        return self.source if self.transform == "identity" else f"{self.source}_{self.transform}"


def split_terms(text: str) -> list[str]:
    """`topic, bucket(16, key)` → its terms (commas inside parentheses do not split)."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            out.append(text[start:i])
            start = i + 1
    out.append(text[start:])
    return [t.strip() for t in out if t.strip()]


def term(text: str) -> Term:
    """One term, checked.

    Raises:
        ValueError: one line naming the term and what is allowed.
    """
    text = text.strip()
    if text in COLUMNS:
        return Term("identity", text)
    m = _TERM.fullmatch(text)
    allowed = (
        f"choose from {', '.join(COLUMNS)}, identity(COL), hour(ts), day(ts), month(ts), bucket(N, COL) with COL "
        f"one of {', '.join(BUCKET_SOURCES)}"
    )
    if m is None:
        raise ValueError(f"{text}: not a partition column or transform ({allowed})")
    transform, source, width = m["transform"], m["source"], m["width"]
    if transform not in ("identity", "bucket", *TIME_TRANSFORMS):
        raise ValueError(f"{text}: not a partition transform of this export ({allowed})")
    if transform == "bucket":
        if width is None or not 1 <= int(width) <= MAX_BUCKETS or source not in BUCKET_SOURCES:
            raise ValueError(
                f"{text}: bucket(N, COL) takes 1 <= N <= {MAX_BUCKETS} and COL one of {', '.join(BUCKET_SOURCES)}"
            )
        return Term("bucket", source, int(width))
    if width is not None:
        raise ValueError(f"{text}: only bucket takes a number ({allowed})")
    if transform == "identity" and source in COLUMNS:
        return Term("identity", source)
    if transform in TIME_TRANSFORMS and source == TIME_SOURCE:
        return Term(transform, source)
    raise ValueError(f"{text}: not a partition transform of this export ({allowed})")


def parse(value: Any) -> tuple[str, ...]:
    """`export.partition_by` or `--partition-by` (a list, or a comma-separated string) as canonical terms.

    Raises:
        ValueError: not a list of terms, an unknown term, or a term twice.
    """
    items = split_terms(value) if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(c, str) for c in items):
        raise ValueError("expected a list of columns or transforms")
    terms = [term(t) for t in items if t.strip()]
    names = [t.name for t in terms]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"{', '.join(twice)}: partitioned by twice")
    return tuple(str(t) for t in terms)


def terms(partition_by: Sequence[str]) -> list[Term]:
    return [term(t) for t in partition_by]


def partition_names(partition_by: tuple[str, ...]) -> tuple[str, ...]:
    """The partition fields' names (a column's own; a transform's `ts_day`, `key_bucket`), as directories name them."""
    return tuple(t.name for t in terms(partition_by))


def for_format(partition_by: tuple[str, ...], fmt: str, where: str = "export.partition_by") -> tuple[str, ...]:
    """The spec a table of format `fmt` takes: Iceberg's as it is; Delta's as its columns (`day(ts)`: `date`).

    Raises:
        JobConfigError: a transform the format has no equivalent of, one line naming it and the format.
    """
    if fmt == "iceberg":
        return partition_by
    out = []
    for t in terms(partition_by):
        if t.transform == "identity" and t.source in COLUMNS:
            out.append(t.source)
        elif t.transform == "day":
            out.append("date")  # the UTC date of ts, a column of every export
        else:
            raise JobConfigError(
                f"{where}: {t}: a {fmt} table has no partition transforms (its partition columns: "
                f"{', '.join(COLUMNS)}; day(ts) is date); use format iceberg for {t}"
            )
    return tuple(dict.fromkeys(out))


def check_rewritable(partition_by: tuple[str, ...], what: str) -> None:
    """Refuse a rewrite by pyiceberg (`what`: the latest mode's merge, optimize) of a table partitioned by
    transforms: pyiceberg computes them on write through pyiceberg-core, which this project does not install, and
    the rewrite selects table partitions by column.

    Raises:
        JobConfigError: one line naming `what` and the transforms.
    """
    transformed = [str(t) for t in terms(partition_by) if t.transform != "identity"]
    if transformed:
        raise JobConfigError(
            f"{what}: the table is partitioned by transforms ({', '.join(transformed)}), which pyiceberg's rewrites "
            f"do not write here; partition by {', '.join(COLUMNS)} for it"
        )


def partition_keys(batch: pa.RecordBatch, partition_by: tuple[str, ...]) -> tuple[pa.RecordBatch, tuple[str, ...]]:
    """`batch` with a column per term holding each row's partition value, as text for the directory names (a term
    of today's columns: the column itself), and the columns to group rows by, in the spec's order."""
    import pyarrow.compute as pc

    names = []
    for t in terms(partition_by):
        if t.transform == "identity":
            names.append(t.source)
            continue
        column = batch.column(t.source)
        if t.transform == "bucket":
            values: pa.Array = _buckets(column, t.width or 1)
        else:
            values = pc.strftime(column, format=DIRECTORY_FORMATS[t.transform])
        batch = batch.append_column(t.name, values)
        names.append(t.name)
    return batch, tuple(names)


def _buckets(column: pa.Array, width: int) -> pa.Array:
    """Iceberg's bucket of each value (its spec: the 32-bit Murmur3 hash of the value's bytes, an int or long's as 8
    little-endian bytes, a string's UTF-8, masked to 31 bits, mod `width`), hashed once per distinct value."""
    import struct

    import mmh3
    import pyarrow as pa
    import pyarrow.compute as pc

    def bucket(v: Any) -> int | None:
        if v is None:
            return None
        data = struct.pack("<q", v) if isinstance(v, int) else v
        return (mmh3.hash(data) & 0x7FFFFFFF) % width

    encoded = pc.dictionary_encode(column)
    buckets = pa.array([bucket(v) for v in encoded.dictionary.to_pylist()], pa.int32())
    return pc.take(buckets, encoded.indices)


def spec_terms(spec: Any, schema: Any) -> tuple[str, ...]:
    """An Iceberg table's partition spec (pyiceberg's `PartitionSpec` over its `Schema`) as terms (`day(ts)`,
    `bucket(16, key)`; a transform this export does not write, as Iceberg prints it: `truncate[4](key)`)."""
    out = []
    for f in spec.fields:
        source, transform = schema.find_field(f.source_id).name, str(f.transform)
        width = re.fullmatch(r"bucket\[(\d+)\]", transform)
        if transform == "identity":
            out.append(source)
        elif width:
            out.append(f"bucket({width[1]}, {source})")
        else:
            out.append(f"{transform}({source})")
    return tuple(out)
