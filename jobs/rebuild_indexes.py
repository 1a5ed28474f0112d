"""spark-submit jobs/rebuild_indexes.py --data-dir PATH [--config conf/FILE] [--topics t1,t2] [--dry-run]
[--report FILE.json] [--salvage] [--broker-stopped]"""

import _bootstrap  # noqa: F401

from tank_log.jobs.exits import exit_process
from tank_spark.rebuild_indexes import main

if __name__ == "__main__":
    exit_process(main())
