"""Bringing a partition back to a consistent state after a crash — what every mutating job runs first and
`tank-log repair` runs alone. One pass, in this order, each part idempotent:

0. an interrupted import that moves segments into the partition (its COMMIT.json written) is finished, whole, under
   the base path's lock (`staging.finish_imports_into`): an append may have sealed the active segment and not yet
   moved the new ones in, a layout step 5 must not touch (made active under another name, the sealed segment would
   sit beside the import's own active segment: two `.log` files);
1. our temporaries (`.…tank-log-….tmp`, `fsutil.temp_path`) left by a killed process are deleted;
2. an interrupted compaction is rolled back or forward (`swap.plan_swap_recovery`, docs/FORMAT.md §6.4);
3. an interrupted salvage is finished (`salvage.plan_salvage_recovery`, §3.11);
4. an index entry at or past the end of its log (a crash between the broker's log and index writes, §4.4, or an
   old salvage) is dropped: the index is rewritten atomically without it, or deleted when nothing is left, so the
   broker is rebuilt it (§9 rule 5; the broker aborts at open on such an entry of the active segment, §2.6);
5. RO segments without a non-empty active segment (the broker killed between its roll and its next active segment,
   §2.5, or before that segment's first write): its next append would hide every RO message (§2.6, §9 rule 4). The
   last RO segment becomes the active one again, the inverse of the roll's rename (`<base>-<last>_<ts>.ilog` →
   `<base>_<ts>.log`, its index keeping its name), after a 0-byte active segment and its index are deleted (what
   the broker deletes at open; the index first, and an index left alone after the last RO seq goes too). An empty
   active segment would not do: the broker deletes it at open (§2.6). The broker then serves every message and
   appends after the last seq. A last RO segment after a seq gap (made active, the gap would abort the broker,
   §4.4) is first merged with the one before it, the gap inside one segment (`_merge_across_gap`). A segment with a
   problem (`check_segment`), a gap that cannot be closed, and a partition an import still moves segments into are
   left as they are and reported (a dry run: step 0 reports, its recovery does the rest);
6. (before 5) RO segments whose ranges overlap (the broker's own recovery resurrects compaction inputs next to their
   output, §6.4, §11.15): the redundant copies are removed where the messages prove it (`_resolve_overlaps`), the
   rest is named;
7. (before 5) an index without its segment file: removed inside another segment's range, named (lost seqs) before a
   later one; a partition with such a loss is never merged across a gap in step 5.

`repair_base` deletes our temporaries in the base directory (a `.cleanup.log` rewrite killed midway) and finishes or
removes interrupted imports (`staging.py`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from tank_log.errors import NeedsAttention, TankFormatError
from tank_log.format.index import ENTRY, REL_SEQ_LIMIT, build_rebuild_rule, encode_index, read_index
from tank_log.format.names import (
    FileName,
    Kind,
    format_active_name,
    format_index_name,
    parse_log_name,
    parse_name,
    segment_logs,
)
from tank_log.storage.completeness import check_segment
from tank_log.storage.datadir import LOST_SEGMENT, non_regular_entries, scan_partition
from tank_log.storage.fsutil import StepHook, atomic_write, fsync_dir, our_temps, remove_if_exists, remove_our_temps
from tank_log.storage.locking import PartitionLock
from tank_log.storage.salvage import finish_salvage, plan_salvage_recovery, reactivate_last_ro, true_last_or
from tank_log.storage.segment import Segment
from tank_log.storage.staging import committed_imports_into, finish_imports_into, recover_imports
from tank_log.storage.swap import plan_swap_recovery, swap_in
from tank_log.storage.writer import SEGMENT_SIZE_LIMIT, SegmentWriter


@dataclass
class RepairResult:
    """What repair did (or, in a dry run, would do) to one partition. `action` is the compaction recovery."""

    path: str
    action: str = "none"  # none | rollback | rollforward | cleanup
    imports_finished: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    renamed: list[tuple[str, str]] = field(default_factory=list)
    salvages_finished: list[str] = field(default_factory=list)
    indexes_trimmed: list[str] = field(default_factory=list)
    active_restored: str | None = None  # "<ilog> -> <log>": the last RO segment made active again
    overlaps_resolved: list[str] = field(default_factory=list)  # redundant overlapping RO segments removed
    gaps_merged: list[str] = field(default_factory=list)  # last RO segments after a gap merged with the one before
    problems: list[str] = field(default_factory=list)

    @property
    def has_work(self) -> bool:
        return bool(
            self.imports_finished
            or self.removed
            or self.renamed
            or self.salvages_finished
            or self.indexes_trimmed
            or self.active_restored
            or self.overlaps_resolved
            or self.gaps_merged
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "action": self.action,
            "imports_finished": self.imports_finished,
            "removed": self.removed,
            "renamed": [list(x) for x in self.renamed],
            "salvages_finished": self.salvages_finished,
            "indexes_trimmed": self.indexes_trimmed,
            "active_restored": self.active_restored,
            "overlaps_resolved": self.overlaps_resolved,
            "gaps_merged": self.gaps_merged,
            "problems": self.problems,
        }


def repair_partition(
    partition_dir: str | os.PathLike[str], *, dry_run: bool = False, on_step: StepHook | None = None
) -> RepairResult:
    """Apply the recovery of the module docstring to one partition directory. With `dry_run`, only report.
    `on_step`: called after every file operation of a merge across a seq gap (crash-injection tests).

    Raises:
        NeedsAttention: a name repair could touch is not a regular file (checked before anything is changed).
    """
    d = os.fspath(partition_dir)
    odd = non_regular_entries(d)
    if odd:
        raise NeedsAttention(
            f"not regular files under segment/index/temporary names: {', '.join(odd)} — move them away first "
            f"(the broker fails on them too); nothing was changed"
        )
    imports = [f"would finish the interrupted import {n}" for n in committed_imports_into(d)]
    if imports and not dry_run:
        with PartitionLock(os.path.dirname(os.path.dirname(os.path.abspath(d))), "repair", blocking=True):
            imports = finish_imports_into(d)
    temps = remove_our_temps(d, dry_run=dry_run)
    swap = plan_swap_recovery(d)
    result = RepairResult(d, swap.action, imports, temps + swap.remove_first + swap.remove_last, list(swap.renames))
    if not dry_run:
        for ops in (swap.remove_first, swap.renames, swap.remove_last):
            for op in ops:
                if isinstance(op, tuple):
                    os.replace(*op)
                elif os.path.exists(op):
                    os.unlink(op)
            if ops:
                fsync_dir(d)
    for rec in plan_salvage_recovery(d):
        result.salvages_finished.append(rec.describe())
        if not dry_run:
            finish_salvage(rec)
    for index, keep in _indexes_past_eof(d, result):
        kept = f"kept {len(keep)} entries before the end of the log" if keep else "deleted"
        result.indexes_trimmed.append(f"{os.path.basename(index)}: {kept}")
        if dry_run:
            continue
        if keep:
            atomic_write(index, encode_index(keep))
        else:
            os.unlink(index)
            fsync_dir(d)
    _resolve_overlaps(d, result, dry_run=dry_run)
    _name_orphan_indexes(d, result, dry_run=dry_run)  # before 5: a merge must never close a gap a lost file left
    _restore_active(d, result, dry_run=dry_run, on_step=on_step)
    return result


def _ro_names(d: str) -> list[tuple[int, int, str]]:
    """(base, last, file name) of the RO segments, by base."""
    logs = segment_logs(sorted(os.listdir(d)))
    return sorted((p.base, p.last or p.base, n) for n, p in logs.items() if p.kind is Kind.RO)


def _resolve_overlaps(d: str, result: RepairResult, *, dry_run: bool) -> None:
    """Step 6 of the module docstring: RO segments whose seq ranges overlap (the broker's open after a compaction
    killed in phases B-D renames the `.old` inputs back next to the outputs, §6.4, §11.15). Where it is proven
    that one choice of non-overlapping segments holds every message of the group, each seq with the same ts, key
    and value in every segment that has it, the others are redundant and removed (an output is a subset of its
    inputs: the inputs stay, the next compaction runs again); the kept segments' indexes are checked and rebuilt
    if another segment's had their name. Anything else is named and left as it is."""
    for group in _overlapping_groups(_ro_names(d)):
        names = [n for _, _, n in group]
        try:
            keep, why = _redundant(d, group)
        except (TankFormatError, OSError) as err:
            keep, why = None, f"a segment does not read ({err})"
        if keep is None:
            result.problems.append(
                f"overlapping RO segments {', '.join(names)}: the same seqs twice (§6.4); not resolved: {why}; "
                "readers refuse the partition until a human keeps one copy"
            )
            continue
        drop = [n for n in names if n not in keep]
        kept_bases = {parse_log_name(n).base for n in keep}  # type: ignore[union-attr]
        result.overlaps_resolved.append(
            f"{', '.join(drop)}: every message also in {', '.join(keep)} (same seq, ts, key, value): removed"
        )
        result.removed += [os.path.join(d, n) for n in drop]
        if dry_run:
            continue
        for n in drop:
            os.unlink(os.path.join(d, n))
            base = parse_log_name(n).base  # type: ignore[union-attr]
            if base not in kept_bases:
                remove_if_exists(os.path.join(d, format_index_name(base)))
        fsync_dir(d)
        for n in keep:
            seg = Segment(os.path.join(d, n))
            if any(p.code.startswith("index") for p in check_segment(seg).problems):
                headers = list(seg.bundles())
                atomic_write(seg.index_path, encode_index(build_rebuild_rule(headers, seg.base)))
                result.indexes_trimmed.append(f"{os.path.basename(seg.index_path)}: rebuilt for {n} (§4.5)")


