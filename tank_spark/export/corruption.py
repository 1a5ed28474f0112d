"""A partition whose segment data turns out malformed while the export reads it (TANK has no checksums, so only a
full read finds some corruptions, docs/FORMAT.md §3.1): the other partitions are exported and committed; that one is
reported `failed` with the file and byte offset, and the run exits 1. `--on-corruption` says what is committed of it:

- `prefix` (default): the rows before the corruption. Its recorded version becomes the last seq committed, so the
  next run starts right after it and stops at the same place until the data is repaired (nothing duplicated, nothing
  skipped; `jobs/rebuild_indexes.py --salvage` or an operator fixes the segment);
- `skip`: nothing of that partition; its recorded version stays where it was.

A hole counts as malformed data: a read that cannot return every seq the partition claims (a truncated RO segment,
a bundle cut out or duplicated, a directory in place of a segment: `storage/completeness.py`) fails its range with
the file, offset and seq range. `prefix` then keeps the rows up to the last seq before the hole that the evidence
trusts (`Hole.trusted_through`: a name or index that contradicts the bundles without a torn tail trusts none of the
segment, since a bundle cut out or duplicated renumbers the messages after it); a range holding rows past that seq is
not kept. The recorded version never passes a hole, so retention's `keep_unexported` guard keeps its data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeAlias

from tank_spark.export.plan import PartitionPlan
from tank_spark.tasks import Workers, map_dealt

if TYPE_CHECKING:
    import pyarrow as pa

    from tank_log.errors import TankFormatError
    from tank_spark.ranges import SegmentRange

ReadRange: TypeAlias = "Callable[[SegmentRange, list[TankFormatError]], Iterator[pa.RecordBatch]]"
"""`ranges.read_range`: a range's row batches; the error that stopped it goes into the list."""

ON_CORRUPTION = ("prefix", "skip")


@dataclass(frozen=True)
class RangeOutcome:
    """What reading one range found. `index` is its position in the run's range list (a partition's ranges are in
    seq order there)."""

    index: int
    topic: str
    partition: int
    rows: int = 0
    min_seq: int | None = None
    max_seq: int | None = None
    error: str | None = None  # the TankFormatError (file @offset: message) that stopped the read
    trusted_through: int | None = None  # with a hole (`HoleError`): the last seq before it the rows can be kept to

    @property
    def key(self) -> tuple[str, int]:
        return (self.topic, self.partition)


@dataclass
class Cut:
    """The run after corruptions: the plans to commit, the ranges whose rows are committed, and the report fields
    of each failed partition."""

    plans: list[PartitionPlan]
    kept: set[int]
    failures: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)


def cut_at_corruption(plans: list[PartitionPlan], outcomes: list[RangeOutcome], mode: str) -> Cut:
    """Per partition with a malformed range: keep its ranges up to that one (`prefix`) or none (`skip`), and end
    its plan at the last seq kept (or where it was)."""
    first_bad: dict[tuple[str, int], RangeOutcome] = {}
    for o in sorted(outcomes, key=lambda o: o.index):
        if o.error is not None and o.key not in first_bad:
            first_bad[o.key] = o
    kept: set[int] = set()
    last_kept: dict[tuple[str, int], int] = {}
    for o in outcomes:
        bad = first_bad.get(o.key)
        if bad is not None and (mode == "skip" or o.index > bad.index):
            continue
        trusted = bad.trusted_through if bad is not None else None
        if trusted is not None and o.max_seq is not None and o.max_seq > trusted:
            # rows past the hole's trusted seq were read, in this range or an earlier one of the same segment (a
            # bundle cut out or duplicated renumbers what follows it): none of the range's rows are kept
            continue
        kept.add(o.index)
        if bad is not None and o.max_seq is not None:
            last_kept[o.key] = max(o.max_seq, last_kept.get(o.key, o.max_seq))
    cut_plans, failures = [], {}
    for p in plans:
        key = (p.topic, p.partition)
        bad = first_bad.get(key)
        if bad is None:
            cut_plans.append(p)
            continue
        last = last_kept.get(key)
        cut_plans.append(replace(p, end=last if last is not None else p.first - 1))
        failures[key] = {
            "status": "failed",
            "error": bad.error,
            "on_corruption": mode,
            "exported_to_seq": last,
            "reason": (
                f"malformed data: exported up to seq {last}, the rest waits for a repair"
                if last is not None
                else "malformed data: nothing of this partition exported"
            ),
        }
    return Cut(cut_plans, kept, failures)


def scan_ranges(workers: Workers, ranges: Sequence[SegmentRange]) -> list[RangeOutcome]:
    """Read every range on the executors or the driver's threads (`workers`), writing nothing: rows, seq bounds
    and the error that stopped it (the dry run, and the pre-pass of exports that decode through Spark SQL, whose
    reader cannot report per range)."""

    def task(it: Iterable[tuple[int, SegmentRange]]) -> Iterator[RangeOutcome]:
        from tank_spark.ranges import read_range

        for i, r in it:
            yield outcome_of(i, r, read_range)

    return map_dealt(workers, ranges, task)


def outcome_of(index: int, r: SegmentRange, read_range: ReadRange) -> RangeOutcome:
    """Read one range to its end or its first malformed chunk."""
    read = TrackedRead(index, r, read_range)
    for _ in read:
        pass
    return read.outcome()


class TrackedRead:
    """The row batches of one range (`read_range`), stopping at its first malformed chunk, and what was read."""

    def __init__(self, index: int, r: SegmentRange, read_range: ReadRange):
        self.index, self.range, self._read_range = index, r, read_range
        self.stopped: list[TankFormatError] = []
        self.rows = 0
        self.lo: int | None = None
        self.hi: int | None = None

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        for b in self._read_range(self.range, self.stopped):
            seqs = b.column("seq").to_numpy()
            if len(seqs):
                self.rows += len(seqs)
                lo, hi = int(seqs.min()), int(seqs.max())
                self.lo = lo if self.lo is None else min(self.lo, lo)
                self.hi = hi if self.hi is None else max(self.hi, hi)
            yield b

    def outcome(self) -> RangeOutcome:
        from tank_log.storage.completeness import HoleError

        error = str(self.stopped[0]) if self.stopped else None
        hole = self.stopped[0] if self.stopped and isinstance(self.stopped[0], HoleError) else None
        trusted = None if hole is None else hole.hole.trusted_through
        r = self.range
        return RangeOutcome(self.index, r.topic, r.partition, self.rows, self.lo, self.hi, error, trusted)
