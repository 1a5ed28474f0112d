"""The jobs, by name, and the files spark-submit runs for them.

The entry points themselves (`tank_spark/entry_points/<job>.py`, installed with the package) start Spark; their
names and paths do not, so the command line (`tank-log job-path compact`) gives them without importing Spark's
layer. Both packages install side by side from one distribution.
"""

from __future__ import annotations

import os

NAMES = ("maintain", "compact", "retention", "rebuild_indexes", "export_delta", "import_delta")

_PACKAGES = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def job_path(name: str) -> str:
    """The file spark-submit runs for job `name` (one of NAMES)."""
    if name not in NAMES:
        raise ValueError(f"unknown job {name!r} (jobs: {', '.join(NAMES)})")
    return os.path.join(_PACKAGES, "tank_spark", "entry_points", f"{name}.py")
