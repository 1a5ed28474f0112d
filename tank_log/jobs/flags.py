"""The command-line flags that `tank-log` and the jobs share, each declared once: the safety flags of the mutating
commands, compaction's rules beyond the broker's, and retention's lakehouse guard (`retention.keep_unexported`).
Light to import: every `tank-log` command builds its parser."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tank_log.jobs.config import JobConfig


def add_broker_stopped(p: argparse.ArgumentParser) -> None:
    """`--broker-stopped`: the operator says the broker is stopped; it is still checked (§9 rule 1)."""
    p.add_argument(
        "--broker-stopped",
        action="store_true",
        help="the broker is stopped (required to mutate partitions that changed recently, docs/FORMAT.md §9; "
        "still checked)",
    )


def add_dead_letter_table(p: argparse.ArgumentParser) -> None:
    """`--dead-letter-table`: where the export puts the values that do not decode, and where the audit finds them."""
    p.add_argument(
        "--dead-letter-table",
        metavar="TABLE",
        help="the table of values that did not decode (default: export.dead_letter_table in --config, else the "
        "table's path or name + _dead_letters, in the table's format)",
    )


def add_force(p: argparse.ArgumentParser) -> None:
    """`--force`: compact whatever the dirty ratio."""
    p.add_argument("--force", action="store_true", help="compact even when the dirty ratio is below the threshold")


def add_salvage(p: argparse.ArgumentParser) -> None:
    """`--salvage`: cut torn tails of RO segments."""
    p.add_argument(
        "--salvage",
        action="store_true",
        help="cut torn tails after the last complete bundle (cut bytes kept in a .-prefixed side file)",
    )


def add_compaction_rules(p: argparse.ArgumentParser) -> None:
    """Compaction's rules beyond the broker's: `--tombstone-retention`, `--drop-keyless`."""
    p.add_argument(
        "--tombstone-retention",
        metavar="DURATION",
        help="drop tombstones older than this (by message ts), e.g. 7days — beyond the broker's rules",
    )
    p.add_argument("--drop-keyless", action="store_true", help="drop keyless messages (Kafka's behaviour)")


def add_time_basis(p: argparse.ArgumentParser) -> None:
    """`--time-basis`: which timestamp retention ages segments by."""
    p.add_argument(
        "--time-basis",
        choices=("name", "message"),
        help="retention ages from the name's ts (the broker's rule) or the newest message ts (Kafka's rule)",
    )


def add_storage_option(p: argparse.ArgumentParser, table_flag: str) -> None:
    """`--storage-option KEY=VALUE` (repeatable) for the object store of the table named by `table_flag`."""
    p.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"an object-store option of the {table_flag} table as delta-rs names it (repeatable; over the config's "
        "storage_options), e.g. AWS_ENDPOINT_URL=http://127.0.0.1:9000; credentials are better left to the environment",
    )


def add_table_format(p: argparse.ArgumentParser) -> None:
    """`--format` and `--catalog`: the table's format (`tank_log.lakehouse.FORMATS`) and Iceberg's SQL catalog (over
    `export.format` and `export.catalog`)."""
    from tank_log.lakehouse.location import FORMATS

    p.add_argument("--format", choices=sorted(FORMATS), help="the table's format: delta (default) or iceberg")
    p.add_argument(
        "--catalog",
        metavar="URI",
        help="with --format iceberg: a REST catalog's http(s):// URI (--table is then its name, namespace.table; "
        "warehouse and credentials from TANK_LOG_CATALOG_WAREHOUSE, TANK_LOG_CATALOG_TOKEN or "
        "TANK_LOG_CATALOG_CREDENTIAL), or a SQL catalog's SQLAlchemy URI (default: a SQLite file beside a local "
        "table; required for a table on object storage)",
    )


def add_metrics_file(p: argparse.ArgumentParser, default: str = "") -> None:
    """`--metrics-file FILE.prom`: the run's Prometheus metrics, written atomically."""
    p.add_argument(
        "--metrics-file",
        metavar="FILE.prom",
        help="also write Prometheus metrics here, atomically (node_exporter's textfile collector)" + default,
    )


def add_source(p: argparse.ArgumentParser) -> None:
    """`--source NAME`: the broker whose partitions a run exports or guards (over `export.source`)."""
    p.add_argument(
        "--source",
        metavar="NAME",
        help="the broker these data dirs are on, part of every recorded version and the table's `source` column "
        "(default: export.source, else this host's name; replicas of one partition: give them the same source)",
    )


def add_keep_unexported(p: argparse.ArgumentParser) -> None:
    """The lakehouse guard of retention (over `retention.keep_unexported`)."""
    p.add_argument(
        "--keep-unexported",
        metavar="TABLE",
        help="never delete what this Delta table (a path or URI, or `export`: export.table) has not received",
    )
    add_storage_option(p, "--keep-unexported")
    add_source(p)
    p.add_argument("--max-holdback-size", metavar="SIZE", help="past this many bytes held back: delete (data-loss)")
    p.add_argument(
        "--max-holdback-age", metavar="DURATION", help="past this much beyond its retention: delete (data-loss)"
    )


def apply_guard_flags(config: JobConfig, args: argparse.Namespace) -> JobConfig:
    """`--keep-unexported TABLE` (or `export`), `--storage-option`, `--max-holdback-size`, `--max-holdback-age`
    (`add_keep_unexported`) over the config."""
    from tank_log.errors import JobConfigError
    from tank_log.jobs.config import KeepUnexported, parse_duration_ms, parse_size_arg
    from tank_log.lakehouse import storage_options

    table, max_size, max_age = args.keep_unexported, args.max_holdback_size, args.max_holdback_age
    keep = config.retention.keep_unexported
    if table:
        keep = keep.model_copy(update={"table": table}) if keep else KeepUnexported(table=table)
    if keep is not None and args.storage_option:
        keep = keep.model_copy(update={"storage_options": storage_options(keep.storage_options, args.storage_option)})
    if (max_size or max_age) and keep is None:
        raise JobConfigError("--max-holdback-size/--max-holdback-age need --keep-unexported (or the config's)")
    if keep is not None and max_size:
        keep = keep.model_copy(update={"max_holdback_bytes": parse_size_arg(max_size, "--max-holdback-size")})
    if keep is not None and max_age:
        keep = keep.model_copy(update={"max_holdback_s": parse_duration_ms(max_age, "--max-holdback-age") // 1000})
    update: dict[str, object] = {"retention": config.retention.model_copy(update={"keep_unexported": keep})}
    if getattr(args, "source", None):  # the guard reads the versions of this broker (`ExportGuards`)
        from tank_log.lakehouse import check_source

        update["export"] = config.export.model_copy(update={"source": check_source(args.source, "--source")})
    return config.model_copy(update=update)