def _overlapping_groups(ro: list[tuple[int, int, str]]) -> list[list[tuple[int, int, str]]]:
    """The RO segments in groups whose ranges chain by overlap; only groups of two or more."""
    groups: list[list[tuple[int, int, str]]] = []
    top = -1
    for seg in ro:
        if groups and seg[0] <= top:
            groups[-1].append(seg)
        else:
            groups.append([seg])
        top = max(top, seg[1]) if len(groups[-1]) > 1 else seg[1]
    return [g for g in groups if len(g) > 1]


def _redundant(d: str, group: list[tuple[int, int, str]]) -> tuple[list[str] | None, str]:
    """The segments of an overlapping group to keep (None: no proof) and why not. Every segment must read whole
    (`check_segment`: no problem but its index); no seq may differ between segments; the kept ones are the
    non-overlapping choice holding the most messages (weighted interval scheduling), and they must hold every seq
    of the group."""
    held: dict[str, dict[int, tuple[int, bytes | None, bytes]]] = {}
    union: dict[int, tuple[int, bytes | None, bytes]] = {}
    for _, _, n in group:
        path = os.path.join(d, n)
        bad = [p for p in check_segment(path).problems if p.severity == "error" and not p.code.startswith("index")]
        if bad:
            return None, f"{n}: {bad[0].message}"
        msgs = {m.seq: (m.ts, m.key, m.value) for m in Segment(path).messages()}
        for seq, m in msgs.items():
            if union.setdefault(seq, m) != m:
                return None, f"seq {seq} differs between the copies"
        held[n] = msgs
    # weighted interval scheduling over [base, last] by message count
    segs = sorted(group, key=lambda g: g[1])
    best: list[tuple[int, list[str]]] = [(0, [])]
    for i, (base, _, n) in enumerate(segs):
        j = max((k + 1 for k in range(i) if segs[k][1] < base), default=0)
        with_it = (best[j][0] + len(held[n]), [*best[j][1], n])
        best.append(max(best[i], with_it, key=lambda b: b[0]))
    total, keep = best[-1]
    if total != len(union):
        return None, f"no set of non-overlapping segments holds all {len(union)} messages"
    return keep, ""


