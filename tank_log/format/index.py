"""Index files `<base>.index` (docs/FORMAT.md §4): read, look up, verify against the log, build.

An entry is (rel_seq u32, file_offset u32), little-endian, pointing at the length varint of a bundle whose first
message has seq base+rel_seq. The index is sparse; three writers space entries differently (§4.3):
- append rule (`build_append_rule`): active-segment appends, `log.index.interval.bytes`;
- rebuild rule (`build_rebuild_rule`): the broker's rebuild of a missing index, fixed 4096 step;
- compaction rule (`build_compaction_rule`): > 10000 bytes or > 128 messages since the last entry.
"""

from __future__ import annotations

import bisect
import os
import struct
from collections.abc import Iterable, Sequence

import numpy as np

from tank_log.errors import IndexFormatError, TankFormatError
from tank_log.format.bundle import BundleHeader
from tank_log.format.varint import unframed_size
from tank_log.problems import Problem

ENTRY = struct.Struct("<II")
REBUILD_STEP = 4096  # §4.5: "TODO: respect configuration"
DEFAULT_INDEX_INTERVAL = 4096  # §1.5 log.index.interval.bytes default
COMPACTION_BYTES = 10000  # §6.3
COMPACTION_MESSAGES = 128
REL_SEQ_LIMIT = 1 << 31  # Appendix B: keep relative seqs < 2**31 (§4.6: wider needs the unimplemented _64 index)

Entry = tuple[int, int]


def parse_index(data: bytes, path: str | None = None) -> list[Entry]:
    """Decode index bytes; a size that is not a multiple of 8 raises IndexFormatError.

    Raises:
        IndexFormatError: a size not a multiple of 8 bytes.
    """
    if len(data) % ENTRY.size:
        raise IndexFormatError(f"index size {len(data)} is not a multiple of 8", path, len(data) - len(data) % 8)
    return list(ENTRY.iter_unpack(data))


def read_index(path: str | os.PathLike[str]) -> list[Entry]:
    with open(path, "rb") as fh:
        return parse_index(fh.read(), os.fspath(path))


def usable_entries(index_path: str | os.PathLike[str], log_size: int) -> list[Entry]:
    """The entries a reader may seek with: none unless the index reads and starts with (0, 0) (§4.2); entries at or
    past the end of the log dropped (an active index may run ahead of a torn log, §4.4)."""
    entries = usable_entry_array(index_path, log_size)
    return list(zip(entries[:, 0].tolist(), entries[:, 1].tolist(), strict=True))


def usable_entry_array(index_path: str | os.PathLike[str], log_size: int) -> np.ndarray:
    """`usable_entries` as an (n, 2) int64 array of (rel, offset) rows, read without an object per entry (every
    reader's completeness check reads the index of each segment it walks)."""
    try:
        with open(index_path, "rb") as fh:
            data = fh.read()
    except OSError:
        return np.empty((0, 2), dtype=np.int64)
    if not data or len(data) % ENTRY.size:
        return np.empty((0, 2), dtype=np.int64)
    entries = np.frombuffer(data, dtype="<u4").reshape(-1, 2).astype(np.int64)
    if entries[0, 0] or entries[0, 1]:
        return np.empty((0, 2), dtype=np.int64)
    inside = entries[:, 1] < log_size
    return entries if inside.all() else entries[inside]


def encode_index(entries: Iterable[Entry]) -> bytes:
    return b"".join(ENTRY.pack(rel, off) for rel, off in entries)


def lookup(entries: Sequence[Entry], rel_seq: int) -> Entry:
    """Greatest entry with rel ≤ rel_seq, else the first entry (§4.4 step 3); (0, 0) for an empty index."""
    if not entries:
        return (0, 0)
    i = bisect.bisect_right(entries, (rel_seq, 0xFFFFFFFF))
    return entries[i - 1] if i else entries[0]


# ---- building ---------------------------------------------------------------------------------------------------


def _entry(h: BundleHeader, base: int) -> Entry:
    rel = h.first_seq - base
    if not 0 <= rel < REL_SEQ_LIMIT:
        raise TankFormatError(f"relative seq {rel} does not fit the index (needs a _64 index, §4.6)", offset=h.offset)
    if h.offset > 0xFFFFFFFF:
        raise TankFormatError("bundle offset beyond 4 GiB (§8)", offset=h.offset)
    return rel, h.offset


