"""tank_log: reader, writer and maintenance operations for the on-disk data of the TANK broker.

The names below are the library's public API; everything else is internal and may change. They load on first use,
so `import tank_log` stays cheap for the command line and for Spark's Python workers::

    import tank_log

    data = tank_log.scan_data_dir("/var/lib/tank")
    for part in data.partitions():
        for seg in part.segments:
            table = seg.read_table()  # pyarrow.Table: seq, ts, key, value
    try:
        tank_log.verify_path("/var/lib/tank")
    except tank_log.TankLogError as err:  # the base of every exception the library raises on purpose
        ...

The format reference is docs/FORMAT.md (shared with the project); modules cite its sections. This package never
imports Spark (that is `tank_spark`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"  # the package's version (pyproject.toml reads it); job reports record it

_EXPORTS = {
    # reading: a data directory, its partitions, their segments
    "scan_data_dir": "tank_log.storage.datadir",
    "scan_partition": "tank_log.storage.datadir",
    "partitions_at": "tank_log.storage.datadir",
    "DataDir": "tank_log.storage.datadir",
    "Topic": "tank_log.storage.datadir",
    "Partition": "tank_log.storage.datadir",
    "Segment": "tank_log.storage.segment",
    "Message": "tank_log.format.messages",
    "MessageColumns": "tank_log.format.messages",
    "PartitionConfig": "tank_log.format.broker_config",
    "load_config": "tank_log.format.broker_config",
    # writing: segments and partitions (Appendix B), live appends
    "SegmentWriter": "tank_log.storage.writer",
    "BundlePolicy": "tank_log.storage.writer",
    "write_segment": "tank_log.storage.writer",
    "write_partition": "tank_log.storage.partition_writer",
    "PartitionAppender": "tank_log.storage.appender",
    # maintenance: one partition at a time
    "compact_partition": "tank_log.maintenance.compaction.compact",
    "CompactionOptions": "tank_log.maintenance.compaction.options",
    "CompactionResult": "tank_log.maintenance.compaction.options",
    "apply_retention": "tank_log.maintenance.retention",
    "RetentionRules": "tank_log.maintenance.retention",
    "RetentionOptions": "tank_log.maintenance.retention",
    "RetentionResult": "tank_log.maintenance.retention",
    "maintain_partition": "tank_log.maintenance.indexes",
    "IndexJobOptions": "tank_log.maintenance.indexes",
    "check_partition": "tank_log.maintenance.verify",
    "verify_path": "tank_log.maintenance.verify",
    "repair_partition": "tank_log.storage.repair",
    "repair_base": "tank_log.storage.repair",
    "Problem": "tank_log.problems",
    # errors: every exception raised on purpose derives from TankLogError
    "TankLogError": "tank_log.errors",
    "TankFormatError": "tank_log.errors",
    "SegmentNameError": "tank_log.errors",
    "IndexFormatError": "tank_log.errors",
    "CleanupLogError": "tank_log.errors",
    "UnrepresentableData": "tank_log.errors",
    "UsageError": "tank_log.errors",
    "JobConfigError": "tank_log.errors",
    "NothingMatched": "tank_log.errors",
    "RunFailed": "tank_log.errors",
    "PartitionLocked": "tank_log.errors",
    "PartitionHeld": "tank_log.errors",
    "PartitionLooksLive": "tank_log.errors",
    "NeedsAttention": "tank_log.errors",
    "ImportRefused": "tank_log.errors",
}

__all__ = ["__version__", *_EXPORTS]

if TYPE_CHECKING:
    from tank_log.errors import (
        CleanupLogError,
        ImportRefused,
        IndexFormatError,
        JobConfigError,
        NeedsAttention,
        NothingMatched,
        PartitionHeld,
        PartitionLocked,
        PartitionLooksLive,
        RunFailed,
        SegmentNameError,
        TankFormatError,
        TankLogError,
        UnrepresentableData,
        UsageError,
    )
    from tank_log.format.broker_config import PartitionConfig, load_config
    from tank_log.format.messages import Message, MessageColumns
    from tank_log.maintenance.compaction.compact import compact_partition
    from tank_log.maintenance.compaction.options import CompactionOptions, CompactionResult
    from tank_log.maintenance.indexes import IndexJobOptions, maintain_partition
    from tank_log.maintenance.retention import RetentionOptions, RetentionResult, RetentionRules, apply_retention
    from tank_log.maintenance.verify import check_partition, verify_path
    from tank_log.problems import Problem
    from tank_log.storage.appender import PartitionAppender
    from tank_log.storage.datadir import DataDir, Partition, Topic, partitions_at, scan_data_dir, scan_partition
    from tank_log.storage.partition_writer import write_partition
    from tank_log.storage.repair import repair_base, repair_partition
    from tank_log.storage.segment import Segment
    from tank_log.storage.writer import BundlePolicy, SegmentWriter, write_segment


def __getattr__(name: str) -> Any:
    """Load a public name's module on first use (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tank_log' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
