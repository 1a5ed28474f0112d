"""Repair of interrupted compactions (docs/FORMAT.md §6.4 "Recommended recovery"), broker-made leftovers."""

import os

from conftest import copy_tree, data_dir

from tank_log.maintenance.verify import check_partition
from tank_log.storage.datadir import scan_partition
from tank_log.storage.repair import repair_partition


def _msgs(d):
    return [(m.seq, m.value) for s in scan_partition(d, "kv", 0).segments for m in s.messages()]


def test_rollback_removes_broker_placeholders(tmp_path):
    base = copy_tree(data_dir("E_before"), str(tmp_path / "e"))
    d = os.path.join(base, "kv", "0")
    before = _msgs(d)
    for name in ["2-0_0.ilog.cleaned", "2.index.cleaned", "7136-8058_1795265101.ilog.swap", "7136.index.swap"]:
        open(os.path.join(d, name), "wb").write(b"partial")
    part = scan_partition(d, "kv", 0)
    assert len(part.leftovers) == 4 and {p.code for p in check_partition(part)} >= {"compaction-leftover"}
    res = repair_partition(d)
    assert res.action == "rollback" and len(res.removed) == 4
    assert _msgs(d) == before
    assert check_partition(scan_partition(d, "kv", 0)) == []


def test_rollforward_after_phase_b_like_the_broker_left_it(tmp_path):
    """The broker's observed phase-B crash (§6.4 table): output `.swap`, inputs partly `.old`; the broker itself
    would resurrect the `.old` inputs next to the outputs (overlap)."""
    after = copy_tree(data_dir("E_after"), str(tmp_path / "after"))
    before = copy_tree(data_dir("E_before"), str(tmp_path / "before"))
    a, b = os.path.join(after, "kv", "0"), os.path.join(before, "kv", "0")
    expected = [m for m in _msgs(a) if m[0] <= 8058] + [m for m in _msgs(b) if m[0] > 8058]
    # outputs of a compaction of seq 1..8058 as .swap next to the inputs, the first three inputs renamed .old
    for name in ["2-7135_1795265100.ilog", "2.index", "7136-8058_1795265101.ilog", "7136.index"]:
        os.rename(os.path.join(a, name), os.path.join(b, name + ".tmp-swap"))
    inputs = sorted((n for n in os.listdir(b) if n.endswith(".ilog")), key=lambda n: int(n.split("-")[0]))
    for name in inputs[:3]:
        os.rename(os.path.join(b, name), os.path.join(b, name + ".old"))
        idx = name.split("-")[0] + ".index"
        os.rename(os.path.join(b, idx), os.path.join(b, idx + ".old"))
    for name in os.listdir(b):
        if name.endswith(".tmp-swap"):
            os.rename(os.path.join(b, name), os.path.join(b, name[: -len(".tmp-swap")] + ".swap"))
    res = repair_partition(b)
    assert res.action == "rollforward"
    assert _msgs(b) == expected
    assert check_partition(scan_partition(b, "kv", 0)) == []
