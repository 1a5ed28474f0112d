"""Spark-facing side of tank-log: job configuration, the shared job runner, the `tank` data source.

Library code lives in `tank_log` (no Spark); job entry points in `jobs/` only parse arguments and call in here.
"""
