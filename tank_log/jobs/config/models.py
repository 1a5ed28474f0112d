"""The job configuration's sections as pydantic models: the YAML key of each field (its alias), its type in the
broker's units (`units.py`), its default. Unknown keys are refused; cross-field rules are validators. The models are
the configuration the jobs read (frozen; `model_copy(update=...)` derives one with flags applied)."""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, field_validator, model_validator

from tank_log.errors import JobConfigError
from tank_log.format.bundle import SnappyPolicy
from tank_log.jobs.config.units import (
    Count,
    Flag,
    Millis,
    OneOf,
    Paths,
    Positive,
    Ratio,
    Seconds,
    Size,
    StringMap,
    Text,
    keyed_by_name,
)
from tank_log.lakehouse import partitioning
from tank_log.lakehouse.location import FORMATS, RestCatalog, parse_catalog
from tank_log.lakehouse.table import SOURCE_PATTERN
from tank_log.maintenance.compaction.options import DEFAULT_KEY_STATE_BUDGET

EXPORT_TABLE = "export"  # keep_unexported.table naming the export section's table (and its storage options)
DEAD_LETTERS_SUFFIX = "_dead_letters"  # export.dead_letter_table's default: the table's path or name + this
PARTITION_COLUMNS = partitioning.COLUMNS  # and Iceberg's transforms (`partitioning.parse`)
TIME_BASES = ("name", "message")

CompactionPolicy = Annotated[str, OneOf("cleanup", "delete")]
SnappyChoice = Annotated[str, OneOf(*(p.value for p in SnappyPolicy))]
TimeBasis = Annotated[str, OneOf(*TIME_BASES)]
Engine = Annotated[str, OneOf("deltalake", "spark")]
TableFormatName = Annotated[str, OneOf(*FORMATS)]
ValueFormat = Annotated[str, OneOf("binary", "utf8", "json", "avro", "protobuf")]
OnBadRecord = Annotated[str, OneOf("fail", "dead_letter", "skip")]
Wire = Annotated[str, OneOf("auto", "confluent", "plain")]  # the Confluent wire format's header on values
ExportMode = Annotated[str, OneOf("append", "latest")]  # fixed per table when it is created
OnCorruption = Annotated[str, OneOf("prefix", "skip")]


def default_dead_letter_table(table: str) -> str:
    """Where an export's dead letters go by default: `s3://b/events` → `s3://b/events_dead_letters`, `ns.events` (a
    catalog's name) → `ns.events_dead_letters`."""
    return table.rstrip("/") + DEAD_LETTERS_SUFFIX


