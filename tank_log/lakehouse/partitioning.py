"""Partition specs: `export.partition_by` as Iceberg's partition transforms, and what each table format makes of them.

A spec is a tuple of terms, each a column of today's (`topic`, `partition`, `date`: identity partitions, as before)
or an Iceberg transform: `identity(COL)`, `hour(ts)`, `day(ts)`, `month(ts)`, `bucket(N, COL)` (COL: `key`, `topic`
or `partition`). Terms are kept in a canonical spelling (`identity(topic)` is `topic`, `bucket(16,key)` is
`bucket(16, key)`), which is also how an existing table's spec is named (`spec_terms`).

- Iceberg: the terms become the table's partition spec at creation (hidden partitioning, the data files hold only
  the table's columns: `iceberg.py`, the one module that speaks pyiceberg, makes the spec from `terms`); each data
  file holds one value of every term (`partition_keys`, which the file writer groups rows by; a bucket's value is
  Iceberg's Murmur3 bucket, which the commit gives pyiceberg, since no file bounds can tell it).
- Delta has no transforms; its equivalent is a generated column (`delta.generationExpression`, table feature
  generatedColumns) that the table is partitioned by, named as Iceberg names the field (`delta_columns`): `ts_hour`
  STRING `date_format(ts, 'yyyy-MM-dd-HH')`, `ts_month` STRING `date_format(ts, 'yyyy-MM')`, `key_bucket` INT
  `pmod(hash(key), N)` (Spark's `hash`: Murmur3 x86_32, seed 42, `_spark_hash`). delta-spark computes them for rows
  written without them, checks them on rows written with them, and turns a filter on ts into one on `ts_hour` or
  `ts_month` (a `date_format` of these patterns is one of the expressions it prunes partitions by; a hash is not: a
  filter on key prunes by `key_bucket` only when the query names it). The file writer computes the same values
  (`partition_keys`); Spark's `date_format` is in the session time zone, which our jobs set to UTC, as anyone
  appending must. `day(ts)` stays the `date` column (the UTC date of ts, a column of every export) and
  `identity(COL)` the column (`for_format`).

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
    """The spec a table of format `fmt` takes: Iceberg's as it is; Delta's with `day(ts)` as its `date` column and
    `identity(COL)` as COL (the other transforms stay: generated columns, `delta_columns`)."""
    if fmt == "iceberg":
        return partition_by
    out = []
    for t in terms(partition_by):
        if t.transform == "identity":
            out.append(t.source)
        elif t.transform == "day":
            out.append("date")  # the UTC date of ts, a column of every export
        else:
            out.append(str(t))
    return tuple(dict.fromkeys(out))


# A Delta table's generated partition column per transform: its Spark SQL type and generation expression (`{source}`,
# `{width}`: the term's), which delta-spark evaluates, and `partition_keys` computes identically
DELTA_GENERATED = {
    "hour": ("string", "date_format({source}, 'yyyy-MM-dd-HH')"),
    "month": ("string", "date_format({source}, 'yyyy-MM')"),
    "bucket": ("integer", "pmod(hash({source}), {width})"),
}
SPARK_HASH_SEED = 42  # Spark's `hash()`: Murmur3 x86_32 with this seed, also the hash of a null


@dataclass(frozen=True)
class GeneratedColumn:
    """A Delta table's generated partition column: its name, Delta (Spark SQL) type and generation expression."""

    name: str
    type: str
    expression: str


def delta_columns(partition_by: Sequence[str]) -> list[GeneratedColumn]:
    """The generated columns a Delta table of this spec (`for_format`'s) is partitioned by, in the spec's order."""
    out = []
    for t in terms(partition_by):
        if t.transform in DELTA_GENERATED:
            kind, expression = DELTA_GENERATED[t.transform]
            out.append(GeneratedColumn(t.name, kind, expression.format(source=t.source, width=t.width)))
    return out


def delta_term(name: str, expression: str | None) -> str:
    """A Delta table's partition column as a term of a spec: a generated column of `delta_columns` is its term
    (`hour(ts)`, `bucket(8, key)`); any other column (generated otherwise, or not at all) is its name."""
    source, _, transform = name.rpartition("_")
    width = re.search(r"(\d+)\)$", expression or "")
    text = f"bucket({width[1] if width else 0}, {source})" if transform == "bucket" else f"{transform}({source})"
    try:
        columns = delta_columns((text,))
    except ValueError:  # not a term at all
        return name
    return text if [(c.name, c.expression) for c in columns] == [(name, expression)] else name


