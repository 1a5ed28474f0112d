"""What an export run does: its settings (flags over the `export` config section) and, per partition, the seq range
it exports — from the version recorded in the table to the last complete seq now."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeAlias, cast

from tank_log.errors import JobConfigError
from tank_log.jobs.flags import add_dead_letter_table, add_source, add_storage_option, add_table_format
from tank_log.lakehouse import (
    LakeTable,
    Recorded,
    TableLocation,
    check_source,
    default_source,
    implementation,
    storage_options,
)
from tank_log.lakehouse.location import Catalog, parse_catalog
from tank_spark.export.other_writers import check_other_writers

if TYPE_CHECKING:
    from tank_log.jobs.config import ExportConfig
    from tank_log.values import ValueSpec
    from tank_spark.context import JobContext

log = logging.getLogger(__name__)


def recorded_versions(
    table: LakeTable, settings: ExportSettings, data_dirs: Iterable[str], topics: Collection[str] | None
) -> dict[tuple[str, int], int | None]:
    """`recorded_version` of every partition of the data dirs (only `topics` when given)."""
    from tank_log.jobs.planning import select_partitions

    return {
        sel.partition.key: table.recorded_version(sel.partition.topic, sel.partition.id)
        for sel in select_partitions(data_dirs, topics, require_match=False)
    }


@dataclass
class PartitionPlan:
    base_path: str
    topic: str
    partition: int
    app_id: str | None  # None until the table exists
    previous: int | None  # last exported seq the table holds, its history checked (None: never exported)
    end: int | None  # last complete seq now (None: empty partition)
    log_start: int | None = None  # the first seq the log holds now (its first segment's base; None: empty)
    recorded: Recorded | None = None  # the recorded version as the table gives it (its `undone` says why not trusted)
    keys_survive: bool = False  # a latest table of a `cleanup` partition: its missing seqs are compaction's (`lost`)

    @property
    def first(self) -> int:
        return (self.previous or 0) + 1

    @property
    def lost(self) -> tuple[int, int] | None:
        """The seqs after what the table holds that the log no longer has (deleted before they were exported, by
        the broker's retention or ours): (first, last), or None.

        None too where `keys_survive`: a latest table holds one row per key, and a `cleanup` partition loses seqs to
        compaction only, which removes a message only when a later one of its key stays in the log (or an empty
        keyless one, which a latest table skips), FORMAT.md §6.2; the broker applies no retention there (§5). So
        every key of a missing seq is exported at its latest message: nothing is lost to the table."""
        if self.keys_survive:
            return None
        if self.previous is None or self.log_start is None or self.log_start <= self.previous + 1:
            return None
        return self.previous + 1, self.log_start - 1

    @property
    def has_work(self) -> bool:
        return self.end is not None and self.end >= self.first


@dataclass(frozen=True)
class ExportSettings:
    table: str
    engine: str
    value_format: str
    value_schema: str | None
    partition_by: tuple[str, ...]
    target_file_bytes: int
    since_ms: int | None = None
    on_corruption: str = "prefix"  # corruption.ON_CORRUPTION
    storage_options: dict[str, str] = field(default_factory=dict, repr=False)  # credentials: never printed
    orphan_horizon_ms: int = 12 * 3600 * 1000  # orphans.py
    optimize: bool = False  # upkeep.py, after the export
    vacuum_retention_ms: int | None = None
    upkeep_only: bool = False  # no export: only the orphan sweep, optimize and vacuum
    continuous: bool = False  # continuous.py: a Structured Streaming query instead of one run
    trigger_interval_ms: int = 30_000
    checkpoint: str | None = None
    on_data_loss: str = "fail"  # continuous: messages retention deleted before they were read fail the query, or not
    in_driver_max_bytes: int = 0  # job.in_driver: a small export runs in the driver process (ExportConfig's default)
    mode: str = "append"  # latest.py: one row per live key (fixed per table)
    table_format: str = "delta"  # tank_log.lakehouse.FORMATS
    catalog: Catalog | None = field(default=None, repr=False)  # iceberg's SQL or REST catalog (may hold credentials)
    source: str | None = None  # the broker these partitions are on (`--source`, export.source; None: unsourced)
    value_spec: ValueSpec | None = None  # typed values (avro, protobuf, json with a JSON Schema): `tank_log.values`
    key_spec: ValueSpec | None = None  # decoded keys (`key` a string or struct); None: bytes
    on_bad_record: str = "dead_letter"  # a typed value that does not decode: fail | dead_letter | skip
    dead_letter_table: str | None = None  # where dead letters go (`dead_letters.py`; None: beside the table)
    replay_dead_letters: bool = False  # no export: `dead_letters.replay`

    @property
    def typed(self) -> bool:
        """Whether values decode into typed columns through `tank_log.values` (bad ones: `on_bad_record`)."""
        return self.value_spec is not None

    @property
    def location(self) -> TableLocation:
        return TableLocation.of(self.table, self.storage_options, self.table_format, self.catalog, self.source)


def add_options(p: argparse.ArgumentParser) -> None:
    """The export job's flags (each overrides its key of the config's `export` section)."""
    _add_table_options(p)
    p.add_argument(
        "--on-corruption",
        choices=("prefix", "skip"),
        help="a partition with malformed data: export what precedes the corruption (prefix, default) or nothing of "
        "it (skip); either way it is reported failed with the file and offset, and the others are exported",
    )
    p.add_argument(
        "--since",
        metavar="TIME",
        help="skip messages with ts before this (ISO date/time or ms); the recorded versions still advance past them",
    )
    _add_upkeep_options(p)
    _add_continuous_options(p)


def _add_table_options(p: argparse.ArgumentParser) -> None:
    """Which table, in which format and mode, and how its rows and files are laid out."""
    p.add_argument("--table", help="the table: a path or a URI (s3://, gs://, az://, abfss://, file://)")
    add_storage_option(p, "--table")
    add_source(p)
    p.add_argument("--engine", choices=("deltalake", "spark"), help="deltalake (delta-rs, default) or spark")
    add_table_format(p)
    p.add_argument(
        "--mode",
        choices=("append", "latest"),
        help="append (default): every message; latest: one row per live key of each partition, a tombstone deleting "
        "its key (a table's mode is fixed when it is created)",
    )
    _add_value_options(p)
    p.add_argument(
        "--partition-by",
        metavar="TERMS",
        help="table partition columns (default topic,date) or, for Iceberg, transforms: "
        "'topic,day(ts),bucket(16, key)' (docs/guides/export-iceberg.md)",
    )
    p.add_argument("--target-file-size", metavar="SIZE", help="Parquet file size target, e.g. 128mb")


def _add_value_options(p: argparse.ArgumentParser) -> None:
    """How values become columns (docs/guides/typed-tables.md), and where the ones that do not decode go."""
    p.add_argument(
        "--value-format",
        choices=("binary", "utf8", "json", "avro", "protobuf"),
        help="how to store values (binary); avro, protobuf and json with --value-schema-file: typed columns",
    )
    p.add_argument("--value-schema", metavar="DDL", help="with --value-format json: e.g. 'id long, name string'")
    p.add_argument(
        "--value-schema-file",
        metavar="FILE",
        help="the values' schema: .avsc (avro), .desc or .proto (protobuf, with --value-message), JSON Schema (json)",
    )
    p.add_argument("--value-message", metavar="NAME", help="with --value-format protobuf: the full message name")
    p.add_argument(
        "--key-format",
        choices=("binary", "utf8", "json", "avro", "protobuf"),
        help="how to store keys (binary): utf8 and json as a string, avro, protobuf and json with --key-schema-file "
        "as a struct; with typed values only",
    )
    p.add_argument("--key-schema-file", metavar="FILE", help="the keys' schema, as --value-schema-file")
    p.add_argument("--key-message", metavar="NAME", help="with --key-format protobuf: the full message name")
    p.add_argument(
        "--on-bad-record",
        choices=("fail", "dead_letter", "skip"),
        help="a typed value that does not decode: into the dead-letter table (dead_letter, default), counted and "
        "left out (skip), or its partition fails with nothing of it committed (fail)",
    )
    p.add_argument(
        "--replay-dead-letters",
        action="store_true",
        help="export nothing: decode the dead letters again with the current value settings (a fixed schema), "
        "append those that now decode to the table and remove them from the dead-letter table",
    )
    add_dead_letter_table(p)


def _add_upkeep_options(p: argparse.ArgumentParser) -> None:
    """The table's upkeep after (or instead of) the export: orphans, small files, files no version needs."""
    p.add_argument(
        "--orphan-horizon",
        metavar="DURATION",
        help="remove files of runs that died before their commit once they are older than this (default 12h; a run "
        "going longer than it does not commit)",
    )
    p.add_argument(
        "--optimize",
        action="store_true",
        help="after the export, rewrite small files into files of the target size (Delta: delta-rs optimize; "
        "Iceberg: a rewrite of each partition with small files, in one commit)",
    )
    p.add_argument(
        "--vacuum",
        metavar="RETENTION",
        help="after the export, delete files no version within RETENTION references, e.g. 168h (not below the "
        "table's delta.deletedFileRetentionDuration, default 7 days; Iceberg: expire older snapshots first, not "
        "below history.expire.max-snapshot-age-ms, default 5 days)",
    )
    p.add_argument(
        "--upkeep-only",
        action="store_true",
        help="export nothing: only remove orphans and run --optimize/--vacuum (a scheduled upkeep task)",
    )


