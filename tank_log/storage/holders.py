"""Who else serves or holds a base path or partition: "the broker is stopped" is checked, not trusted (docs/FORMAT.md
§9 rule 1; the broker takes no lock, §1.1).

A process holds a directory when its command line names it or a path under it (the broker runs as `tank -p BASE`),
when it has a file under it open (`/proc/<pid>/fd`) or mapped (`/proc/<pid>/maps`: the broker mmaps indexes, §9).
Our own process, its ancestors (the shell, Airflow, the Spark driver that started us) and its descendants are not
holders. Processes whose `/proc` entries we may not read (another user's, without privileges) are checked by their
command line only, which is world-readable. A process whose main thread has exited while its other threads run
shows its files, maps and command line only under a thread's entry (`/proc/<pid>/task/<tid>`): read there.

One look at every process serves every partition of a run (`partition_holders`): a scan of `/proc` indexed by path,
so that a partition's check is a few lookups, not a read of every process's descriptors and maps (a topic of 65,530
partition directories, most of them empty, is a legal layout). The mapped files are indexed at a scan's second check:
its first searches each process's `maps` as the scan read it (a scan that serves one partition, as each of a run's
slow partitions gets, does not parse them). The scan is kept fresh enough to keep the broker out:
- a process started since the scan is seen within `NEW_S` (the pid list is read again, new pids read in full): a
  broker started during a run is seen by the next partition's check; a process the scan saw in its first `SETTLE_S`
  (a fork's child that may not have exec'd the broker yet) has its command line read again at each check until then;
- every process is read again at least every `RESCAN_S` (or ten times a scan's own duration on a machine where a
  scan is slower, so that scans take at most a tenth of a run): what a process that existed at the scan opened or
  mapped since (or became by exec) is seen within that bound;
- a process the scan finds holding the partition is read again before it is reported: one that let go, exited or
  became a zombie is not a holder; one that is exiting or whose command line cannot be read (the kernel drops an
  exiting process's memory, and so its command line, before its descriptors) is watched for up to `UNNAMED_WAIT_S`
  and reported only if it still holds the partition then, named by what `/proc` still says of it (its `comm`, its
  executable, whether it is exiting), never as a blank.
`holders` (a base path's check before a broker starts, a wait for it to stop) always looks afresh.
"""

from __future__ import annotations

import bisect
import os
import re
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from tank_log.errors import PartitionHeld
from tank_log.storage.locking import is_run_mark

PROC = "/proc"
NEW_S = 0.01  # a process started this long before a partition's check is seen by it
RESCAN_S = 1.0  # every process is read again at least this often (see RESCAN_SHARE)
RESCAN_SHARE = 10  # ... or this many times a scan's own duration, when that is longer
SETTLE_S = 1.0  # a process younger than this may still exec (a fork's child becoming the broker): see `add_new`
UNNAMED_WAIT_S = 5.0  # how long a holder whose command line cannot be read is watched (once a scan) before it is
# reported: a large process's exit unmaps its memory before it closes its files
PF_EXITING = 0x4  # `flags` of /proc/<pid>/stat (include/linux/sched.h): the process is exiting

_also_ours: list[int] = []  # pids whose process family counts as ours too (`also_ours`)
_pause = time.sleep  # how a check waits before it looks at an unnamed holder again (tests make it deterministic)


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
    """`holders` of one partition directory: files under it, or a command line naming it or its base path. Served
    by the run's scan of `/proc`, kept fresh as the module says."""
    d = os.path.abspath(os.fspath(partition_dir))
    global _scan
    with _scan_lock:
        now = time.monotonic()
        if _scan is None or _scan.owner != os.getpid() or now - _scan.taken > _scan.max_age:
            if not os.path.isdir(PROC):
                return []
            _scan = _Scan()
        elif now - _scan.listed > NEW_S:
            _scan.add_new()
        return _scan.holders([_scan.real(d)], {_scan.real(os.path.dirname(os.path.dirname(d)))})


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
    if all(h.exiting for h in others):
        return f"held by a process that is exiting (its files go when it ends: run again): {others[0]}"
    return f"held by another process (stop the broker first, §9 rule 1): {next(h for h in others if not h.exiting)}"


