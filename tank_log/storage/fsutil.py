"""Crash-safe file mutations: `.`-prefixed temporary name, fsync file, rename, fsync directory (docs/FORMAT.md §9
rule 8). The broker skips `.`-prefixed names (§1.7), so temporaries never confuse it."""

from __future__ import annotations

import os
import re
import stat
import uuid
from collections.abc import Callable

StepHook = Callable[[str], None]  # called after every file operation of a multi-file protocol (crash tests)

_OUR_TEMP = re.compile(r"^\..*\.tank-log-[0-9a-f]{12}\.tmp$")


def fsync_dir(path: str | os.PathLike[str]) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_path(directory: str | os.PathLike[str], final_name: str) -> str:
    """A unique `.`-prefixed temporary path in `directory` for a file that will become `final_name`."""
    return os.path.join(os.fspath(directory), f".{final_name}.tank-log-{uuid.uuid4().hex[:12]}.tmp")


def is_our_temp(name: str) -> bool:
    """Whether `name` is one of our temporaries (`temp_path`): left only by a killed process, safe to delete."""
    return _OUR_TEMP.match(name) is not None


def our_temps(directory: str | os.PathLike[str]) -> list[str]:
    """Paths of our temporaries in `directory` (see `is_our_temp`)."""
    d = os.fspath(directory)
    return [os.path.join(d, n) for n in sorted(os.listdir(d)) if is_our_temp(n)]


def remove_our_temps(directory: str | os.PathLike[str], *, dry_run: bool = False) -> list[str]:
    """Delete our temporaries in `directory` (the caller holds its lock); return their paths."""
    temps = our_temps(directory)
    if not dry_run and temps:
        for p in temps:
            if os.path.exists(p):
                os.unlink(p)
        fsync_dir(directory)
    return temps


def is_regular_file(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is (a symlink to) a regular file — not a directory, FIFO, socket, device or broken link."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except FileNotFoundError:
        return False


def write_file_synced(path: str, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def remove_if_exists(path: str | os.PathLike[str]) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def write_temp_then_rename(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to a temporary beside `path`, fsync, rename to `path` (the caller fsyncs the directory); the
    temporary is removed when anything fails (a full disk must not stay full of our leftovers)."""
    path = os.fspath(path)
    tmp = temp_path(os.path.dirname(path) or ".", os.path.basename(path))
    try:
        write_file_synced(tmp, data)
        os.replace(tmp, path)
    except BaseException:
        remove_if_exists(tmp)
        raise


def atomic_write(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace `path` with `data` atomically and durably."""
    path = os.fspath(path)
    write_temp_then_rename(path, data)
    fsync_dir(os.path.dirname(path) or ".")
