"""The base path's `.cleanup.log` as a file (docs/FORMAT.md §1.6): (topic, partition) → last compacted seq, read as
the broker loads it and rewritten atomically (temp + fsync + rename + directory fsync)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from tank_log.errors import TankFormatError
from tank_log.format.cleanup_log import FILE_NAME, CleanupRecord, encode_cleanup_log, parse_cleanup_log
from tank_log.storage.fsutil import atomic_write, remove_our_temps
from tank_log.storage.locking import PartitionLock


def read_cleanup_log(base_path: str | os.PathLike[str]) -> dict[tuple[str, int], int]:
    """(topic, partition) → lastCleanupMaxSeqNum as the broker loads it: last record wins, seq 0 skipped, a record
    no topic can have (an empty topic name: `unusable_records`) dropped as the broker drops unknown topics (§1.6)."""
    path = os.path.join(os.fspath(base_path), FILE_NAME)
    try:
        with open(path, "rb") as fh:
            records = parse_cleanup_log(fh.read(), path)
    except FileNotFoundError:
        return {}
    return {(r.topic, r.partition): r.seq for r in records if r.seq and r.topic}


def unusable_records(base_path: str | os.PathLike[str]) -> list[tuple[int, CleanupRecord]]:
    """(byte offset, record) of each record no topic can have (an empty topic name): the broker drops it, and so do
    we at the next rewrite."""
    path = os.path.join(os.fspath(base_path), FILE_NAME)
    try:
        with open(path, "rb") as fh:
            records = parse_cleanup_log(fh.read(), path)
    except (FileNotFoundError, TankFormatError):
        return []
    out, offset = [], 0
    for r in records:
        if not r.topic:
            out.append((offset, r))
        offset += 1 + len(r.topic.encode("utf-8", errors="surrogateescape")) + 10
    return out


def write_cleanup_log(base_path: str | os.PathLike[str], marks: Mapping[tuple[str, int], int]) -> None:
    """Write all records atomically (temp + fsync + rename + directory fsync)."""
    records = [CleanupRecord(t, p, s) for (t, p), s in sorted(marks.items())]
    atomic_write(os.path.join(os.fspath(base_path), FILE_NAME), encode_cleanup_log(records))


def update_cleanup_log(base_path: str | os.PathLike[str], updates: Mapping[tuple[str, int], int | None]) -> None:
    """Set (or, with None, remove) records for some partitions, keeping the others: read-modify-write under the
    base path's lock, after deleting temporaries a killed rewrite left (docs/FORMAT.md §1.6)."""
    with PartitionLock(base_path, "cleanup-log", blocking=True):
        remove_our_temps(base_path)
        marks = read_cleanup_log(base_path)
        for key, seq in updates.items():
            if seq is None:
                marks.pop(key, None)
            else:
                marks[key] = seq
        write_cleanup_log(base_path, marks)
