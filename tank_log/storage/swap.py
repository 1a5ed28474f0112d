"""Bringing a partition with leftovers of an interrupted compaction to a consistent state (TANK_FORMAT.md §6.4,
"Recommended recovery for an external tool"), for the broker's compactions and ours (same file protocol).

The broker's own open-time recovery gets phases B–D wrong (it renames `.old` inputs back next to the promoted
outputs: overlapping segments). Here:
1. any `*.cleaned` → roll back: delete `*.cleaned` and `*.swap`, strip `.old`;
2. else any `*.swap` → roll forward: delete the inputs not yet renamed to `.old`, promote `*.swap`, delete `*.old`;
3. else any `*.old` → delete them;
then check the layout invariants. Every step fsyncs the directory, and the steps are ordered so that repair itself
can be interrupted and re-run.

Telling apart, in phase B/C, a plain RO segment that is an input not yet renamed (delete) from an output already
promoted (keep): a promoted output holds survivors of the inputs, so its range overlaps some `.old` input; an
unrenamed input never overlaps another input (the partition had no overlaps before compaction).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from tank_log.format.names import CompactionTemp, FileName, Kind, format_index_name, parse_name
from tank_log.storage.fsutil import fsync_dir

_OUR_TEMP = re.compile(r"^\..*\.tank-log-[0-9a-f]{12}\.tmp$")


@dataclass
class RepairResult:
    path: str
    action: str = "none"  # none | rollback | rollforward | cleanup
    removed: list[str] = field(default_factory=list)
    renamed: list[tuple[str, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.removed or self.renamed)

    def to_dict(self) -> dict:
        return {
            "path": self.path,
            "action": self.action,
            "removed": self.removed,
            "renamed": [list(x) for x in self.renamed],
            "problems": self.problems,
        }


def _overlaps(a: FileName, b: FileName) -> bool:
    return a.base <= b.last and b.base <= a.last  # type: ignore[operator]


@dataclass
class RepairPlan:
    """Ordered file operations: remove `remove_first`, then `renames`, then remove `remove_last`."""

    action: str = "none"  # none | rollback | rollforward | cleanup
    remove_first: list[str] = field(default_factory=list)
    renames: list[tuple[str, str]] = field(default_factory=list)
    remove_last: list[str] = field(default_factory=list)


def plan_repair(partition_dir: str) -> RepairPlan:
    """What repair would do in `partition_dir`; touches nothing."""
    names = sorted(os.listdir(partition_dir))
    temps: dict[str, list[tuple[str, CompactionTemp]]] = {"cleaned": [], "swap": [], "old": []}
    plain_ro: list[tuple[str, FileName]] = []
    for n in names:
        try:
            parsed = parse_name(n)
        except ValueError:
            continue
        if isinstance(parsed, CompactionTemp):
            temps[parsed.stage].append((n, parsed))
        elif isinstance(parsed, FileName) and parsed.kind is Kind.RO:
            plain_ro.append((n, parsed))

    def j(n: str) -> str:
        return os.path.join(partition_dir, n)

    plan = RepairPlan(remove_first=[j(n) for n in names if _OUR_TEMP.match(n)])
    if temps["cleaned"]:  # crash while writing outputs or in phase A: inputs untouched → roll back
        plan.action = "rollback"
        plan.remove_first += [j(n) for n, _ in temps["cleaned"] + temps["swap"]]
        plan.renames = [(j(n), j(n[: -len(".old")])) for n, _ in temps["old"]]
    elif temps["swap"]:  # phase B or C: all outputs complete → roll forward
        plan.action = "rollforward"
        swap_ro = [t.inner for _, t in temps["swap"] if t.inner and t.inner.kind is Kind.RO]
        old_ro = [t.inner for _, t in temps["old"] if t.inner and t.inner.kind is Kind.RO]
        m = max((s.last for s in swap_ro), default=0)  # type: ignore[type-var]
        output_bases = {s.base for s in swap_ro}
        for n, seg in plain_ro:
            if seg.base > m or any(_overlaps(seg, o) for o in old_ro):
                continue  # rolled while compaction ran, or an output promoted before the crash
            plan.remove_first.append(j(n))  # an input not yet renamed to .old
            index = format_index_name(seg.base)
            if seg.base not in output_bases and index in names:
                plan.remove_first.append(j(index))
        plan.renames = [(j(n), j(n[: -len(".swap")])) for n, _ in temps["swap"]]
        plan.remove_last = [j(n) for n, _ in temps["old"]]
    elif temps["old"]:  # phase D: outputs final → drop the inputs
        plan.action = "cleanup"
        plan.remove_last = [j(n) for n, _ in temps["old"]]
    elif plan.remove_first:
        plan.action = "cleanup"
    return plan


def repair_partition(partition_dir: str | os.PathLike, *, dry_run: bool = False) -> RepairResult:
    """Apply the recovery; see module docstring. With `dry_run`, only report."""
    partition_dir = os.fspath(partition_dir)
    plan = plan_repair(partition_dir)
    result = RepairResult(partition_dir, plan.action, plan.remove_first + plan.remove_last, plan.renames)
    if dry_run or plan.action == "none":
        return result
    for step in (plan.remove_first, plan.renames, plan.remove_last):
        if not step:
            continue
        for op in step:
            if isinstance(op, tuple):
                os.replace(*op)
            elif os.path.exists(op):
                os.unlink(op)
        fsync_dir(partition_dir)
    return result