def _add_continuous_options(p: argparse.ArgumentParser) -> None:
    """--continuous: a streaming export until stopped."""
    p.add_argument(
        "--continuous",
        action="store_true",
        help="stream new messages into the table until stopped (SIGTERM/Ctrl-C: the batch in flight finishes)",
    )
    p.add_argument("--trigger-interval", metavar="DURATION", help="with --continuous: micro-batch interval (30s)")
    p.add_argument(
        "--checkpoint", metavar="PATH", help="with --continuous: the query's checkpoint directory (required)"
    )
    p.add_argument(
        "--on-data-loss",
        choices=("fail", "skip"),
        help="with --continuous: messages retention deleted before they were exported fail the query (fail, "
        "default) or are reported (log, report, <checkpoint>/tank-data-loss.jsonl) and skipped",
    )


def prepare(ctx: JobContext, args: argparse.Namespace) -> Prepared:
    """Flags over the `export` config section; then plan (before Spark starts, so bad input fails fast)."""
    # The parsers are imported here, on the driver: tasks unpickle this module, and jobs.config would load the
    # compaction package into every Python worker (~0.1-0.2 s, bench/RESULTS.md, "Spark's Python workers").
    from tank_log.jobs.config import parse_duration_ms, parse_partition_by, parse_size_arg
    from tank_log.lakehouse.partitioning import for_format

    cfg = ctx.config.export
    table = args.table or cfg.table
    if not table:
        raise JobConfigError("no Delta table: pass --table PATH or set export.table")
    location, options = _table_location(cfg, args, table)
    fmt, schema = _value_format(cfg, args)
    spec = _value_spec(ctx, cfg, args, fmt)
    key_spec = _key_spec(ctx, cfg, args)
    if key_spec is not None and spec is None and fmt in ("binary", "utf8"):
        from tank_log.values import ValueFormatName, ValueSpec

        spec = ValueSpec(cast(ValueFormatName, fmt))  # `value` by the plain decoder: bad keys take the typed path
    partition_by = (
        parse_partition_by(args.partition_by, "--partition-by") if args.partition_by is not None else cfg.partition_by
    )
    partition_by = for_format(partition_by, location.format, "--partition-by/export.partition_by")
    target = (
        parse_size_arg(args.target_file_size, "--target-file-size") if args.target_file_size else cfg.target_file_size
    )
    since, horizon = _since_and_horizon(args)
    settings = ExportSettings(
        table,
        args.engine or cfg.engine,
        fmt,
        schema,
        partition_by,
        target,
        since,
        on_corruption=args.on_corruption or cfg.on_corruption,
        storage_options=options,
        orphan_horizon_ms=horizon or cfg.orphan_horizon_ms,
        optimize=args.optimize,
        vacuum_retention_ms=parse_duration_ms(args.vacuum, "--vacuum") if args.vacuum else None,
        upkeep_only=args.upkeep_only,
        table_format=location.format,
        catalog=location.catalog,
        in_driver_max_bytes=(
            parse_size_arg(args.in_driver_max_bytes, "--in-driver-max-bytes")
            if args.in_driver_max_bytes is not None
            else cfg.in_driver_max_bytes
        ),
        mode=args.mode or cfg.mode,
        source=check_source(args.source, "--source") if args.source else cfg.source or default_source(),
        value_spec=spec,
        key_spec=key_spec,
        on_bad_record=args.on_bad_record or cfg.on_bad_record,
        dead_letter_table=args.dead_letter_table or cfg.dead_letter_table,
        replay_dead_letters=args.replay_dead_letters,
    )
    settings = replace(settings, **_continuous_settings(ctx, args, settings))
    _check_typed(settings)
    if settings.upkeep_only and not (settings.optimize or settings.vacuum_retention_ms is not None):
        log.info("export: --upkeep-only without --optimize/--vacuum: only orphaned files are removed")
    plans, delta_table = plan_export(ctx, settings)  # before Spark starts: unknown topics fail fast
    if settings.vacuum_retention_ms is not None:  # before Spark starts: refused with exit 2, nothing exported
        implementation(settings.location.format).check_vacuum_retention(delta_table, settings.vacuum_retention_ms)
    if settings.upkeep_only:
        if delta_table is None:
            raise JobConfigError(f"--upkeep-only: there is no Delta table at {settings.table}")
        plans = []  # nothing to export
    return settings, plans, delta_table


