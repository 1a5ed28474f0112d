"""spark-submit jobs/retention.py --data-dir PATH [--config conf/FILE] [--topics t1,t2] [--dry-run]
[--report FILE.json] [--time-basis name|message] [--broker-stopped]"""

import _bootstrap  # noqa: F401

from tank_log.jobs.exits import exit_process
from tank_spark.retention import main

if __name__ == "__main__":
    exit_process(main())
