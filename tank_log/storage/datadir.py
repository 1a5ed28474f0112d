"""Discovering topics, partitions and segments of a broker base path, as the broker does (docs/FORMAT.md §1, §2.6).

What the broker ignores is ignored here too (`.`-prefixed names, non-directories at the top, unknown names in a
partition); what it would mis-parse, crash on or silently drop is reported as a Problem instead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from tank_log.errors import SegmentNameError, TankFormatError, UsageError
from tank_log.format.broker_config import PartitionConfig, load_config
from tank_log.format.cleanup_log import FILE_NAME as CLEANUP_LOG
from tank_log.format.index import read_index
from tank_log.format.names import SIDE_FILE, CompactionTemp, FileName, Kind, parse_name
from tank_log.problems import Problem
from tank_log.storage.cleanup_marks import read_cleanup_log, unusable_records
from tank_log.storage.fsutil import is_our_temp, is_regular_file
from tank_log.storage.segment import Segment

MOVE_RETRIES = 3  # re-scans of a partition whose segment keeps vanishing under a live broker before a read fails
NOT_A_FILE = "not-a-file"  # Problem code: a non-regular file where a segment, index or temporary should be
OVERLAP = "overlap"  # Unread code: two segment files claim the same seqs (§6.4, §11.15)
LOST_SEGMENT = "lost-segment"  # Unread code: an index left behind by a segment file that is gone (§2.3, §4)


@dataclass(frozen=True)
class Unread:
    """Data found on disk that a reader leaves out, and why: a whole directory or file, or `size` bytes from
    `offset` of a file."""

    path: str
    reason: str
    offset: int | None = None
    size: int | None = None
    first_seq: int | None = None  # the seqs the partition claims there (None: none known)
    last_seq: int | None = None  # (None with a first_seq: up to an end nobody knows)
    code: str | None = None  # the damage, in verify's words (`NOT_A_FILE`, `OVERLAP`, `LOST_SEGMENT`)

    def __str__(self) -> str:
        where = self.path if self.offset is None else f"{self.path} @{self.offset}"
        what = "not read" if self.size is None else f"{self.size} bytes not read"
        if self.first_seq is not None:
            what += f", seqs {self.first_seq}..{'' if self.last_seq is None else self.last_seq}"
        return f"{where}: {what} ({self.reason})"


@dataclass
class Partition:
    """One partition directory (§2.6): its RO segments by base, the active one, and what the scan found wrong."""

    topic: str
    id: int
    path: str
    config: PartitionConfig
    ro: list[Segment] = field(default_factory=list)  # sorted by base
    active: Segment | None = None
    leftovers: list[tuple[str, CompactionTemp]] = field(default_factory=list)  # interrupted compaction files
    index_files: dict[int, str] = field(default_factory=dict)  # base → path of <base>.index
    problems: list[Problem] = field(default_factory=list)
    unread: list[Unread] = field(default_factory=list)  # segment files a reader leaves out (bad names, extra .log)

    @property
    def segments(self) -> list[Segment]:
        """RO segments then the active one: the partition's data in seq order."""
        return self.ro + ([self.active] if self.active else [])

    @property
    def overlaps(self) -> list[Unread]:
        """Seqs two segment files claim at once (`OVERLAP`): a reader returns nothing of such a partition."""
        return [u for u in self.unread if u.code == OVERLAP]

    @property
    def readable(self) -> list[Segment]:
        """The segments a reader returns: all of them in seq order, or none when two claim the same seqs (which of
        them holds the right messages is for `tank-log repair` to decide, not for a reader to guess)."""
        return [] if self.overlaps else self.segments

    @property
    def key(self) -> tuple[str, int]:
        return (self.topic, self.id)


@dataclass
class Topic:
    """One topic directory (§1.2): its config and partitions."""

    name: str
    path: str
    config: PartitionConfig
    partitions: list[Partition] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    unread: list[Unread] = field(default_factory=list)  # partition directories a reader leaves out


@dataclass
class DataDir:
    """A broker base path as scanned (`scan_data_dir`): its topics, `.cleanup.log` marks and problems."""

    path: str
    topics: list[Topic] = field(default_factory=list)
    cleanup_marks: dict[tuple[str, int], int] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)

    def partitions(self) -> list[Partition]:
        return [p for t in self.topics for p in t.partitions]

    def all_problems(self) -> list[Problem]:
        out = list(self.problems)
        for t in self.topics:
            out += t.problems
            for p in t.partitions:
                out += p.problems
        return out


