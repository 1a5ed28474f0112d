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
    spark: SparkSession, ctx: JobContext, settings: ExportSettings, plans: list[PartitionPlan]
) -> DataFrame:
    """The DataFrame of rows to export, with the table's columns (decoded values, quarantine columns, date)."""
    from tank_spark.ranges import format_seq_ranges
    from tank_spark.source import register

    register(spark)
    ranges: dict[tuple[str, int], tuple[int | None, int | None]] = {
        (p.topic, p.partition): (p.first, p.end) for p in plans if p.has_work
    }
    reader = spark.read.format("tank").option("seq_ranges", format_seq_ranges(ranges))
    if settings.since_ms is not None:
        reader = reader.option("min_ts", str(settings.since_ms))
    return table_frame(settings, reader.load(",".join(ctx.data_dirs)))


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


@dataclass
class TypedRows:
    """One row batch decoded: the good rows in the table's columns, the bad ones in the dead letters' (all of them:
    `dead_letters.BadRecords` says where each goes)."""

    good: pa.RecordBatch
    bad: pa.RecordBatch


def typed_rows(b: pa.RecordBatch, settings: ExportSettings, schema: pa.Schema) -> TypedRows:
    """Decode a row batch's values in bulk (`ValueDecoder.decode`) into the table's typed columns; an empty or null
    value (a tombstone) is a row of nulls, not a bad record."""
    import numpy as np
    import pyarrow.compute as pc

    from tank_log.values.evolve import conform
    from tank_spark.export.schema import DEAD_LETTER_SCHEMA, RESERVED, storable_type, to_storable

    value = b.column("value")
    decoded = value_decoder(settings).decode(value)
    tombstone = pc.fill_null(pc.equal(pc.binary_length(value), 0), True).to_numpy(zero_copy_only=False)
    bad = np.asarray(decoded.bad, dtype=bool) & ~tombstone
    good = pa.array(~bad)
    date = pc.cast(pc.cast(b.column("ts"), pa.timestamp("us")), pa.date32())  # the UTC date
    source = pa.array([settings.source] * len(b), pa.string())
    struct = decoded.columns  # a tombstone's row is null (whatever the decoder made of no bytes)
    null = pa.array(tombstone | np.asarray(pc.is_null(struct).to_numpy(zero_copy_only=False), dtype=bool))
    struct = pa.StructArray.from_arrays(struct.flatten(), fields=list(struct.type), mask=null)
    struct = to_storable(struct, storable_type(struct.type, settings.table_format, ""))
    target = pa.struct([f for f in schema if f.name not in RESERVED])  # the table's (`schema.evolved_schema`)
    struct = conform(struct, target)  # renamed (an Avro alias, a Protobuf number), narrowed, dropped fields
    fields = dict(zip(target.names, struct.flatten(), strict=True))  # the row's nulls applied
    own = {c: b.column(c) for c in BASE_COLUMNS} | {
        "date": date,
        TS_RAW.name: b.column(TS_RAW.name),
        SOURCE.name: source,
    }
    cols = [
        own.get(f.name, fields.get(f.name))
        for f in schema  # by name: an evolved table has its newer columns last
    ]
    rows = pa.RecordBatch.from_arrays(cols, names=schema.names)
    dead = pa.RecordBatch.from_arrays(
        [b.column(c) for c in BASE_COLUMNS]
        + [value, decoded.schema_ids, decoded.errors, date, b.column(TS_RAW.name), source],
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
