"""Who else serves or holds a base path or partition: "the broker is stopped" is checked, not trusted (docs/FORMAT.md
§9 rule 1; the broker takes no lock, §1.1).

A process holds a directory when its command line names it or a path under it (the broker runs as `tank -p BASE`),
when it has a file under it open (`/proc/<pid>/fd`) or mapped (`/proc/<pid>/maps`: the broker mmaps indexes, §9).
Our own process, its ancestors (the shell, Airflow, the Spark driver that started us) and its descendants are not
holders. Processes whose `/proc` entries we may not read (another user's, without privileges) are checked by their
command line only, which is world-readable.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from tank_log.errors import PartitionHeld

PROC = "/proc"

_also_ours: list[int] = []  # pids whose process family counts as ours too (`also_ours`)


@contextmanager
def also_ours(host: str, pid: int) -> Iterator[None]:
    """Count process `pid` of `host` — e.g. the Spark driver that sent this task — with its ancestors and
    descendants as ours while the block runs, when this is that host (its command line names the base path, and in
    local mode its JVM and Python workers are its descendants). Another host's pid means nothing here."""
    mine = host == socket.gethostname()
    if mine:
        _also_ours.append(pid)
    try:
        yield
    finally:
        if mine:
            _also_ours.remove(pid)


def partition_holders(partition_dir: str | os.PathLike[str]) -> list[Holder]:
    """`holders` of one partition directory: files under it, or a command line naming it or its base path."""
    d = os.path.abspath(os.fspath(partition_dir))
    return holders([d], names=[os.path.dirname(os.path.dirname(d))])


def check_not_held(partition_dir: str | os.PathLike[str]) -> None:
    """Refuse a partition another process holds.

    Raises:
        PartitionHeld: another process holds the partition (naming it).
    """
    held = partition_holders(partition_dir)
    if held:
        raise PartitionHeld(held_reason(held))


def held_reason(held: list[Holder]) -> str:
    """The one line a skipped partition reports."""
    return f"held by another process (stop the broker first, §9 rule 1): {held[0]}"


@dataclass(frozen=True)
class Holder:
    """A process holding a directory, and how."""

    pid: int
    command: str  # its command line (arguments joined by spaces, shortened)
    how: str  # e.g. "has /data/t/0/1-9_1.ilog open"

    def __str__(self) -> str:
        return f"pid {self.pid} ({self.command}) {self.how}"


def holders(directories: Iterable[str | os.PathLike[str]], *, names: Iterable[str] = ()) -> list[Holder]:
    """Processes other than ours that hold any of `directories` (open or mapped files under them, or a command line
    naming them or a path under them), plus those whose command line names one of `names` (e.g. the base path of a
    partition: `tank -p BASE` serves every partition under it). Empty on systems without `/proc`."""
    dirs = [_real(d) for d in directories]
    exact = {_real(n) for n in names}
    if not os.path.isdir(PROC):
        return []
    parents = _parents()
    ours = _ours(parents)
    out = []
    for pid in parents:
        if pid in ours:
            continue
        how = _named_by_command(pid, dirs, exact) or _open_under(pid, dirs) or _mapped_under(pid, dirs)
        if how:
            out.append(Holder(pid, _command(pid), how))
    return out


def _real(path: str | os.PathLike[str]) -> str:
    return os.path.realpath(os.fspath(path))


def _under(path: str, dirs: list[str]) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in dirs)


def _parents() -> dict[int, int]:
    """pid → parent pid of every process."""
    out = {}
    for entry in os.listdir(PROC):
        if not entry.isdigit():
            continue
        try:
            with open(f"{PROC}/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:  # exited since the listing
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()  # after "(comm)": state, ppid, ...
        out[int(entry)] = int(fields[1])
    return out


def _ours(parents: dict[int, int]) -> set[int]:
    """Our process (and any `also_ours` one), their ancestors and their descendants."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    ours: set[int] = set()
    for root in (os.getpid(), *_also_ours):
        ours.add(root)
        p = parents.get(root, os.getppid() if root == os.getpid() else 0)
        while p > 0 and p not in ours:
            ours.add(p)
            p = parents.get(p, 0)
        todo = [root]
        while todo:
            for child in children.get(todo.pop(), []):
                if child not in ours:
                    ours.add(child)
                    todo.append(child)
    return ours


def _argv(pid: int) -> list[str]:
    try:
        with open(f"{PROC}/{pid}/cmdline", "rb") as fh:
            raw = fh.read()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _command(pid: int, limit: int = 160) -> str:
    text = " ".join(_argv(pid))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _named_by_command(pid: int, dirs: list[str], exact: set[str]) -> str | None:
    """The first argument (or `--opt=VALUE` value) that names a path at or under `dirs`, or one of `exact`."""
    try:
        cwd = os.readlink(f"{PROC}/{pid}/cwd")
    except OSError:
        cwd = "/"
    for arg in _argv(pid)[1:]:
        for candidate in (arg, arg.split("=", 1)[1] if "=" in arg else ""):
            if candidate and ("/" in candidate or candidate in (".", "..")):
                path = os.path.realpath(os.path.join(cwd, candidate))
                if path in exact or _under(path, dirs):
                    return f"names {path} on its command line"
    return None


def _links(pid: int) -> Iterator[str]:
    d = f"{PROC}/{pid}/fd"
    try:
        fds = os.listdir(d)
    except OSError:  # another user's process: only its command line is visible
        return
    for fd in fds:
        try:
            yield os.readlink(f"{d}/{fd}")
        except OSError:
            continue


def _open_under(pid: int, dirs: list[str]) -> str | None:
    for target in _links(pid):
        if target.startswith("/") and _under(target.removesuffix(" (deleted)"), dirs):
            return f"has {target} open"
    return None


def _mapped_under(pid: int, dirs: list[str]) -> str | None:
    try:
        with open(f"{PROC}/{pid}/maps") as fh:
            for line in fh:
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and parts[5].startswith("/"):
                    path = parts[5].strip().removesuffix(" (deleted)")
                    if _under(path, dirs):
                        return f"maps {path}"
    except OSError:
        return None
    return None
