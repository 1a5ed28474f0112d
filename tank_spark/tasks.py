"""Spreading work items (partitions, segment ranges) over Spark tasks.

A Spark task costs ~40 ms of scheduling and Python worker round trips in local mode (bench/RESULTS.md), so items
are not one task each: up to `TASKS_PER_CORE` tasks per core each run their share one after another, dealt
round-robin so that neighbouring items (often of similar size) land in different tasks.
"""

from __future__ import annotations

import pickle
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeAlias, cast

from tank_log.jobs.processes import usable_cpus

if TYPE_CHECKING:
    from pyspark import RDD, SparkContext
    from pyspark.sql import SparkSession

TASKS_PER_CORE = 4


def deal(sc: SparkContext, items: Sequence[Any]) -> RDD[tuple[int, Any]]:
    """An RDD of (index, item) over up to `TASKS_PER_CORE` tasks per core; slice j holds items j, j + n, …"""
    slices = max(1, min(len(items), max(1, sc.defaultParallelism) * TASKS_PER_CORE))
    indexed = list(enumerate(items))
    return sc.parallelize([x for j in range(slices) for x in indexed[j::slices]], numSlices=slices)


Task = Callable[[Iterable[tuple[int, Any]]], Iterable[Any]]

Workers: TypeAlias = "SparkContext | SparkSession | int"
"""Where dealt work runs: Spark's executors (a SparkContext; through Spark Connect, which has none, the remote
session: `through_connect`), or (work small enough for the driver, e.g. `export.in_driver_max_bytes`) that many
threads of the driver (`driver_processes` of the run's master)."""


def map_dealt(workers: Workers, items: Sequence[Any], task: Task) -> list[Any]:
    """`task` over the (index, item) pairs dealt to Spark tasks, or over each of them in the driver's threads;
    collected in order."""
    if isinstance(workers, int):
        return in_threads(items, task, workers)
    if is_connect(workers):  # no SparkContext, no RDDs
        return through_connect(cast("SparkSession", workers), items, task)
    return list(deal(cast("SparkContext", workers), items).mapPartitions(task).collect())


def is_connect(spark: object) -> bool:
    """Whether `spark` is a Spark Connect session (`SparkSession.builder.remote`): it has no SparkContext."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def through_connect(session: SparkSession, items: Sequence[Any], task: Task) -> list[Any]:
    """`map_dealt` through Spark Connect, which has no RDD API: `session.range` with one row per slice and as many
    partitions, and `mapInArrow` running `task` over the items dealt to its slice as `deal` deals them (they travel
    with the function). Outputs come back pickled, each tagged with the last index its task took (as `in_threads`
    does), and are returned in index order."""
    if not items:
        return []
    slices = max(1, min(len(items), connect_parallelism(session) * TASKS_PER_CORE))
    indexed = list(enumerate(items))

    def run(batches: Iterable[Any]) -> Iterable[Any]:
        for batch in batches:
            for j in batch.column(0).to_pylist():
                yield _tagged(task, indexed[j::slices])

    frame = session.range(0, slices, 1, slices).mapInArrow(run, "index long, seq long, value binary")
    table = frame.toArrow()
    tags = zip(table.column("index").to_pylist(), table.column("seq").to_pylist(), range(table.num_rows), strict=True)
    order = sorted(tags)
    values = table.column("value").to_pylist()
    return [pickle.loads(values[k]) for _, _, k in order]


def _tagged(task: Task, pairs: list[tuple[int, Any]]) -> Any:
    """One slice's outputs of `task`, pickled, as an Arrow batch: each tagged with the index of the last pair its
    task took before yielding it (-1: none yet) and its place among the slice's outputs."""
    import pyarrow as pa

    current = [-1]

    def take() -> Iterator[tuple[int, Any]]:
        for pair in pairs:
            current[0] = pair[0]
            yield pair

    index, seq, value = [], [], []
    for n, x in enumerate(task(take())):
        index.append(current[0])
        seq.append(n)
        value.append(pickle.dumps(x))
    return pa.RecordBatch.from_arrays(
        [pa.array(index, pa.int64()), pa.array(seq, pa.int64()), pa.array(value, pa.binary())],
        names=["index", "seq", "value"],
    )


def connect_parallelism(session: SparkSession) -> int:
    """The cores of a Connect server's Spark (its default parallelism, which a client cannot ask for): the
    partitions of a `range` it splits by that default."""
    from pyspark.sql import functions as F

    ids = session.range(0, 1 << 16).select(F.spark_partition_id().alias("id"))  # not in an aggregate: nondeterministic
    row = ids.agg(F.max("id")).first()
    return 1 if row is None or row[0] is None else int(row[0]) + 1


_LOCAL = re.compile(r"local(?:\[(\d+|\*)(?:,\s*\d+)?\])?$")  # local, local[N], local[*], local[N,F], local[*,F]


def driver_processes(master: str) -> int:
    """How many processes (`processes.run_in_processes`) or threads (`in_threads`) run a small job in the driver:
    the cores of a local master, else the CPUs the driver may use."""
    m = _LOCAL.match(master.strip())
    if m and m.group(1) and m.group(1) != "*":
        return max(1, int(m.group(1)))
    if m and not m.group(1):  # plain `local`: one core
        return 1
    return usable_cpus()


def in_threads(items: Sequence[Any], task: Task, threads: int) -> list[Any]:
    """`task` over the (index, item) pairs in a pool of up to `threads` threads, collected in order. Each thread runs
    `task` once, over the pairs it takes one at a time from a shared queue (in order), as a Spark task runs its
    share: what a task opens once (the import's table and its dataset, whose cost grows with the table's files) is
    opened once per thread, not once per item. An output belongs to the last pair its task took before yielding it.
    Parquet encoding and object-store uploads release the GIL, so the threads overlap: an export of 1M messages in
    the driver took 1.56-1.78 s on one thread and 1.10-1.30 s on two, to the loopback S3 server (bench/RESULTS.md,
    "Export to Delta, and the way back"). On an error no thread takes another pair, the running ones finish, and
    the first error is raised."""
    workers = max(1, min(len(items), threads))
    if workers == 1:
        return list(task(iter(enumerate(items))))

    pairs = iter(enumerate(items))
    outputs: list[list[Any]] = [[] for _ in items]
    before: list[Any] = []  # what a task yields before it takes a pair
    taking = threading.Lock()
    stop = threading.Event()

    def share() -> None:
        current: list[list[Any]] = []

        def take() -> Iterator[tuple[int, Any]]:
            while not stop.is_set():
                with taking:
                    pair = next(pairs, None)
                if pair is None:
                    return
                current[:] = [outputs[pair[0]]]
                yield pair

        try:
            for out in task(take()):
                (current[0] if current else before).append(out)
        except BaseException:
            stop.set()
            raise

    with ThreadPoolExecutor(workers, thread_name_prefix="tank-task") as pool:
        futures = [pool.submit(share) for _ in range(workers)]
    errors = [e for f in futures if (e := f.exception()) is not None]
    if errors:
        raise errors[0]
    return before + [x for out in outputs for x in out]