def build_rebuild_rule(headers: Iterable[BundleHeader], base: int) -> list[Entry]:
    """Entries exactly as the broker's `rebuild_index` writes them (§4.5): the first bundle, then every bundle
    whose header ends at or beyond the previously indexed bundle's start + 4096."""
    out: list[Entry] = []
    last_start = -1
    for h in headers:
        if last_start < 0 or h.set_offset >= last_start + REBUILD_STEP:
            out.append(_entry(h, base))
            last_start = h.offset
    return out


def build_append_rule(
    headers: Iterable[BundleHeader], base: int, interval: int = DEFAULT_INDEX_INTERVAL
) -> list[Entry]:
    """Entries as `append_bundle` writes them when a segment is written in one broker run (§4.3): the first bundle,
    then a bundle when more than `interval` bytes were appended since the start of the last indexed bundle."""
    out: list[Entry] = []
    since = None
    for h in headers:
        if since is None or since > interval:
            out.append(_entry(h, base))
            since = 0
        since += h.size
    return out


def build_compaction_rule(headers: Iterable[BundleHeader], base: int) -> list[Entry]:
    """Entries as the broker's compaction writes them (§6.3): the first bundle, then before a bundle when more than
    10000 bytes or more than 128 messages were written since the last entry. The byte count excludes each bundle's
    length varint (matches every compaction output in the fixtures)."""
    out: list[Entry] = []
    nbytes = nmsgs = 0
    for h in headers:
        if not out or nbytes > COMPACTION_BYTES or nmsgs > COMPACTION_MESSAGES:
            out.append(_entry(h, base))
            nbytes = nmsgs = 0
        nbytes += unframed_size(h.size)
        nmsgs += h.count
    return out


# ---- verification -----------------------------------------------------------------------------------------------


NOT_A_BUNDLE_START = 1  # `entry_disagreements`: no bundle starts at the entry's offset
OTHER_SEQ = 2  # a bundle starts there, with another first seq


def entry_disagreements(entries: np.ndarray, starts: np.ndarray, firsts: np.ndarray, base: int) -> np.ndarray:
    """Per index entry (rows of (rel, offset)): 0 when a bundle of `starts` (file offsets, increasing; `firsts`
    their first seqs) starts at its offset with seq base + rel, else why not (`NOT_A_BUNDLE_START`, `OTHER_SEQ`).
    The check of §4.4 that `verify_index` reports and every reader's completeness check (storage/completeness.py)
    applies, in bulk."""
    out = np.zeros(len(entries), dtype=np.int8)
    if not len(entries):
        return out
    offs = entries[:, 1].astype(np.int64)
    pos = np.searchsorted(starts, offs)
    found = pos < len(starts)
    found[found] = starts[pos[found]] == offs[found]
    out[~found] = NOT_A_BUNDLE_START
    want = (entries[:, 0].astype(np.int64) + base).astype(np.uint64)
    seq_ok = np.zeros(len(entries), dtype=bool)
    seq_ok[found] = firsts[pos[found]] == want[found]
    out[found & ~seq_ok] = OTHER_SEQ
    return out


def disagreeing_entries(entries: np.ndarray, starts: np.ndarray, firsts: np.ndarray, base: int) -> np.ndarray:
    """Indices of the entries `entry_disagreements` finds wrong, in order: a few numpy operations, as every reader's
    completeness check asks once per walked chunk."""
    if not len(entries):
        return np.zeros(0, dtype=np.intp)
    if not len(starts):
        return np.arange(len(entries))
    offs = entries[:, 1]
    pos = np.minimum(starts.searchsorted(offs), len(starts) - 1)  # past the last start: it cannot be equal
    ok = starts[pos] == offs
    ok &= firsts[pos] == (entries[:, 0] + base).astype(np.uint64)
    return np.flatnonzero(~ok)


