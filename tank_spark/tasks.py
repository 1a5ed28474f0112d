"""Spreading work items (partitions, segment ranges) over Spark tasks.

A Spark task costs ~40 ms of scheduling and Python worker round trips in local mode (bench/RESULTS.md), so items
are not one task each: up to `TASKS_PER_CORE` tasks per core each run their share one after another, dealt
round-robin so that neighbouring items (often of similar size) land in different tasks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

TASKS_PER_CORE = 4


def deal(sc: Any, items: list[Any]) -> Any:
    """An RDD of (index, item) over up to `TASKS_PER_CORE` tasks per core; slice j holds items j, j + n, …"""
    slices = max(1, min(len(items), max(1, sc.defaultParallelism) * TASKS_PER_CORE))
    indexed = list(enumerate(items))
    return sc.parallelize([x for j in range(slices) for x in indexed[j::slices]], numSlices=slices)


Task = Callable[[Iterator[tuple[int, Any]]], Iterator[Any]]


def map_dealt(sc: Any | None, items: list[Any], task: Task) -> list[Any]:
    """`task` over the (index, item) pairs dealt to Spark tasks, collected; with no SparkContext (work small enough
    for the driver, e.g. `export.in_driver_max_bytes`), over all of them in this process."""
    if sc is None:
        return list(task(iter(enumerate(items))))
    return list(deal(sc, items).mapPartitions(task).collect())
