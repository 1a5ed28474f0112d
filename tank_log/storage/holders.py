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
from tank_log.storage.locking import is_run_mark

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
    """Refuse a partition another process (the broker) holds; another tank-log run is left to the partition lock.

    Raises:
        PartitionHeld: another process holds the partition (naming it).
    """
    held = foreign(partition_holders(partition_dir))
    if held:
        raise PartitionHeld(held_reason(held))


def foreign(held: list[Holder]) -> list[Holder]:
    """The holders that are not runs of ours (the broker, a reader): they keep mutations out."""
    return [h for h in held if not h.tank_log_run]


def held_reason(held: list[Holder]) -> str:
    """The one line a skipped partition reports: the broker (or another foreign holder) first."""
    others = foreign(held)
    if not others:
        return f"another tank-log run (pid {held[0].pid}) holds it"
    return f"held by another process (stop the broker first, §9 rule 1): {others[0]}"


@dataclass(frozen=True)
class Holder:
    """A process holding a directory, and how."""

    pid: int
    command: str  # its command line (arguments joined by spaces, shortened)
    how: str  # e.g. "has /data/t/0/1-9_1.ilog open"
    tank_log_run: bool = False  # another run of ours (it or its family holds one of our locks or run markers)

    def __str__(self) -> str:
        run = ", another tank-log run" if self.tank_log_run else ""
        return f"pid {self.pid} ({self.command}) {self.how}{run}"


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
    in_maps = _as_in_maps(dirs)
    out = []
    for pid in parents:
        if pid in ours:
            continue
        how = _named_by_command(pid, dirs, exact) or _open_under(pid, dirs) or _mapped_under(pid, in_maps)
        if how:
            out.append(Holder(pid, _command(pid), how, _in_tank_log_run(pid, parents)))
    return out


JOBS = ("maintain", "compact", "retention", "rebuild_indexes", "export_delta", "import_delta")  # entry_points.NAMES


def _runs_ours(argv: list[str]) -> bool:
    """Whether a command line runs one of our programs (from its start: before it can mark itself)."""
    for i, arg in enumerate(argv):
        name = os.path.basename(arg)
        parent = os.path.basename(os.path.dirname(arg))
        if name == "tank-log" or (parent in ("jobs", "entry_points") and name.removesuffix(".py") in JOBS):
            return True
        if arg.startswith(("tank_spark.", "tank_log.tools")) and i and argv[i - 1] == "-m":
            return True
    return False


def _in_tank_log_run(pid: int, parents: dict[int, int]) -> bool:
    """Whether `pid` is a tank-log run: its command line runs one of our programs, or it, an ancestor or a descendant
    of it holds one of our locks or run markers open (its driver, its worker processes, the JVM and spark-submit
    between them)."""
    if _runs_ours(_argv(pid)):
        return True
    family = {pid}
    p = parents.get(pid, 0)
    while p > 1 and p not in family:
        family.add(p)
        p = parents.get(p, 0)
    todo = [pid]
    children: dict[int, list[int]] = {}
    for child, parent in parents.items():
        children.setdefault(parent, []).append(child)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in family:
                family.add(child)
                todo.append(child)
    return any(is_run_mark(target) for member in family for target in _links(member))


def _real(path: str | os.PathLike[str]) -> str:
    return os.path.realpath(os.fspath(path))


def _under(path: str, dirs: list[str]) -> bool:
    return path in dirs or path.startswith(_prefixes(dirs))


def _prefixes(dirs: list[str]) -> tuple[str, ...]:
    """What a path under one of `dirs` starts with (each directory's path and a slash)."""
    return tuple(d.rstrip("/") + "/" for d in dirs)


def _as_in_maps(dirs: list[str]) -> tuple[bytes, ...]:
    """`_prefixes` as `/proc/<pid>/maps` writes paths: bytes, a newline as `\\012`."""
    return tuple(os.fsencode(p.replace("\n", "\\012")) for p in _prefixes(dirs))


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
                if candidate.startswith(("/dev/", "/proc/")):  # e.g. `bash /dev/fd/3`: its fds, not ours to resolve
                    continue
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


def _mapped_under(pid: int, prefixes: tuple[bytes, ...]) -> str | None:
    """The first file process `pid` maps under the directories of `prefixes` (`_as_in_maps`). `maps` names each
    mapped file by its absolute path: a process whose `maps` contains none of the prefixes maps nothing under them,
    and one search of the whole text rules out most processes (a JVM maps thousands of files: parsing every line of
    every process took ~1 ms per process per partition)."""
    try:
        with open(f"{PROC}/{pid}/maps", "rb") as fh:
            text = fh.read()
    except OSError:
        return None
    if not any(p in text for p in prefixes):
        return None
    for line in text.split(b"\n"):
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith(prefixes):
            return f"maps {os.fsdecode(parts[5].removesuffix(b' (deleted)'))}"  # as `maps` writes it: one line
    return None