def _table_location(cfg: ExportConfig, args: argparse.Namespace, table: str) -> tuple[TableLocation, dict[str, str]]:
    """The table's location (format, catalog, storage options: flags over the config), checked."""
    table_format = args.format or cfg.format
    catalog = parse_catalog(args.catalog, "--catalog") if args.catalog else cfg.catalog  # http(s)://: a REST catalog
    if catalog and table_format != "iceberg":
        raise JobConfigError("--catalog/export.catalog: only with --format iceberg")
    options = storage_options(cfg.storage_options, args.storage_option)
    try:
        location = TableLocation.of(table, options, table_format, catalog)
    except ValueError as err:
        raise JobConfigError(str(err)) from None
    if location.is_local and os.path.exists(location.uri) and not os.path.isdir(location.uri):
        raise JobConfigError(f"--table {table} exists and is not a directory")
    return location, options


def _value_format(cfg: ExportConfig, args: argparse.Namespace) -> tuple[str, str | None]:
    """The values' format and, for json, the schema (DDL) of their typed columns (None with a JSON Schema file)."""
    fmt = args.value_format or cfg.value_format
    schema_file = args.value_schema_file or (cfg.value_schema_file if not args.value_format else None)
    schema = args.value_schema or (cfg.value_schema if fmt == "json" and not args.value_schema_file else None)
    if fmt == "json" and schema and schema_file:
        raise JobConfigError("--value-format json takes --value-schema DDL or --value-schema-file, not both")
    if fmt == "json" and not schema and not schema_file:
        raise JobConfigError(
            "--value-format json needs --value-schema DDL (e.g. 'id long, name string') or --value-schema-file"
        )
    if fmt != "json" and args.value_schema:
        raise JobConfigError("--value-schema is only for --value-format json")
    return fmt, schema


