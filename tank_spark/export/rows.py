"""The rows to write: straight from segment ranges for binary/utf8 values (executors, no Spark SQL), or through
Spark SQL for JSON values (typed columns, quarantine columns)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from tank_spark.export.plan import (
    ExportSettings,
    PartitionPlan,
)
from tank_spark.export.schema import BASE_COLUMNS, SOURCE, json_fields
from tank_spark.schema import TS_RAW

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from tank_log.values import ValueDecoder, ValueSpec
    from tank_spark.context import JobContext
    from tank_spark.ranges import SegmentRange


def decoded_frame(
    spark: SparkSession,
    ctx: JobContext,
    settings: ExportSettings,
    plans: list[PartitionPlan],
    schema: pa.Schema | None = None,
) -> DataFrame:
    """The DataFrame of rows to export, with the table's columns (decoded values, quarantine columns, date); typed
    values (`settings.typed`) in the columns of `schema`, the table's (`typed_frame`)."""
    from tank_spark.ranges import format_seq_ranges
    from tank_spark.source import register

    register(spark)
    ranges: dict[tuple[str, int], tuple[int | None, int | None]] = {
        (p.topic, p.partition): (p.first, p.end) for p in plans if p.has_work
    }
    reader = spark.read.format("tank").option("seq_ranges", format_seq_ranges(ranges))
    if settings.since_ms is not None:
        reader = reader.option("min_ts", str(settings.since_ms))
    rows = reader.load(",".join(ctx.data_dirs))
    if settings.typed:
        assert schema is not None  # the table's columns: `schema.evolved_schema`'s order and types
        return typed_frame(settings, rows, schema)
    return table_frame(settings, rows)