class Section(BaseModel):
    """A mapping of the job YAML: unknown keys refused, frozen once loaded."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class SparkSettings(Section):
    """`spark`: used when spark-submit does not say (its `--master` always wins)."""

    master: str | None = Field(default=None, description="the Spark master when not given by spark-submit")
    app_name: Text = Field(default="tank-log", description="the Spark application name (the job name follows)")
    conf: StringMap = Field(default_factory=dict, description="Spark properties, e.g. spark.sql.shuffle.partitions")


class TopicCompaction(Section):
    """`compaction.topics.<topic>`: per-topic overrides; null = inherit."""

    policy: CompactionPolicy | None = Field(
        default=None, description="cleanup: compact even if the topic's config says delete; delete: never"
    )
    tombstone_retention_ms: Millis | None = Field(
        default=None, alias="tombstone_retention", description="drop tombstones older than this"
    )
    drop_keyless: Flag | None = Field(default=None, description="drop keyless messages (Kafka's behaviour)")
    min_compaction_lag_ms: Millis | None = Field(
        default=None, alias="min_compaction_lag", description="leave messages younger than this"
    )
    min_cleanable_ratio: Ratio | None = Field(default=None, description="compact only past this dirty ratio")


MIN_KEY_STATE_BUDGET = 64 << 10


class CompactionSettings(Section):
    """`compaction`."""

    force: Flag = Field(default=False, description="compact even when the dirty ratio is below the threshold")
    min_compaction_lag_ms: Millis = Field(
        default=0, alias="min_compaction_lag", description="leave the newest segments younger than this (by message ts)"
    )
    tombstone_retention_ms: Millis | None = Field(
        default=None, alias="tombstone_retention", description="null: keep tombstones forever (the broker's rule)"
    )
    drop_keyless: Flag = Field(
        default=False, description="drop keyless messages (Kafka's behaviour; the broker keeps them)"
    )
    bundle_messages: Positive = Field(default=100, description="messages per output bundle, at most")
    bundle_bytes: Size = Field(default=64 << 10, description="bytes per output bundle, about")
    snappy: SnappyChoice = Field(
        default="when_smaller", description="when_smaller | client | always | never (never: the read-speed option)"
    )
    segment_bytes: Size | None = Field(default=None, description="null: each topic's log.segment.bytes")
    min_cleanable_ratio: Ratio | None = Field(
        default=None, description="null: each topic's log.cleaner.min.cleanable.ratio"
    )
    key_state_budget: Size = Field(
        default=DEFAULT_KEY_STATE_BUDGET, description="memory for a partition's keys (~24 B each); more spill to disk"
    )
    topics: Annotated[dict[str, TopicCompaction], BeforeValidator(keyed_by_name)] = Field(default_factory=dict)

    @field_validator("key_state_budget")
    @classmethod
    def _budget_floor(cls, n: int) -> int:
        if (
            n < MIN_KEY_STATE_BUDGET
        ):  # a key map this small holds next to no key: the spill splits and splits for nothing
            raise ValueError(
                f"must be at least {MIN_KEY_STATE_BUDGET >> 10}kb (a key takes ~24 bytes plus the map's own)"
            )
        return n

    @field_validator("segment_bytes")
    @classmethod
    def _segment_range(cls, n: int | None) -> int | None:
        if n is not None and not 64 <= n < 1 << 32:
            raise ValueError("must be within 64 bytes and 4 GiB (docs/FORMAT.md §8)")
        return n


def _table_shorthand(value: Any) -> Any:
    return {"table": value} if isinstance(value, str) else value


def _catalog_setting(value: Any) -> Any:
    if value is not None and not isinstance(value, str | dict | RestCatalog):
        raise ValueError("expected a SQLAlchemy URI or {type: rest, uri: ...}")
    return parse_catalog(value, "catalog")  # JobConfigError: a ValueError, reported with the key's path


CatalogSetting = Annotated[
    str | RestCatalog | None,
    BeforeValidator(_catalog_setting),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "minLength": 1},
                {
                    "type": "object",
                    "properties": {
                        "type": {"enum": ["rest", "sql"]},
                        "uri": {"type": "string"},
                        "warehouse": {"type": "string"},
                        "token": {"type": "string"},
                        "credential": {"type": "string"},
                    },
                    "required": ["type", "uri"],
                    "additionalProperties": False,
                },
                {"type": "null"},
            ]
        }
    ),
]


class KeepUnexported(Section):
    """`retention.keep_unexported`: retention keeps what this table has not received (the export's recorded versions),
    within the bounds."""

    table: Text = Field(description=f"a table path or URI, or `{EXPORT_TABLE}`: export.table and its options")
    storage_options: StringMap = Field(
        default_factory=dict, repr=False, description="for a table other than the export's"
    )
    max_holdback_bytes: Size = Field(
        default=0, alias="max_holdback_size", description="bytes held back, at most (0: none)"
    )
    max_holdback_s: Seconds = Field(
        default=0, alias="max_holdback_age", description="how far past its retention the oldest held segment may get"
    )
    format: TableFormatName | None = Field(
        default=None, description=f"the table's format: delta (default) | iceberg; `{EXPORT_TABLE}`: export.format"
    )
    catalog: CatalogSetting = Field(
        default=None,
        repr=False,
        description=f"format iceberg: the catalog (as export.catalog); `{EXPORT_TABLE}`: export.catalog",
    )

    @model_validator(mode="after")
    def _format_of_another_table(self) -> KeepUnexported:
        if self.table == EXPORT_TABLE and (self.format is not None or self.catalog is not None):
            raise ValueError(f"format and catalog are the export's own for table `{EXPORT_TABLE}`")
        if self.catalog is not None and self.format != "iceberg":
            raise ValueError("catalog goes with format iceberg")
        return self


Guard = Annotated[KeepUnexported, BeforeValidator(_table_shorthand)]


def _count_limit(value: Any) -> Any:
    if value == 1 and not isinstance(value, bool):
        raise ValueError("must be 0 or >= 2 (the broker's rule)")
    return value


class TopicRetention(Section):
    """`retention.topics.<topic>`: per-topic overrides of the broker config (a topic TTL); null = its config."""

    enabled: Flag | None = Field(default=None, description="true: enforce even on a cleanup topic; false: never")
    max_age_s: Seconds | None = Field(default=None, alias="max_age", description="delete RO segments older than this")
    max_bytes: Size | None = Field(default=None, description="keep at most this many bytes of RO segments")
    segments_count: Annotated[Count, BeforeValidator(_count_limit)] | None = Field(
        default=None, description="keep at most this many RO segments (0 or >= 2)"
    )
    time_basis: TimeBasis | None = Field(default=None, description="name | message")
    keep_unexported: Literal[False] | Guard | None = Field(default=None, description="false: off for the topic")

    @property
    def limits(self) -> dict[str, Any]:
        """The overridden retention limits (RetentionRules field → value)."""
        from tank_log.maintenance.retention import POLICIES

        return {p.name: getattr(self, p.name) for p in POLICIES if getattr(self, p.name) is not None}


class RetentionSettings(Section):
    """`retention`."""

    time_basis: TimeBasis = Field(
        default="name", description="name (the broker's rule: the name's ts) | message (the newest message ts)"
    )
    include_cleanup_topics: Flag = Field(default=False, description="the broker applies no retention to cleanup topics")
    keep_unexported: Guard | None = Field(default=None, description="the lakehouse guard (off when absent)")
    topics: Annotated[dict[str, TopicRetention], BeforeValidator(keyed_by_name)] = Field(default_factory=dict)

    def guard_of(self, topic: str) -> KeepUnexported | None:
        """The lakehouse guard of one topic: its own, else the global one; None when off."""
        own = self.topics[topic].keep_unexported if topic in self.topics else None
        if own is None:
            return self.keep_unexported
        return own if isinstance(own, KeepUnexported) else None


def _partition_columns(value: Any) -> tuple[str, ...]:
    return partitioning.parse(value)


def parse_partition_by(value: Any, where: str) -> tuple[str, ...]:
    """`--partition-by` or `export.partition_by`: columns among PARTITION_COLUMNS, or Iceberg's partition transforms
    (`tank_log.lakehouse.partitioning`).

    Raises:
        JobConfigError: an unknown column (or not a list of them), naming `where`.
    """
    try:
        return _partition_columns(value)
    except ValueError as err:
        raise JobConfigError(f"{where}: {err}") from None


def _source(value: Any) -> Any:
    if value is not None and (not isinstance(value, str) or not SOURCE_PATTERN.fullmatch(value)):
        raise ValueError(
            f"{value!r}: a source is 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return value


def _schema_ids(value: Any) -> Any:
    """`{id: file}` of the Confluent wire format: ids as integers (YAML may read them as strings)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"expected a mapping of schema id to schema file, got {type(value).__name__}")
    try:
        return {int(k): v for k, v in value.items()}
    except ValueError:
        raise ValueError("schema ids are integers") from None