def _value_spec(ctx: JobContext, cfg: ExportConfig, args: argparse.Namespace, fmt: str) -> ValueSpec | None:
    """The typed values' spec (flags over `export`, a topic's `export.topics.<topic>` over both for the keys it
    sets), checked: its schema file loads (`tank_log.values.decoder_for`). None for binary, utf8 and json by DDL.

    Raises:
        JobConfigError: a flag without its format, protobuf without a message, or the run's topics with different
            specs (one table holds one set of value columns).
        ValueSchemaError: a schema file missing or malformed.
    """
    flags = {"--value-message": args.value_message, "--value-schema-file": args.value_schema_file}
    if fmt in ("binary", "utf8") and any(flags.values()):
        given = ", ".join(f for f, v in flags.items() if v)
        raise JobConfigError(f"{given}: only with --value-format avro, protobuf or json")
    base = {
        "format": fmt,
        "schema_file": args.value_schema_file or (cfg.value_schema_file if not args.value_format else None),
        "message": args.value_message or cfg.value_message,
        "schema_ids": dict(cfg.value_schema_ids),
        "registry_url": cfg.value_registry_url,
        "wire": cfg.value_wire,
    }
    return _topics_spec(ctx, cfg, base, "value", bool(args.value_format), _spec_of)


def _key_spec(ctx: JobContext, cfg: ExportConfig, args: argparse.Namespace) -> ValueSpec | None:
    """The keys' spec (flags over `export.key_*`, a topic's `export.topics.<topic>.key_*` over both; the values'
    registry answers for their ids too), checked like the values'. None for binary keys (bytes).

    Raises:
        JobConfigError: a flag without its format, a schema'd format without its schema or message, or the run's
            topics with different key specs (one table holds one `key` column).
        ValueSchemaError: a schema file missing or malformed.
    """
    if (args.key_schema_file or args.key_message) and (args.key_format or cfg.key_format) in ("binary", "utf8"):
        raise JobConfigError("--key-schema-file, --key-message: only with --key-format avro, protobuf or json")
    base = {
        "format": args.key_format or cfg.key_format,
        "schema_file": args.key_schema_file or (cfg.key_schema_file if not args.key_format else None),
        "message": args.key_message or cfg.key_message,
        "schema_ids": dict(cfg.key_schema_ids),
        "registry_url": cfg.value_registry_url,
        "wire": cfg.key_wire,
    }
    return _topics_spec(ctx, cfg, base, "key", bool(args.key_format), _key_spec_of)


