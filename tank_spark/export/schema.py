"""The Delta table's columns, derived from the row schema (`tank_spark.schema`) and the value format."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import pyarrow as pa

from tank_log.errors import JobConfigError, RunFailed
from tank_log.lakehouse.table import SOURCE_COLUMN
from tank_log.values.spec import NUMBER_KEY
from tank_spark.export.plan import (
    ExportSettings,
)
from tank_spark.schema import KEY_COLUMNS, ROW_SCHEMA, TS_RAW

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from tank_log.lakehouse import LakeTable
    from tank_log.lakehouse.delta import DeltaLakeTable

log = logging.getLogger(__name__)

BASE_COLUMNS = KEY_COLUMNS  # topic, partition, seq, ts, key: as the data source reads them
VALUE_FIELDS = {"binary": pa.field("value", pa.binary()), "utf8": pa.field("value", pa.string())}
QUARANTINE_FIELDS = [pa.field("decode_error", pa.string()), pa.field("raw_value", pa.binary())]  # non-binary values
DERIVED_FIELDS = [pa.field("date", pa.date32())]  # the UTC date of ts (a partition column by default)
SOURCE = pa.field(SOURCE_COLUMN, pa.string())  # the broker the row came from (`--source`; null: written before it)
DEAD_LETTER_FIELDS = [  # what a dead letter holds beside the message's metadata (`dead_letters.py`)
    pa.field("value", pa.binary()),  # the raw value, as the broker holds it
    pa.field("schema_id", pa.int32()),  # its Confluent schema id (null: plain)
    pa.field("error", pa.string()),  # why it did not decode: one line naming the field or byte and the rule
]
EVOLVABLE = (TS_RAW, SOURCE)  # trailing columns a table made before them gains (`commit.add_missing_columns`)


DEAD_LETTER_SCHEMA = pa.schema(
    [ROW_SCHEMA.field(c) for c in BASE_COLUMNS] + DEAD_LETTER_FIELDS + DERIVED_FIELDS + list(EVOLVABLE)
)
"""The dead-letter table's columns."""


def table_schema(settings: ExportSettings) -> pa.Schema:
    """The Arrow schema of the Delta table for these settings (partition columns included).

    Adding a column: declare it here and compute it in `rows.py` (both row pipelines).
    """
    fields = [key_field(settings) if c == "key" else ROW_SCHEMA.field(c) for c in BASE_COLUMNS]
    if settings.value_spec is not None:  # bad values go to the dead letters (`dead_letters.py`), not quarantine
        fields += typed_fields(settings)
    elif settings.value_format in VALUE_FIELDS:
        fields.append(VALUE_FIELDS[settings.value_format])
    else:
        fields += json_fields(settings.value_schema)
    if settings.value_format != "binary" and settings.value_spec is None:
        fields += QUARANTINE_FIELDS
    if delta_spark_typed(settings):
        fields = [f.with_type(nullable_nested(f.type)) for f in fields]
    return pa.schema(fields + DERIVED_FIELDS + list(EVOLVABLE))  # last: tables made before them gain them


def delta_spark_typed(settings: ExportSettings) -> bool:
    """Whether delta-spark writes these typed values (`--engine spark`, Delta). It checks a field that is NOT NULL
    inside a struct column even in rows where the struct itself is null (a tombstone's, a union's other branch;
    delta-io/delta#860) and fails the write: such a table's struct fields are all nullable (`nullable_nested`)."""
    return settings.typed and settings.engine == "spark" and settings.table_format == "delta"


def nullable_nested(t: pa.DataType) -> pa.DataType:
    """`t` with every field of a struct in it nullable, at any depth (in lists and maps too)."""
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(nullable_nested(f.type)).with_nullable(True) for f in t])
    if pa.types.is_map(t):
        key, item = t.key_field, t.item_field
        return pa.map_(key.with_type(nullable_nested(key.type)), item.with_type(nullable_nested(item.type)))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(t.value_field.with_type(nullable_nested(t.value_type)))
    return t


