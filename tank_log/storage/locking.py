"""Per-partition lock so that two tank-log jobs never mutate the same partition.

The lock is a `.`-prefixed file in the partition directory (the broker ignores such names, docs/FORMAT.md §1.7)
held with `flock`: the kernel releases it when the holder dies, so a crashed job never leaves a stale lock. The
file's content (pid, host, job, start time) is only for humans. The broker itself takes no lock (§1.1), which is
why mutations also require it to be stopped (§9).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time

from tank_log.errors import PartitionLocked

LOCK_NAME = ".tank-log.lock"


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
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if self.blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip()
            os.close(fd)
            raise PartitionLocked(
                f"{os.path.dirname(self.path)} is locked by another job ({holder or 'unknown'})"
            ) from None
        info = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "job": self.job, "since": time.time()})
        os.ftruncate(fd, 0)
        os.pwrite(fd, info.encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> PartitionLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
