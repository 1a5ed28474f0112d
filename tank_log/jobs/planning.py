"""The one planning loop of every job and of the data source: data dirs → selected partitions → tasks.

A task is a small picklable dataclass naming one partition; the driver (Spark or the CLI) plans them, executors or
the CLI `run()` them. Each job module (`jobs/compaction.py`, `jobs/retention.py`, `jobs/indexes.py`) only says what
its task does and which partitions it leaves out, and why.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from tank_log.maintenance.outcome import Status
from tank_log.storage.datadir import DataDir, Partition, partitions_at, scan_data_dir


@dataclass(frozen=True)
class Selected:
    """One partition a run looks at, with the data dir it was found in."""

    base_path: str
    data_dir: DataDir
    partition: Partition


def select_partitions(data_dirs: Iterable[str], topics: Collection[str] | None = None) -> Iterator[Selected]:
    """Every partition of the data dirs (only `topics` when given), in directory order."""
    for base in data_dirs:
        dd = scan_data_dir(base)
        for topic in dd.topics:
            if topics is not None and topic.name not in topics:
                continue
            for part in topic.partitions:
                yield Selected(base, dd, part)


def left_out(part: Partition, reason: str) -> dict[str, Any]:
    """The report entry of a partition a run does not touch."""
    return {
        "topic": part.topic,
        "partition": part.id,
        "path": part.path,
        "status": str(Status.SKIPPED),
        "reason": reason,
    }


@dataclass(frozen=True)
class PartitionTask:
    """One partition's work; subclasses implement `apply`."""

    base_path: str
    topic: str
    partition: int
    path: str

    def load(self) -> Partition:
        """The partition as it is now, with its topic's and its own config (executor side)."""
        (part,) = partitions_at(self.path)
        return part

    def apply(self, part: Partition) -> dict[str, Any]:
        raise NotImplementedError

    def run(self) -> dict[str, Any]:
        """The report entry of this partition."""
        result = self.apply(self.load())
        result["base_path"] = self.base_path
        return result


def run_task(task: PartitionTask) -> dict[str, Any]:
    """What executors call (a module-level function pickles by reference)."""
    return task.run()
