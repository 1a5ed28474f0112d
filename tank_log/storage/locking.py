"""Per-partition lock so that two tank-log jobs never mutate the same partition, and the mark a run of ours carries
so that another run tells it from the broker.

The lock is a `.`-prefixed file in the partition directory (the broker ignores such names, docs/FORMAT.md §1.7)
held with `flock`: the kernel releases it when the holder dies, so a crashed job never leaves a stale lock. The
holder unlinks the file before it lets go of the lock, so no lock file stays behind after a run; a process that
opened the file before the unlink finds, once it holds the lock, that the inode it locked is no longer the one at
the path, and tries again (the usual protocol for unlinked lock files). Only a run killed while it held the lock
leaves the file; the next run takes it and removes it. The file's content (pid, host, job, start time) is only for
humans. The broker itself takes no lock (§1.1), which is why mutations also require it to be stopped (§9).

`holding` keeps a partition's lock across several steps of one run (maintain: repair, retention, compaction,
indexes, a final verify): each step's own `PartitionLock` of it, in the same thread, then passes through, so no other
run comes between the steps and the final verify never reads a partition another run is rewriting.

`run_marker` is held open by every mutating run for its whole life: a `.tank-log.run-<pid>` file in each base path,
unlinked as soon as it is created (so it never stays behind, not even after a SIGKILL). `storage/holders.py` tells a
process holding a marker or a lock (or one in its process family) as another tank-log run, never as the broker.
"""

from __future__ import annotations

import contextlib
import contextvars
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterable, Iterator

from tank_log.errors import PartitionLocked

LOCK_NAME = ".tank-log.lock"
MARK_PREFIX = ".tank-log."  # the lock files' and the run markers' names start with it

_HELD: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar("tank_log_held_locks", default=frozenset())


def is_run_mark(path: str) -> bool:
    """Whether an open file (as /proc shows it: a path, maybe ` (deleted)`) is a lock or run marker of ours."""
    return os.path.basename(path.removesuffix(" (deleted)")).startswith(MARK_PREFIX)


class PartitionLock:
    """The lock of one directory: a partition's, or the base path's (taken around `.cleanup.log` rewrites).
    `blocking` waits for the holder instead of raising PartitionLocked."""

    def __init__(self, partition_dir: str | os.PathLike[str], job: str = "tank-log", *, blocking: bool = False):
        self.path = os.path.join(os.fspath(partition_dir), LOCK_NAME)
        self.job = job
        self.blocking = blocking
        self._fd: int | None = None

    def acquire(self) -> PartitionLock:
        """Raises:
        PartitionLocked: another tank-log process holds the lock (non-blocking mode).
        """
        held = _HELD.get()
        if held and os.path.realpath(self.path) in held:  # an enclosing `holding` of this thread has it
            return self
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if self.blocking else fcntl.LOCK_NB))
            except BlockingIOError:
                holder = os.pread(fd, 4096, 0).decode(errors="replace").strip()
                os.close(fd)
                raise PartitionLocked(f"another tank-log run {_describe(holder)} holds it") from None
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # the holder we waited for unlinked it: lock the file at the path now
        info = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "job": self.job, "since": time.time()})
        os.ftruncate(fd, 0)
        os.pwrite(fd, info.encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)  # still ours: nobody else can hold the lock of this inode
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> PartitionLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


@contextlib.contextmanager
def holding(partition_dir: str | os.PathLike[str], job: str) -> Iterator[None]:
    """Hold the lock of `partition_dir` until the block ends; the block's own locks of it pass through.

    Raises:
        PartitionLocked: another tank-log run holds it.
    """
    lock = PartitionLock(partition_dir, job).acquire()
    token = _HELD.set(_HELD.get() | {os.path.realpath(lock.path)})
    try:
        yield
    finally:
        _HELD.reset(token)
        lock.release()


def _describe(holder: str) -> str:
    """`(pid N, job J)` from a lock file's content, or `(pid unknown)`."""
    try:
        info = json.loads(holder)
        return f"(pid {info['pid']}, {info.get('job', 'tank-log')})"
    except (ValueError, KeyError, TypeError):
        return "(pid unknown)"


@contextlib.contextmanager
def run_marker(base_paths: Iterable[str | os.PathLike[str]]) -> Iterator[None]:
    """Mark this process as a tank-log run on `base_paths` while the block runs (see the module doc). A base path
    that does not exist or cannot be written is not marked (the run finds that out itself)."""
    fds = []
    try:
        for base in base_paths:
            path = os.path.join(os.fspath(base), f"{MARK_PREFIX}run-{os.getpid()}")
            try:
                fds.append(os.open(path, os.O_RDONLY | os.O_CREAT, 0o644))
                os.unlink(path)
            except OSError:
                continue
        yield
    finally:
        for fd in fds:
            os.close(fd)