def not_null_nested(schema: pa.Schema) -> list[str]:
    """The paths of the NOT NULL fields inside struct columns of `schema` (delta-spark cannot write them:
    `delta_spark_typed`)."""
    return sorted(path for path, f, in_struct in all_fields(schema) if in_struct and not f.nullable)


def all_fields(schema: pa.Schema) -> Iterator[tuple[str, pa.Field, bool]]:
    """Every field of `schema` at any depth, with its path (a list's items `a[]`, a map's `a.key` and `a.value`) and
    whether it is a struct's field (a column, a list's items, a map's keys and values are not)."""
    todo = [(f.name, f, False) for f in schema]
    while todo:
        path, f, in_struct = todo.pop()
        yield path, f, in_struct
        t = f.type
        if pa.types.is_struct(t):
            todo += [(f"{path}.{c.name}", c, True) for c in t]
        elif pa.types.is_map(t):
            todo += [(f"{path}.key", t.key_field, False), (f"{path}.value", t.item_field, False)]
        elif pa.types.is_list(t) or pa.types.is_large_list(t):
            todo.append((f"{path}[]", t.value_field, False))


def key_field(settings: ExportSettings) -> pa.Field:
    """The `key` column: bytes, or the decoded keys (`settings.key_spec`): a string (utf8, json without a schema) or a
    struct of the key schema's fields, nullable."""
    from tank_spark.export.rows import key_decoder_of, key_is_text

    spec = settings.key_spec
    if spec is None:
        return ROW_SCHEMA.field("key")
    if key_is_text(spec):
        return pa.field("key", pa.string())
    struct = storable_type(key_decoder_of(spec).arrow_type, settings.table_format, "key")
    return pa.field("key", pa.struct([f.with_nullable(True) for f in struct]))  # a null key: null fields


RESERVED = {f.name for f in QUARANTINE_FIELDS + DERIVED_FIELDS + list(EVOLVABLE)} | set(BASE_COLUMNS) | {"value"}
"""The table's own column names: a decoded field of one of these names is refused."""


def plain_values(settings: ExportSettings) -> bool:
    """Whether the typed path carries values without a schema (binary or utf8 values of a run with decoded keys):
    the decoder's one column is the table's `value`."""
    return settings.value_spec is not None and settings.value_spec.format in ("binary", "utf8")


def own_columns(settings: ExportSettings) -> set[str]:
    """The table's own columns among `settings`' (RESERVED; `value` is a decoded column of plain values)."""
    return RESERVED - {"value"} if plain_values(settings) else RESERVED


def typed_fields(settings: ExportSettings, *, metadata: bool = False) -> list[pa.Field]:
    """The table columns of typed values: the decoder's top-level fields (`tank_log.values`), nullable (a tombstone
    has none); with `metadata`, the decoder's field metadata too (Avro aliases, Protobuf numbers: for `evolve`).

    Raises:
        JobConfigError: a decoded field named as one of the table's own columns.
    """
    from tank_spark.export.rows import value_decoder

    struct = value_decoder(settings).arrow_type
    fields = [
        pa.field(f.name, storable_type(f.type, settings.table_format, f.name), True, f.metadata if metadata else None)
        for f in (struct.field(i) for i in range(struct.num_fields))
    ]
    clash = [f.name for f in fields if f.name in own_columns(settings)]
    if clash:
        raise JobConfigError(
            f"{settings.value_spec.schema_file if settings.value_spec else 'the value schema'}: field(s) "
            f"{', '.join(clash)} clash with the table's own columns ({', '.join(sorted(RESERVED))})"
        )
    return fields


PROTOBUF_NUMBERS_KEY = "tank_log.export.protobuf_numbers"
"""The table property recording the Protobuf field number of each value column (a JSON object, column → number):
a later schema that renames a field keeps its number, and its column (`evolved_schema`)."""


