"""Offline verification of segments, indexes, names and partition layout (what `tank verify` should do, §7.1,
without aborting): every problem is reported with its file and offset; nothing raises on bad input."""

from __future__ import annotations

import os

from tank_log.problems import Problem
from tank_log.storage.completeness import check_segment
from tank_log.storage.datadir import (
    LOST_SEGMENT,
    Partition,
    classify_path,
    partitions_at,
    rescan_partition,
    scan_data_dir,
)
from tank_log.storage.holders import partition_holders
from tank_log.storage.segment import Segment


def check_partition(part: Partition) -> list[Problem]:
    """Every segment of a partition plus the layout invariants of docs/FORMAT.md §9 rules 3–4."""
    problems = list(part.problems)
    for path, temp in part.leftovers:
        problems.append(
            Problem(
                path,
                None,
                "compaction-leftover",
                f"leftover of an interrupted compaction ({temp.stage}); run `tank-log repair` (§6.4)",
            )
        )
    checks = {s.path: check_segment(s) for s in part.segments}
    for c in checks.values():
        problems += c.problems
    problems += _layout_problems(part)
    bases = {s.base for s in part.segments}
    lost = {u.path: u for u in part.unread if u.code == LOST_SEGMENT}
    for base, path in part.index_files.items():
        if path in lost:  # the evidence of a segment file that is gone: its seqs were lost with it
            u = lost[path]
            message = f"seqs {u.first_seq}..{u.last_seq} lost: {u.reason.removeprefix(f'[{LOST_SEGMENT}] ')}"
            problems.append(Problem(path, None, LOST_SEGMENT, message))
        elif base not in bases:
            problems.append(
                Problem(
                    path,
                    None,
                    "stale-index",
                    "index without its segment: appended to if this base becomes active (§2.3)",
                    "warning",
                )
            )
    return problems


def _layout_problems(part: Partition) -> list[Problem]:
    """The partition's layout by its segments' names (what the broker routes by): RO ranges that do not overlap
    (§9 rule 3), then a non-empty active segment right after the last RO seq (§9 rule 4, §4.4)."""
    problems: list[Problem] = []
    prev: Segment | None = None
    for s in part.ro:
        if prev is not None and prev.last is not None and s.base <= prev.last:
            problems.append(
                Problem(s.path, None, "overlap", f"RO range {s.base}-{s.last} overlaps {os.path.basename(prev.path)}")
            )
        prev = s
    if part.ro:
        last_ro = max(s.last or 0 for s in part.ro)  # RO names always carry a last
        if part.active is None or part.active.size == 0:
            problems.append(
                Problem(
                    part.path,
                    None,
                    "no-active",
                    "RO segments without a non-empty active segment: the broker hides all RO data "
                    "after the next append (§9 rule 4)",
                )
            )
        elif part.active.base <= last_ro:
            problems.append(
                Problem(
                    part.active.path, None, "active-base", f"active base {part.active.base} <= last RO seq {last_ro}"
                )
            )
        elif part.active.base != last_ro + 1:
            problems.append(
                Problem(
                    part.active.path,
                    None,
                    "gap-before-active",
                    f"seq gap {last_ro + 1}..{part.active.base - 1} between the last RO segment and "
                    f"the active segment: the broker aborts on a fetch inside it (§4.4)",
                    aborts=True,
                )
            )
    return problems


def verify_path(path: str | os.PathLike[str]) -> list[Problem]:
    """Verify a segment file, partition, topic or base path; never raises for bad data."""
    path = os.fspath(path)
    try:
        kind = classify_path(path)
        if kind == "segment":
            return check_segment(path).problems
        if kind == "base":
            dd = scan_data_dir(path)
            problems = list(dd.problems)
            for t in dd.topics:
                problems += t.problems
                for p in t.partitions:
                    problems += _checked(p)
            return problems
        problems = []
        for p in partitions_at(path):
            problems += _checked(p)
        return problems
    except OSError as err:
        return [Problem(path, None, "io", str(err))]


LIVE_RESCANS = 3  # times a partition is scanned again when a file vanished while it was checked


def _checked(part: Partition) -> list[Problem]:
    """`check_partition`, with an I/O error reported as a problem of that partition (the others are still checked).
    A broker that serves the partition meanwhile rolls its active segment (renamed to `.ilog`) and deletes segments
    past retention (§2.4): a file that vanished while it was checked is not an error, the partition is scanned and
    checked again (a few times, then whatever is still missing is reported)."""
    held = [
        Problem(part.path, None, "held", f"{h}: mutations skip this partition while it runs (§9 rule 1)", "warning")
        for h in partition_holders(part.path)
    ]
    for attempt in range(LIVE_RESCANS + 1):
        try:
            problems = check_partition(part)
        except OSError as err:
            problems = [*part.problems, Problem(err.filename or part.path, None, "io", str(err))]
        vanished = [p for p in problems if p.code == "io" and p.path and not os.path.exists(p.path)]
        if not vanished or attempt == LIVE_RESCANS or not os.path.isdir(part.path):
            return held + problems
        part = rescan_partition(part.path, part.topic, part.id)
    raise AssertionError("unreachable")
