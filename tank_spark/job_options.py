"""The jobs' command line: the options every job shares (`job_parser`) and the ones several jobs add."""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING, NoReturn

from tank_log import __version__
from tank_log.errors import UsageError
from tank_log.jobs.flags import add_metrics_file

if TYPE_CHECKING:
    pass

log = logging.getLogger("tank_log.job")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse exits 2 itself; keep that but through our report path
        raise UsageError(message)


def job_parser(job: str, description: str) -> argparse.ArgumentParser:
    p = _Parser(prog=f"{job}.py", description=description)
    p.add_argument("--version", action="version", version=f"{job} (tank-log {__version__})")
    p.add_argument(
        "--data-dir",
        action="append",
        default=[],
        metavar="PATH",
        help="broker base path (repeatable); overrides data_dirs of the config",
    )
    p.add_argument("--config", metavar="FILE", help="YAML job configuration (conf/)")
    p.add_argument("--topics", metavar="T1,T2", help="only these topics")
    p.add_argument("--dry-run", action="store_true", help="report what would be done, change nothing")
    p.add_argument("--report", metavar="FILE.json", help="write the JSON run report here")
    add_metrics_file(p, default="; default: the config's metrics_file")
    p.add_argument("--master", help="Spark master when not launched by spark-submit (default: config or local[*])")
    p.add_argument(
        "--remote",
        metavar="sc://HOST:PORT",
        help="run through this Spark Connect server (SPARK_REMOTE is not read); only the jobs that run their tasks "
        "through DataFrames do (the export: docs/guides/reading.md, 'Through Spark Connect')",
    )
    p.add_argument(
        "--in-driver-max-bytes",
        metavar="SIZE",
        help="a run reading at most this much segment data (the import: table files) runs in the driver without "
        "starting Spark (default: the config's in_driver_max_bytes, 1gb; the export's: export.in_driver_max_bytes, "
        "128mb, with binary/utf8 values and engine deltalake); 0: always on executors",
    )
    p.add_argument(
        "--spark-log-level",
        default="WARN",
        choices=("ERROR", "WARN", "INFO", "DEBUG"),
        help="Spark's own log level, from its start-up on (default WARN: no INFO lines before the job's output)",
    )
    return p
