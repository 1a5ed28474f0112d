"""What a writer checks before it rewrites or deletes anything: that the data it reads is all the partition claims.

The readers refuse an incomplete partition through `storage.completeness` (`SegmentAudit`, `Hole`); a writer that
read past the same evidence would turn it into clean-looking data (a cut or duplicated bundle renumbers every
message after it: compaction would keep the wrong survivors under the wrong seqs, and afterwards nothing could see
it). Every writer here goes through the same audit, on bundle headers only (no decompression: a few numpy
operations per walked chunk), and refuses what it cannot trust with the file, the offset and the seq range:

- `segment_hole`: one segment's headers walked whole, the audit's verdict (`Damage` or None);
- `HeaderAudit`: the same audit fed by a walk the writer makes anyway (compaction's pass 1);
- `tail_hole`: the same verdict from a segment's first bundle and its bytes after its last index entry (cheap);
- `partition_damage`: what the names say is missing or doubled, as the partition scan found it (`Partition.unread`:
  overlapping segments, an index whose segment file is gone, files a reader leaves out);
- `refuse_damage`: all of it for the segments a writer is about to trust, raised as `DamagedInput`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from tank_log.errors import NeedsAttention, TankFormatError
from tank_log.format.decode import BundleTable
from tank_log.format.index import usable_entries
from tank_log.storage.completeness import Hole, SegmentAudit
from tank_log.storage.datadir import Partition
from tank_log.storage.segment import DEFAULT_CHUNK_BYTES, Segment, SegmentWalk


@dataclass(frozen=True)
class Damage:
    """One piece of damage a writer found: the file, the offset (None: the whole file), the seqs the partition
    claims there (`last_seq` None: an end nobody knows) and why."""

    path: str
    offset: int | None
    first_seq: int | None
    last_seq: int | None
    code: str
    reason: str

    @classmethod
    def of_hole(cls, hole: Hole) -> Damage:
        last = hole.last_seq
        return cls(hole.path, hole.offset, hole.first_seq, last, hole.code, hole.reason)

    @property
    def seqs(self) -> str:
        if self.first_seq is None:
            return "seqs unknown"
        if self.last_seq is None:
            return f"seqs {self.first_seq}.. (end unknown)"
        return f"seqs {self.first_seq}..{self.last_seq}"

    def __str__(self) -> str:
        where = self.path if self.offset is None else f"{self.path} @{self.offset}"
        return f"{where}: {self.seqs} cannot be trusted ([{self.code}] {self.reason})"

    def to_dict(self) -> dict[str, object]:
        return {
            "path": self.path,
            "offset": self.offset,
            "first_seq": self.first_seq,
            "last_seq": self.last_seq,
            "code": self.code,
            "reason": self.reason,
        }


class DamagedInput(NeedsAttention):
    """A writer's input is damaged: it refused it and wrote nothing (`damage` says where and which seqs)."""

    def __init__(self, job: str, damage: list[Damage]):
        self.damage = damage
        first = damage[0]
        more = f" (and {len(damage) - 1} more)" if len(damage) > 1 else ""
        super().__init__(
            f"{first}{more}; {job} refused: nothing was written (`tank-log verify` shows it; salvage, repair or "
            f"restore the segment first, docs/operations/crash-safety.md)"
        )


