"""spark-submit jobs/import_delta.py --data-dir BASE --table PATH_OR_URI [--config conf/FILE] [--topics t1,t2]
[--append] [--segment-bytes SIZE] [--storage-option KEY=VALUE] [--format delta|iceberg] [--catalog URI]
[--dry-run] [--report FILE.json]; an Iceberg table named in a REST catalog: --table NAMESPACE.TABLE --format iceberg
--catalog http://HOST:PORT"""

import _bootstrap  # noqa: F401

from tank_log.jobs.exits import exit_process
from tank_spark.import_delta import main

if __name__ == "__main__":
    exit_process(main())