def verify_index(
    index_path: str,
    data: bytes | None,
    headers: Sequence[BundleHeader] | tuple[np.ndarray, np.ndarray],
    base: int,
    log_size: int,
    *,
    active: bool,
) -> list[Problem]:
    """Check an index against its log's bundle headers (§4.1, §4.2); `data` None = the index file is missing.
    `headers`: the bundles, or their file offsets and first seqs as arrays (increasing offsets).

    What kafka-dump-log checks for Kafka: first entry (0,0), strictly increasing, each entry at a bundle start whose
    first seq matches, no offset past the end, size a multiple of 8. Plus the broker's crash cases: a 0-byte RO
    index (§4.2) and, for the active segment, an entry at or beyond the log size (§2.6).
    """
    has_bundles = bool(len(headers[0]) if isinstance(headers, tuple) else len(headers))
    problems, entries = _read_entries(index_path, data, has_bundles, active=active)
    if not entries:
        return problems
    if isinstance(headers, tuple):
        starts, firsts = headers
    else:
        starts = np.array([h.offset for h in headers], dtype=np.int64)
        firsts = np.array([h.first_seq for h in headers], dtype=np.uint64)
    return problems + _entry_problems(index_path, entries, starts, firsts, base, log_size, active=active)


def _read_entries(
    index_path: str, data: bytes | None, has_bundles: bool, *, active: bool
) -> tuple[list[Problem], list[Entry]]:
    """The index file as a whole: missing, empty, a size that is not a multiple of 8; its complete entries."""
    problems: list[Problem] = []

    def bad(offset: int | None, code: str, message: str, severity: str = "error", aborts: bool = False) -> None:
        problems.append(Problem(index_path, offset, code, message, severity, aborts))

    if data is None:
        if not active:
            bad(
                None,
                "index-missing",
                "RO index missing (the broker rebuilds it on first read; needs write access)",
                "warning",
            )
        else:
            bad(None, "index-missing", "active segment index missing (rebuilt at open; fails in -r mode)", "warning")
        return problems, []
    if not data:
        if not active and has_bundles:
            bad(
                0,
                "index-empty",
                "0-byte RO index: the broker aborts on the first read (§4.2); delete or rebuild it",
                aborts=True,
            )
        elif active and has_bundles:
            bad(0, "index-empty", "empty active index (the broker rebuilds it at open)", "warning")
        return problems, []
    if len(data) % ENTRY.size:
        bad(len(data) - len(data) % 8, "index-size", f"index size {len(data)} is not a multiple of 8")
    entries = list(ENTRY.iter_unpack(data[: len(data) - len(data) % 8]))
    if not entries:
        if not active:
            bad(
                0,
                "index-empty",
                "RO index without a complete entry: the broker aborts on the first read (§4.2)",
                aborts=True,
            )
        return problems, []
    return problems, entries


def _entry_problems(
    index_path: str,
    entries: list[Entry],
    starts: np.ndarray,
    firsts: np.ndarray,
    base: int,
    log_size: int,
    *,
    active: bool,
) -> list[Problem]:
    """Each entry against the log: (0, 0) first, strictly increasing, within the file, at a bundle start whose first
    seq it names."""
    problems: list[Problem] = []

    def bad(offset: int | None, code: str, message: str, severity: str = "error", aborts: bool = False) -> None:
        problems.append(Problem(index_path, offset, code, message, severity, aborts))

    if entries[0] != (0, 0):
        bad(0, "index-first-entry", f"first entry is {entries[0]}, must be (0, 0)")
    arr = np.array(entries, dtype=np.int64).reshape(-1, 2)
    why = entry_disagreements(arr, starts, firsts, base)
    prev: Entry | None = None
    for i, (rel, off) in enumerate(entries):
        pos = i * ENTRY.size
        if prev is not None and (rel <= prev[0] or off <= prev[1]):
            bad(pos, "index-order", f"entry {i} ({rel}, {off}) does not strictly increase after {prev}")
        prev = (rel, off)
        if off >= log_size:
            if active:
                bad(
                    pos,
                    "index-past-eof",
                    f"entry {i} offset {off} >= log size {log_size} (the broker aborts at open)",
                    aborts=True,
                )
            else:
                bad(pos, "index-past-eof", f"entry {i} offset {off} >= log size {log_size}")
            continue
        if why[i] == NOT_A_BUNDLE_START:
            bad(pos, "index-not-bundle-start", f"entry {i} offset {off} is not the start of a bundle")
        elif why[i] == OTHER_SEQ:
            there = int(firsts[int(np.searchsorted(starts, off))])
            bad(
                pos,
                "index-seq-mismatch",
                f"entry {i} says seq {base + rel} at offset {off}, the bundle there starts at seq {there}",
            )
    return problems
