"""Make `tank_log`/`tank_spark` importable when a job runs from a source checkout without an install
(`python jobs/<job>.py`); spark-submit deployments ship them with --py-files instead (README). Imported first by
every job script: from then on a stop (SIGTERM, Ctrl-C) ends the job with exit 130 and a line
(`tank_log.jobs.stopping.stop_while_starting`), never by the signal."""

import os
import sys

try:
    import tank_spark  # noqa: F401
except ImportError:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, root)
    os.environ["PYTHONPATH"] = root + os.pathsep + os.environ.get("PYTHONPATH", "")  # local-mode workers

from tank_log.jobs.stopping import stop_while_starting  # noqa: E402

stop_while_starting(os.path.splitext(os.path.basename(sys.argv[0]))[0])