@dataclass(frozen=True)
class Holder:
    """A process holding a directory, and how."""

    pid: int
    command: str  # its command line (arguments joined by spaces, shortened), or what /proc says of it without one
    how: str  # e.g. "has /data/t/0/1-9_1.ilog open"
    tank_log_run: bool = False  # another run of ours (it or its family holds one of our locks or run markers)
    exiting: bool = False  # it was exiting, and still held the directory `UNNAMED_WAIT_S` later

    def __str__(self) -> str:
        run = ", another tank-log run" if self.tank_log_run else ""
        return f"pid {self.pid} ({self.command}) {self.how}{run}"


def holders(directories: Iterable[str | os.PathLike[str]], *, names: Iterable[str] = ()) -> list[Holder]:
    """Processes other than ours that hold any of `directories` (open or mapped files under them, or a command line
    naming them or a path under them), plus those whose command line names one of `names` (e.g. the base path of a
    partition: `tank -p BASE` serves every partition under it). Empty on systems without `/proc`. A fresh look at
    every process (a caller waiting for the broker to stop polls it); it also serves the next `partition_holders`."""
    dirs = [_real(d) for d in directories]
    exact = {_real(n) for n in names}
    if not os.path.isdir(PROC):
        return []
    global _scan
    with _scan_lock:
        _scan = _Scan()
        return _scan.holders(dirs, exact)


@dataclass
class _Proc:
    """What one look at a process found: its parent, state, flags and name (`/proc/<pid>/stat`), where its other
    entries are, and, when read, its command line with the paths it names, its open files and its mapped files."""

    pid: int
    ppid: int
    state: str
    flags: int
    comm: str
    where: str | None  # /proc/<pid>, or a live thread's entry when the main thread has exited; None: holds nothing
    start: float  # when it started, in seconds since the boot
    argv: list[str] | None = None
    named: list[str] | None = None  # the real paths its command line names
    opened: list[str] | None = None  # its descriptors' targets as /proc shows them (maybe ending " (deleted)")
    mapped: list[str] | None = None  # its mapped files as `maps` writes them (a newline as `\\012`)
    maps_text: bytes | None = None  # its `maps` as a full look read it, until the scan takes it (`_Scan.take_maps`)

    @property
    def exiting(self) -> bool:
        return bool(self.flags & PF_EXITING)

    @property
    def young(self) -> bool:
        return time.clock_gettime(time.CLOCK_BOOTTIME) - self.start < SETTLE_S


_Entry = tuple[str, int, str]  # (path, pid, how) in a sorted index

_scan: _Scan | None = None
_scan_lock = threading.Lock()


def _forget_in_child() -> None:
    """A forked child takes a scan of its own (it is another process: its own family is ours), and a lock another
    thread of its parent held while it forked is not held in it."""
    global _scan, _scan_lock
    _scan, _scan_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