def protobuf_numbers(settings: ExportSettings) -> dict[str, str]:
    """What a new table of Protobuf values records of its columns (`PROTOBUF_NUMBERS_KEY`); nothing for others."""
    if settings.value_spec is None or settings.value_spec.format != "protobuf":
        return {}
    return {PROTOBUF_NUMBERS_KEY: _numbers_json(_numbers_of(typed_fields(settings, metadata=True)))}


def _numbers_of(fields: Iterable[pa.Field]) -> dict[str, int]:
    return {f.name: int(f.metadata[NUMBER_KEY]) for f in fields if f.metadata and NUMBER_KEY in f.metadata}


def _numbers_json(numbers: dict[str, int]) -> str:
    return json.dumps(numbers, sort_keys=True, separators=(",", ":"))


def recorded_numbers(settings: ExportSettings, table: LakeTable) -> dict[str, int] | None:
    """The Protobuf field numbers the table records of its columns (`PROTOBUF_NUMBERS_KEY`), None when it records
    none (a table made before the export recorded them, or of other values).

    Raises:
        RunFailed: the property is not a JSON object of column → number (one line naming the table and key).
    """
    raw = table.properties().get(PROTOBUF_NUMBERS_KEY)
    if raw is None:
        return None
    try:
        numbers = json.loads(raw)
        if not isinstance(numbers, dict):
            raise ValueError("not an object")
        return {str(k): int(v) for k, v in numbers.items()}
    except (ValueError, TypeError) as err:
        raise RunFailed(
            f"table {settings.table}: table property {PROTOBUF_NUMBERS_KEY} is not a JSON object of column -> "
            f"Protobuf field number ({err}): nothing committed"
        ) from None


def _check_unrecorded(settings: ExportSettings, old: list[pa.Field], new: list[pa.Field]) -> None:
    """Refuse a new Protobuf field that may be a column renamed: its name no column's, its number none the table
    records, while a column whose number the table does not record is not in the new schema. Without that number
    the export cannot tell a renamed field from a removed one and an added one.

    Raises:
        RunFailed: one line naming the field(s), the column(s), and what to do.
    """
    known = {f.name for f in old}
    recorded = {f.metadata[NUMBER_KEY] for f in old if f.metadata and NUMBER_KEY in f.metadata}
    names = {f.name for f in new}
    numbered = [f for f in new if f.metadata and NUMBER_KEY in f.metadata]
    fresh = [f for f in numbered if f.name not in known and f.metadata[NUMBER_KEY] not in recorded]
    unnumbered = [f.name for f in old if not (f.metadata and NUMBER_KEY in f.metadata) and f.name not in names]
    if fresh and unnumbered:
        what = ", ".join(f"{f.name} (number {f.metadata[NUMBER_KEY].decode()})" for f in fresh)
        raise RunFailed(
            f"table {settings.table} records no Protobuf field number of column(s) {', '.join(unnumbered)}, which "
            f"the new schema lacks: field(s) {what} may be one of them renamed: nothing committed; export once with "
            "the schema file the table was made with (that run records the numbers), then with the new one"
        )


def json_fields(ddl: str | None) -> list[pa.Field]:
    """The table columns of a JSON value schema (DDL). Parsed by the active Spark session: an export of JSON values
    always starts Spark (`job.needs_spark`)."""
    from pyspark.sql.pandas.types import to_arrow_type
    from pyspark.sql.types import StructType

    if ddl is None:
        raise JobConfigError("--value-format json needs --value-schema DDL")
    try:
        struct = StructType.fromDDL(ddl)
    except Exception as err:
        raise JobConfigError(f"--value-schema {ddl!r}: {err}") from None
    if not isinstance(struct, StructType):
        raise JobConfigError(f"--value-schema {ddl!r}: expected fields such as 'id long, name string'")
    clash = [f.name for f in struct.fields if f.name in RESERVED]
    if clash:
        raise JobConfigError(f"--value-schema: field(s) {', '.join(clash)} clash with the table's own columns")
    return [pa.field(f.name, to_arrow_type(f.dataType)) for f in struct.fields]