class TopicValues(Section):
    """`export.topics.<topic>`: how one topic's values and keys decode (docs/guides/typed-tables.md); null =
    inherit."""

    value_format: ValueFormat | None = Field(default=None, description="binary | utf8 | json | avro | protobuf")
    value_schema_file: Text | None = Field(default=None, description=".avsc | .desc or .proto | JSON Schema .json")
    value_message: Text | None = Field(default=None, description="protobuf: the full message name")
    value_schema_ids: Annotated[dict[int, str], BeforeValidator(_schema_ids)] | None = Field(
        default=None, description="Confluent wire format: schema id -> schema file"
    )
    value_registry_url: Text | None = Field(default=None, description="a Confluent Schema Registry's REST API")
    value_wire: Wire | None = Field(default=None, description="auto | confluent | plain")
    key_format: ValueFormat | None = Field(default=None, description="binary | utf8 | json | avro | protobuf")
    key_schema_file: Text | None = Field(default=None, description="the keys' schema file")
    key_message: Text | None = Field(default=None, description="protobuf keys: the full message name")
    key_schema_ids: Annotated[dict[int, str], BeforeValidator(_schema_ids)] | None = Field(
        default=None, description="keys in the Confluent wire format: schema id -> schema file"
    )
    key_wire: Wire | None = Field(default=None, description="the keys' header: auto | confluent | plain")