def scan_partition(path: str, topic: str, pid: int, config: PartitionConfig | None = None) -> Partition:
    """List one partition directory (§2.6 scan) and load its partition-level config on top of `config`."""
    problems: list[Problem] = []
    config, cfg_problems = load_config(os.path.join(path, "config"), config or PartitionConfig())
    part = Partition(topic, pid, path, config, problems=problems + cfg_problems)
    logs: list[Segment] = []
    for entry in sorted(os.listdir(path)):
        full = os.path.join(path, entry)
        try:
            parsed = parse_name(entry)
        except TankFormatError as err:
            part.problems.append(Problem(full, None, "bad-name", err.message))
            if is_regular_file(full):
                part.unread.append(Unread(full, f"not read: {err.message}"))
            continue
        if (parsed is not None or _job_touches_unparsed(entry)) and _not_regular(full):
            part.problems.append(_not_a_file(full))
            if isinstance(parsed, FileName) and parsed.kind is not Kind.INDEX:  # a segment nobody can read
                part.unread.append(
                    Unread(
                        full, _not_a_file(full).message, first_seq=parsed.base, last_seq=parsed.last, code=NOT_A_FILE
                    )
                )
            continue
        if parsed is None:
            if is_our_temp(entry):
                part.problems.append(_leftover_temporary(full))
            elif not entry.startswith(".") and entry != "config":
                part.problems.append(
                    Problem(
                        full, None, "unexpected-name", "unexpected name (the broker logs and ignores it)", "warning"
                    )
                )
            continue
        if isinstance(parsed, CompactionTemp):
            part.leftovers.append((full, parsed))
            continue
        if parsed.kind is Kind.INDEX:
            if parsed.wide:
                part.problems.append(
                    Problem(
                        full,
                        None,
                        "wide-index",
                        "_64.index is not implemented: the broker aborts on this segment (§4.6)",
                        aborts=True,
                    )
                )
            else:
                part.index_files[parsed.base] = full
            continue
        try:
            size = os.stat(full).st_size
        except FileNotFoundError:  # renamed/unlinked by a live broker since the listing (§9 rule 2)
            continue
        logs.append(Segment(full, name=parsed, size=size))
    _place_segments(part, logs)
    return part


def _place_segments(part: Partition, logs: list[Segment]) -> None:
    """The partition's segments as the broker opens them (§2.6): RO by base, the last `.log` active (others are
    reported and not read), a 0-byte active one reported."""
    ro = sorted((s for s in logs if not s.is_active), key=lambda s: (s.base, s.last or 0))
    actives = sorted((s for s in logs if s.is_active), key=lambda s: s.base)
    part.ro = ro
    if actives:
        part.active = actives[-1]
        for other in actives[:-1]:
            part.problems.append(
                Problem(
                    other.path,
                    None,
                    "several-active",
                    "more than one .log in the partition (the broker keeps one, §2.6)",
                )
            )
            part.unread.append(Unread(other.path, "a second active segment: the broker keeps one (§2.6)"))
    if part.active is not None and part.active.size == 0:
        part.problems.append(
            Problem(
                part.active.path,
                None,
                "empty-active",
                "0-byte active segment: the broker deletes it at open (§2.6)",
                "warning",
            )
        )
    part.unread += _overlaps(part) + _lost_segments(part)


def _overlaps(part: Partition) -> list[Unread]:
    """Seqs claimed by two segment files: an RO range starting at or below the end of an earlier one (§9 rule 3), or
    an active segment starting at or below the last RO seq. The broker makes this layout itself when a crash during
    its compaction resurrects the inputs next to the outputs (§6.4, §11.15) and routes by base (§4.4): the same seqs
    come from either file, and a reader that returned both would duplicate them. A pair is damage only if both files
    are still there after the listing (a live broker renames compaction inputs away while a directory is listed)."""
    out = []
    prev: Segment | None = None
    following = part.ro + ([part.active] if part.active is not None and part.active.size else [])
    for seg in following:
        if prev is not None and prev.last is not None and seg.base <= prev.last:
            if os.path.exists(seg.path) and os.path.exists(prev.path):
                last = prev.last if seg.last is None else min(seg.last, prev.last)
                what = "the active segment" if seg.is_active else f"RO range {seg.base}-{seg.last}"
                reason = (
                    f"[{OVERLAP}] {what} overlaps {os.path.basename(prev.path)} ({prev.base}-{prev.last}), as a "
                    "compaction input resurrected next to its output does (§6.4, §11.15): nothing of the partition "
                    "is read until `tank-log repair` or an operator removes one"
                )
                out.append(Unread(seg.path, reason, first_seq=seg.base, last_seq=last, code=OVERLAP))
        if prev is None or (seg.last is not None and prev.last is not None and seg.last > prev.last):
            prev = seg
    return out


