"""Make `tank_log`/`tank_spark` importable when a job runs from a source checkout without an install
(`python jobs/<job>.py`); spark-submit deployments ship them with --py-files instead (README)."""

import os
import sys

try:
    import tank_spark  # noqa: F401
except ImportError:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, root)
    os.environ["PYTHONPATH"] = root + os.pathsep + os.environ.get("PYTHONPATH", "")  # local-mode workers
