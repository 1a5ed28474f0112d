"""tank_log: file-level reader and writer for the on-disk data of the TANK broker.

The format reference is docs/FORMAT.md (shared with the project); modules cite its sections.
This package never imports Spark.
"""

__version__ = "0.1.0"  # the package's version (pyproject.toml reads it); job reports record it
