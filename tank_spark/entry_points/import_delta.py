"""Import a Delta table (a tank-log export) into TANK partitions.

python -m tank_spark.entry_points.import_delta --help
spark-submit $(tank-log job-path import_delta) ...
"""

import sys

from tank_spark.import_delta import main

if __name__ == "__main__":
    sys.exit(main())