MAX_DECIMAL_DIGITS = 38  # Delta's and Iceberg's decimals hold at most this many digits


def storable_type(t: pa.DataType, table_format: str, path: str) -> pa.DataType:
    """The type a table of `table_format` stores a decoded field of type `t` as (the decoders' mapping,
    docs/guides/typed-tables.md): a null-typed field becomes a string column (always null), a time of day
    microseconds since midnight (int64; Iceberg keeps its `time` type), a duration microseconds (int64), an unsigned
    integer the next signed type that holds it (uint64 the decoders give as decimal(20, 0)), nested types type by
    type.

    Raises:
        JobConfigError: a type neither format holds (a decimal of more than 38 digits), naming the field's path.
    """
    if pa.types.is_null(t):
        return pa.string()
    if pa.types.is_time(t):
        return pa.time64("us") if table_format == "iceberg" else pa.int64()
    if pa.types.is_duration(t):  # neither format has one: microseconds, as a long
        return pa.int64()
    if pa.types.is_unsigned_integer(t):  # neither format has unsigned types: the next signed one that holds it
        return pa.int64() if t.bit_width >= 32 else pa.int32()
    if pa.types.is_decimal(t):
        if t.precision > MAX_DECIMAL_DIGITS:
            raise JobConfigError(
                f"field {path}: {t} holds more than {MAX_DECIMAL_DIGITS} digits, the most a Delta or Iceberg decimal "
                "holds"
            )
        return pa.decimal128(t.precision, t.scale)
    if pa.types.is_struct(t):
        return pa.struct(
            [
                f.with_type(storable_type(f.type, table_format, f"{path}.{f.name}"))
                for f in (t.field(i) for i in range(t.num_fields))
            ]
        )
    if pa.types.is_map(t):
        return pa.map_(
            storable_type(t.key_type, table_format, f"{path}.key"),
            t.item_field.with_type(storable_type(t.item_type, table_format, f"{path}.value")),
        )
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        item = t.value_field.with_type(storable_type(t.value_type, table_format, f"{path}[]"))
        return pa.list_(item)
    return t


def to_storable(a: pa.Array, t: pa.DataType) -> pa.Array:
    """`a` as type `t` (its `storable_type`), nested arrays converted child by child."""
    import pyarrow.compute as pc

    if a.type == t:
        return a
    if pa.types.is_null(a.type):
        return pa.nulls(len(a), t)
    if pa.types.is_time(a.type):
        us = pc.cast(a, pa.time64("us"), safe=False)  # nanoseconds: truncated to microseconds
        return us if pa.types.is_time(t) else us.view(pa.int64())
    if pa.types.is_duration(a.type):
        return pc.cast(a, pa.duration("us"), safe=False).view(pa.int64())
    mask = pc.is_null(a) if a.null_count else None
    if pa.types.is_struct(a.type):
        children = [to_storable(c, t.field(i).type) for i, c in enumerate(a.flatten())]
        return pa.StructArray.from_arrays(children, fields=list(t), mask=mask)
    if pa.types.is_map(a.type):
        keys = to_storable(a.keys, t.key_type)
        items = to_storable(a.items, t.item_type)
        return pa.MapArray.from_arrays(a.offsets, keys, items, type=t, mask=mask)
    if pa.types.is_list(a.type) or pa.types.is_large_list(a.type):
        values = to_storable(a.flatten(), t.value_type)
        offsets = pc.subtract(a.offsets, a.offsets[0]).cast(pa.int32())
        return pa.ListArray.from_arrays(offsets, values, type=t, mask=mask)
    return a.cast(t)


