"""Index and integrity maintenance of a partition: verify everything, then fix what is safe to fix.

- repair leftovers of interrupted compactions and salvages first (`storage/repair.py`);
- rebuild missing, empty (a 0-byte RO index aborts the broker, §4.2) or wrong indexes with the broker's rebuild rule
  (§4.5), written atomically;
- move `_64.index` files aside (the broker aborts on them, §4.6) to a `.`-prefixed name it ignores;
- with `salvage`: cut a torn tail (§3.11) after the last complete bundle with the crash-safe protocol of
  `storage/salvage.py` — the cut bytes are kept in a `.`-prefixed side file, nothing intact is lost (the broker's
  own salvage drops one intact bundle), mid-file corruption is never cut, and no cut breaks a layout rule;
- report what was found, what was done, and what needs a human (mid-file corruption, overlapping ranges, a seq gap
  before the active segment, ...).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

from tank_log.errors import NeedsAttention
from tank_log.format.index import build_append_rule, build_rebuild_rule, encode_index
from tank_log.maintenance.outcome import PartitionOutcome, Status, run_on_partition
from tank_log.maintenance.preflight import SafetyOptions, refuse_if_live
from tank_log.maintenance.verify import check_partition
from tank_log.problems import Problem
from tank_log.storage.datadir import Partition, scan_partition
from tank_log.storage.fsutil import atomic_write, fsync_dir
from tank_log.storage.repair import repair_partition
from tank_log.storage.salvage import plan_salvage, salvage_tail
from tank_log.storage.segment import Segment, Tail

log = logging.getLogger(__name__)

INDEX_CODES = {
    "index-missing",
    "index-empty",
    "index-size",
    "index-first-entry",
    "index-order",
    "index-past-eof",
    "index-not-bundle-start",
    "index-seq-mismatch",
}


@dataclass(frozen=True)
class IndexJobOptions(SafetyOptions):
    """What index maintenance may do beyond verifying: salvage torn RO tails, write missing indexes."""

    salvage: bool = False
    rebuild_missing: bool = True  # also write indexes that are missing (the broker would rebuild them on read)


@dataclass
class IndexJobResult(PartitionOutcome):
    """One partition's index maintenance: the problems found, the actions taken, and what was left unfixed."""

    found: list[dict[str, Any]] = field(default_factory=list)
    actions: list[dict[str, Any]] = field(default_factory=list)
    unfixed: list[dict[str, Any]] = field(default_factory=list)


def rebuild_index_file(
    seg: Segment, out_path: str | None = None, *, rule: str = "rebuild", interval: int = 4096
) -> tuple[str, int, Tail | None]:
    """Write the index of a segment atomically (default: `<base>.index` next to it); return (path, entries, the
    segment's tail)."""
    walk = seg.bundles()
    headers = list(walk)
    entries = (
        build_rebuild_rule(headers, seg.base) if rule == "rebuild" else build_append_rule(headers, seg.base, interval)
    )
    path = out_path or seg.index_path
    atomic_write(path, encode_index(entries))
    return path, len(entries), walk.tail


def maintain_partition(part: Partition, options: IndexJobOptions = IndexJobOptions()) -> IndexJobResult:
    """Verify a partition's indexes against its segments and rebuild (or, with `salvage`, repair) what is wrong,
    under the partition's lock and the safety checks of `options` (docs/FORMAT.md §4)."""
    res = IndexJobResult(part.topic, part.id, part.path)
    return run_on_partition(
        part.path, "rebuild_indexes", res, lambda r: _maintain(part, options, r), dry_run=options.dry_run
    )