class _Scan:
    """One look at every process, indexed by the paths they hold, plus the processes started since (`add_new`)."""

    def __init__(self) -> None:
        t0 = time.monotonic()
        self.owner = os.getpid()
        self.procs: dict[int, _Proc] = {}
        for pid in _pids():
            p = _look(pid)
            if p is not None:
                self.procs[pid] = p
        self.extra: dict[int, _Proc] = {}  # started since the scan
        self.young = {pid for pid, p in self.procs.items() if p.young}  # may still exec: see `add_new`
        self.gone: set[int] = set()  # exited since the scan (a reread found no such process)
        self.version = 0
        self._ours: tuple[tuple[object, ...], set[int]] | None = None
        self._runs: dict[int, bool] = {}
        self._reals: dict[str, str] = {}
        self.watched: set[int] = set()  # holders without a command line watched for `UNNAMED_WAIT_S` already
        self.checks = 0
        self.unindexed: dict[int, bytes] | None = {}  # pid → `maps` not yet in the index (None: all of it is)
        entries: tuple[list[_Entry], list[_Entry], list[_Entry]] = ([], [], [])
        for p in self.procs.values():
            for index, more in zip(entries, _entries(p), strict=True):
                index += more
            self.take_maps(p)
        self.index = tuple(sorted(index) for index in entries)
        self.taken = self.listed = time.monotonic()
        self.max_age = max(RESCAN_S, RESCAN_SHARE * (self.taken - t0))

    def add_new(self) -> None:
        """Read the processes started since the scan (or since the last call), and index them. A process that was
        young when it was read (a fork's child may not have exec'd yet: the broker is started so) has its command
        line read again, and is read in full again when it changed, until it is `SETTLE_S` old."""
        for pid in _pids():
            if (pid in self.procs or pid in self.extra) and pid not in self.gone:
                continue
            p = _look(pid)
            if p is not None and (p.where is not None or pid not in self.gone):  # not a zombie seen already
                self._index(p)
        for pid in list(self.young):
            known = self.extra.get(pid) or self.procs.get(pid)
            now = _look(pid, lazily=True)
            if known is None or now is None:
                self.young.discard(pid)
                continue
            if (now.start, now.where) != (known.start, known.where) or (
                now.where is not None and _argv_at(now.where) != known.argv
            ):
                again = _look(pid)
                if again is not None:
                    self._index(again)
            if not now.young:
                self.young.discard(pid)
        self.listed = time.monotonic()

    def _index(self, p: _Proc) -> None:
        """Know process `p` from now on (a new one, or one that changed: its old entries are only candidates that
        `holders` reads again)."""
        self.gone.discard(p.pid)
        self.procs.pop(p.pid, None)
        self.extra[p.pid] = p
        if p.young:
            self.young.add(p.pid)
        self.version += 1
        for index, more in zip(self.index, _entries(p), strict=True):
            for entry in more:
                bisect.insort(index, entry)
        self.take_maps(p)

    def take_maps(self, p: _Proc) -> None:
        """The `maps` a full look at `p` read: kept as read until the scan's second check, in the index after it."""
        if p.maps_text is None:
            return
        if self.unindexed is None:
            for m in _parse_maps(p.maps_text):
                bisect.insort(self.index[2], (m, p.pid, _maps(m)))
        else:  # what a process mapped before it changed stays a candidate, as in the index
            self.unindexed[p.pid] = self.unindexed.get(p.pid, b"") + p.maps_text
        p.maps_text = None

    def _index_maps(self) -> None:
        """Every `maps` kept as read, into the index (a scan's second check: it serves more than one partition)."""
        assert self.unindexed is not None
        named, opened, mapped = self.index
        more = [(m, pid, _maps(m)) for pid, text in self.unindexed.items() for m in _parse_maps(text)]
        self.index = (named, opened, sorted(mapped + more))
        self.unindexed = None

    def real(self, path: str) -> str:
        """`os.path.realpath` of a partition directory or base path, its parent's resolved once per scan (a topic's
        partitions share it)."""
        parent, _, leaf = path.rstrip("/").rpartition("/")
        if not parent or leaf in ("", ".", "..") or os.path.islink(path):
            return _real(path)
        real = self._reals.get(parent)
        if real is None:
            real = self._reals[parent] = _real(parent)
        return f"{real.rstrip('/')}/{leaf}"

    def holders(self, dirs: list[str], exact: set[str]) -> list[Holder]:
        """The processes other than ours that hold `dirs` (or name one of `exact`), each read again first."""
        found = self._candidates(dirs, exact)
        ours = self.ours()
        out = []
        for pid in sorted(found):
            if pid in ours or pid in self.gone:
                continue
            live = self._reread(pid, dirs, exact)
            if live is not None:
                p, how = live
                out.append(Holder(pid, _command(p), how, self._in_tank_log_run(p), p.exiting))
        return out

    def _candidates(self, dirs: list[str], exact: set[str]) -> dict[int, str]:
        """pid → how, for what the index (the scan and the processes started since) says holds `dirs` or names
        `exact`."""
        found: dict[int, str] = {}
        self.checks += 1
        if self.unindexed is not None and self.checks > 1:
            self._index_maps()
        named, opened, mapped = self.index
        for index, keys in ((named, [*dirs, *exact]), (opened, dirs)):
            for key in keys:
                for _, pid, how in _at_or_under(index, key, under=key in dirs):
                    found.setdefault(pid, how)
        for prefix in _as_in_maps(dirs):
            for _, pid, how in _under_prefix(mapped, os.fsdecode(prefix)):
                found.setdefault(pid, how)
            # `maps` not indexed yet: a mapped path under `dirs` starts with the prefix, so its text holds it (a
            # process whose text holds it elsewhere is read again, as every candidate is, and is no holder)
            for pid, text in (self.unindexed or {}).items():
                if prefix in text:
                    found.setdefault(pid, _maps(os.fsdecode(prefix)))
        return found

    def ours(self) -> set[int]:
        """`_ours` of the processes the scan knows, for this process and the `also_ours` ones (kept until either
        changes: a forked worker takes a scan of its own)."""
        key = (os.getpid(), tuple(_also_ours), self.version)
        if self._ours is None or self._ours[0] != key:
            self._ours = (key, _ours(self.parents()))
        return self._ours[1]

    def parents(self) -> dict[int, int]:
        return {pid: p.ppid for pid, p in (*self.procs.items(), *self.extra.items()) if pid not in self.gone}

    def _reread(self, pid: int, dirs: list[str], exact: set[str]) -> tuple[_Proc, str] | None:
        """Whether process `pid` holds `dirs` now (read again), and how; one that is exiting or cannot be named (no
        command line: exiting, or it never set one) is watched until it lets go or can be named, for up to
        `UNNAMED_WAIT_S` (once a scan)."""
        in_maps = _as_in_maps(dirs)
        deadline = time.monotonic() + UNNAMED_WAIT_S
        wait = 0.01
        while True:
            p = _look(pid, lazily=True)
            how = _holds(p, dirs, exact, in_maps) if p is not None else None
            if p is None or how is None:
                if p is None or p.where is None:
                    self.gone.add(pid)
                    self.version += 1
                return None
            if (p.argv and not p.exiting) or pid in self.watched:
                return p, how
            if time.monotonic() >= deadline:
                self.watched.add(pid)
                return p, how
            _pause(wait)
            wait = min(2 * wait, 0.2)

    def _in_tank_log_run(self, p: _Proc) -> bool:
        """`_in_tank_log_run`, once per process and scan."""
        if p.pid not in self._runs:
            self._runs[p.pid] = _in_tank_log_run(p, self.parents())
        return self._runs[p.pid]