def _name_orphan_indexes(d: str, result: RepairResult, *, dry_run: bool) -> None:
    """Step 7 (run before step 5): an index without its segment file. Inside another segment's range (what a
    removal of a redundant overlapping segment killed midway leaves) it indexes nothing: removed. One the partition
    scan takes for the evidence of a lost segment (`datadir.LOST_SEGMENT`): its seqs were lost with the file, named
    (the index is kept; readers refuse the partition)."""
    names = sorted(os.listdir(d))
    ranges = sorted((p.base, p.last) for p in segment_logs(names).values())
    bases = {b for b, _ in ranges}
    stale = []
    for n in names:
        try:
            parsed = parse_name(n) if n.endswith(".index") else None
        except TankFormatError:
            continue  # the partition scan reports it
        if not isinstance(parsed, FileName) or parsed.kind is not Kind.INDEX or parsed.wide or parsed.base in bases:
            continue
        if any(lo < parsed.base and hi is not None and parsed.base <= hi for lo, hi in ranges):
            stale.append(os.path.join(d, n))
    for u in scan_partition(d, "", 0).unread:
        if u.code == LOST_SEGMENT:
            result.problems.append(
                f"{os.path.basename(u.path)}: an index without its segment file: seqs {u.first_seq}..{u.last_seq} "
                "were lost with it (restore the segment; readers refuse the partition until then)"
            )
    result.removed += stale
    if stale and not dry_run:
        for f in stale:
            remove_if_exists(f)
        fsync_dir(d)