def _maintain(part: Partition, options: IndexJobOptions, res: IndexJobResult) -> None:
    if not options.dry_run:  # under the lock now: another run of ours may have changed it since it was planned
        part = scan_partition(part.path, part.topic, part.id, part.config)
    rep = repair_partition(part.path, dry_run=True)
    problems = check_partition(part)
    res.found = [p.to_dict() for p in problems]
    fixable = _plan_fixes(part, problems, options)
    if rep.has_work:
        fixable.insert(0, ("repair", None))
    if not fixable:
        res.unfixed = [p.to_dict() for p in problems if p.severity == "error"]
        res.status = Status.NEEDS_ATTENTION if res.unfixed else Status.CLEAN
        return
    if options.dry_run:
        res.actions = [{"action": f"would {what}", "target": target} for what, target in fixable]
        res.repair = rep.to_dict() if rep.has_work else None
        res.unfixed = [p.to_dict() for p in problems if p.severity == "error" and not _covered(p, fixable)]
        res.status = Status.DRY_RUN
        return
    if not options.broker_stopped:
        refuse_if_live(part, "fixing files", options.live_window_s)
    if rep.has_work:
        res.repair = repair_partition(part.path).to_dict()
        part = scan_partition(part.path, part.topic, part.id, part.config)
        problems = check_partition(part)
        fixable = _plan_fixes(part, problems, options)
    for what, target in fixable:
        if what == "move-aside":
            aside = os.path.join(part.path, f".{os.path.basename(target)}.moved-aside")
            os.rename(target, aside)
            fsync_dir(part.path)
            res.actions.append(
                {"action": "moved-aside", "file": os.path.basename(target), "to": os.path.basename(aside)}
            )
        elif what == "salvage":
            try:
                plan = plan_salvage(target, part.ro, part.active)
            except NeedsAttention as refused:
                res.unfixed.append({"path": target.path, "code": "salvage-refused", "message": str(refused)})
                continue
            done = salvage_tail(plan)
            res.actions.append(done)
            res.reason = "; ".join(filter(None, [res.reason, cut_reason(done)]))
    if any(what in ("salvage", "move-aside") for what, _ in fixable):
        part = scan_partition(part.path, part.topic, part.id, part.config)
        problems = check_partition(part)
    for what, target in _plan_fixes(part, problems, options):
        if what == "rebuild-index":
            path, n, _ = rebuild_index_file(target)
            res.actions.append(
                {
                    "action": "rebuilt-index",
                    "file": os.path.basename(path),
                    "entries": n,
                    "rule": "rebuild (docs/FORMAT.md §4.5)",
                }
            )
    after = check_partition(scan_partition(part.path, part.topic, part.id, part.config))
    res.unfixed += [p.to_dict() for p in after if p.severity == "error"]
    res.status = Status.NEEDS_ATTENTION if res.unfixed else Status.FIXED


def cut_reason(action: dict[str, Any]) -> str:
    """One salvage's loss in words: the file, the seqs and how many messages it cut, and where the bytes are."""
    seqs = action.get("seqs_cut")
    n = action.get("messages_cut")
    if seqs is None:
        what = "no seq the names claim"
    else:
        what = f"seqs {seqs[0]}..{'' if seqs[1] is None else seqs[1]}"
        what += f" ({n} messages lost)" if n is not None else " (the torn bundle, its count unknown)"
    return (
        f"salvage cut {action['bytes_cut']} bytes of {action['segment']} at {action['cut_at']}: {what}; the bytes are "
        f"kept in {action['side_file']}"
    )


def _plan_fixes(part: Partition, problems: list[Problem], options: IndexJobOptions) -> list[tuple[str, Any]]:
    by_path = {s.path: s for s in part.segments}
    by_index = {s.index_path: s for s in part.segments}
    fixes: list[tuple[str, Any]] = []
    torn = {p.path for p in problems if p.code == "torn-tail"}
    # a log that is malformed, or whose content contradicts its name, keeps its index: where a bundle was cut out or
    # duplicated, the index's disagreement is the evidence of it, and a rebuilt one would make the damage look clean
    broken = {p.path for p in problems if p.code in ("format", "io", "name-base", "name-last", "mid-file-corruption")}
    for p in problems:
        if p.code == "wide-index":
            fixes.append(("move-aside", p.path))
        elif p.code == "torn-tail" and options.salvage and p.path in by_path:
            fixes.append(("salvage", by_path[p.path]))
    rebuild: dict[str, Segment] = {}
    for p in problems:
        if p.code in INDEX_CODES and p.path in by_index:
            sf = by_index[p.path]
            if sf.path in broken or (sf.path in torn and not options.salvage):
                continue  # the log itself needs attention first
            if p.code == "index-missing" and not options.rebuild_missing:
                continue
            rebuild[sf.path] = sf
    fixes += [("rebuild-index", sf) for sf in rebuild.values()]
    return fixes


def _covered(problem: Problem, fixes: list[tuple[str, Any]]) -> bool:
    targets = {getattr(t, "path", t) for _, t in fixes} | {getattr(t, "index_path", None) for _, t in fixes}
    return problem.path in targets