def evolved_schema(settings: ExportSettings, table: LakeTable) -> pa.Schema:
    """The schema to write typed values into an existing table, after evolving it to the decoder's columns
    (`tank_log.values.evolve`): fields the new schema adds become nullable columns of the table (Delta: a schema
    change commit; Iceberg: `update_schema`, new field ids, the others kept), fields it dropped stay (null in new
    rows), a widened type widens the column in place (Iceberg: `widen_column`; Delta: delta-spark's typeWidening
    table feature, `--engine spark` only: `_widen_delta`). The table's column order is kept. Protobuf values: a
    column is matched by the field number the table records of it (`PROTOBUF_NUMBERS_KEY`), so a renamed field
    keeps its column; the numbers of new columns are recorded, and on the returned schema's columns (`conform`).

    Raises:
        IncompatibleSchema: a field changed incompatibly (the field's path and both types; nothing committed).
        RunFailed: a new Protobuf field that may be a column whose number the table does not record, renamed
            (`_check_unrecorded`).
        RunFailed: a widening this engine or format cannot make (the field and both types; nothing committed).
        JobConfigError: a Delta table with type widening, which delta-rs neither reads nor writes, on its path.
    """
    from tank_log.values import evolve

    delta = _delta_of(settings, table)
    widening = delta is not None and delta_widening(delta)
    if widening and (settings.engine != "spark" or settings.replay_dead_letters):
        raise JobConfigError(
            widening_refused(settings, "--replay-dead-letters" if settings.replay_dead_letters else "")
        )
    have = table.arrow_schema()
    strict = not_null_nested(have) if delta_spark_typed(settings) else []
    if strict:
        raise RunFailed(
            f"--engine spark: table {settings.table} has NOT NULL fields inside struct columns ({', '.join(strict[:3])}"
            f"{', ...' if len(strict) > 3 else ''}), which delta-spark checks even where the struct is null "
            "(delta-io/delta#860): nothing committed; export it with --engine deltalake, or to a new table"
        )
    _check_key(settings, have)
    recorded = recorded_numbers(settings, table)
    old = [_numbered(f, (recorded or {}).get(f.name)) for f in have if f.name not in own_columns(settings)]
    new = typed_fields(settings, metadata=True)
    _check_unrecorded(settings, old, new)
    merged = evolve(
        pa.struct([f.with_type(plain_type(f.type)) for f in old]),
        pa.struct([f.with_type(plain_type(f.type)) for f in new]),
    )
    by_name = {f.name: f for f in new}
    known = {f.name: plain_type(f.type) for f in old}
    widened = [(f.name, known[f.name], f.type) for f in merged if f.name in known and f.type != known[f.name]]
    added = [by_name.get(f.name, f).remove_metadata() for f in merged if f.name not in known]
    if delta_spark_typed(settings):  # a struct column delta-spark writes: its fields nullable (`nullable_nested`)
        added = [f.with_type(nullable_nested(f.type)) for f in added]
    _refuse_unwidenable(settings, table, widened)
    spark = _spark_session() if delta is not None and (widened or (added and widening)) else None
    deferred = delta is not None and spark is None and bool(widened or (added and widening))
    if deferred:  # the spark engine without Spark: this run writes no rows (`job.needs_spark`); a run that does widens
        log.info(
            "export: %s: no Spark session, nothing to write: its columns change in a run that writes", settings.table
        )
    elif delta is not None and spark is not None:
        _widen_delta(spark, settings, delta, widened, added)
    else:
        widen = getattr(table, "widen_column", None)  # Iceberg's promotions (`_refuse_unwidenable` checked them)
        for name, was, now in widened:
            assert widen is not None
            log.info(
                "export: widening column %s from %s to %s in %s (schema evolution)", name, was, now, settings.table
            )
            widen(name, now)
        _add_columns(table, settings, added)
    columns_now = set(table.arrow_schema().names)  # a deferred column is recorded when it is added
    numbers = {**(recorded or {}), **_numbers_of(merged)}  # a column's recorded number, a new one's, a named one's
    numbers = {name: n for name, n in numbers.items() if name in columns_now}
    if numbers and numbers != recorded:
        _record_numbers(settings, table, numbers)
    want = {f.name: f for f in table_schema(settings)}
    kept = {f.name: f.type for f in merged if not pa.types.is_nested(f.type)}
    if deferred:
        kept.update((name, was) for name, was, _ in widened)
    columns = []
    for f in table.arrow_schema():
        w = want.get(f.name)
        if w is not None and kept.get(f.name, w.type) != w.type:  # narrowed: the wider column (`conform` casts)
            w = w.with_type(kept[f.name])
        if w is not None and plain_type(f.type) == nullable_nested(w.type) != w.type:  # made by delta-spark
            w = w.with_type(nullable_nested(w.type))
        columns.append(f if w is None else w)
    return pa.schema([_numbered(f, numbers.get(f.name)) for f in columns])  # `conform` finds a renamed field