def _topics_spec(
    ctx: JobContext,
    cfg: ExportConfig,
    base: dict[str, Any],
    side: str,
    flagged: bool,
    build: Callable[[dict[str, Any]], ValueSpec | None],
) -> ValueSpec | None:
    """The one spec of the run's `side` (value or key): `base` with each topic's `export.topics.<topic>.<side>_*`
    over it (the values' registry answers for both), built and checked by `build`; a flag's format is every
    topic's.

    Raises:
        JobConfigError: the run's topics with different specs (one table holds one set of columns).
    """
    specs: dict[str | None, ValueSpec | None] = {}
    for topic in _topics_of(ctx, cfg) if not flagged else [None]:
        own = cfg.topics.get(topic) if topic is not None else None
        fields = dict(base)
        if own is not None:
            dumped = own.model_dump(exclude_none=True)
            fields.update({k.removeprefix(f"{side}_"): v for k, v in dumped.items() if k.startswith(f"{side}_")})
            fields["registry_url"] = dumped.get("value_registry_url", fields["registry_url"])
        specs[topic] = build(fields)
    if len({repr(s) for s in specs.values()}) > 1:
        raise JobConfigError(
            f"topics {', '.join(str(t) for t in specs)} have different {side} formats (export.topics): export each "
            "to its own table (--topics, --table)"
        )
    return next(iter(specs.values()))


def _key_spec_of(fields: dict[str, Any]) -> ValueSpec | None:
    """A ValueSpec of the export's key settings, checked; None for binary keys."""
    from tank_log.values import ValueSpec
    from tank_spark.export.rows import key_decoder_of

    fmt, schema_file, ids = fields["format"], fields.get("schema_file"), dict(fields.get("schema_ids") or {})
    if fmt == "binary":
        return None
    schemaless = fmt == "utf8" or (fmt == "json" and not schema_file and not ids)
    if fmt in ("avro", "protobuf") and not schema_file and not ids and not fields.get("registry_url"):
        raise JobConfigError(f"--key-format {fmt} needs --key-schema-file FILE (or export.key_schema_ids)")
    if fmt == "protobuf" and not fields.get("message"):
        raise JobConfigError("--key-format protobuf needs --key-message NAME (the full message name)")
    registry = None if schemaless else fields.get("registry_url")
    spec = ValueSpec(fmt, schema_file, fields.get("message"), ids, registry, fields.get("wire") or "auto")
    key_decoder_of(spec)  # a missing or malformed schema file: ValueSchemaError (exit 2), before anything is written
    return spec


def _topics_of(ctx: JobContext, cfg: ExportConfig) -> Sequence[str | None]:
    """The run's topics, for their `export.topics` entries ([None]: no entry applies)."""
    from tank_log.jobs.planning import select_partitions

    if not cfg.topics:
        return [None]
    if ctx.topics:
        return sorted(ctx.topics)
    return sorted({s.partition.topic for s in select_partitions(ctx.data_dirs, None, require_match=False)})


def _spec_of(fields: dict[str, Any]) -> ValueSpec | None:
    """A ValueSpec of the export's value keys, checked; None when values are not typed through `tank_log.values`."""
    from tank_log.values import ValueSpec
    from tank_spark.export.rows import decoder_of

    fmt, schema_file = fields["format"], fields.get("schema_file")
    if fmt in ("binary", "utf8") or (fmt == "json" and not schema_file):
        return None
    if not schema_file and not fields.get("schema_ids") and not fields.get("registry_url"):
        raise JobConfigError(f"--value-format {fmt} needs --value-schema-file FILE (or export.value_schema_ids)")
    if fmt == "protobuf" and not fields.get("message"):
        raise JobConfigError("--value-format protobuf needs --value-message NAME (the full message name)")
    spec = ValueSpec(
        fmt,
        schema_file,
        fields.get("message"),
        dict(fields.get("schema_ids") or {}),
        fields.get("registry_url"),
        fields.get("wire") or "auto",
    )
    decoder_of(spec)  # a missing or malformed schema file: ValueSchemaError (exit 2), before anything is written
    return spec