def _lost_segments(part: Partition) -> list[Unread]:
    """Seqs the partition claimed in a segment file that is gone, proved by the index it left behind (`<b>.index`
    without a segment of base b, §2.1) when b lies above the partition's first segment, below the active one and in
    no RO range: the broker names an index after its segment and deletes the index with it (§5), so such an index
    outlived a `.ilog` that held seqs b.. (its entries name some of them, §4.1; the next segment's base bounds them).

    Harmless, and left to verify's `stale-index` warning: an index below the first segment (what retention's
    interrupted deletion leaves, §5), inside an RO range (a compaction input's index renamed back by the broker's
    recovery, §6.4), at or above the active base, or above the last RO segment with no active one (a 0-byte active
    segment deleted at open leaves its index, §2.6; the next roll appends to it, §2.3)."""
    segs = part.segments
    if not segs:
        return []
    bases = {s.base for s in segs} | {u.first_seq for u in part.unread if u.code == NOT_A_FILE}
    first = segs[0].base
    out = []
    for b, path in sorted(part.index_files.items()):
        if b in bases or b <= first:
            continue
        if part.active is not None and b >= part.active.base:
            continue
        if any(s.last is not None and s.base <= b <= s.last for s in part.ro):
            continue
        later = [s.base for s in segs if s.base > b]
        if not later:
            continue  # above the last RO segment, no active one: a deleted 0-byte active segment's index
        if not os.path.exists(path):
            continue  # deleted since the listing
        last = later[0] - 1
        known = _indexed_seq(path, b)
        named = "" if known is None else f" (its index names seqs up to at least {known})"
        held = [p for p, t in part.leftovers if t.inner is not None and t.inner.base == b]
        if held:  # a compaction was interrupted (or runs) between renaming its input and the input's index (§6.4)
            where = f"is under a compaction temporary name ({os.path.basename(held[0])}): `tank-log repair` resolves it"
        else:
            where = "is gone; lost unless the file is restored"
        reason = (
            f"[{LOST_SEGMENT}] index without its segment: the `.ilog` of base {b}{named}, up to the next segment's "
            f"base, {where} (§2.3, §4.1, §6.4)"
        )
        out.append(Unread(path, reason, first_seq=b, last_seq=last, code=LOST_SEGMENT))
    return out


def _indexed_seq(path: str, base: int) -> int | None:
    """The highest seq an index's entries name (the first seq of the last indexed bundle), None when unreadable."""
    try:
        entries = read_index(path)
    except (OSError, TankFormatError):
        return None
    return base + max(rel for rel, _ in entries) if entries else None


def rescan_partition(path: str, topic: str, pid: int) -> Partition:
    """One partition directory again, with its topic's config under its own (§1.5)."""
    config, _ = load_config(os.path.join(os.path.dirname(path), "config"), PartitionConfig())
    return scan_partition(path, topic, pid, config)


def scan_topic(path: str, name: str, config: PartitionConfig | None = None) -> Topic:
    """A topic directory: its `config` and its digit-named partitions (§1.3, §1.4)."""
    config, problems = load_config(os.path.join(path, "config"), config or PartitionConfig())
    topic = Topic(name, path, config, problems=problems)
    digit_names = sorted((e for e in os.listdir(path) if e.isdigit()), key=lambda e: (int(e), e))
    count = len(digit_names)
    if not count:
        topic.problems.append(
            Problem(path, None, "no-partitions", "topic without partition directories (the broker skips it)", "warning")
        )
        return topic
    ids = [int(e) for e in digit_names]
    if min(ids) != 0 or max(ids) != count - 1 or len(set(ids)) != count:
        topic.problems.append(
            Problem(
                path,
                None,
                "partition-ids",
                f"partition directories {digit_names} are not 0..{count - 1}: the broker serves partitions "
                f"0..{count - 1} by count (§1.4) and ignores or aborts on the others",
            )
        )
    for entry in digit_names:
        full = os.path.join(path, entry)
        pid = int(entry)
        if entry != str(pid):
            topic.problems.append(
                Problem(
                    full, None, "partition-name", f"non-canonical partition directory name (the broker opens {pid!s}/)"
                )
            )
            topic.unread.append(Unread(full, f"non-canonical partition directory name (the broker opens {pid!s}/)"))
            continue
        if not os.path.isdir(full):
            topic.problems.append(
                Problem(
                    full, None, "partition-not-dir", "digit-named non-directory: the broker aborts opening it (§1.4)"
                )
            )
            continue
        if pid >= count:  # reported above; the broker never opens it
            topic.unread.append(Unread(full, f"partition {pid} of a topic with {count} partition directories (§1.4)"))
            continue
        topic.partitions.append(scan_partition(full, name, pid, config))
    return topic