def _numbered(f: pa.Field, number: int | None) -> pa.Field:
    """`f` with its Protobuf field number (`NUMBER_KEY`, what `evolve` and `conform` match by) when it has one."""
    return f if number is None else f.with_metadata({**(f.metadata or {}), NUMBER_KEY: str(number).encode()})


def _record_numbers(settings: ExportSettings, table: LakeTable, numbers: dict[str, int]) -> None:
    """Record the columns' Protobuf field numbers in the table (`PROTOBUF_NUMBERS_KEY`): a commit of its own. Not in
    a Delta table with type widening, which delta-rs cannot commit to: there a later renamed field of a column added
    since is refused (`_check_unrecorded`), not made a new column."""
    value = _numbers_json(numbers)
    delta = _delta_of(settings, table)
    if delta is not None and delta_widening(delta):
        log.warning(
            "export: %s: delta-rs cannot record the Protobuf field numbers of columns in a table with type widening",
            settings.table,
        )
        return
    log.info("export: recording the Protobuf field numbers of %s's columns: %s", settings.table, value)
    table.set_properties({PROTOBUF_NUMBERS_KEY: value})


def _add_columns(table: LakeTable, settings: ExportSettings, added: list[pa.Field]) -> None:
    for f in added:
        log.info("export: adding column %s %s to %s (schema evolution)", f.name, f.type, settings.table)
        table.add_column(f)


TYPE_WIDENING = ("typeWidening", "typeWidening-preview")
"""Delta's table feature of widened columns (delta-spark 4.0; its 3.2 preview's name): delta-rs (deltalake 1.6.6)
refuses to read the rows of such a table ("reader features {'typeWidening'} ... not yet supported by the deltalake
reader") and to commit to it ("Unsupported table features required: [TypeWidening]"); its log it reads."""


def _delta_of(settings: ExportSettings, table: LakeTable) -> DeltaLakeTable | None:
    from tank_log.lakehouse.delta import DeltaLakeTable

    return table if settings.table_format == "delta" and isinstance(table, DeltaLakeTable) else None


def delta_widening(table: DeltaLakeTable) -> bool:
    """Whether the Delta table has the type widening table feature (`TYPE_WIDENING`)."""
    from tank_log.lakehouse.delta import table_features

    return bool(table_features(table) & set(TYPE_WIDENING))


def widening_refused(settings: ExportSettings, what: str = "") -> str:
    """The one line refusing a Delta table with type widening to a path that reads or writes it with delta-rs
    (`what`: that path's flag; the deltalake engine by default)."""
    if what:
        return (
            f"table {settings.table} uses table feature typeWidening (a column widened by delta-spark): {what} "
            "writes with delta-rs, which neither reads nor writes such a table: nothing written"
        )
    return (
        f"table {settings.table} uses table feature typeWidening (a column widened by delta-spark), which delta-rs "
        "neither reads nor writes: nothing written; export it with --engine spark"
    )