def _entries(p: _Proc) -> tuple[list[_Entry], list[_Entry], list[_Entry]]:
    """What process `p` holds, as index entries: the paths its command line names, its open files, its mapped files."""
    return (
        [(path, p.pid, _names(path)) for path in p.named or ()],
        [(_strip(t), p.pid, _has(t)) for t in p.opened or () if t.startswith("/")],
        [(m, p.pid, _maps(m)) for m in p.mapped or ()],
    )


def _at_or_under(index: list[_Entry], key: str, *, under: bool) -> Iterator[_Entry]:
    """The entries of a sorted index whose path is `key` or, with `under`, a path under it."""
    i = bisect.bisect_left(index, (key,))
    while i < len(index) and index[i][0] == key:
        yield index[i]
        i += 1
    if under:
        yield from _under_prefix(index, key.rstrip("/") + "/")


def _under_prefix(index: list[_Entry], prefix: str) -> Iterator[_Entry]:
    i = bisect.bisect_left(index, (prefix,))
    while i < len(index) and index[i][0].startswith(prefix):
        yield index[i]
        i += 1


def _holds(p: _Proc, dirs: list[str], exact: set[str], in_maps: tuple[bytes, ...]) -> str | None:
    """How process `p` holds `dirs` (or names one of `exact`): its command line first, then its open files, then
    its mapped files (each read on demand when the look was lazy); None when it does not."""
    if p.where is None:  # a zombie: it holds nothing
        return None
    _fill_named(p)
    for path in p.named or ():
        if path in exact or _under(path, dirs):
            return _names(path)
    if p.opened is None:
        p.opened = list(_links(p.where))
    for target in p.opened:
        if target.startswith("/") and _under(_strip(target), dirs):
            return _has(target)
    if p.mapped is None:
        p.mapped = _mapped(p.where)
    prefixes = tuple(os.fsdecode(b) for b in in_maps)
    for m in p.mapped:
        if m.startswith(prefixes):
            return _maps(m)
    return None


def _names(path: str) -> str:
    return f"names {path} on its command line"


def _has(target: str) -> str:
    return f"has {target} open"


def _maps(mapped: str) -> str:
    return f"maps {_strip(mapped)}"  # as `maps` writes it: one line


def _strip(target: str) -> str:
    return target.removesuffix(" (deleted)")


def _pids() -> list[int]:
    try:
        return [int(e) for e in os.listdir(PROC) if e.isdigit()]
    except OSError:
        return []


