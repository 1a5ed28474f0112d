"""Importing whole partitions into a base path, crash-safe (docs/FORMAT.md §9 rules 3, 4, 8).

Writers (one per partition, e.g. a Spark task) write complete segments under the final names into a staging
directory `BASE/.tank-import-<run>/<writer>/<topic>/<partition>/`, which the broker and our scans ignore (§1.7: a
`.`-prefixed name). The commit then:
1. writes `BASE/.tank-import-<run>/COMMIT.json` (fsynced): every staged partition, where it goes, and the active
   segment to seal when appending. From here on the import rolls forward; before it, it rolls back.
2. per partition: a new partition directory is renamed into place in one step; appending to an existing one seals
   its active segment (`<base>-<last>_<ts>.ilog`, ts = the active log's mtime, as the broker's roll names it, §2.5)
   and moves the new segments in by seq, index before log, the new active segment last; so does an import into a
   partition directory without segments that holds other files (a partition `config`, a `.gitkeep`): they stay;
3. creates the empty partition directories a topic lacks below its highest partition (the broker serves partitions
   0..count-1 of the digit-named directories, §1.4), then removes the staging directory.
`recover_imports(base)` (run by the import job before it writes, and by `tank-log repair`) finishes an import
whose COMMIT.json exists and removes one whose does not; `finish_imports_into(partition)` (run by every partition
repair, `storage/repair.py`) finishes those moving segments into one partition. Every step is idempotent.

Segment names: every staged segment is named with the import's clock (`stage_partition`'s `name_ts`, default
now), never its messages' times. The broker ages RO segments by the name's ts (§2.2, §5: deleted once
`ts + log.retention.secs` is past, at a roll) and names a segment at its roll with the active log's mtime (§2.5): the
original segment of every restored message was named at a roll that happened before its rows were exported, so
before the import, at the latest. Named by the import's clock, no restored segment is aged out sooner than the
original would have been (a producer's ts may be far older than the append, and a restore named after it was deleted
at the broker's first roll); it may live longer, by up to the time between the original's roll and the import.

Writers and the driver meet at a lock file in the staging directory, created by `open_import` before any writer
starts: a writer stages a partition holding it shared; the commit and the abort take it exclusively, so they wait
for writers still running (a failed Spark job reports its failure before its other tasks are killed), then unlink
it, so a writer that starts later stages nothing (`ImportAborted`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass

import numpy as np

from tank_log.errors import ImportAborted, ImportRefused, TankFormatError
from tank_log.format.messages import MessageColumns
from tank_log.format.names import (
    MAX_PARTITIONS,
    FileName,
    Kind,
    format_ro_name,
    parse_name,
    partition_id_problem,
    topic_name_problem,
)
from tank_log.storage.completeness import SegmentAudit
from tank_log.storage.datadir import Partition, scan_partition
from tank_log.storage.fsutil import atomic_write, fsync_dir
from tank_log.storage.partition_writer import PartitionWriter
from tank_log.storage.writer import BundlePolicy, WrittenSegment

log = logging.getLogger(__name__)

STAGE_PREFIX = ".tank-import-"
MANIFEST = "COMMIT.json"
WRITERS_LOCK = ".writers.lock"
WRITERS_WAIT_S = 120.0  # how long the commit or the abort waits for running writers to stop


@dataclass(frozen=True)
class StagedPartition:
    """One partition written into the staging area, ready to commit."""

    topic: str
    partition: int
    staged_dir: str
    target_dir: str
    first_seq: int
    last_seq: int
    messages: int
    segments: int
    bytes: int
    seal: tuple[str, str] | None  # appending: the existing active segment's name → its RO name


def new_run_id() -> str:
    """An import's id: names its staging directory."""
    return uuid.uuid4().hex[:12]


def stage_root(base: str, run_id: str) -> str:
    return os.path.join(base, f"{STAGE_PREFIX}{run_id}")