def _restore_active(d: str, result: RepairResult, *, dry_run: bool, on_step: StepHook | None = None) -> None:
    """Step 5 of the module docstring: make the last RO segment active again when no non-empty active segment
    follows the RO segments. Each state between the deletes and the rename is one this step handles again."""
    logs = segment_logs(sorted(os.listdir(d)))
    ro = sorted((p, n) for n, p in logs.items() if p.kind is Kind.RO)
    actives = [n for n, p in logs.items() if p.kind is Kind.ACTIVE]
    if not ro or len(actives) > 1:  # several .log files: verify reports them, a human decides
        return
    empty = actives[0] if actives else None
    if empty is not None and os.path.getsize(os.path.join(d, empty)) > 0:
        return
    parsed, name = ro[-1]
    seg = Segment(os.path.join(d, name), name=parsed)
    ts = parsed.ts or int(os.stat(seg.path).st_mtime)  # a legacy name: its last write, as the broker's roll names it
    target = format_active_name(parsed.base, ts)
    errors = [
        f"the committed import {n} appends to it (its recovery seals and fills it)" for n in committed_imports_into(d)
    ]
    errors += [str(p) for p in check_segment(seg).problems if p.severity == "error"]
    before = ro[-2][0].last if len(ro) > 1 else None
    mergeable = not errors and not result.problems and not os.path.lexists(os.path.join(d, target))
    if before is not None and before + 1 < parsed.base and mergeable:
        prev = Segment(os.path.join(d, ro[-2][1]), name=ro[-2][0])
        if _merge_across_gap(d, prev, seg, result, dry_run=dry_run, on_step=on_step):
            if not dry_run:
                _restore_active(d, result, dry_run=dry_run, on_step=on_step)  # the merged one is the last RO now
            return
    if before is not None and before >= parsed.base:
        errors.append(f"it overlaps {ro[-2][1]} (seqs {parsed.base}..{before} twice, §6.4)")
    elif before is not None and before + 1 != parsed.base:  # made active, the gap would abort the broker (§4.4)
        errors.append(
            f"seq gap or overlap {before + 1}..{parsed.base - 1} before it (§4.4): the broker aborts on a read of a "
            f"gap before its active segment. What to do: keep producers off {os.path.basename(d)} (the broker's next "
            f"append hides seqs {ro[0][0].base}..{parsed.last}); if a segment holding seqs "
            f"{before + 1}..{parsed.base - 1} was lost, restore it and run repair again; otherwise export the "
            f"partition and import it into a fresh "
            f"base (jobs/export_delta.py, then jobs/import_delta.py), which writes the gap inside a segment as a "
            f"sparse bundle (§3.6)"
        )
    if os.path.lexists(os.path.join(d, target)):
        errors.append(f"{target} exists")
    why = "RO segments without a non-empty active segment: the broker hides them after its next append (§9 rule 4)"
    if errors:
        result.problems.append(f"{why}; {name} not made active: {errors[0]}")
        return
    result.active_restored = f"{name} -> {target}"
    # the index first: a kill between the deletes leaves the 0-byte log, which the rerun deletes with nothing else;
    # an index without a log at the seq after the last RO one (the other order, killed between) goes too: the
    # broker's next roll would take it over
    stale = []
    next_base = logs[empty].base if empty is not None else (parsed.last or parsed.base) + 1
    if all(p.base != next_base for p, _ in ro):  # its index, unless an RO segment's
        stale.append(os.path.join(d, format_index_name(next_base)))
    if empty is not None:
        stale.append(os.path.join(d, empty))
    stale = [f for f in stale if os.path.exists(f)]
    result.removed += stale
    if dry_run:
        return
    if stale:
        for f in stale:
            remove_if_exists(f)
        fsync_dir(d)
    reactivate_last_ro(seg, ts)


