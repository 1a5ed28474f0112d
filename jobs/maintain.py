"""spark-submit jobs/maintain.py --data-dir PATH [--config conf/FILE] [--topics t1,t2] [--dry-run]
[--report FILE.json] [--broker-stopped] [--salvage] [--force] [--time-basis name|message]"""

import _bootstrap  # noqa: F401

from tank_log.jobs.exits import exit_process
from tank_spark.maintain import main

if __name__ == "__main__":
    exit_process(main())
