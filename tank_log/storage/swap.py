"""The compaction file protocol (docs/FORMAT.md §6.4): replacing input segments by output segments, and bringing a
partition with leftovers of an interrupted replacement back to a consistent state — both directions in one place.

Forward (`swap_in`; outputs already written and fsynced under `.`-prefixed temporary names):
  cleaned: outputs → `<name>.cleaned`            A: `.cleaned` → `.swap`
  B: inputs → `<name>.old`                        C: strip `.swap` (outputs take their final names)
  D: unlink the `.old` inputs
The directory is fsynced after every phase. A crash anywhere leaves a state that `storage.repair.repair_partition`
maps to exactly the inputs (before A completed) or exactly the outputs (after), which is the recovery below.

Recovery, for the broker's compactions and ours ("Recommended recovery for an external tool"):

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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tank_log.errors import TankFormatError
from tank_log.format.names import CompactionTemp, FileName, Kind, format_index_name, parse_name
from tank_log.storage.fsutil import StepHook, fsync_dir

if TYPE_CHECKING:
    from tank_log.storage.segment import Segment
    from tank_log.storage.writer import WrittenSegment


def _overlaps(a: FileName, b: FileName) -> bool:
    return a.base <= b.last and b.base <= a.last  # type: ignore[operator]


@dataclass
class RepairPlan:
    """Ordered file operations: remove `remove_first`, then `renames`, then remove `remove_last`."""

    action: str = "none"  # none | rollback | rollforward | cleanup
    remove_first: list[str] = field(default_factory=list)
    renames: list[tuple[str, str]] = field(default_factory=list)
    remove_last: list[str] = field(default_factory=list)


def plan_swap_recovery(partition_dir: str) -> RepairPlan:
    """What recovering an interrupted compaction would do in `partition_dir`; touches nothing."""
    names = sorted(os.listdir(partition_dir))
    temps: dict[str, list[tuple[str, CompactionTemp]]] = {"cleaned": [], "swap": [], "old": []}
    plain_ro: list[tuple[str, FileName]] = []
    for n in names:
        try:
            parsed = parse_name(n)
        except TankFormatError:
            continue  # not ours to touch: verify and the partition scan report it
        if isinstance(parsed, CompactionTemp):
            temps[parsed.stage].append((n, parsed))
        elif isinstance(parsed, FileName) and parsed.kind is Kind.RO:
            plain_ro.append((n, parsed))

    def j(n: str) -> str:
        return os.path.join(partition_dir, n)

    plan = RepairPlan()
    if temps["cleaned"]:  # crash while writing outputs or in phase A: inputs untouched → roll back
        plan.action = "rollback"
        plan.remove_first += [j(n) for n, _ in temps["cleaned"] + temps["swap"]]
        plan.renames = [(j(n), j(n[: -len(".old")])) for n, _ in temps["old"]]
    elif temps["swap"]:  # phase B or C: all outputs complete → roll forward
        plan.action = "rollforward"
        swap_ro = [t.inner for _, t in temps["swap"] if t.inner and t.inner.kind is Kind.RO]
        old_ro = [t.inner for _, t in temps["old"] if t.inner and t.inner.kind is Kind.RO]
        m = max((s.last for s in swap_ro if s.last is not None), default=0)
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
    return plan


def swap_in(
    directory: str, inputs: Sequence[Segment], outputs: Sequence[WrittenSegment], on_step: StepHook | None = None
) -> list[str]:
    """Replace `inputs` by `outputs` (fsynced temporaries) with the forward phases; return the outputs' final names.

    `on_step` is called after every file operation (crash-injection tests).
    """
    step: StepHook = on_step or (lambda what: None)

    def j(name: str) -> str:
        return os.path.join(directory, name)

    finals = [(w, w.log_name, w.index_name) for w in outputs]
    # outputs become visible to the protocol as *.cleaned (the broker would unlink them: rollback)
    for w, log_name, index_name in finals:
        os.rename(w.index_path, j(index_name + ".cleaned"))
        step(f"cleaned {index_name}")
        os.rename(w.log_path, j(log_name + ".cleaned"))
        step(f"cleaned {log_name}")
    fsync_dir(directory)
    step("fsync cleaned")
    for _, log_name, index_name in finals:  # A
        os.rename(j(log_name + ".cleaned"), j(log_name + ".swap"))
        step(f"A {log_name}")
        os.rename(j(index_name + ".cleaned"), j(index_name + ".swap"))
        step(f"A {index_name}")
    fsync_dir(directory)
    step("fsync A")
    for seg in inputs:  # B
        name = os.path.basename(seg.path)
        os.rename(seg.path, j(name + ".old"))
        step(f"B {name}")
        if os.path.exists(seg.index_path):
            os.rename(seg.index_path, seg.index_path + ".old")
            step(f"B {os.path.basename(seg.index_path)}")
    fsync_dir(directory)
    step("fsync B")
    for _, log_name, index_name in finals:  # C
        os.rename(j(index_name + ".swap"), j(index_name))
        step(f"C {index_name}")
        os.rename(j(log_name + ".swap"), j(log_name))
        step(f"C {log_name}")
    fsync_dir(directory)
    step("fsync C")
    for seg in inputs:  # D
        name = os.path.basename(seg.path)
        os.unlink(j(name + ".old"))
        step(f"D {name}")
        if os.path.exists(seg.index_path + ".old"):
            os.unlink(seg.index_path + ".old")
            step(f"D {os.path.basename(seg.index_path)}.old")
    fsync_dir(directory)
    step("fsync D")
    return [log_name for _, log_name, _ in finals]