def _refuse_unwidenable(settings: ExportSettings, table: LakeTable, widened: list[Widening]) -> None:
    """Refuse, before anything is committed, the first widening this run cannot make: on Iceberg one pyiceberg does
    not promote (`promotable`); on Delta one delta-spark does not make (`delta_promotable`), or any with another
    engine than `--engine spark` (delta-rs cannot widen, nor read or write a table once delta-spark has) or in a
    replay of dead letters (delta-rs writes it).

    Raises:
        RunFailed: one line naming the field, both types, and what to do.
    """
    delta = settings.table_format == "delta"
    for name, was, now in widened:
        head = f"field {name}: {was} -> {now} is a compatible change, but "
        if pa.types.is_nested(was) or pa.types.is_nested(now):  # a struct's field: top-level columns only
            why = f"this export cannot change a column's type so in a {settings.table_format} table"
        elif delta and not delta_promotable(was, now):
            why = "delta-spark's type widening does not make it"
        elif delta and settings.replay_dead_letters:
            why = "--replay-dead-letters writes with delta-rs, which cannot widen a column"
        elif delta and settings.engine != "spark":
            raise RunFailed(
                f"{head}delta-rs cannot widen a column of the delta table {settings.table}: nothing committed; "
                "rerun with --engine spark (delta-spark widens it in place: table feature typeWidening, after which "
                "only --engine spark writes the table), or export to a new table"
            )
        elif not delta and (getattr(table, "widen_column", None) is None or not promotable(was, now)):
            why = f"this export cannot change a column's type so in a {settings.table_format} table"
        else:
            continue
        raise RunFailed(f"{head}{why} ({settings.table}): nothing committed; export to a new table")


Widening = tuple[str, pa.DataType, pa.DataType]  # a top-level column: its name, the table's type, the wider one

SQL_TYPES = {pa.int16(): "SMALLINT", pa.int32(): "INT", pa.int64(): "BIGINT", pa.float64(): "DOUBLE"}


def delta_promotable(was: pa.DataType, now: pa.DataType) -> bool:
    """Whether delta-spark's type widening (Delta 4.0's, docs.delta.io "Delta type widening") changes a column of
    type `was` to `now` with `ALTER COLUMN ... TYPE`, among what `evolve` merges: an integer to a wider one, an int
    (or narrower) or a float to double, a decimal to more digits at the same scale. Not a long to double (delta-spark
    refuses it: a double does not hold every long)."""
    ints = [pa.int8(), pa.int16(), pa.int32(), pa.int64()]
    if was in ints and now in ints:
        return ints.index(now) > ints.index(was)
    if pa.types.is_float64(now):
        return was in ints[:3] or pa.types.is_float32(was)
    return promotable(was, now)


def _spark_session() -> SparkSession | None:
    """The run's Spark session (the job's, active in its thread), or None: the spark engine starts none for a run
    with nothing to write (`job.needs_spark`)."""
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession()


def _widen_delta(
    spark: SparkSession, settings: ExportSettings, table: DeltaLakeTable, widened: list[Widening], added: list[pa.Field]
) -> None:
    """Widen columns of a Delta table in place through delta-spark: its type widening table feature enabled (a
    commit of its own, the first time), then every column's new type in one `ALTER TABLE ... ALTER COLUMN` commit;
    the columns `added` by `ALTER TABLE ... ADD COLUMNS` (delta-rs commits nothing to such a table). The older files
    keep their narrower Parquet types, which Delta's readers widen as they read. A change delta-spark refuses raises
    before any row is written (only the feature's commit may be in the table then).

    Raises:
        RunFailed: the table disables type widening, or delta-spark refused (its first line).
    """
    target = f"delta.{_quoted(settings.location.spark_path())}"
    enabled = table.metadata().configuration.get("delta.enableTypeWidening")
    if widened and enabled == "false":
        name, was, now = widened[0]
        raise RunFailed(
            f"field {name}: {was} -> {now}: table {settings.table} sets delta.enableTypeWidening=false: nothing "
            "committed; set it to true to let the export widen the column, or export to a new table"
        )
    statements = []
    if widened and enabled != "true":
        statements.append(f"ALTER TABLE {target} SET TBLPROPERTIES ('delta.enableTypeWidening' = 'true')")
    if widened:
        changes = ", ".join(f"{_quoted(n)} TYPE {_sql_type(now)}" for n, _, now in widened)
        statements.append(f"ALTER TABLE {target} ALTER COLUMN {changes}")
    if added:
        statements.append(f"ALTER TABLE {target} ADD COLUMNS ({_ddl(spark, added)})")
    for name, was, now in widened:
        log.info("export: widening column %s from %s to %s in %s (schema evolution, delta-spark)", name, was, now,
                 settings.table)  # fmt: skip
    for f in added:
        log.info("export: adding column %s %s to %s (schema evolution, delta-spark)", f.name, f.type, settings.table)
    with _hadoop_options(spark, settings.location.spark_options()):
        for sql in statements:
            try:
                spark.sql(sql)
            except Exception as err:  # Spark's AnalysisException, py4j's errors: one line, the change named
                what = "; ".join(f"field {n}: {was} -> {now}" for n, was, now in widened)
                what = what or f"new column(s) {', '.join(f.name for f in added)}"
                first = next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
                table.refresh()
                raise RunFailed(
                    f"{what}: delta-spark did not change table {settings.table} ({first}): no rows committed "
                    f"(table version {table.version()})"
                ) from None
    table.refresh()