def open_import(base: str, run_id: str) -> None:
    """Create the run's staging directory and its writers' lock: the driver, before any writer starts."""
    root = stage_root(base, run_id)
    os.mkdir(root)
    os.close(os.open(os.path.join(root, WRITERS_LOCK), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    fsync_dir(root)


@contextlib.contextmanager
def _writing(base: str, run_id: str) -> Iterator[None]:
    """Held by a writer while it stages a partition (see the module doc).

    Raises:
        ImportAborted: the run was aborted or committed (or never opened): nothing may be staged.
    """
    root = stage_root(base, run_id)
    try:
        fd = os.open(os.path.join(root, WRITERS_LOCK), os.O_RDONLY)
    except FileNotFoundError:
        raise ImportAborted(f"{root}: the import was aborted or committed; nothing staged") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        if os.fstat(fd).st_nlink == 0:  # unlinked while we waited
            raise ImportAborted(f"{root}: the import was aborted or committed; nothing staged")
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def _writers_stopped(root: str, wait_s: float) -> Iterator[None]:
    """Wait for the run's writers to stop (at most `wait_s`) and bar new ones, for the commit or the abort: the lock
    held exclusively and unlinked, and held until the staging directory is done with (no lock: nothing to wait for)."""
    path = os.path.join(root, WRITERS_LOCK)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        yield
        return
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    log.warning("%s: writers still running after %.0f s; going on without them", root, wait_s)
                    break
                time.sleep(0.05)
        os.unlink(path)
        yield
    finally:
        os.close(fd)


def check_target(topic: str | None, partition: int | None) -> None:
    """Raises ImportRefused (naming the value and the rule) unless `topic`/`partition` is a partition the broker
    would serve: a topic directory name (§1.3) and an id in 0..65529 (§8)."""
    problem = topic_name_problem(topic)
    if problem:
        raise ImportRefused(f"topic {topic!r} {problem}")
    problem = partition_id_problem(partition)
    if problem:
        raise ImportRefused(f"topic {topic!r}: partition {partition!r} {problem}")


def existing_last_seq(target_dir: str, topic: str, partition: int) -> int | None:
    """The last seq of an existing partition (None: it does not exist or holds no segment).

    Raises:
        ImportRefused: its active segment ends in a torn bundle (appending would seal it as RO).
    """
    return _last_seq(_existing(target_dir, topic, partition))


def _existing(target_dir: str, topic: str, partition: int) -> Partition | None:
    return scan_partition(target_dir, topic, partition) if os.path.isdir(target_dir) else None


def _last_seq(part: Partition | None) -> int | None:
    """The partition's last seq, walking its whole active segment (a torn or malformed one is refused, not sealed;
    so is a partition whose segments claim seqs no reader can return: `storage/completeness.py`)."""
    if part is None:
        return None
    unreadable = [u for u in part.unread if u.first_seq is not None]
    if unreadable:
        raise ImportRefused(f"{unreadable[0]}: move it away or restore the segment before appending")
    if not part.segments:
        return None
    last = part.segments[-1]
    if not last.is_active:
        return last.last
    audit = SegmentAudit(last)
    walk = last.tables()
    for file_offset, table in walk:
        audit.observe(file_offset, table)
    seq = audit.last_seq
    hole = audit.finish(walk.tail)
    if hole is not None:
        raise ImportRefused(f"{hole}: repair the partition before appending")
    if walk.tail is not None and walk.tail.torn_bytes:
        raise ImportRefused(
            f"{last.path}: the active segment ends in a torn bundle at byte {walk.tail.valid_end}: salvage it "
            "before appending (`tank-log maintain BASE --salvage` or jobs/rebuild_indexes.py --salvage)"
        )
    return seq if seq is not None else (part.ro[-1].last if part.ro else None)


def stage_partition(
    base: str,
    run_id: str,
    writer_id: str,
    topic: str,
    partition: int,
    chunks: Iterable[MessageColumns],
    *,
    append: bool,
    segment_bytes: int,
    policy: BundlePolicy | None = None,
    name_ts: int | None = None,
) -> StagedPartition:
    """Write one partition's messages (increasing seqs, in chunks of columns) as segments into the staging area,
    each named with `name_ts` (seconds; default now: see the module doc).

    Raises:
        ImportRefused: the topic or partition cannot be one the broker serves (`names.topic_name_problem`,
            `partition_id_problem`: never a path outside `base`); the partition exists and `append` is false; the
            messages do not start above its last seq; seqs do not increase; or a gap before the new active segment
            cannot be avoided (§9 rule 3).
    """
    check_target(topic, partition)
    target = os.path.join(base, topic, str(partition))
    part = _existing(target, topic, partition)
    last = _last_seq(part)
    if last is not None and not append:
        raise ImportRefused(f"{target}: the partition exists (last seq {last}); append to it or import elsewhere")
    staged = os.path.join(stage_root(base, run_id), writer_id, topic, str(partition))
    with _writing(base, run_id):
        if os.path.exists(staged):  # an earlier attempt of the same writer
            shutil.rmtree(staged)
        ts = int(time.time()) if name_ts is None else name_ts
        written = _write_segments(staged, target, chunks, last, segment_bytes, policy or BundlePolicy(), ts)
    seal = None
    if last is not None and part is not None and part.active is not None:
        seal = (part.active.file_name, format_ro_name(part.active.base, last, _roll_ts(part.active.path)))
    return StagedPartition(
        topic,
        partition,
        staged,
        target,
        written[0].base,
        written[-1].last,
        sum(w.messages for w in written),
        len(written),
        sum(w.size for w in written),
        seal,
    )


def _roll_ts(active_path: str) -> int:
    """The name ts the broker's roll gives an active segment it seals: its log's mtime in seconds (§2.5; never 0,
    §9 rule 6)."""
    return max(1, int(os.stat(active_path).st_mtime))


def _write_segments(
    staged: str,
    target: str,
    chunks: Iterable[MessageColumns],
    last: int | None,
    segment_bytes: int,
    policy: BundlePolicy,
    name_ts: int,
) -> list[WrittenSegment]:
    """The partition's segments written into `staged` (removed again if anything fails)."""
    writer: PartitionWriter | None = None
    prev = last
    try:
        for cols in chunks:
            if not len(cols):
                continue
            _check_increasing(cols, target, prev, "the previous row" if writer else "the partition's last seq")
            if writer is None:  # a gap after the existing segments must sit before an RO segment, never the active one
                gap_before = last is not None and int(cols.seq[0]) != last + 1
                writer = PartitionWriter(
                    staged, segment_bytes=segment_bytes, policy=policy, first_segment_ro=gap_before, name_ts=name_ts
                )
            writer.add_columns(cols)
            prev = int(cols.seq[-1])
        if writer is None:
            raise ImportRefused(f"{target}: no rows")
        written = writer.finish()
    except BaseException as err:
        if writer is not None:
            writer.abort()
        shutil.rmtree(staged, ignore_errors=True)
        if isinstance(err, ValueError):  # what the segment writer refuses
            raise ImportRefused(f"{target}: {err}") from None
        raise
    return written


def _check_increasing(cols: MessageColumns, target: str, prev: int | None, prev_is: str) -> None:
    """Raises ImportRefused unless the seqs increase and start above `prev` (`prev_is` names it)."""
    seq = cols.seq
    steps = np.flatnonzero(seq[1:] <= seq[:-1])
    if prev is not None and int(seq[0]) <= prev:
        bad, before, what = int(seq[0]), prev, prev_is
    elif len(steps):
        bad, before, what = int(seq[steps[0] + 1]), int(seq[steps[0]]), "the previous row"
    else:
        return
    raise ImportRefused(
        f"{target}: seq {bad} is not above {what} ({before}): rows must be sorted by seq, each partition in "
        "one task (repartition(topic, partition) and sortWithinPartitions seq)"
    )


def commit_import(base: str, run_id: str, staged: list[StagedPartition], wait_s: float = WRITERS_WAIT_S) -> None:
    """Move every staged partition into place (see the module doc); crash-safe, recoverable.

    Raises:
        ImportRefused: two writers staged the same partition, or a new partition's directory appeared meanwhile.
    """
    seen: dict[tuple[str, int], str] = {}
    for s in staged:
        if (s.topic, s.partition) in seen:
            raise ImportRefused(
                f"{s.topic}/{s.partition}: rows of one partition were written by two tasks "
                "(repartition(topic, partition) before writing)"
            )
        seen[(s.topic, s.partition)] = s.staged_dir
    root = stage_root(base, run_id)
    for s in staged:
        if s.seal is None and _holds_segments(s.target_dir):
            raise ImportRefused(f"{s.target_dir}: appeared while importing; nothing was moved")
    with _writers_stopped(root, wait_s):  # e.g. a failed attempt's writer still running
        atomic_write(os.path.join(root, MANIFEST), json.dumps([asdict(s) for s in staged]).encode())
        fsync_dir(root)
        _roll_forward(base, root)


def _holds_segments(partition_dir: str) -> bool:
    """Whether a partition directory holds a segment, index or compaction file (by name, §2.1): a directory with
    only a `config` or a `.gitkeep` is a partition without data, which an import may fill."""
    if not os.path.isdir(partition_dir):
        return False
    for name in os.listdir(partition_dir):
        if name.startswith("."):
            continue
        try:
            if parse_name(name) is not None:
                return True
        except TankFormatError:  # a name the broker would mis-parse: not ours to fill around
            return True
    return False


def abort_import(base: str, run_id: str, wait_s: float = WRITERS_WAIT_S) -> None:
    """Remove the staging directory of a run that did not commit, once its running writers have stopped (waiting at
    most `wait_s`; a writer that outlives that leaves a directory the next `recover_imports` removes)."""
    root = stage_root(base, run_id)
    with _writers_stopped(root, wait_s):
        shutil.rmtree(root, ignore_errors=True)


def recover_imports(base: str, *, dry_run: bool = False) -> list[str]:
    """Finish (COMMIT.json present) or remove (absent) interrupted imports under `base`; what was done."""
    done = []
    for name in sorted(os.listdir(base)):
        root = os.path.join(base, name)
        if not name.startswith(STAGE_PREFIX) or not os.path.isdir(root):
            continue
        if os.path.exists(os.path.join(root, MANIFEST)):
            done.append(f"finished the interrupted import {name}")
            if not dry_run:
                _roll_forward(base, root)
        else:
            done.append(f"removed the uncommitted import {name}")
            if not dry_run:
                shutil.rmtree(root)
    if done and not dry_run:
        fsync_dir(base)
    return done


def committed_imports_into(partition_dir: str) -> list[str]:
    """The staging directories (names) of interrupted imports whose COMMIT.json moves segments into the partition
    at `partition_dir` (`BASE/<topic>/<id>`): until their recovery has rolled them forward, its layout is theirs (an
    append may have sealed its active segment and not yet moved the new ones in). An unreadable manifest counts."""
    d = os.path.abspath(partition_dir)
    topic_dir = os.path.dirname(d)
    base, topic, pid = os.path.dirname(topic_dir), os.path.basename(topic_dir), os.path.basename(d)
    found = []
    for name in sorted(os.listdir(base)):
        manifest = os.path.join(base, name, MANIFEST)
        if not name.startswith(STAGE_PREFIX) or not os.path.isfile(manifest):
            continue
        try:
            with open(manifest, "rb") as fh:
                entries = json.load(fh)
            if not any(e["topic"] == topic and str(e["partition"]) == pid for e in entries):
                continue
        except (OSError, ValueError, TypeError, KeyError):
            pass
        found.append(name)
    return found


def finish_imports_into(partition_dir: str) -> list[str]:
    """Finish the interrupted imports into one partition (`committed_imports_into`), each whole; what was done. The
    caller holds the base path's lock."""
    base = os.path.dirname(os.path.dirname(os.path.abspath(partition_dir)))
    done = []
    for name in committed_imports_into(partition_dir):
        _roll_forward(base, os.path.join(base, name))
        done.append(f"finished the interrupted import {name}")
    return done


def _roll_forward(base: str, root: str) -> None:
    with open(os.path.join(root, MANIFEST), "rb") as fh:
        entries = json.load(fh)
    for e in entries:
        s = StagedPartition(**{**e, "seal": tuple(e["seal"]) if e["seal"] else None})
        topic_dir = os.path.dirname(s.target_dir)
        if not os.path.isdir(topic_dir):
            os.makedirs(topic_dir)
            fsync_dir(os.path.dirname(topic_dir))
        if s.seal is None:
            if os.path.isdir(s.target_dir) and not os.listdir(s.target_dir):
                os.rmdir(s.target_dir)  # an empty directory (e.g. made by hand): replaced in one step
            if os.path.isdir(s.staged_dir) and not os.path.isdir(s.target_dir):
                os.rename(s.staged_dir, s.target_dir)
                fsync_dir(topic_dir)
                continue
        else:
            active, sealed = s.seal
            if os.path.exists(os.path.join(s.target_dir, active)):
                os.rename(os.path.join(s.target_dir, active), os.path.join(s.target_dir, sealed))
                fsync_dir(s.target_dir)
        # appending, or a partition directory that holds other files (its `config`): the segments move in one by one
        if os.path.isdir(s.staged_dir):
            for name in _in_commit_order(os.listdir(s.staged_dir)):
                os.rename(os.path.join(s.staged_dir, name), os.path.join(s.target_dir, name))
            fsync_dir(s.target_dir)
    _fill_partition_ids(sorted({os.path.dirname(e["target_dir"]) for e in entries}))
    shutil.rmtree(root)
    fsync_dir(base)


def _fill_partition_ids(topic_dirs: list[str]) -> None:
    """Create the empty partition directories a topic lacks below its highest one: the broker counts digit-named
    entries and serves partitions 0..count-1 (§1.4), so a topic with only `1/` would lose it (or abort startup)."""
    for topic_dir in topic_dirs:
        names = set(os.listdir(topic_dir))
        top = max((int(n) for n in names if n.isascii() and n.isdigit() and int(n) < MAX_PARTITIONS), default=-1)
        missing = [i for i in range(top + 1) if str(i) not in names]  # bounded: ids are below 65530 (§8)
        for i in missing:
            os.mkdir(os.path.join(topic_dir, str(i)))
        if missing:
            fsync_dir(topic_dir)


def _in_commit_order(names: list[str]) -> list[str]:
    """Segments by base, each index before its log, the active segment last (never an active one before the RO
    segments it follows)."""

    def key(name: str) -> tuple[int, int, int]:
        parsed = parse_name(name)
        if not isinstance(parsed, FileName):
            raise ImportRefused(f"{name}: not a segment file in a staged partition")
        return (1 if parsed.kind is Kind.ACTIVE else 0, parsed.base, 0 if parsed.kind is Kind.INDEX else 1)

    return sorted((n for n in names if not n.startswith(".")), key=key)
