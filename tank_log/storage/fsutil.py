"""Crash-safe file mutations: `.`-prefixed temporary name, fsync file, rename, fsync directory (TANK_FORMAT.md §9
rule 8). The broker skips `.`-prefixed names (§1.7), so temporaries never confuse it."""

from __future__ import annotations

import os
import uuid


def fsync_dir(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_path(directory: str | os.PathLike, final_name: str) -> str:
    """A unique `.`-prefixed temporary path in `directory` for a file that will become `final_name`."""
    return os.path.join(os.fspath(directory), f".{final_name}.tank-log-{uuid.uuid4().hex[:12]}.tmp")


def write_file_synced(path: str, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def atomic_write(path: str | os.PathLike, data: bytes) -> None:
    """Replace `path` with `data` atomically and durably."""
    path = os.fspath(path)
    directory = os.path.dirname(path) or "."
    tmp = temp_path(directory, os.path.basename(path))
    try:
        write_file_synced(tmp, data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(directory)