def check_rewritable(partition_by: tuple[str, ...], what: str, fmt: str = "iceberg") -> None:
    """Refuse a rewrite (`what`: the latest mode's merge, optimize) of a table partitioned by transforms. pyiceberg
    (Iceberg) computes them on write through pyiceberg-core, which this project does not install, and the rewrite
    selects table partitions by column; delta-rs's MERGE (Delta, `fmt`'s spec: `for_format`'s) evaluates the
    generated columns' expressions itself, and has no `pmod` or `hash` (nor Spark's `date_format` patterns).

    Raises:
        JobConfigError: one line naming `what` and the transforms.
    """
    transformed = [str(t) for t in terms(partition_by) if t.transform != "identity"]
    if transformed:
        writer = "delta-rs's MERGE does" if fmt == "delta" else "pyiceberg's rewrites do"
        raise JobConfigError(
            f"{what}: the table is partitioned by transforms ({', '.join(transformed)}), which {writer} not write "
            f"here; partition by {', '.join(COLUMNS)} for it"
        )


def partition_keys(
    batch: pa.RecordBatch, partition_by: tuple[str, ...], fmt: str = "iceberg"
) -> tuple[pa.RecordBatch, tuple[str, ...]]:
    """`batch` with a column per term holding each row's partition value, as text for the directory names (a term
    of today's columns: the column itself), and the columns to group rows by, in the spec's order. A bucket is
    Iceberg's (`fmt` iceberg) or the value of Delta's generated column (`fmt` delta: Spark's `pmod(hash(COL), N)`)."""
    import pyarrow.compute as pc

    names = []
    for t in terms(partition_by):
        if t.transform == "identity":
            names.append(t.source)
            continue
        column = batch.column(t.source)
        if t.transform == "bucket":
            values: pa.Array = (_spark_buckets if fmt == "delta" else _buckets)(column, t.width or 1)
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


def _spark_buckets(column: pa.Array, width: int) -> pa.Array:
    """Spark's `pmod(hash(value), width)` of each value (`_spark_hash`; a null hashes to the seed, so it has a
    bucket too), hashed once per distinct value."""
    import struct

    import pyarrow as pa
    import pyarrow.compute as pc

    def bucket(v: Any) -> int:
        if v is None:
            return SPARK_HASH_SEED % width
        if isinstance(v, int):  # an int column (`partition`): hashInt, the Murmur3 of its 4 little-endian bytes
            return _spark_hash(struct.pack("<i", v)) % width
        return _spark_hash(v.encode() if isinstance(v, str) else v) % width  # a Python % is Spark's pmod

    encoded = pc.dictionary_encode(column)
    buckets = pa.array([bucket(v) for v in encoded.dictionary.to_pylist()], pa.int32())
    return pc.fill_null(pc.take(buckets, encoded.indices), SPARK_HASH_SEED % width)


def _spark_hash(data: bytes) -> int:
    """Spark's `hash()` of a string's or binary's bytes (`Murmur3_x86_32.hashUnsafeBytes`, seed 42), a signed 32-bit
    int. It differs from Murmur3 in its tail: each of the last `len % 4` bytes is mixed in as a block of its own (the
    byte sign-extended to 32 bits). So the tail bytes become such blocks for `mmh3`, and its finalization, which
    mixes in that longer length, is undone and redone with the true length."""
    import struct

    import mmh3

    aligned = len(data) - len(data) % 4
    tail = data[aligned:]
    if not tail:
        return int(mmh3.hash(data, SPARK_HASH_SEED))
    blocks = data[:aligned] + struct.pack(f"<{len(tail)}i", *(b - 256 if b > 127 else b for b in tail))
    h = _unfmix(mmh3.hash(blocks, SPARK_HASH_SEED, signed=False)) ^ len(blocks) ^ len(data)
    out = _fmix(h)
    return out - (1 << 32) if out >= 1 << 31 else out


_M32 = 0xFFFFFFFF


def _fmix(h: int) -> int:
    """Murmur3's finalization of a 32-bit state (after the length is xored in)."""
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _M32
    return h ^ (h >> 16)


def _unfmix(h: int) -> int:
    """The inverse of `_fmix` (each of its steps is a bijection of 32-bit ints)."""
    h ^= h >> 16
    h = (h * pow(0xC2B2AE35, -1, 1 << 32)) & _M32
    h ^= (h >> 13) ^ (h >> 26)
    h = (h * pow(0x85EBCA6B, -1, 1 << 32)) & _M32
    return h ^ (h >> 16)


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
