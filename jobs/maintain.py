"""spark-submit jobs/maintain.py --data-dir PATH [--config conf/FILE] [--topics t1,t2] [--dry-run]
[--report FILE.json] [--broker-stopped] [--salvage] [--force] [--time-basis name|message]"""

import sys

import _bootstrap  # noqa: F401

from tank_spark.maintain import main

if __name__ == "__main__":
    sys.exit(main())