def _since_and_horizon(args: argparse.Namespace) -> tuple[int | None, int | None]:
    """--since (ms since the epoch) and --orphan-horizon (ms), if given."""
    from tank_log.jobs.config import parse_duration_ms

    since = None
    if args.since:
        from tank_spark.ranges import parse_time_ms

        try:
            since = parse_time_ms(args.since)
        except ValueError:
            raise JobConfigError(f"--since {args.since!r}: expected an ISO date/time or ms since the epoch") from None
    horizon = parse_duration_ms(args.orphan_horizon, "--orphan-horizon") if args.orphan_horizon else None
    if horizon == 0:
        raise JobConfigError("--orphan-horizon: must be more than 0 (it protects runs in flight)")
    return since, horizon


def _check_typed(settings: ExportSettings) -> None:
    """Refuse what an export of typed values does not do yet, before anything is written.

    Raises:
        JobConfigError: one line naming the flags (docs/guides/typed-tables.md, "Limits").
    """
    if settings.key_spec is not None and not settings.typed:
        raise JobConfigError(
            f"--key-format {settings.key_spec.format}: decoded keys take values of binary, utf8, avro, protobuf or "
            "json with --value-schema-file, not json with --value-schema DDL (a bad key goes to the dead-letter table)"
        )
    if settings.key_spec is not None and settings.key_spec.format in ("avro", "protobuf", "json"):
        from tank_log.lakehouse.partitioning import terms
        from tank_spark.export.rows import key_is_text

        by_key = [t for t in terms(settings.partition_by) if t.source == "key"]
        if by_key and not key_is_text(settings.key_spec):
            raise JobConfigError(
                f"--partition-by {', '.join(settings.partition_by)}: a decoded key is a struct, which Iceberg does not "
                "bucket; partition by topic, partition or ts, or keep --key-format binary or utf8"
            )
    if settings.replay_dead_letters and not settings.typed:
        raise JobConfigError("--replay-dead-letters: the values are not typed (--value-format avro|protobuf|json)")
    if not settings.typed:
        return
    _check_spark_iceberg_types(settings)
    clashes = {
        "--upkeep-only": settings.upkeep_only and settings.replay_dead_letters,
        # a latest table's MERGE matches the raw key (audit compares it with the log's): decoded keys append only
        "--mode latest": settings.mode == "latest" and settings.key_spec is not None,
    }
    bad = [f for f, on in clashes.items() if on]
    if bad:
        what = f"--value-format {settings.value_format} with a schema"
        plain = settings.value_spec is not None and settings.value_spec.format in ("binary", "utf8")
        if settings.key_spec and (plain or bad == ["--mode latest"]):
            what = f"--key-format {settings.key_spec.format}"  # plain values typed for their keys' sake
        raise JobConfigError(
            f"{what} does not take {', '.join(bad)}: dead letters are replayed by an export run, decoded keys "
            "exported by append runs (docs/guides/typed-tables.md)"
        )


def _check_spark_iceberg_types(settings: ExportSettings) -> None:
    """Refuse typed values with a time of day (Avro time-millis/micros: an Iceberg `time` column) on an Iceberg
    table with --engine spark: Iceberg's Spark runtime opens no table with a time column.

    Raises:
        JobConfigError: one line naming the flag and the fields.
    """
    import pyarrow as pa

    from tank_spark.export.schema import all_fields, table_schema

    if settings.engine != "spark" or settings.table_format != "iceberg":
        return
    found = sorted(path for path, f, _ in all_fields(table_schema(settings)) if pa.types.is_time(f.type))
    if found:
        raise JobConfigError(
            f"--engine spark does not take typed values with a time of day into an Iceberg table (field(s) "
            f"{', '.join(found)}: Iceberg's Spark runtime opens no table with a time column); use --engine "
            "deltalake (pyiceberg writes it)"
        )


