"""spark-submit jobs/compact.py --data-dir PATH [--config conf/FILE] [--topics t1,t2] [--dry-run]
[--report FILE.json] [--force] [--broker-stopped] [--tombstone-retention DURATION] [--drop-keyless]"""

import _bootstrap  # noqa: F401

from tank_log.jobs.exits import exit_process
from tank_spark.compact import main

if __name__ == "__main__":
    exit_process(main())