def typed_frame(settings: ExportSettings, df: DataFrame, schema: pa.Schema) -> DataFrame:
    """Rows of the tank source → the table's typed columns (engine spark): each batch decoded in Spark's tasks by
    `typed_rows` (the deltalake engine's decoders), the bad values left out (the run found them before and put them
    in the dead-letter table: `job._decode_pre_pass`); the Spark schema is the table's Arrow `schema` (a timestamp
    without a time zone: TIMESTAMP_NTZ)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    def decode(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            good = typed_rows(b, settings, schema).good
            if good.num_rows:
                yield good.cast(schema)  # the source's `ts` comes in the session's time zone: the same instants

    return df.mapInArrow(decode, from_arrow_schema(schema, prefer_timestamp_ntz=True))


def table_frame(settings: ExportSettings, df: DataFrame) -> DataFrame:
    """Rows of the tank source (batch or stream) → the table's columns."""
    from pyspark.sql import functions as F

    cols = [F.col(c) for c in BASE_COLUMNS]
    if settings.value_format == "binary":
        cols.append(F.col("value"))
    else:
        valid = F.is_valid_utf8("value")
        text = F.when(valid, F.col("value").cast("string"))
        if settings.value_format == "utf8":
            error = F.when(~valid, F.lit("invalid UTF-8"))
            cols.append(F.when(error.isNull(), text).alias("value"))
        else:
            assert settings.value_schema is not None  # value_format json comes with a schema (plan.prepare)
            ddl = settings.value_schema + ", _corrupt_record string"
            parsed = F.from_json(text, ddl, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_corrupt_record"})
            df = df.withColumn("_parsed", parsed)
            empty = F.length("value") == 0  # a tombstone or empty message: nulls, not an error
            error = F.when(~valid, F.lit("invalid UTF-8")).when(
                ~empty & (F.col("_parsed").isNull() | F.col("_parsed._corrupt_record").isNotNull()),
                F.lit("not valid JSON for the value schema"),
            )
            for f in json_fields(settings.value_schema):
                cols.append(F.when(error.isNull(), F.col(f"_parsed.`{f.name}`")).alias(f.name))
        cols += [error.alias("decode_error"), F.when(error.isNotNull(), F.col("value")).alias("raw_value")]
    cols.append(F.to_date(F.col("ts")).alias("date"))
    cols.append(F.col(TS_RAW.name))
    cols.append(F.lit(settings.source).cast("string").alias(SOURCE.name))
    return df.select(*cols)


def direct_ranges(ctx: JobContext, settings: ExportSettings, plans: list[PartitionPlan]) -> list[SegmentRange]:
    """Read tasks (segment ranges, docs/FORMAT.md §4.4) covering every partition's (previous, end] range."""
    from tank_spark.ranges import DEFAULT_SPLIT_BYTES, Bounds, plan_ranges

    bounds = Bounds(
        seq_ranges={(p.topic, p.partition): (p.first, p.end) for p in plans if p.has_work}, min_ts=settings.since_ms
    )
    return [r for r in plan_ranges(list(ctx.data_dirs), bounds, True, DEFAULT_SPLIT_BYTES) if r.path]


def table_batches(
    row_batches: Iterable[pa.RecordBatch], settings: ExportSettings, schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """Batches of the table's schema for binary/utf8 values from row batches of segment ranges (executor side)."""
    import pyarrow.compute as pc

    for b in row_batches:
        cols = [b.column(c) for c in BASE_COLUMNS]
        value = b.column("value")
        if settings.value_format == "binary":
            cols.append(value)
        else:
            text, error = utf8_with_errors(value)
            cols += [text, error, pc.if_else(pc.is_null(error), pa.nulls(len(value), pa.binary()), value)]
        cols.append(pc.cast(pc.cast(b.column("ts"), pa.timestamp("us")), pa.date32()))  # the UTC date
        cols.append(b.column(TS_RAW.name))
        cols.append(pa.array([settings.source] * len(b), pa.string()))
        yield pa.RecordBatch.from_arrays(cols, schema=schema)


_DECODERS: dict[str, ValueDecoder] = {}  # per process (the driver, an executor's Python worker): built once


def value_decoder(settings: ExportSettings) -> ValueDecoder:
    """The decoder of the settings' typed values, built once per process (`decoder_of`)."""
    assert settings.value_spec is not None  # `ExportSettings.typed`
    return decoder_of(settings.value_spec)


def decoder_of(spec: ValueSpec) -> ValueDecoder:
    """`tank_log.values.decoder_for(spec)`, built once per process (a .proto schema compiles in a subprocess)."""
    from tank_log.values import decoder_for

    key = repr(spec)
    if key not in _DECODERS:
        _DECODERS[key] = decoder_for(spec)
    return _DECODERS[key]


def key_decoder_of(spec: ValueSpec) -> ValueDecoder:
    """`decoder_of` for keys: a decoder of its own (its errors say `key:`), built once per process."""
    from tank_log.values import decoder_for

    key = "key " + repr(spec)
    if key not in _DECODERS:
        decoder = decoder_for(spec)
        if hasattr(decoder, "format_label"):  # the errors' first word (BatchDecoder): a key's, not a value's
            decoder.format_label = "key"
        _DECODERS[key] = decoder
    return _DECODERS[key]


def key_is_text(spec: ValueSpec) -> bool:
    """Whether keys of `spec` are one string column (utf8; json without a schema), not a struct of fields."""
    return spec.format == "utf8" or (spec.format == "json" and spec.schema_file is None and not spec.schema_ids)


def decoded_keys(key: pa.Array, settings: ExportSettings, key_type: pa.DataType) -> tuple[pa.Array, pa.Array]:
    """(the `key` column of type `key_type`, each row's error or null) of a batch's raw keys by `settings.key_spec`:
    a null or empty key is a null `key`, not a bad record."""
    import numpy as np
    import pyarrow.compute as pc

    from tank_spark.export.schema import storable_type, to_storable

    assert settings.key_spec is not None
    decoded = key_decoder_of(settings.key_spec).decode(key)
    absent = pc.fill_null(pc.equal(pc.binary_length(key), 0), True).to_numpy(zero_copy_only=False)
    bad = np.asarray(decoded.bad, dtype=bool) & ~absent
    struct = decoded.columns
    null = pa.array(absent | bad | np.asarray(pc.is_null(struct).to_numpy(zero_copy_only=False), dtype=bool))
    struct = pa.StructArray.from_arrays(struct.flatten(), fields=list(struct.type), mask=null)
    errors = pc.if_else(pa.array(bad), decoded.errors, pa.scalar(None, pa.string()))
    if key_is_text(settings.key_spec):
        return struct.field(0).cast(key_type), errors
    struct = to_storable(struct, storable_type(struct.type, settings.table_format, "key"))
    return pa.StructArray.from_arrays(struct.flatten(), fields=list(key_type), mask=null), errors


@dataclass
class TypedRows:
    """One row batch decoded: the good rows in the table's columns, the bad ones in the dead letters' (all of them:
    `dead_letters.BadRecords` says where each goes)."""

    good: pa.RecordBatch
    bad: pa.RecordBatch


def typed_rows(b: pa.RecordBatch, settings: ExportSettings, schema: pa.Schema) -> TypedRows:
    """Decode a row batch's values in bulk (`ValueDecoder.decode`) into the table's typed columns; an empty or null
    value (a tombstone) is a row of nulls, not a bad record (binary or utf8 values, whose one column is `value`: an
    empty value stays empty)."""
    import numpy as np
    import pyarrow.compute as pc

    from tank_log.values.evolve import conform
    from tank_spark.export.schema import DEAD_LETTER_SCHEMA, own_columns, plain_values, storable_type, to_storable

    value = b.column("value")
    decoded = value_decoder(settings).decode(value)
    no_value = pc.is_null(value) if plain_values(settings) else pc.fill_null(pc.equal(pc.binary_length(value), 0), True)
    tombstone = no_value.to_numpy(zero_copy_only=False)
    bad = np.asarray(decoded.bad, dtype=bool) & ~tombstone
    good = pa.array(~bad)
    date = pc.cast(pc.cast(b.column("ts"), pa.timestamp("us")), pa.date32())  # the UTC date
    source = pa.array([settings.source] * len(b), pa.string())
    struct = decoded.columns  # a tombstone's row is null (whatever the decoder made of no bytes)
    null = pa.array(tombstone | np.asarray(pc.is_null(struct).to_numpy(zero_copy_only=False), dtype=bool))
    struct = pa.StructArray.from_arrays(struct.flatten(), fields=list(struct.type), mask=null)
    struct = to_storable(struct, storable_type(struct.type, settings.table_format, ""))
    reserved = own_columns(settings)
    target = pa.struct([f for f in schema if f.name not in reserved])  # the table's (`schema.evolved_schema`)
    struct = conform(struct, target)  # renamed (an Avro alias, a Protobuf number), narrowed, dropped fields
    fields = dict(zip(target.names, struct.flatten(), strict=True))  # the row's nulls applied
    errors = decoded.errors
    keys = {}
    if settings.key_spec is not None:  # a key that does not decode makes its record bad, as its value would
        keys["key"], key_errors = decoded_keys(b.column("key"), settings, schema.field("key").type)
        key_bad = pc.is_valid(key_errors).to_numpy(zero_copy_only=False)
        errors = pc.if_else(pa.array(bad), errors, key_errors)  # the value's error first
        bad = bad | key_bad
        good = pa.array(~bad)
    own = (
        {c: b.column(c) for c in BASE_COLUMNS}
        | keys
        | {
            "date": date,
            TS_RAW.name: b.column(TS_RAW.name),
            SOURCE.name: source,
        }
    )
    cols = [
        own.get(f.name, fields.get(f.name))
        for f in schema  # by name: an evolved table has its newer columns last
    ]
    rows = pa.RecordBatch.from_arrays(cols, names=schema.names)
    dead = pa.RecordBatch.from_arrays(
        [b.column(c) for c in BASE_COLUMNS] + [value, decoded.schema_ids, errors, date, b.column(TS_RAW.name), source],
        schema=DEAD_LETTER_SCHEMA,
    )
    return TypedRows(rows.filter(good), dead.filter(pa.array(bad)))


def utf8_with_errors(value: pa.Array) -> tuple[pa.Array, pa.Array]:
    """(text, decode_error) of binary values; invalid UTF-8 → null text and an error."""
    try:
        return value.cast(pa.string()), pa.nulls(len(value), pa.string())
    except pa.ArrowInvalid:
        texts: list[str | None] = []
        errors: list[str | None] = []
        for v in value.to_pylist():
            try:
                texts.append(v.decode("utf-8"))
                errors.append(None)
            except UnicodeDecodeError:
                texts.append(None)
                errors.append("invalid UTF-8")
        return pa.array(texts, pa.string()), pa.array(errors, pa.string())
