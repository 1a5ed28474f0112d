"""File names of a partition directory (docs/FORMAT.md §2.1, §2.6 scan, §6.4 compaction temporaries).

The broker splits a name at its first `.`; the stem carries unpadded decimal numbers. It parses `.ilog` numbers
without validating digits, so garbage names become garbage segments: we reject anything that is not canonical
decimal (no sign, no leading zero), out of range (seq u64 >= 1, ts u32), or `last < base` (an assertion abort in
the broker).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from tank_log.errors import SegmentNameError
from tank_log.format.varint import U32_MAX, U64_MAX

_NUM = r"(0|[1-9][0-9]*)"
_RO_RE = re.compile(rf"{_NUM}-{_NUM}(?:_{_NUM})?")
_ACTIVE_RE = re.compile(rf"{_NUM}(?:_{_NUM})?")
_INDEX_RE = re.compile(rf"{_NUM}(_64)?")

COMPACTION_SUFFIXES = (".cleaned", ".swap", ".old")
MAX_PARTITIONS = 65530  # TANK_Limits::max_topic_partitions (§8): partition ids 0..65529
MAX_TOPIC_NAME_BYTES = 255  # a topic name is a strwlen8_t (§1.3)
SIDE_FILE = re.compile(r"^\.(?P<log>.+)\.torn-at-(?P<cut>0|[1-9][0-9]*)$")  # the bytes a salvage cut (§3.11)


class Kind(Enum):
    RO = "ilog"
    ACTIVE = "log"
    INDEX = "index"


@dataclass(frozen=True, order=True)
class FileName:
    """A parsed segment log or index name.

    `last` is set for RO logs only; `ts` is None for legacy names (docs/FORMAT.md §2.1: "ts treated as 0");
    `wide` marks `<base>_64.index` (§4.6, never written by the broker, crashes it).
    """

    base: int
    kind: Kind
    last: int | None = None
    ts: int | None = None
    wide: bool = False

    @property
    def name(self) -> str:
        if self.kind is Kind.RO:
            return format_ro_name(self.base, self.last, self.ts)  # type: ignore[arg-type]
        if self.kind is Kind.ACTIVE:
            return format_active_name(self.base, self.ts)
        return format_index_name(self.base, wide=self.wide)


@dataclass(frozen=True)
class CompactionTemp:
    """A compaction leftover `<inner>.cleaned|.swap|.old` (docs/FORMAT.md §6.4); `inner` is the final name.

    `inner` is None only for `.cleaned` files whose name is not a valid segment name, such as the broker's
    placeholder `<base>-0_0.ilog.cleaned` written before the output's last seq is known (the broker unlinks every
    `.cleaned` at open, whatever its name, §2.6).
    """

    inner: FileName | None
    stage: str  # "cleaned" | "swap" | "old"


def _num(text: str, name: str, limit: int, what: str) -> int:
    value = int(text)
    if value > limit:
        raise SegmentNameError(f"{what} {value} out of range in file name {name!r}")
    return value


def _parse_plain(name: str, stem: str, rest: str) -> FileName | None:
    if rest == "ilog":
        m = _RO_RE.fullmatch(stem)
        if not m:
            raise SegmentNameError(f"not a valid segment name (want <base>-<last>[_<ts>].ilog): {name!r}")
        base = _num(m[1], name, U64_MAX, "base")
        last = _num(m[2], name, U64_MAX, "last")
        ts = _num(m[3], name, U32_MAX, "timestamp") if m[3] is not None else None
        if base == 0:
            raise SegmentNameError(f"base sequence number 0 is never assigned: {name!r}")
        if last < base:
            raise SegmentNameError(f"last < base in segment name (the broker aborts on it): {name!r}")
        return FileName(base, Kind.RO, last, ts)
    if rest == "log":
        m = _ACTIVE_RE.fullmatch(stem)
        if not m:
            raise SegmentNameError(f"not a valid active segment name (want <base>[_<ts>].log): {name!r}")
        base = _num(m[1], name, U64_MAX, "base")
        ts = _num(m[2], name, U32_MAX, "timestamp") if m[2] is not None else None
        if base == 0:
            raise SegmentNameError(f"base sequence number 0 is never assigned: {name!r}")
        return FileName(base, Kind.ACTIVE, None, ts)
    if rest == "index":
        m = _INDEX_RE.fullmatch(stem)
        if not m:
            raise SegmentNameError(f"not a valid index name (want <base>.index): {name!r}")
        return FileName(_num(m[1], name, U64_MAX, "base"), Kind.INDEX, wide=m[2] is not None)
    return None


def topic_name_problem(name: str | None) -> str | None:
    """Why `name` cannot be a topic the broker loads from its base path, or None: a directory directly under the base
    path whose name does not start with `.` (§1.2, §1.3), at most 255 bytes (§8). The `CreateTopic` API is stricter
    (1..64 of `[A-Za-z0-9_-]`); the broker serves any such directory."""
    if name is None:
        return "is null (every row needs its topic)"
    if not name or name in (".", ".."):
        return "is not a directory name (§1.3: a topic is a directory under the base path)"
    if "/" in name or "\0" in name:
        return "contains '/' or NUL: not one directory under the base path (§1.3)"
    if name.startswith("."):
        return "starts with '.': the broker ignores such a directory as a stray topic (§1.2)"
    if len(name.encode("utf-8", "surrogatepass")) > MAX_TOPIC_NAME_BYTES:
        return f"is longer than {MAX_TOPIC_NAME_BYTES} bytes (§1.3, §8)"
    return None


def partition_id_problem(partition: int | None) -> str | None:
    """Why `partition` cannot be a partition id, or None: ids are 0..65529 (u16, at most 65530 per topic, §8)."""
    if partition is None:
        return "is null (every row needs its partition)"
    if not 0 <= partition < MAX_PARTITIONS:
        return f"is outside 0..{MAX_PARTITIONS - 1} (partition ids are u16, at most {MAX_PARTITIONS} per topic, §8)"
    return None


def parse_name(name: str, path: str | None = None) -> FileName | CompactionTemp | None:
    """Parse a partition-directory entry name (`path`: the file, named in errors; default the name itself).

    Returns None for names the broker ignores or treats specially (`.`-prefixed, `config`, other extensions).

    Raises:
        SegmentNameError: a segment/index extension with a name that is not canonical (names the file).
    """
    try:
        return _parse_name(name)
    except SegmentNameError as err:
        raise err.located(path or name) from None


def parse_log_name(name: str) -> FileName | None:
    """The parsed name of a segment log (RO or active); None for anything else, including names the broker would
    mis-parse (verify and the partition scan report those; recovery code leaves them alone)."""
    try:
        parsed = _parse_name(name)
    except SegmentNameError:
        return None
    return parsed if isinstance(parsed, FileName) and parsed.kind is not Kind.INDEX else None


def segment_logs(names: Iterable[str]) -> dict[str, FileName]:
    """The segment logs among directory entries: entry name → parsed name (see `parse_log_name`)."""
    return {n: f for n in names if (f := parse_log_name(n)) is not None}


def _parse_name(name: str) -> FileName | CompactionTemp | None:
    if not name or name.startswith(".") or name == "config":
        return None
    stem, dot, rest = name.partition(".")
    if not dot:
        return None
    for suffix in COMPACTION_SUFFIXES:
        if rest.endswith(suffix):
            inner_rest = rest[: -len(suffix)]
            try:
                inner = _parse_plain(name, stem, inner_rest)
            except SegmentNameError:
                if suffix != ".cleaned":
                    raise
                return CompactionTemp(None, "cleaned")
            if inner is None:
                return None
            return CompactionTemp(inner, suffix[1:])
    return _parse_plain(name, stem, rest)


def format_ro_name(base: int, last: int, ts: int | None) -> str:
    """`<base>-<last>_<ts>.ilog` (or legacy `<base>-<last>.ilog` when ts is None).

    Raises:
        ValueError: last < base, or numbers out of range.
    """
    if not 1 <= base <= last <= U64_MAX:
        raise ValueError(f"invalid RO segment range {base}-{last}")
    return f"{base}-{last}.ilog" if ts is None else f"{base}-{last}_{_check_ts(ts)}.ilog"


def format_active_name(base: int, ts: int | None) -> str:
    """`<base>_<ts>.log` (or legacy `<base>.log` when ts is None).

    Raises:
        ValueError: numbers out of range.
    """
    if not 1 <= base <= U64_MAX:
        raise ValueError(f"invalid segment base {base}")
    return f"{base}.log" if ts is None else f"{base}_{_check_ts(ts)}.log"


def side_file_name(log_name: str, cut: int) -> str:
    """`.<log>.torn-at-<cut>`: the bytes a salvage cut off `log_name` at offset `cut` (`.`-prefixed: the broker
    ignores it, §1.7)."""
    return f".{log_name}.torn-at-{cut}"


def format_index_name(base: int, *, wide: bool = False) -> str:
    """`<base>.index` (`<base>_64.index` only to name the reserved wide form; never write it)."""
    return f"{base}_64.index" if wide else f"{base}.index"


def name_ts_from_message_ts(message_ts: int, now: float | None = None) -> int:
    """A name timestamp (u32 seconds, §2.2) for a segment from one of its message timestamps: the message ts read as
    ms (§3.7) when that is a plausible time (after the epoch, not beyond a day from now), else the clock — producers
    writing µs or ns would otherwise give a name ts past u32 (or far in the future, which age retention never
    deletes). Never 0 (§9 rule 6)."""
    now = time.time() if now is None else now
    seconds = message_ts // 1000
    return seconds if 0 < seconds <= now + 86400 else int(now)


def _check_ts(ts: int) -> int:
    if not 0 <= ts <= U32_MAX:
        raise ValueError(f"name timestamp out of u32 range: {ts}")
    return ts
