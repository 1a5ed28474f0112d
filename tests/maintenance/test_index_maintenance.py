"""Index/integrity maintenance (docs/FORMAT.md §4, §3.11, §6.4) against what the real broker rebuilt."""

import glob
import os
from collections import defaultdict

import pytest
from conftest import FIXTURES, copy_tree, load_dump, tree_digest

from tank_log.maintenance.indexes import IndexJobOptions, maintain_partition
from tank_log.maintenance.verify import check_partition
from tank_log.storage.datadir import partitions_at, scan_partition
from tank_log.storage.segment import Segment

D = os.path.join(FIXTURES, "D_index_rebuild")
SET_DATA = {"B_compaction_restart_after": os.path.join(FIXTURES, "B_compaction_restart", "after", "data")}
STOPPED = IndexJobOptions(broker_stopped=True)


def rebuilt_by_set():
    out = defaultdict(list)
    for p in glob.glob(os.path.join(D, "rebuilt", "**", "*.index"), recursive=True):
        setname, rel = os.path.relpath(p, os.path.join(D, "rebuilt")).split(os.sep, 1)
        out[setname].append(rel)
    return out


def corrupt(path, mode):
    data = open(path, "rb").read()
    if mode == "deleted":
        os.unlink(path)
    elif mode == "truncated":
        open(path, "wb").write(data[:5] if len(data) > 8 else data[:3])
    elif mode == "zeroed":
        open(path, "wb").write(b"")
    elif mode == "corrupted":
        b = bytearray(data)
        b[0:8] = (7).to_bytes(4, "little") + (3).to_bytes(4, "little")  # first entry (7, 3): wrong
        open(path, "wb").write(bytes(b))


@pytest.mark.parametrize("mode", ["deleted", "truncated", "zeroed", "corrupted"])
def test_rebuilt_indexes_equal_the_brokers(tmp_path, mode):
    for setname, rels in sorted(rebuilt_by_set().items()):
        src = SET_DATA.get(setname, os.path.join(FIXTURES, setname, "data"))
        base = copy_tree(src, str(tmp_path / setname))
        touched = set()
        for rel in rels:
            corrupt(os.path.join(base, rel), mode)
            touched.add(os.path.dirname(rel))
        for rel_dir in sorted(touched):
            (part,) = partitions_at(os.path.join(base, rel_dir))
            res = maintain_partition(part, STOPPED)
            assert res.status == "fixed", (setname, rel_dir, res)
            codes = {f["code"] for f in res.found}
            expected = {
                "deleted": "index-missing",
                "truncated": "index-size",
                "zeroed": "index-empty",
                "corrupted": "index-first-entry",
            }[mode]
            if mode == "zeroed" and any(f["path"].endswith(".index") and "active" in f["message"] for f in res.found):
                expected = "index-empty"
            assert expected in codes, (rel_dir, codes)
        for rel in rels:
            with (
                open(os.path.join(base, rel), "rb") as got,
                open(os.path.join(D, "rebuilt", setname, rel), "rb") as want,
            ):
                assert got.read() == want.read(), (setname, rel)


def _torn_copy(fixture_copy, name="A_multi", key=("events", 2), ro=False, cut_into_last=7):
    base = fixture_copy(name)
    part = next(p for p in partitions_at(base) if p.key == key)
    sf = part.ro[-1] if ro else part.active
    bundles = list(Segment(sf.path).bundles())
    with open(sf.path, "r+b") as fh:
        fh.truncate(bundles[-1].offset + cut_into_last)
    return base, part, sf, bundles


def test_salvage_active_keeps_every_complete_bundle(fixture_copy):
    base, part, sf, bundles = _torn_copy(fixture_copy)
    res = maintain_partition(part, IndexJobOptions(broker_stopped=True))
    assert res.status == "needs-attention" and any(u["code"] == "torn-tail" for u in res.unfixed)
    res = maintain_partition(part, IndexJobOptions(broker_stopped=True, salvage=True))
    assert res.status == "fixed", res
    salvaged = [a for a in res.actions if a["action"] == "salvaged"][0]
    assert salvaged["cut_at"] == bundles[-1].offset and salvaged["bytes_cut"] == 7
    side = os.path.join(part.path, salvaged["side_file"])
    assert os.path.basename(side).startswith(".") and os.path.getsize(side) == 7
    after = scan_partition(part.path, "events", 2)
    got = [(m.seq, m.value) for s in after.segments for m in s.messages()]
    dump = [(m[0], m[3]) for m in load_dump("A_multi")[("events", 2)]]
    assert got == dump[: len(got)] and len(got) == len(dump) - bundles[-1].count
    assert check_partition(after) == []


