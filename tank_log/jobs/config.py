"""The jobs' configuration file (YAML) and command line, validated at load.

One format for every job; durations and sizes use the broker's grammar (docs/FORMAT.md §1.5: `7days`, `1h+30min`,
`64kb`, `1gb`). Unknown keys and bad values are errors naming the key. Command-line flags override the file.

    data_dirs: [/var/lib/tank]          # one or several broker base paths
    broker_stopped: false               # mutations need the broker stopped (docs/FORMAT.md §9)
    live_window: 5min                   # a partition changed this recently looks live and is refused
    in_driver_max_bytes: 1gb            # compact/retention/rebuild/maintain reading at most this: no Spark (0: never)
    metrics_file: null                  # Prometheus metrics of every run (node_exporter textfile), e.g. x.prom
    spark:
      master: local[2]                  # used when not given by spark-submit
      app_name: tank-log
      conf: {spark.sql.shuffle.partitions: "8"}
    compaction:
      force: false
      min_compaction_lag: 0
      tombstone_retention: null         # null = keep tombstones forever (the broker's rule)
      drop_keyless: false
      bundle_messages: 100
      bundle_bytes: 64kb
      snappy: when_smaller              # when_smaller | client | always | never
      segment_bytes: null               # null = each topic's log.segment.bytes
      min_cleanable_ratio: null         # null = each topic's log.cleaner.min.cleanable.ratio
      key_state_budget: 256mb           # memory for a partition's keys; more keys compact in rounds
      topics:                           # per-topic overrides; `policy: cleanup` compacts a `delete` topic
        orders: {policy: cleanup, tombstone_retention: 7days}
    retention:
      time_basis: name                  # name (the broker's rule: name ts) | message (newest message ts)
      include_cleanup_topics: false     # the broker applies no retention to cleanup topics
      keep_unexported:                  # never delete what this Delta table has not received (off when absent)
        table: export                   # a path or URI, or `export`: export.table with export.storage_options
        storage_options: {}             # for a table other than the export's
        max_holdback_size: 50gb         # past either bound: delete anyway, report data-loss, exit 1 (0: no bound)
        max_holdback_age: 3days         # how far past its retention the oldest held-back segment may get
      topics:                           # per-topic overrides of the broker config (a topic TTL)
        clicks: {max_age: 3days, max_bytes: 10gb, segments_count: 50, time_basis: message, enabled: true}
        audit: {keep_unexported: false} # or a keep_unexported mapping of its own
    export:                             # jobs/export_delta.py (flags override)
      table: /lake/tank/events          # Delta table path or URI
      engine: deltalake                 # deltalake (delta-rs) | spark (delta-spark, needs Delta's jars)
      value_format: json                # binary | utf8 | json
      value_schema: "id long, name string"
      partition_by: [topic, date]       # from topic, partition, date (UTC date of ts)
      target_file_size: 128mb
      on_corruption: prefix             # a partition with malformed data: export what precedes it | skip it
      storage_options:                  # object stores, as delta-rs names them (the environment fills the rest)
        AWS_ENDPOINT_URL: http://127.0.0.1:9000
      orphan_horizon: 12h               # files of runs that died before their commit, older than this, are removed
    maintenance_window:                 # airflow DAG tank_maintenance_window (see brokers)
      rolling: false                    # true: one host (Airflow queue) at a time; stop at the first failure
      spark_master: local[*]            # the per-host maintenance job's master
    brokers:                            # the broker hosts the window stops, maintains and starts
      - name: broker-a
        data_dirs: [/srv/tank]
        stop_command: systemctl stop tank
        start_command: systemctl start tank
        ready_check: tcp://127.0.0.1:11011   # serving again = this port accepts connections
        stop_timeout: 5min              # until nothing holds data_dirs; else fail and leave the broker alone
        ready_timeout: 5min
        queue: tank-host-a              # the Airflow (Celery) queue whose worker runs on that host
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from typing import Any

import yaml

from tank_log.errors import JobConfigError
from tank_log.format.broker_config import parse_duration, parse_size
from tank_log.format.bundle import SnappyPolicy
from tank_log.maintenance.compaction.options import DEFAULT_KEY_STATE_BUDGET
from tank_log.maintenance.retention import POLICIES as RETENTION_POLICIES


def _duration_ms(value: Any, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value * 1000
    if isinstance(value, str):
        try:
            return parse_duration(value) * 1000
        except ValueError as err:
            raise JobConfigError(f"{where}: {err} (broker duration units: 30s, 15min, 2h, 7days, 1week)") from None
    raise JobConfigError(f"{where}: expected a duration such as 7days, got {value!r}")


def _size(value: Any, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        try:
            return parse_size(value)
        except ValueError as err:
            raise JobConfigError(f"{where}: {err} (broker size units: 512b, 64kb, 256mb, 1gb)") from None
    raise JobConfigError(f"{where}: expected a size such as 64kb, got {value!r}")


def _bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    raise JobConfigError(f"{where}: expected true or false, got {value!r}")


def _int(value: Any, where: str, lo: int = 0) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= lo:
        return value
    raise JobConfigError(f"{where}: expected an integer >= {lo}, got {value!r}")


def _ratio(value: Any, where: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1:
        return float(value)
    raise JobConfigError(f"{where}: expected a number within [0, 1], got {value!r}")


def _choice(value: Any, where: str, choices: tuple[str, ...]) -> str:
    if isinstance(value, str) and value.lower() in choices:
        return value.lower()
    raise JobConfigError(f"{where}: expected one of {', '.join(choices)}, got {value!r}")


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise JobConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def _check_keys(section: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(section) - allowed)
    if unknown:
        raise JobConfigError(
            f"{where}: unknown key(s) {', '.join(map(str, unknown))} (allowed: {', '.join(sorted(allowed))})"
        )


@dataclass(frozen=True)
class TopicCompaction:
    """Per-topic compaction overrides; None = inherit."""

    policy: str | None = None  # cleanup (compact even if the topic's config says delete) | delete (never)
    tombstone_retention_ms: int | None = None
    drop_keyless: bool | None = None
    min_compaction_lag_ms: int | None = None
    min_cleanable_ratio: float | None = None


@dataclass(frozen=True)
class CompactionSettings:
    force: bool = False
    min_compaction_lag_ms: int = 0
    tombstone_retention_ms: int | None = None
    drop_keyless: bool = False
    bundle_messages: int = 100
    bundle_bytes: int = 64 << 10
    snappy: str = "when_smaller"
    segment_bytes: int | None = None
    min_cleanable_ratio: float | None = None
    key_state_budget: int = DEFAULT_KEY_STATE_BUDGET
    topics: dict[str, TopicCompaction] = field(default_factory=dict)


EXPORT_TABLE = "export"  # keep_unexported.table naming the export section's table (and its storage options)


@dataclass(frozen=True)
class KeepUnexported:
    """Retention keeps what this Delta table has not received (the export's app transactions), within the bounds."""

    table: str  # a path or URI, or EXPORT_TABLE
    storage_options: dict[str, str] = field(default_factory=dict, repr=False)
    max_holdback_bytes: int = 0  # bytes held back past the limits, at most (0: no bound)
    max_holdback_s: int = 0  # how far past its retention the oldest held-back segment may get (0: no bound)


@dataclass(frozen=True)
class TopicRetention:
    """Per-topic retention overrides (a messaging system's topic TTL); None = the topic's broker config."""

    enabled: bool | None = None  # true: enforce even on a cleanup topic; false: never
    limits: dict[str, Any] = field(default_factory=dict)  # RetentionRules field → value (retention POLICIES)
    time_basis: str | None = None
    keep_unexported: KeepUnexported | bool | None = None  # None: the global setting; False: off for the topic


@dataclass(frozen=True)
class RetentionSettings:
    time_basis: str = "name"  # name (the broker's rule) | message (Kafka's rule)
    include_cleanup_topics: bool = False  # the broker applies no retention to cleanup topics
    keep_unexported: KeepUnexported | None = None  # the lakehouse guard (off when None)
    topics: dict[str, TopicRetention] = field(default_factory=dict)

    def guard_of(self, topic: str) -> KeepUnexported | None:
        """The lakehouse guard of one topic: its own, else the global one; None when off."""
        own = self.topics[topic].keep_unexported if topic in self.topics else None
        if own is None:
            return self.keep_unexported
        return own if isinstance(own, KeepUnexported) else None


@dataclass(frozen=True)
class ExportConfig:
    """The `export` section (flags of jobs/export_delta.py override it)."""

    table: str | None = None
    engine: str = "deltalake"  # deltalake | spark
    value_format: str = "binary"  # binary | utf8 | json
    value_schema: str | None = None  # DDL, with value_format json
    partition_by: tuple[str, ...] = ("topic", "date")
    target_file_size: int = 128 << 20
    on_corruption: str = "prefix"  # prefix | skip: what a partition with malformed data exports
    storage_options: dict[str, str] = field(default_factory=dict, repr=False)  # delta-rs names; may hold secrets
    orphan_horizon_ms: int = 12 * 3600 * 1000  # files of runs that never committed, older than this, are removed
    # An export of at most this many new segment bytes runs in the driver, without Spark (0: always on executors).
    # Below ~400 MB of segment data the driver alone is faster than Spark's start plus any number of cores; 128 MiB
    # leaves room for data that compresses well (bench/RESULTS.md, "Small exports in the driver by default").
    in_driver_max_bytes: int = 128 << 20


@dataclass(frozen=True)
class SparkSettings:
    master: str | None = None
    app_name: str = "tank-log"
    conf: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class BrokerHost:
    """One broker of the maintenance window: where its data is, how to stop and start it, how to tell it serves."""

    name: str
    data_dirs: tuple[str, ...]
    stop_command: str
    start_command: str
    ready_check: str  # tcp://HOST:PORT
    stop_timeout_s: int = 300
    ready_timeout_s: int = 300
    queue: str | None = None  # the Airflow queue of a worker on that host; None = the default queue

    @property
    def ready_address(self) -> tuple[str, int]:
        """(host, port) of `ready_check`."""
        return parse_ready_check(self.ready_check, "ready_check")


@dataclass(frozen=True)
class WindowSettings:
    rolling: bool = False
    spark_master: str = "local[*]"


@dataclass(frozen=True)
class JobConfig:
    data_dirs: tuple[str, ...] = ()
    broker_stopped: bool = False
    live_window_s: int = 300
    # A partition job (compact, retention, rebuild_indexes, maintain) whose partitions hold at most this many bytes of
    # segment data runs in the driver's processes, without Spark (0: always on executors). Spark's start, first job
    # and stop cost 5-7 s; one core compacts ~200 MB/s, so below ~1 GB the driver's cores beat any cluster
    # (bench/RESULTS.md, "Small partition runs in the driver's processes"). The export has its own,
    # `export.in_driver_max_bytes`.
    in_driver_max_bytes: int = 1 << 30
    metrics_file: str | None = None  # every run's Prometheus metrics (tank_log/metrics.py)
    spark: SparkSettings = SparkSettings()
    compaction: CompactionSettings = CompactionSettings()
    retention: RetentionSettings = RetentionSettings()
    export: ExportConfig = ExportConfig()
    window: WindowSettings = WindowSettings()
    brokers: tuple[BrokerHost, ...] = ()
    raw: dict[str, Any] = field(default_factory=dict, compare=False)  # sections other jobs read (validated by them)


_TOPIC_COMPACTION_KEYS = {"policy", "tombstone_retention", "drop_keyless", "min_compaction_lag", "min_cleanable_ratio"}


def _topic_compaction(value: Any, where: str) -> TopicCompaction:
    v = _mapping(value, where)
    _check_keys(v, _TOPIC_COMPACTION_KEYS, where)
    return TopicCompaction(
        policy=_choice(v["policy"], f"{where}.policy", ("cleanup", "delete")) if "policy" in v else None,
        tombstone_retention_ms=None
        if v.get("tombstone_retention") is None
        else _duration_ms(v["tombstone_retention"], f"{where}.tombstone_retention"),
        drop_keyless=_bool(v["drop_keyless"], f"{where}.drop_keyless") if "drop_keyless" in v else None,
        min_compaction_lag_ms=_duration_ms(v["min_compaction_lag"], f"{where}.min_compaction_lag")
        if "min_compaction_lag" in v
        else None,
        min_cleanable_ratio=_ratio(v["min_cleanable_ratio"], f"{where}.min_cleanable_ratio")
        if "min_cleanable_ratio" in v
        else None,
    )


def _compaction(value: Any) -> CompactionSettings:
    w = "compaction"
    v = _mapping(value, w)
    _check_keys(
        v,
        {f.name for f in fields(CompactionSettings)} - {"min_compaction_lag_ms", "tombstone_retention_ms"}
        | {"min_compaction_lag", "tombstone_retention"},
        w,
    )
    s = CompactionSettings()
    kw: dict[str, Any] = {}
    if "force" in v:
        kw["force"] = _bool(v["force"], f"{w}.force")
    if "min_compaction_lag" in v:
        kw["min_compaction_lag_ms"] = _duration_ms(v["min_compaction_lag"], f"{w}.min_compaction_lag")
    if v.get("tombstone_retention") is not None:
        kw["tombstone_retention_ms"] = _duration_ms(v["tombstone_retention"], f"{w}.tombstone_retention")
    if "drop_keyless" in v:
        kw["drop_keyless"] = _bool(v["drop_keyless"], f"{w}.drop_keyless")
    if "bundle_messages" in v:
        kw["bundle_messages"] = _int(v["bundle_messages"], f"{w}.bundle_messages", 1)
    if "bundle_bytes" in v:
        kw["bundle_bytes"] = _size(v["bundle_bytes"], f"{w}.bundle_bytes")
    if "snappy" in v:
        kw["snappy"] = _choice(v["snappy"], f"{w}.snappy", tuple(p.value for p in SnappyPolicy))
    if v.get("segment_bytes") is not None:
        n = _size(v["segment_bytes"], f"{w}.segment_bytes")
        if not 64 <= n < 1 << 32:
            raise JobConfigError(f"{w}.segment_bytes: must be within 64 bytes and 4 GiB (docs/FORMAT.md §8)")
        kw["segment_bytes"] = n
    if v.get("min_cleanable_ratio") is not None:
        kw["min_cleanable_ratio"] = _ratio(v["min_cleanable_ratio"], f"{w}.min_cleanable_ratio")
    if "key_state_budget" in v:
        kw["key_state_budget"] = _size(v["key_state_budget"], f"{w}.key_state_budget")
    topics = _mapping(v.get("topics"), f"{w}.topics")
    kw["topics"] = {str(t): _topic_compaction(o, f"{w}.topics.{t}") for t, o in topics.items()}
    return replace(s, **kw)


def _limit(unit: str, value: Any, where: str) -> int:
    """A retention limit in the job config, by the unit of its policy."""
    if unit == "duration":
        return _duration_ms(value, where) // 1000
    if unit == "size":
        return _size(value, where)
    count = _int(value, where)
    if count == 1:
        raise JobConfigError(f"{where}: must be 0 or >= 2 (the broker's rule)")
    return count


def _keep_unexported(value: Any, where: str) -> KeepUnexported:
    if isinstance(value, str):
        value = {"table": value}
    v = _mapping(value, where)
    _check_keys(v, {"table", "storage_options", "max_holdback_size", "max_holdback_age"}, where)
    if not isinstance(v.get("table"), str) or not v["table"]:
        raise JobConfigError(f"{where}.table: expected a Delta table path or URI, or `{EXPORT_TABLE}`")
    opts = _mapping(v.get("storage_options"), f"{where}.storage_options")
    return KeepUnexported(
        table=v["table"],
        storage_options={str(k): str(x) for k, x in opts.items()},
        max_holdback_bytes=_size(v.get("max_holdback_size", 0), f"{where}.max_holdback_size"),
        max_holdback_s=_duration_ms(v.get("max_holdback_age", 0), f"{where}.max_holdback_age") // 1000,
    )


def _topic_retention(value: Any, where: str) -> TopicRetention:
    v = _mapping(value, where)
    _check_keys(v, {"enabled", "time_basis", "keep_unexported"} | {p.config_key for p in RETENTION_POLICIES}, where)
    keep: KeepUnexported | bool | None = None
    if v.get("keep_unexported") is False:
        keep = False
    elif v.get("keep_unexported") is not None:
        keep = _keep_unexported(v["keep_unexported"], f"{where}.keep_unexported")
    return TopicRetention(
        keep_unexported=keep,
        enabled=_bool(v["enabled"], f"{where}.enabled") if "enabled" in v else None,
        limits={
            p.name: _limit(p.unit, v[p.config_key], f"{where}.{p.config_key}")
            for p in RETENTION_POLICIES
            if p.config_key in v
        },
        time_basis=_choice(v["time_basis"], f"{where}.time_basis", TIME_BASES) if "time_basis" in v else None,
    )


TIME_BASES = ("name", "message")


def _retention(value: Any) -> RetentionSettings:
    w = "retention"
    v = _mapping(value, w)
    _check_keys(v, {"time_basis", "include_cleanup_topics", "keep_unexported", "topics"}, w)
    topics = _mapping(v.get("topics"), f"{w}.topics")
    keep = v.get("keep_unexported")
    return RetentionSettings(
        keep_unexported=None if keep is None else _keep_unexported(keep, f"{w}.keep_unexported"),
        time_basis=_choice(v.get("time_basis", "name"), f"{w}.time_basis", TIME_BASES),
        include_cleanup_topics=_bool(v.get("include_cleanup_topics", False), f"{w}.include_cleanup_topics"),
        topics={str(t): _topic_retention(o, f"{w}.topics.{t}") for t, o in topics.items()},
    )


PARTITION_COLUMNS = ("topic", "partition", "date")


def parse_partition_by(value: Any, where: str) -> tuple[str, ...]:
    """Raises:
    JobConfigError: an unknown or repeated column.
    """
    cols = value.split(",") if isinstance(value, str) else value
    if not isinstance(cols, list | tuple) or not all(isinstance(c, str) for c in cols):
        raise JobConfigError(f"{where}: expected a list of columns")
    cols = tuple(c.strip() for c in cols if c.strip())
    bad = [c for c in cols if c not in PARTITION_COLUMNS]
    if bad:
        raise JobConfigError(f"{where}: {', '.join(bad)} (choose from {', '.join(PARTITION_COLUMNS)})")
    return cols


def _export(value: Any) -> ExportConfig:
    w = "export"
    v = _mapping(value, w)
    keys = {
        "table",
        "engine",
        "value_format",
        "value_schema",
        "partition_by",
        "target_file_size",
        "on_corruption",
        "storage_options",
        "orphan_horizon",
        "in_driver_max_bytes",
    }
    _check_keys(v, keys, w)
    kw: dict[str, Any] = {}
    if v.get("table") is not None:
        if not isinstance(v["table"], str) or not v["table"]:
            raise JobConfigError(f"{w}.table: expected a path or URI")
        kw["table"] = v["table"]
    if "engine" in v:
        kw["engine"] = _choice(v["engine"], f"{w}.engine", ("deltalake", "spark"))
    if "value_format" in v:
        kw["value_format"] = _choice(v["value_format"], f"{w}.value_format", ("binary", "utf8", "json"))
    if v.get("value_schema") is not None:
        if not isinstance(v["value_schema"], str):
            raise JobConfigError(f"{w}.value_schema: expected a DDL string such as 'id long, name string'")
        kw["value_schema"] = v["value_schema"]
    if "partition_by" in v:
        kw["partition_by"] = parse_partition_by(v["partition_by"], f"{w}.partition_by")
    if "target_file_size" in v:
        kw["target_file_size"] = _size(v["target_file_size"], f"{w}.target_file_size")
    if "on_corruption" in v:
        kw["on_corruption"] = _choice(v["on_corruption"], f"{w}.on_corruption", ("prefix", "skip"))
    if "storage_options" in v:
        opts = _mapping(v["storage_options"], f"{w}.storage_options")
        kw["storage_options"] = {str(k): str(x) for k, x in opts.items()}
    if "orphan_horizon" in v:
        kw["orphan_horizon_ms"] = _duration_ms(v["orphan_horizon"], f"{w}.orphan_horizon")
        if not kw["orphan_horizon_ms"]:
            raise JobConfigError(f"{w}.orphan_horizon: must be more than 0 (it protects runs in flight)")
    if "in_driver_max_bytes" in v:
        kw["in_driver_max_bytes"] = _size(v["in_driver_max_bytes"], f"{w}.in_driver_max_bytes")
    cfg = replace(ExportConfig(), **kw)
    if (cfg.value_format == "json") != (cfg.value_schema is not None):
        raise JobConfigError(f"{w}: value_schema goes with value_format json (and json needs it)")
    return cfg


def _spark(value: Any) -> SparkSettings:
    v = _mapping(value, "spark")
    _check_keys(v, {"master", "app_name", "conf"}, "spark")
    conf = _mapping(v.get("conf"), "spark.conf")
    return SparkSettings(
        master=None if v.get("master") is None else str(v["master"]),
        app_name=str(v.get("app_name", "tank-log")),
        conf={str(k): str(x) for k, x in conf.items()},
    )


def parse_ready_check(value: Any, where: str) -> tuple[str, int]:
    """`tcp://HOST:PORT` → (HOST, PORT).

    Raises:
        JobConfigError: not of that form.
    """
    host, sep, port = value[len("tcp://") :].rpartition(":") if isinstance(value, str) else ("", "", "")
    if not (isinstance(value, str) and value.startswith("tcp://") and sep and host and port.isdigit()):
        raise JobConfigError(f"{where}: expected tcp://HOST:PORT (the broker's listening address), got {value!r}")
    if not 0 < int(port) < 65536:
        raise JobConfigError(f"{where}: port {port} out of range")
    return host.strip("[]"), int(port)


def _text(value: Any, where: str) -> str:
    if isinstance(value, str) and value.strip():
        return value
    raise JobConfigError(f"{where}: expected a non-empty string, got {value!r}")


def _paths(value: Any, where: str, *, allow_empty: bool = False) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not (value or allow_empty) or not all(isinstance(d, str) and d for d in value):
        raise JobConfigError(f"{where}: expected a list of paths")
    return tuple(value)


_BROKER_KEYS = {
    "name",
    "data_dirs",
    "stop_command",
    "start_command",
    "ready_check",
    "stop_timeout",
    "ready_timeout",
    "queue",
}


def _broker(value: Any, where: str) -> BrokerHost:
    v = _mapping(value, where)
    _check_keys(v, _BROKER_KEYS, where)
    missing = sorted({"name", "data_dirs", "stop_command", "start_command", "ready_check"} - set(v))
    if missing:
        raise JobConfigError(f"{where}: missing {', '.join(missing)}")
    parse_ready_check(v["ready_check"], f"{where}.ready_check")
    return BrokerHost(
        name=_text(v["name"], f"{where}.name"),
        data_dirs=_paths(v["data_dirs"], f"{where}.data_dirs"),
        stop_command=_text(v["stop_command"], f"{where}.stop_command"),
        start_command=_text(v["start_command"], f"{where}.start_command"),
        ready_check=v["ready_check"],
        stop_timeout_s=_duration_ms(v.get("stop_timeout", 300), f"{where}.stop_timeout") // 1000,
        ready_timeout_s=_duration_ms(v.get("ready_timeout", 300), f"{where}.ready_timeout") // 1000,
        queue=None if v.get("queue") is None else _text(v["queue"], f"{where}.queue"),
    )


def _brokers(value: Any) -> tuple[BrokerHost, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise JobConfigError("brokers: expected a list of brokers (name, data_dirs, stop_command, ...)")
    brokers = tuple(_broker(b, f"brokers[{i}]") for i, b in enumerate(value))
    names = [b.name for b in brokers]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise JobConfigError(f"brokers: name(s) given twice: {', '.join(repeated)}")
    dirs = [(b.queue, os.path.normpath(d)) for b in brokers for d in b.data_dirs]  # a queue = a host's worker
    shared = sorted({d for q, d in dirs if dirs.count((q, d)) > 1})
    if shared:
        raise JobConfigError(f"brokers: data dir(s) of two brokers on one queue (host): {', '.join(shared)}")
    return brokers


def _window(value: Any) -> WindowSettings:
    w = "maintenance_window"
    v = _mapping(value, w)
    _check_keys(v, {"rolling", "spark_master"}, w)
    return WindowSettings(
        rolling=_bool(v.get("rolling", False), f"{w}.rolling"),
        spark_master=_text(v.get("spark_master", "local[*]"), f"{w}.spark_master"),
    )


TOP_LEVEL_KEYS = {
    "data_dirs",
    "broker_stopped",
    "live_window",
    "in_driver_max_bytes",
    "metrics_file",
    "spark",
    "compaction",
    "retention",
    "export",
    "maintenance_window",
    "brokers",
}


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's last key silently wins; a job config must not (a repeated section would hide the first)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        """Raises:
        JobConfigError: a key given twice in one mapping.
        """
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise JobConfigError(f"duplicate key {key!r} (line {key_node.start_mark.line + 1})")
            seen.add(key)
        return super().construct_mapping(node, deep)


def _optional_path(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise JobConfigError(f"{where}: expected a file path")
    return value


def parse_job_config(doc: Any, source: str = "config") -> JobConfig:
    """Validate a parsed YAML document.

    Raises:
        JobConfigError: an unknown key or a bad value, naming the key.
    """
    v = _mapping(doc, source)
    _check_keys(v, TOP_LEVEL_KEYS, source)
    return JobConfig(
        data_dirs=_paths(v.get("data_dirs", []), "data_dirs", allow_empty=True),
        broker_stopped=_bool(v.get("broker_stopped", False), "broker_stopped"),
        live_window_s=_duration_ms(v.get("live_window", 300), "live_window") // 1000,
        in_driver_max_bytes=_size(v.get("in_driver_max_bytes", 1 << 30), "in_driver_max_bytes"),
        metrics_file=_optional_path(v.get("metrics_file"), "metrics_file"),
        spark=_spark(v.get("spark")),
        compaction=_compaction(v.get("compaction")),
        retention=_retention(v.get("retention")),
        export=_export(v.get("export")),
        window=_window(v.get("maintenance_window")),
        brokers=_brokers(v.get("brokers")),
        raw=v,
    )


def load_job_config(path: str | os.PathLike[str] | None) -> JobConfig:
    """Read and validate a YAML job config; None = defaults. Relative paths in it (`data_dirs`, a local
    `export.table`) are relative to the config file's directory, so a config works from any working directory
    (an Airflow worker's is not the repository).

    Raises:
        JobConfigError: a missing file, invalid YAML, a repeated key, an unknown key or a bad value.
    """
    if path is None:
        return JobConfig()
    try:
        with open(path) as fh:
            doc = yaml.load(fh, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except FileNotFoundError:
        raise JobConfigError(f"config file not found: {path}") from None
    except yaml.YAMLError as err:
        raise JobConfigError(f"{path}: not valid YAML: {err}") from None
    except JobConfigError as err:
        raise JobConfigError(f"{path}: {err}") from None
    try:
        config = parse_job_config(doc or {}, os.fspath(path))
    except JobConfigError as err:
        raise JobConfigError(f"{path}: {err}") from None
    return relative_to(config, os.path.dirname(os.path.abspath(path)))


def relative_to(config: JobConfig, directory: str) -> JobConfig:
    """The config with its relative local paths resolved against `directory` (URIs and absolute paths kept)."""

    def resolve(p: str) -> str:
        return p if "://" in p else os.path.normpath(os.path.join(directory, os.path.expanduser(p)))

    export = config.export
    if export.table is not None:
        export = replace(export, table=resolve(export.table))
    brokers = tuple(replace(b, data_dirs=tuple(resolve(d) for d in b.data_dirs)) for b in config.brokers)

    def keep(k: Any) -> Any:
        return replace(k, table=resolve(k.table)) if isinstance(k, KeepUnexported) and k.table != EXPORT_TABLE else k

    retention = config.retention
    retention = replace(
        retention,
        keep_unexported=keep(retention.keep_unexported),
        topics={t: replace(o, keep_unexported=keep(o.keep_unexported)) for t, o in retention.topics.items()},
    )
    return replace(
        config,
        metrics_file=None if config.metrics_file is None else resolve(config.metrics_file),
        data_dirs=tuple(resolve(d) for d in config.data_dirs),
        export=export,
        brokers=brokers,
        retention=retention,
    )


def parse_duration_ms(value: str, where: str) -> int:
    """A command-line duration in the broker's grammar, in ms."""
    return _duration_ms(value, where)


def parse_size_arg(value: str, where: str) -> int:
    """A command-line size in the broker's grammar, in bytes."""
    return _size(value, where)
