"""The jobs' configuration file (YAML), validated at load by pydantic models (`models.py`; the value types in the
broker's units in `units.py`; reading, errors and relative paths in `loading.py`).

One format for every job; durations and sizes use the broker's grammar (docs/FORMAT.md §1.5: `7days`, `1h+30min`,
`64kb`, `1gb`). Unknown keys and bad values are errors naming the key path. Command-line flags override the file.
`tank-log config schema` prints the JSON Schema. Every key, with its default:

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
      key_state_budget: 256mb           # memory for a partition's keys; more keys spill to disk
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
      table: /lake/tank/events          # the table's path or URI
      format: delta                     # delta | iceberg (pyiceberg, a SQL catalog)
      catalog: null                     # iceberg: SQLAlchemy URI (default: SQLite beside the table), {type: rest, uri}
      engine: deltalake                 # deltalake (delta-rs) | spark (delta-spark, needs Delta's jars)
      value_format: json                # binary | utf8 | json
      value_schema: "id long, name string"
      partition_by: [topic, date]       # topic, partition, date (UTC date of ts); Iceberg also day(ts), bucket(N, key)
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

from tank_log.jobs.config.loading import json_schema as json_schema
from tank_log.jobs.config.loading import load_job_config as load_job_config
from tank_log.jobs.config.loading import parse_job_config as parse_job_config
from tank_log.jobs.config.loading import relative_to as relative_to
from tank_log.jobs.config.models import EXPORT_TABLE as EXPORT_TABLE
from tank_log.jobs.config.models import PARTITION_COLUMNS as PARTITION_COLUMNS
from tank_log.jobs.config.models import BrokerHost as BrokerHost
from tank_log.jobs.config.models import CompactionSettings as CompactionSettings
from tank_log.jobs.config.models import ExportConfig as ExportConfig
from tank_log.jobs.config.models import JobConfig as JobConfig
from tank_log.jobs.config.models import KeepUnexported as KeepUnexported
from tank_log.jobs.config.models import RetentionSettings as RetentionSettings
from tank_log.jobs.config.models import SparkSettings as SparkSettings
from tank_log.jobs.config.models import TopicCompaction as TopicCompaction
from tank_log.jobs.config.models import TopicRetention as TopicRetention
from tank_log.jobs.config.models import WindowSettings as WindowSettings
from tank_log.jobs.config.models import parse_partition_by as parse_partition_by
from tank_log.jobs.config.models import parse_ready_check as parse_ready_check
from tank_log.jobs.config.units import parse_duration_ms as parse_duration_ms
from tank_log.jobs.config.units import parse_size_arg as parse_size_arg

TOP_LEVEL_KEYS = frozenset(f.alias or n for n, f in JobConfig.model_fields.items())
