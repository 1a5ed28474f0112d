"""The command-line flags of retention's lakehouse guard (`retention.keep_unexported`), shared by `tank-log maintain`
and the retention and maintain jobs. Its own module, light to import: every `tank-log` command builds its parser."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tank_log.jobs.config import JobConfig


def add_keep_unexported(p: argparse.ArgumentParser) -> None:
    """The lakehouse guard of retention (over `retention.keep_unexported`)."""
    p.add_argument(
        "--keep-unexported",
        metavar="TABLE",
        help="never delete what this Delta table (a path or URI, or `export`: export.table) has not received",
    )
    p.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="for the --keep-unexported table, as for the export (over its storage_options)",
    )
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
    return config.model_copy(update={"retention": config.retention.model_copy(update={"keep_unexported": keep})})
