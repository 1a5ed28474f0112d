"""spark-submit jobs/export_delta.py --data-dir PATH --table PATH_OR_URI [--config conf/FILE] [--topics t1,t2]
[--dry-run] [--report FILE.json] [--engine deltalake|spark] [--value-format binary|utf8|json] [--value-schema DDL]
[--partition-by cols] [--target-file-size SIZE] [--format delta|iceberg] [--catalog SQLALCHEMY_URI]"""

import _bootstrap  # noqa: F401

from tank_log.jobs.exits import exit_process
from tank_spark.export.job import main

if __name__ == "__main__":
    exit_process(main())