class ExportConfig(Section):
    """`export` (flags of jobs/export_delta.py override it)."""

    table: Text | None = Field(default=None, description="the table's path or URI (s3://, gs://, az://, file://)")
    format: TableFormatName = Field(default="delta", description="delta | iceberg (pyiceberg, a SQL catalog)")
    catalog: CatalogSetting = Field(
        default=None,
        repr=False,
        description="format iceberg: a SQL catalog's SQLAlchemy URI (default: a SQLite file beside a local table), or "
        "a REST catalog {type: rest, uri, warehouse, token | credential}, whose tables export.table names "
        "(namespace.table)",
    )
    engine: Engine = Field(
        default="deltalake", description="deltalake (delta-rs) | spark (delta-spark, needs Delta's jars)"
    )
    value_format: ValueFormat = Field(default="binary", description="binary | utf8 | json (decoded by value_schema)")
    value_schema: str | None = Field(
        default=None, description="DDL, with value_format json, e.g. 'id long, name string'"
    )
    value_schema_file: Text | None = Field(default=None, description=".avsc | .desc or .proto | JSON Schema .json")
    value_message: Text | None = Field(default=None, description="protobuf: the full message name")
    value_schema_ids: Annotated[dict[int, str], BeforeValidator(_schema_ids)] = Field(
        default_factory=dict, description="Confluent wire format: schema id -> schema file (the format's)"
    )
    value_registry_url: Text | None = Field(default=None, description="a Confluent Schema Registry's REST API")
    value_wire: Wire = Field(
        default="auto", description="auto (the Confluent header when present) | confluent (always) | plain (never)"
    )
    key_format: ValueFormat = Field(
        default="binary", description="binary | utf8 | json | avro | protobuf: the `key` column (a string or struct)"
    )
    key_schema_file: Text | None = Field(default=None, description="the keys' .avsc | .desc or .proto | JSON Schema")
    key_message: Text | None = Field(default=None, description="protobuf keys: the full message name")
    key_schema_ids: Annotated[dict[int, str], BeforeValidator(_schema_ids)] = Field(
        default_factory=dict, description="keys in the Confluent wire format: schema id -> schema file"
    )
    key_wire: Wire = Field(default="auto", description="the keys' header: auto | confluent | plain")
    topics: Annotated[dict[str, TopicValues], BeforeValidator(keyed_by_name)] = Field(default_factory=dict)
    on_bad_record: OnBadRecord = Field(
        default="dead_letter", description="a value that does not decode: fail | dead_letter | skip"
    )
    dead_letter_table: Text | None = Field(
        default=None, description="where dead letters go (default: the table's path or name + _dead_letters)"
    )
    partition_by: Annotated[tuple[str, ...], BeforeValidator(_partition_columns)] = Field(
        default=("topic", "date"),
        description="table partition columns (topic, partition, date: the UTC date of ts) or Iceberg transforms "
        "(identity(COL), hour(ts), day(ts), month(ts), bucket(N, COL))",
    )
    target_file_size: Size = Field(default=128 << 20, description="Parquet files of about this size")
    on_corruption: OnCorruption = Field(
        default="prefix", description="a partition with malformed data: export what precedes it | skip it"
    )
    storage_options: StringMap = Field(default_factory=dict, repr=False, description="delta-rs names; may hold secrets")
    orphan_horizon_ms: Millis = Field(
        default=12 * 3600 * 1000,
        alias="orphan_horizon",
        description="files of runs that died before their commit, older",
    )
    # An export of at most this many new segment bytes runs in the driver, without Spark (0: always on executors).
    # Below ~400 MB of segment data the driver alone is faster than Spark's start plus any number of cores; 128 MiB
    # leaves room for data that compresses well (bench/RESULTS.md, "Export to Delta, and the way back").
    in_driver_max_bytes: Size = Field(
        default=128 << 20, description="an export this small runs in the driver (0: never)"
    )
    mode: ExportMode = Field(
        default="append",
        description="append: every message | latest: one row per live key (docs/guides/export-latest.md)",
    )
    source: Annotated[str | None, BeforeValidator(_source)] = Field(
        default=None,
        description="the broker the data dirs are on, in every recorded version and the `source` column (null: the "
        "host name; replicas of one partition: the same source, docs/guides/export.md)",
    )

    @field_validator("orphan_horizon_ms")
    @classmethod
    def _horizon(cls, ms: int) -> int:
        if not ms:
            raise ValueError("must be more than 0 (it protects runs in flight)")
        return ms

    @model_validator(mode="after")
    def _json_needs_schema(self) -> ExportConfig:
        if self.value_schema is not None and (self.value_format != "json" or self.value_schema_file is not None):
            raise ValueError("value_schema (DDL) goes with value_format json, without value_schema_file")
        if self.value_format == "json" and self.value_schema is None and self.value_schema_file is None:
            raise ValueError("value_format json needs value_schema (DDL) or value_schema_file (a JSON Schema)")
        if self.catalog is not None and self.format != "iceberg":
            raise ValueError("catalog goes with format iceberg")
        return self