def scan_data_dir(path: str | os.PathLike[str]) -> DataDir:
    """A broker base path (§1.2): every directory not starting with `.` is a topic (symlinks followed).

    Raises:
        FileNotFoundError: `path` is not a directory.
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"not a directory: {path}")
    dd = DataDir(path)
    try:
        dd.cleanup_marks = read_cleanup_log(path)
    except TankFormatError as err:
        dd.problems.append(Problem(os.path.join(path, CLEANUP_LOG), err.offset, "cleanup-log", err.message))
    for offset, record in unusable_records(path):
        dd.problems.append(
            Problem(
                os.path.join(path, CLEANUP_LOG),
                offset,
                "cleanup-log",
                f"a record with an empty topic (partition {record.partition}, seq {record.seq}): no topic can have it; "
                "the broker drops it, and so does the next rewrite (§1.6)",
                "warning",
            )
        )
    for entry in sorted(os.listdir(path)):
        full = os.path.join(path, entry)
        if entry.startswith("."):
            if is_our_temp(entry):
                dd.problems.append(_leftover_temporary(full))
            elif os.path.isdir(full):
                dd.problems.append(
                    Problem(full, None, "stray-topic", "stray or half-created topic (the broker ignores it)", "warning")
                )
            continue
        try:
            is_dir = os.path.isdir(full) and os.stat(full) is not None
        except OSError:
            dd.problems.append(Problem(full, None, "stat-failed", "cannot stat: the broker aborts startup (§1.2)"))
            continue
        if is_dir:
            dd.topics.append(scan_topic(full, entry))
    return dd


def non_regular_entries(directory: str) -> list[str]:
    """Paths in a partition dir under names a job may read, rename or delete (segments, indexes, compaction and our
    temporaries, salvage side files; also names the broker mis-parses) that are not regular files."""
    out = []
    for name in sorted(os.listdir(directory)):
        try:
            touched = parse_name(name) is not None or _job_touches_unparsed(name)
        except SegmentNameError:
            touched = True
        if touched and _not_regular(os.path.join(directory, name)):
            out.append(os.path.join(directory, name))
    return out


def _job_touches_unparsed(name: str) -> bool:
    """A `.`-prefixed name of ours: a temporary or a salvage side file (`parse_name` ignores both)."""
    return is_our_temp(name) or SIDE_FILE.match(name) is not None


def _not_regular(path: str) -> bool:
    """Not (a symlink to) a regular file — and still there (a file vanishing meanwhile is no problem)."""
    return not is_regular_file(path) and os.path.lexists(path)


def _not_a_file(path: str) -> Problem:
    kind = "a directory" if os.path.isdir(path) else "not a regular file"
    message = f"{kind} under a segment/index name: the broker fails opening it; move it away (no job touches it)"
    return Problem(path, None, NOT_A_FILE, message, aborts=True)


def _leftover_temporary(path: str) -> Problem:
    message = "temporary of a killed tank-log run; `tank-log repair` deletes it"
    return Problem(path, None, "leftover-temporary", message, "warning")


def _looks_like_segment_file(name: str) -> bool:
    """A segment, index or compaction leftover name — valid or not (`01-5.ilog` still makes a partition)."""
    try:
        return parse_name(name) is not None
    except SegmentNameError:
        return True


def _subdirs(path: str) -> list[str]:
    """Directories in `path`, but for those under segment or index names (a partition's `not-a-file` problem)."""
    return [
        e
        for e in os.listdir(path)
        if not e.startswith(".") and os.path.isdir(os.path.join(path, e)) and not _looks_like_segment_file(e)
    ]


def classify_path(path: str | os.PathLike[str]) -> str:
    """What a user-given path is — "segment", "partition", "topic" or "base" — decided by its content, not its name
    (a topic or a base path may be named by digits, docs/FORMAT.md §1.3):
    - a file is a segment; a directory holding segment/index files is a partition;
    - a directory whose subdirectories are digit-named partitions (no deeper directories), `0` among them, is a topic
      (the broker serves partitions 0..N-1, §1.4);
    - any other directory is a base path; an empty digit-named directory is an (empty) partition.

    Raises:
        FileNotFoundError: the path does not exist.
        UsageError: a directory with segment files and subdirectories (no TANK layout has both).
    """
    path = os.fspath(path).rstrip("/") or "/"
    if os.path.isfile(path):
        return "segment"
    entries = os.listdir(path)
    subdirs = _subdirs(path)
    if any(_looks_like_segment_file(e) for e in entries):
        if subdirs:
            raise UsageError(
                f"{path}: ambiguous: segment files next to subdirectories {sorted(subdirs)[:5]} "
                f"(give a partition, topic or base path)"
            )
        return "partition"
    if not subdirs:
        return "partition" if os.path.basename(path).isdigit() else "base"
    if "0" in subdirs and all(d.isdigit() and not _subdirs(os.path.join(path, d)) for d in subdirs):
        return "topic"
    return "base"


def partitions_at(path: str | os.PathLike[str], topics: list[str] | None = None) -> list[Partition]:
    """Partitions under a partition, topic or base path (used by the CLI and the jobs).

    Raises:
        UsageError: a path that is no partition, topic or base path.
    """
    return scan_partitions(path, topics)[0]


def scan_partitions(
    path: str | os.PathLike[str], topics: list[str] | None = None
) -> tuple[list[Partition], list[Unread]]:
    """Partitions under a partition, topic or base path, and the data found there that a reader of them leaves out
    (partition directories the broker never opens, segment files under names it cannot parse, a second `.log`).

    Raises:
        UsageError: a path that is no partition, topic or base path.
    """
    path = os.fspath(path).rstrip("/") or "/"
    kind = classify_path(path)
    if kind == "partition":
        if not os.path.basename(path).isdigit():
            raise UsageError(f"{path}: a directory of segment files must be a partition directory named 0, 1, ...")
        topic_dir = os.path.dirname(path)
        topic_cfg, _ = load_config(os.path.join(topic_dir, "config"))
        part = scan_partition(path, os.path.basename(topic_dir), int(os.path.basename(path)), topic_cfg)
        return [part], list(part.unread)
    if kind == "topic":
        chosen = [scan_topic(path, os.path.basename(path))]
    elif kind == "base":
        chosen = [t for t in scan_data_dir(path).topics if topics is None or t.name in topics]
    else:
        raise UsageError(f"{path} is a file, not a directory")
    parts = [p for t in chosen for p in t.partitions]
    return parts, [u for t in chosen for u in t.unread] + [u for p in parts for u in p.unread]


def last_complete_seq(part: Partition) -> int | None:
    """The partition's last seq readable now: the active segment's last complete bundle (seeking to its last index
    entry, §4.4), else the last RO segment's name; None for an empty (or deleted) partition.

    The broker may roll (§2.5), compact (§6.4) or delete (§5) a segment between the scan and the read (§9 rule 2):
    the partition is then scanned again, up to `MOVE_RETRIES` times.
    """
    for _ in range(MOVE_RETRIES):
        try:
            return _last_complete_seq(part)
        except FileNotFoundError:
            try:
                part = rescan_partition(part.path, part.topic, part.id)
            except FileNotFoundError:
                return None  # the partition directory itself is gone
    return _last_complete_seq(part)


def _last_complete_seq(part: Partition) -> int | None:
    from tank_log.format.index import REL_SEQ_LIMIT

    for sf in reversed(part.segments):
        if not sf.is_active:
            return sf.last
        if sf.size == 0:
            continue
        start, next_seq = sf.seek(sf.base + REL_SEQ_LIMIT)  # the last usable index entry
        last = None
        try:
            for h in sf.bundles(start=start, next_seq=next_seq):
                last = h.last_seq
        except TankFormatError:
            if start == 0:
                raise
            for h in sf.bundles():  # a bad index entry: walk from the start
                last = h.last_seq
        if last is not None:
            return last
    return None
