"""The completeness audit compaction's pass 1 runs on every walked chunk (`storage.completeness.SegmentAudit`): the
index read as one array, a chunk's entries found by a search, not a mask over the whole index; the same verdicts as
the per-entry check `verify` reports, on the real broker's segments."""

from __future__ import annotations

import os
import shutil
import tracemalloc

import numpy as np
import pytest
from conftest import data_dir

from tank_log.format.index import (
    ENTRY,
    disagreeing_entries,
    encode_index,
    entry_disagreements,
    read_index,
    usable_entries,
    usable_entry_array,
)
from tank_log.storage.completeness import SegmentAudit
from tank_log.storage.segment import Segment

SEGMENT = "1226-2349_1795265089.ilog"  # an RO segment of the real broker's compacted topic, 11 index entries


def reference_entries(path: str, log_size: int) -> list[tuple[int, int]]:
    """§4.2 and §4.4 as the readers apply them, entry by entry."""
    try:
        entries = read_index(path)
    except Exception:
        return []
    if not entries or entries[0] != (0, 0):
        return []
    return [e for e in entries if e[1] < log_size]


def test_index_entries_as_an_array_are_the_usable_entries(tmp_path):
    """Every fixture index, and the indexes a reader must not seek with (missing, empty, torn, not starting at
    (0, 0)) or must cut (entries past the log's end), read as an array give the usable entries."""
    cases = []
    for root, _, files in os.walk(data_dir("E_before")):
        cases += [(os.path.join(root, f), 1 << 40) for f in files if f.endswith(".index")]
    good = encode_index([(0, 0), (5, 100), (9, 200), (12, 300)])
    for name, data, size in [
        ("empty", b"", 1000),
        ("torn", good[:-3], 1000),
        ("not-at-zero", encode_index([(0, 4), (5, 100)]), 1000),
        ("past-the-end", good, 250),
        ("out-of-order", encode_index([(0, 0), (9, 200), (5, 100)]), 1000),
    ]:
        (tmp_path / name).write_bytes(data)
        cases.append((str(tmp_path / name), size))
    cases.append((str(tmp_path / "missing"), 1000))
    for path, size in cases:
        arr = usable_entry_array(path, size)
        assert arr.dtype == np.int64 and arr.shape[1:] == (2,)
        assert [tuple(e) for e in arr.tolist()] == reference_entries(path, size) == usable_entries(path, size), path


def test_disagreeing_entries_are_the_ones_verify_reports():
    """The chunk check's shortcut names exactly the entries `verify`'s per-entry check finds wrong (no bundle start
    there, another first seq), before, inside and after the bundles."""
    rng = np.random.default_rng(7)
    for _ in range(300):
        starts = np.unique(rng.integers(0, 2000, rng.integers(0, 40))).astype(np.int64)
        firsts = (np.arange(len(starts)) * 3 + 100).astype(np.uint64)
        picks = rng.integers(0, max(len(starts), 1), rng.integers(0, 20))
        offs = starts[picks] if len(starts) else np.zeros(len(picks), np.int64)
        rels = firsts[picks].astype(np.int64) - 90 if len(starts) else np.zeros(len(picks), np.int64)
        entries = np.stack([rels, offs], axis=1) if len(picks) else np.empty((0, 2), np.int64)
        entries = entries + rng.integers(-1, 2, entries.shape) * (rng.random(entries.shape) < 0.2)
        entries[:, 1] = np.maximum(entries[:, 1], 0)
        base = 10
        want = np.flatnonzero(entry_disagreements(entries, starts, firsts, base))
        assert disagreeing_entries(entries, starts, firsts, base).tolist() == want.tolist()


def audit_of(seg: Segment, chunk_bytes: int):
    audit = SegmentAudit(seg)
    walk = seg.tables(chunk_bytes=chunk_bytes)
    for base, table in walk:
        audit.observe(base, table, None)
    return audit.finish(walk.tail)


@pytest.mark.parametrize("order", ["as-written", "out-of-order"])
def test_an_entry_off_its_bundle_is_found_in_whichever_chunk_holds_it(tmp_path, order):
    """One index entry of a real segment moved off its bundle (a byte on, or to another bundle's start): the audit
    walking the segment in small chunks names that entry (index-data, its offset), wherever it falls; in an index
    whose entries are out of order too."""
    src = os.path.join(data_dir("E_before"), "kv", "0")
    seg_path = shutil.copy(os.path.join(src, SEGMENT), tmp_path / SEGMENT)
    index_path = tmp_path / "1226.index"
    entries = read_index(os.path.join(src, "1226.index"))
    assert len(entries) >= 8
    seg = Segment(seg_path)
    assert audit_of(seg, 4096) is None
    for k in range(1, len(entries)):
        for moved in ((entries[k][0], entries[k][1] + 1), (entries[k][0], entries[k - 1][1])):
            bad = [*entries[:k], moved, *entries[k + 1 :]]
            if order == "out-of-order":  # the last two entries swapped: each still right on its own
                bad[-2:] = bad[:-3:-1] if k < len(bad) - 2 else bad[-2:]
            index_path.write_bytes(encode_index(bad))
            for chunk_bytes in (4096, 1 << 20):
                hole = audit_of(Segment(seg_path), chunk_bytes)
                assert hole is not None and hole.code == "index-data", (k, moved, chunk_bytes)
                assert hole.offset == moved[1], (k, moved, chunk_bytes, hole)


def test_the_audit_holds_an_index_as_an_array(tmp_path):
    """A segment's audit holds its index as numbers, not as an object per entry: a 1 GiB segment's index of 262,144
    entries costs its audit a few MiB, not ~40 (what a tuple of two ints per entry takes)."""
    n = 200_000
    seg_path = tmp_path / f"1-{n}_1795265089.ilog"
    with open(seg_path, "wb") as fh:
        fh.truncate(n * 64)
    (tmp_path / "1.index").write_bytes(b"".join(ENTRY.pack(i, i * 64) for i in range(n)))
    seg = Segment(seg_path)
    tracemalloc.start()
    try:
        audit = SegmentAudit(seg)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(audit.entries) == n
    assert peak / n < 64, f"{peak / n:.0f} bytes per index entry"