class HeaderAudit:
    """The completeness audit of one segment fed by a headers-only walk the caller makes anyway: `observe` every
    walked chunk's table, then `finish` with the walk."""

    def __init__(self, seg: Segment, job: str):
        self.seg, self.job = seg, job
        self.audit = SegmentAudit(seg)

    def observe(self, file_offset: int, table: BundleTable) -> None:
        self.audit.observe(file_offset, table, None)

    def failed(self, err: TankFormatError) -> Damage:
        return Damage.of_hole(self.audit.failed(err))

    def finish(self, walk: SegmentWalk[tuple[int, BundleTable]]) -> Damage | None:
        """The damage the walk's end shows (None: the segment is all its name and index claim)."""
        hole = self.audit.finish(walk.tail)
        return None if hole is None else Damage.of_hole(hole)

    def walk(self, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[tuple[int, BundleTable]]:
        """The segment's headers-only chunks, each observed first; malformed data raises `DamagedInput`."""
        walk = self.seg.tables(chunk_bytes=chunk_bytes)
        try:
            for base, table in walk:
                self.observe(base, table)
                yield base, table
        except TankFormatError as err:
            raise DamagedInput(self.job, [self.failed(err)]) from None
        damage = self.finish(walk)
        if damage is not None:
            raise DamagedInput(self.job, [damage])


def segment_hole(seg: Segment, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Damage | None:
    """Walk one segment's bundle headers (no decompression) and say what it cannot be trusted for (None: nothing):
    names against content, index entries against bundles, a torn or corrupt RO tail, a malformed header. A torn tail
    of the active segment is an append in flight (§3.11), not damage."""
    audit = HeaderAudit(seg, "the read")
    walk = seg.tables(chunk_bytes=chunk_bytes)
    try:
        for base, table in walk:
            audit.observe(base, table)
    except TankFormatError as err:
        return audit.failed(err)
    except OSError as err:
        return Damage(seg.path, None, seg.base, seg.last, "io", str(err))
    return audit.finish(walk)


def tail_hole(seg: Segment) -> Damage | None:
    """`segment_hole` at the cost of a segment's first bundle header and its bytes after its last usable index
    entry, for what a writer does not read anyway (compaction's "nothing-to-do", the young tail it leaves). A bundle
    cut out or duplicated anywhere before the last entry moves the bytes under it: the entry then points at another
    bundle (the seqs counted from it end off the name's last) or inside one (a malformed header); after it, the
    count ends off the name's last too; a truncation or a torn tail ends the walk early. A segment without two
    usable entries is walked whole (`segment_hole`)."""
    entries = usable_entries(seg.index_path, seg.size)
    if len(entries) < 2 or seg.is_active:
        return segment_hole(seg)
    try:  # the first walked chunk (64 KiB) for the first bundle's seq; the walk is dropped, and its file closed
        _, head = next(seg.tables(chunk_bytes=1 << 16), (0, None))
    except TankFormatError as err:
        return Damage(seg.path, err.offset, seg.base, seg.last, "format", err.message)
    if head is not None and len(head) and int(head.firsts[0]) != seg.base:
        why = f"name says base {seg.base}, first message has seq {int(head.firsts[0])}"
        return Damage(seg.path, 0, seg.base, seg.last, "name-base", why)
    rel, off = entries[-1]
    audit = SegmentAudit(seg, start=off, next_seq=seg.base + rel)
    walk = seg.tables(start=off, next_seq=seg.base + rel)
    try:
        for base, table in walk:
            audit.observe(base, table, None)
    except TankFormatError as err:
        return Damage.of_hole(audit.failed(err))
    hole = audit.finish(walk.tail)
    return None if hole is None else Damage.of_hole(hole)


def partition_damage(part: Partition) -> list[Damage]:
    """What the partition's names say is missing or doubled, as the partition scan found it (`Partition.unread`):
    overlapping segments (a resurrected compaction input next to its output, §6.4, §11.15), an index whose segment
    file is gone, files a reader leaves out."""
    return [Damage(u.path, u.offset, u.first_seq, u.last_seq, u.code or "unread", u.reason) for u in part.unread]


def refuse_damage(
    job: str, part: Partition, segments: Iterable[Segment], *, names: bool = True, quick: bool = False
) -> None:
    """Raise `DamagedInput` naming every damage of `segments` (their headers walked; with `quick`, `tail_hole`'s
    walk) and, with `names`, of the partition's names; return when there is none.

    Raises:
        DamagedInput: what was found (nothing was written yet: the caller writes only after this returns).
    """
    damage = partition_damage(part) if names else []
    for seg in segments:
        hole = tail_hole(seg) if quick else segment_hole(seg)
        if hole is not None:
            damage.append(hole)
    if damage:
        raise DamagedInput(job, damage)


def describe(damage: Iterable[Damage]) -> list[dict[str, object]]:
    """Damage as report entries."""
    return [d.to_dict() for d in damage]