def _torn_ro(fixture_copy, which):
    base = fixture_copy("A_multi")
    part = next(p for p in partitions_at(base) if p.key == ("events", 2))
    sf = part.ro[which]
    bundles = list(Segment(sf.path).bundles())
    with open(sf.path, "r+b") as fh:
        fh.truncate(bundles[-1].offset + 7)
    return part, sf, bundles


def test_salvage_ro_segment_renames_to_the_true_last(fixture_copy):
    part, sf, bundles = _torn_ro(fixture_copy, -2)
    res = maintain_partition(part, IndexJobOptions(broker_stopped=True, salvage=True))
    assert res.status == "fixed", res
    salvaged = [a for a in res.actions if a["action"] == "salvaged"][0]
    assert salvaged["renamed_to"] == f"{sf.base}-{bundles[-1].first_seq - 1}_{sf.name.ts}.ilog"
    # the torn messages leave a gap before the next RO segment, which the broker skips (§4.4 step 2)
    assert check_partition(scan_partition(part.path, "events", 2)) == []


def test_salvage_refuses_to_cut_the_last_ro_segment_before_the_active(fixture_copy):
    """Cutting messages off the last RO segment would leave a seq gap before the active segment, which the broker
    aborts on (§4.4: "a tool must never create this layout"): refused, the log left byte for byte."""
    part, sf, bundles = _torn_ro(fixture_copy, -1)
    before = open(sf.path, "rb").read()
    index_before = open(sf.index_path, "rb").read()
    res = maintain_partition(part, IndexJobOptions(broker_stopped=True, salvage=True))
    assert "salvaged" not in [a["action"] for a in res.actions]
    assert res.status == "needs-attention"
    # the index is not rebuilt over the cut: its entry into the torn bundle is evidence of what the log lost
    assert [u["code"] for u in res.unfixed] == ["salvage-refused", "torn-tail", "name-last", "index-not-bundle-start"]
    assert "gap before the active segment" in res.unfixed[0]["message"]
    assert open(sf.path, "rb").read() == before
    assert open(sf.index_path, "rb").read() == index_before


def test_wide_index_is_moved_aside_and_leftovers_repaired(fixture_copy):
    base = fixture_copy("E_before")
    (part,) = partitions_at(base)
    open(os.path.join(part.path, "1_64.index"), "wb").write(b"\0" * 12)
    open(os.path.join(part.path, "1-0_0.ilog.cleaned"), "wb").write(b"partial")
    part = scan_partition(part.path, "kv", 0)
    res = maintain_partition(part, STOPPED)
    assert res.status == "fixed", res
    assert res.repair["action"] == "rollback"
    assert [a["action"] for a in res.actions] == ["moved-aside"]
    assert sorted(n for n in os.listdir(part.path) if "64" in n) == [".1_64.index.moved-aside"]


def test_dry_run_and_idempotence(fixture_copy):
    base = fixture_copy("A_multi")
    (part,) = partitions_at(os.path.join(base, "small", "0"))
    os.unlink(part.ro[1].index_path)
    before = tree_digest(base, include_lock=True)
    res = maintain_partition(part, IndexJobOptions(dry_run=True))
    assert res.status == "dry-run" and res.actions[0]["action"] == "would rebuild-index"
    assert tree_digest(base, include_lock=True) == before
    assert maintain_partition(part, STOPPED).status == "fixed"
    assert maintain_partition(scan_partition(part.path, "small", 0), STOPPED).status == "clean"


def test_unfixable_corruption_is_reported(fixture_copy):
    base = fixture_copy("A_multi")
    (part,) = partitions_at(os.path.join(base, "small", "0"))
    with open(part.ro[0].path, "r+b") as fh:
        fh.seek(1)
        fh.write(b"\xc3")  # flags of the first bundle: bit 7 + codec 3
    res = maintain_partition(part, STOPPED)
    assert res.status == "needs-attention"
    assert any(u["code"] == "format" and u["offset"] == 0 for u in res.unfixed)