def _look(pid: int, *, lazily: bool = False) -> _Proc | None:
    """What `/proc` says of process `pid` (None: there is no such process any more); everything, or with `lazily`
    only its stat (`_holds` reads the rest as it needs it)."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:  # exited since the listing
        return None
    close = stat.rfind(b")")
    fields = stat[close + 2 :].split()  # after "(comm)": state, ppid, pgrp, session, tty, tpgid, flags, ... (proc(5))
    try:
        state, ppid, flags, start = fields[0].decode(), int(fields[1]), int(fields[6]), int(fields[19]) / _TICKS
    except (IndexError, ValueError):
        return None
    comm = stat[stat.find(b"(") + 1 : close].decode(errors="replace")
    p = _Proc(pid, ppid, state, flags, comm, _where(pid, state), start)
    if not lazily and p.where is not None:
        _fill_named(p)
        p.opened = list(_links(p.where))
        p.maps_text = _maps_text(p.where)
    return p


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # the unit of a process's start time in stat


def _where(pid: int, state: str) -> str | None:
    """Where process `pid`'s entries are: its own, or, when its main thread has exited (a zombie leader) while
    other threads run, a live thread's; None for a zombie."""
    if state not in ("Z", "X"):
        return f"{PROC}/{pid}"
    try:
        tids = [t for t in os.listdir(f"{PROC}/{pid}/task") if t != str(pid)]
    except OSError:
        return None
    return f"{PROC}/{pid}/task/{tids[0]}" if tids else None


def _fill_named(p: _Proc) -> None:
    if p.argv is None and p.where is not None:
        p.argv = _argv_at(p.where)
        p.named = _named_paths(p.where, p.argv)


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


def _in_tank_log_run(p: _Proc, parents: dict[int, int]) -> bool:
    """Whether process `p` is a tank-log run: its command line runs one of our programs, or it, an ancestor or a
    descendant of it holds one of our locks or run markers open (its driver, its worker processes, the JVM and
    spark-submit between them)."""
    if _runs_ours(p.argv or []):
        return True
    pid = p.pid
    family = {pid}
    q = parents.get(pid, 0)
    while q > 1 and q not in family:
        family.add(q)
        q = parents.get(q, 0)
    todo = [pid]
    children: dict[int, list[int]] = {}
    for child, parent in parents.items():
        children.setdefault(parent, []).append(child)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in family:
                family.add(child)
                todo.append(child)
    for member in family:
        where = p.where if member == pid else _where(member, "R")
        if where is not None and any(is_run_mark(target) for target in _links(where)):
            return True
    return False


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


def _argv_at(where: str) -> list[str]:
    try:
        with open(f"{where}/cmdline", "rb") as fh:
            raw = fh.read()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _command(p: _Proc, limit: int = 160) -> str:
    """Its command line, or, without one, what /proc still says of it: its name, its executable, whether it is
    exiting."""
    text = " ".join(p.argv or [])
    if not text:
        try:
            exe = os.readlink(f"{p.where}/exe") if p.where else ""
        except OSError:
            exe = ""
        text = f"[{p.comm}]" + (f" {exe}" if exe else "") + " without a command line"
        text += ": exiting" if p.exiting else ""
    return text if len(text) <= limit else text[: limit - 1] + "…"


_named_cache: dict[tuple[str, tuple[str, ...]], list[str]] = {}


def _named_paths(where: str, argv: list[str]) -> list[str]:
    """The real paths of the arguments (or `--opt=VALUE` values) that look like paths, in order (resolved once per
    command line and working directory: a Spark JVM's class path has hundreds)."""
    try:
        cwd = os.readlink(f"{where}/cwd")
    except OSError:
        cwd = "/"
    key = (cwd, tuple(argv[1:]))
    cached = _named_cache.get(key)
    if cached is not None:
        return cached
    out = []
    for arg in argv[1:]:
        for candidate in (arg, arg.split("=", 1)[1] if "=" in arg else ""):
            if candidate and ("/" in candidate or candidate in (".", "..")):
                if candidate.startswith(("/dev/", "/proc/")):  # e.g. `bash /dev/fd/3`: its fds, not ours to resolve
                    continue
                out.append(os.path.realpath(os.path.join(cwd, candidate)))
    if len(_named_cache) > 4096:
        _named_cache.clear()
    _named_cache[key] = out
    return out


def _links(where: str) -> Iterator[str]:
    d = f"{where}/fd"
    try:
        fds = os.listdir(d)
    except OSError:  # another user's process: only its command line is visible
        return
    for fd in fds:
        try:
            yield os.readlink(f"{d}/{fd}")
        except OSError:
            continue


_MAPPED = re.compile(rb"^\S+ \S+ \S+ \S+ \S+ +(/[^\n]*)$", re.MULTILINE)


def _mapped(where: str) -> list[str]:
    """The files a process maps, each once, as `maps` writes them (a JVM maps thousands of regions of a few hundred
    files)."""
    return _parse_maps(_maps_text(where))


def _maps_text(where: str) -> bytes:
    try:
        with open(f"{where}/maps", "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def _parse_maps(text: bytes) -> list[str]:
    return [os.fsdecode(m) for m in dict.fromkeys(_MAPPED.findall(text))]