def parse_ready_check(value: Any) -> tuple[str, int]:
    """`tcp://HOST:PORT` → (HOST, PORT).

    Raises:
        ValueError: not of that form.
    """
    host, sep, port = value[len("tcp://") :].rpartition(":") if isinstance(value, str) else ("", "", "")
    if not (isinstance(value, str) and value.startswith("tcp://") and sep and host and port.isdigit()):
        raise ValueError(f"expected tcp://HOST:PORT (the broker's listening address), got {value!r}")
    if not 0 < int(port) < 65536:
        raise ValueError(f"port {port} out of range")
    return host.strip("[]"), int(port)


def _ready_check(value: Any) -> str:
    parse_ready_check(value)
    return str(value)


class BrokerHost(Section):
    """`brokers[]`: one broker of the maintenance window: where its data is, how to stop and start it, how to tell
    it serves."""

    name: Text = Field(description="the broker's name (unique)")
    data_dirs: Paths = Field(description="its base paths")
    stop_command: Text = Field(description="e.g. systemctl stop tank")
    start_command: Text = Field(description="must return once the broker is launched, e.g. systemctl start tank")
    ready_check: Annotated[str, BeforeValidator(_ready_check)] = Field(description="tcp://HOST:PORT")
    stop_timeout_s: Seconds = Field(
        default=300, alias="stop_timeout", description="until nothing holds data_dirs; else fail, the broker left alone"
    )
    ready_timeout_s: Seconds = Field(default=300, alias="ready_timeout", description="until ready_check accepts")
    queue: Text | None = Field(default=None, description="the Airflow queue of a worker on that host (null: default)")
    job_config: Text | None = Field(
        default=None, description="the configuration of its maintain job, when not the window's (e.g. its topics)"
    )

    @field_validator("data_dirs")
    @classmethod
    def _some(cls, dirs: tuple[str, ...]) -> tuple[str, ...]:
        if not dirs:
            raise ValueError("expected a list of paths")
        return dirs

    @property
    def ready_address(self) -> tuple[str, int]:
        """(host, port) of `ready_check`."""
        return parse_ready_check(self.ready_check)


class WindowSettings(Section):
    """`maintenance_window` (the Airflow DAG tank_maintenance_window)."""

    rolling: Flag = Field(default=False, description="one host (Airflow queue) at a time; stop at the first failure")
    spark_master: Text = Field(default="local[*]", description="the per-host maintenance job's master")


def _broker_list(value: Any) -> Any:
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise ValueError("expected a list of brokers (name, data_dirs, stop_command, ...)")
    return value


class JobConfig(Section):
    """The job configuration file."""

    data_dirs: Paths = Field(default=(), description="broker base paths (--data-dir overrides)")
    broker_stopped: Flag = Field(default=False, description="mutations need the broker stopped (docs/FORMAT.md §9)")
    live_window_s: Seconds = Field(
        default=300, alias="live_window", description="a partition changed this recently looks live"
    )
    # A partition job (compact, retention, rebuild_indexes, maintain) whose partitions hold at most this many bytes of
    # segment data runs in the driver's processes, without Spark (0: always on executors). Spark's start, first job
    # and stop cost 5-7 s; one core compacts ~200 MB/s, so below ~1 GB the driver's cores beat any cluster
    # (bench/RESULTS.md, "Spark's fixed costs"). The import reads it as the size of its table's files (in the driver's
    # threads). The export has its own, `export.in_driver_max_bytes`.
    in_driver_max_bytes: Size = Field(
        default=1 << 30, description="partition jobs reading at most this run in the driver's processes (0: never)"
    )
    metrics_file: Text | None = Field(
        default=None, description="every run's Prometheus metrics (node_exporter textfile)"
    )
    spark: SparkSettings = Field(default=SparkSettings())
    compaction: CompactionSettings = Field(default=CompactionSettings())
    retention: RetentionSettings = Field(default=RetentionSettings())
    export: ExportConfig = Field(default=ExportConfig())
    window: WindowSettings = Field(default=WindowSettings(), alias="maintenance_window")
    brokers: Annotated[tuple[BrokerHost, ...], BeforeValidator(_broker_list)] = ()

    @field_validator("brokers")
    @classmethod
    def _distinct(cls, brokers: tuple[BrokerHost, ...]) -> tuple[BrokerHost, ...]:
        names = [b.name for b in brokers]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"name(s) given twice: {', '.join(repeated)}")
        dirs = [(b.queue, os.path.normpath(d)) for b in brokers for d in b.data_dirs]  # a queue = a host's worker
        shared = sorted({d for q, d in dirs if dirs.count((q, d)) > 1})
        if shared:
            raise ValueError(f"data dir(s) of two brokers on one queue (host): {', '.join(shared)}")
        return brokers