def _merge_across_gap(
    d: str, prev: Segment, last: Segment, result: RepairResult, *, dry_run: bool, on_step: StepHook | None = None
) -> bool:
    """The last RO segment follows a seq gap, so it cannot become active (a gap before the active segment aborts the
    broker, §4.4). Put the gap inside a segment instead, as sparse bundles allow (§3.6): `prev` and `last` become
    one RO segment `<prev base>-<last last>`, their bundles copied verbatim but for `last`'s first one, re-encoded
    sparse when it is not (its seqs were implicit, after a gap they must be explicit). It replaces the two by the
    compaction file protocol (`swap.swap_in`: a crash anywhere is rolled back or forward by the next repair), and
    step 5 then makes it active. Whether it did (False: `prev` has a problem, or the two would not fit one segment;
    the caller names the gap)."""
    if any(p.severity == "error" for p in check_segment(prev).problems):
        return False
    headers = list(prev.bundles()) + list(last.bundles())
    if sum(h.size for h in headers) > SEGMENT_SIZE_LIMIT or (last.last or 0) - prev.base >= REL_SEQ_LIMIT:
        return False
    merged = f"{prev.base}-{last.last}"
    result.gaps_merged.append(
        f"{prev.file_name} + {last.file_name} -> {merged}: seq gap {(prev.last or 0) + 1}..{last.base - 1} inside "
        "one segment (a sparse bundle, §3.6), so that it can become active (§9 rule 4)"
    )
    if dry_run:
        return True
    writer = SegmentWriter(d, ts=last.ts, index_rule="append")
    try:
        for seg in (prev, last):
            with open(seg.path, "rb") as fh:
                data = fh.read()
            for i, h in enumerate(seg.bundles()):
                if seg is last and i == 0 and not h.sparse:
                    for m in seg.messages(stop_seq=h.last_seq):
                        if m.seq <= h.last_seq:
                            writer.add(m)
                    writer.flush_bundle()
                    continue
                writer.add_bundle(data[h.offset : h.offset + h.size], h.first_seq, h.last_seq, h.count, sparse=h.sparse)
        written = writer.finish()
    except BaseException:
        writer.abort()
        raise
    assert written is not None
    swap_in(d, [prev, last], [written], on_step)
    return True


def _indexes_past_eof(d: str, result: RepairResult) -> list[tuple[str, list[tuple[int, int]]]]:
    """(index path, the entries before the end of its log) for every index whose last entry is at or past it. An RO
    segment whose content does not reach its name's last seq is not a crash state but lost data: its index entries
    past the end are the evidence of what was there, kept, and the loss is named in `result.problems`."""
    out = []
    for n, parsed in segment_logs(sorted(os.listdir(d))).items():
        index = os.path.join(d, format_index_name(parsed.base))
        try:
            with open(index, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size < ENTRY.size or size % ENTRY.size:
                    continue  # empty, or malformed: verify reports it and the index job rebuilds it
                fh.seek(size - ENTRY.size)
                _, last_off = ENTRY.unpack(fh.read(ENTRY.size))
            log_size = os.path.getsize(os.path.join(d, n))
        except FileNotFoundError:
            continue
        if last_off < log_size:
            continue
        entries = read_index(index)
        if any(b[0] <= a[0] or b[1] <= a[1] for a, b in zip(entries, entries[1:], strict=False)):
            continue  # out of order: not a crash state, verify reports it and the index job rebuilds it
        if parsed.kind is Kind.RO and (got := true_last_or(os.path.join(d, n), parsed)) != parsed.last:
            if _torn(os.path.join(d, n)):
                continue  # a torn RO tail: verify reports it, salvage replaces the index before it cuts (§3.11)
            result.problems.append(
                f"{os.path.basename(index)}: entries past the end of {n}, whose content ends at seq {got} before its "
                f"name's last {parsed.last}: data lost from the segment, not a crash state; the index is kept as "
                f"evidence (restore the segment, or salvage it)"
            )
            continue
        out.append((index, [e for e in entries if e[1] < log_size]))
    return out


def _torn(path: str) -> bool:
    """Whether a segment ends in bytes after its last complete bundle (a malformed one: not ours to judge here)."""
    walk = Segment(path).bundles()
    try:
        for _ in walk:
            pass
    except TankFormatError:
        return True
    return walk.tail is not None and walk.tail.torn_bytes > 0


def repair_base(base_path: str | os.PathLike[str], *, dry_run: bool = False) -> list[str]:
    """Delete our temporaries in the base directory (a `.cleanup.log` rewrite killed midway) and finish or remove
    interrupted imports (`staging.recover_imports`), under the base path's lock; return what was done.

    Raises:
        PartitionLocked: another job is rewriting `.cleanup.log` right now.
    """
    if dry_run:
        return our_temps(base_path) + recover_imports(os.fspath(base_path), dry_run=True)
    with PartitionLock(base_path, "repair"):
        return remove_our_temps(base_path) + recover_imports(os.fspath(base_path))
