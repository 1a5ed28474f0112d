"""Delete expired RO segments of delete-policy topics.

python -m tank_spark.entry_points.retention --help
spark-submit $(tank-log job-path retention) ...
"""

from tank_log.jobs.stopping import stop_while_starting

if __name__ == "__main__":  # a stop from here on ends the run with 130 and a line, not by the signal
    stop_while_starting("retention")

from tank_log.jobs.exits import exit_process  # noqa: E402
from tank_spark.retention import main  # noqa: E402

if __name__ == "__main__":
    exit_process(main())