def _continuous_settings(ctx: JobContext, args: argparse.Namespace, settings: ExportSettings) -> dict[str, Any]:
    """The --continuous flags, checked against the rest.

    Raises:
        JobConfigError: a continuous flag without --continuous, no --checkpoint, or a flag that does not apply.
    """
    from tank_log.jobs.config import parse_duration_ms

    flags = {
        "--trigger-interval": args.trigger_interval,
        "--checkpoint": args.checkpoint,
        "--on-data-loss": args.on_data_loss,
    }
    if not args.continuous:
        given = [f for f, v in flags.items() if v is not None]
        if given:
            raise JobConfigError(f"{', '.join(given)}: only with --continuous")
        return {}
    if not args.checkpoint:
        raise JobConfigError("--continuous needs --checkpoint PATH (where the query records its progress)")
    clashes = {
        "--dry-run": ctx.dry_run,
        "--upkeep-only": settings.upkeep_only,
        "--optimize": settings.optimize,
        "--vacuum": settings.vacuum_retention_ms is not None,
        "--engine spark": settings.engine == "spark",
    }
    bad = [f for f, on in clashes.items() if on]
    if bad:
        raise JobConfigError(
            f"--continuous does not take {', '.join(bad)} (run upkeep as its own scheduled --upkeep-only task)"
        )
    interval = parse_duration_ms(args.trigger_interval, "--trigger-interval") if args.trigger_interval else 30_000
    return {
        "continuous": True,
        "trigger_interval_ms": interval,
        "checkpoint": args.checkpoint,
        "on_data_loss": args.on_data_loss or "fail",
    }


Prepared: TypeAlias = "tuple[ExportSettings, list[PartitionPlan], LakeTable | None]"
"""What `prepare` hands the job: the settings, every partition's plan, the table (None before the first export)."""


def plan_export(ctx: JobContext, settings: ExportSettings) -> tuple[list[PartitionPlan], LakeTable | None]:
    """Per partition: the range to export, against the table's latest version (also used to re-plan after a
    concurrent commit).

    Raises:
        OtherWriter: another writer added rows of a partition past its recorded version (`other_writers.py`).
    """
    from tank_log.jobs.planning import select_partitions
    from tank_log.storage.datadir import last_complete_seq

    table = settings.location.open()
    plans: list[PartitionPlan] = []
    seen: dict[tuple[str, int], str] = {}
    for sel in select_partitions(ctx.data_dirs, ctx.topics):
        part, base = sel.partition, sel.base_path
        if part.key in seen:
            raise JobConfigError(
                f"{part.topic}/{part.id} exists in {seen[part.key]} and {base}: export one broker per table"
            )
        seen[part.key] = base
        aid, recorded = (
            (None, Recorded(None, None))
            if table is None
            else (table.app_id(part.topic, part.id), table.recorded(part.topic, part.id))
        )
        if recorded.undone:
            log.warning(
                "export: %s/%s: the table records seq %s, but %s: it holds seqs up to %s; what the log still has "
                "after that is exported again",
                part.topic,
                part.id,
                recorded.recorded,
                recorded.undone,
                "none" if recorded.version is None else recorded.version,
            )
        end = last_complete_seq(part)
        start = part.readable[0].base if part.readable and end is not None else None
        keys_survive = settings.mode == "latest" and part.config.cleanup_policy == "cleanup"
        plans.append(
            PartitionPlan(base, part.topic, part.id, aid, recorded.version, end, start, recorded, keys_survive)
        )
    if settings.engine == "spark" and not settings.upkeep_only:
        _check_spark_can_rewrite(plans)
    if table is not None and not settings.upkeep_only:
        check_other_writers(settings.table, table, {(p.topic, p.partition): p.previous for p in plans})
    return plans, table


def _check_spark_can_rewrite(plans: list[PartitionPlan]) -> None:
    """delta-spark skips a write whose app-transaction version is not above the one the table records, even when a
    RESTORE undid the rows of that version: refuse what it would skip.

    Raises:
        JobConfigError: one line naming the partitions and what to run instead.
    """
    stuck = [
        p
        for p in plans
        if p.recorded is not None
        and p.recorded.undone
        and p.has_work
        and p.end is not None
        and p.recorded.recorded is not None
        and p.end <= p.recorded.recorded
    ]
    if stuck:
        named = ", ".join(f"{p.topic}/{p.partition} (seqs {p.first}..{p.end})" for p in stuck[:5])
        raise JobConfigError(
            f"the table's history undid rows of {named}: delta-spark skips a write whose version is not above the "
            "recorded one; export them again once with --engine deltalake"
        )