def _sql_type(t: pa.DataType) -> str:
    if pa.types.is_decimal(t):
        return f"DECIMAL({t.precision}, {t.scale})"
    return SQL_TYPES[t]


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _ddl(spark: SparkSession, fields: list[pa.Field]) -> str:
    """`fields` as Spark SQL column definitions (`a BIGINT, b STRUCT<...>`), their types as delta-rs maps them to
    Delta's (which are Spark's, in Delta's JSON schema), printed by Spark itself."""
    from tank_log.lakehouse.delta import delta_schema_json

    as_json = delta_schema_json(pa.schema([f.with_nullable(True) for f in fields]))
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    return str(jvm.org.apache.spark.sql.types.DataType.fromJson(as_json).toDDL())


@contextmanager
def _hadoop_options(spark: SparkSession, options: dict[str, str]) -> Iterator[None]:
    """The table's storage options (`spark_options`: s3a's) in the session's conf while SQL runs on the table (a
    DataFrame's reader and writer take them as options; SQL takes the session's Hadoop conf), then as they were."""
    before: dict[str, str | None] = {k: spark.conf.get(k, None) for k in options}
    for k, v in options.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, was in before.items():
            if was is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, was)


def promotable(was: pa.DataType, now: pa.DataType) -> bool:
    """Whether Iceberg promotes a column of type `was` to `now` in place: int to long, float to double, a decimal to
    more digits at the same scale."""
    if (was, now) in ((pa.int32(), pa.int64()), (pa.float32(), pa.float64())):
        return True
    if not (pa.types.is_decimal(was) and pa.types.is_decimal(now)):
        return False
    return bool(was.scale == now.scale and now.precision > was.precision)


def _check_key(settings: ExportSettings, have: pa.Schema) -> None:
    """Refuse keys the table's `key` column cannot take: another type, or a key schema changed (in one line naming
    the field and both types; a key schema's compatible change is not followed in place)."""
    from tank_log.values import evolve

    if "key" not in have.names:
        return
    was, now = plain_type(have.field("key").type), plain_type(key_field(settings).type)
    if was == now:
        return
    evolve(pa.struct([pa.field("key", was)]), pa.struct([pa.field("key", now)]))  # IncompatibleSchema: the path
    raise RunFailed(
        f"field key: {was} -> {now}: this export cannot change the key column's type in a {settings.table_format} "
        f"table ({settings.table}): nothing committed; export to a new table"
    )


def plain_type(t: pa.DataType) -> pa.DataType:
    """`t` with the large and view variants a table's reader may give (large_string, string_view, large_list, ...)
    as the plain ones, nested types type by type: the types `evolve` compares."""
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(plain_type(f.type)) for f in (t.field(i) for i in range(t.num_fields))])
    if pa.types.is_map(t):
        return pa.map_(plain_type(t.key_type), t.item_field.with_type(plain_type(t.item_type)))
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        return pa.list_(t.value_field.with_type(plain_type(t.value_type)))
    return t
