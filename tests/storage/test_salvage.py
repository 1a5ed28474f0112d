"""Salvage of torn tails (docs/FORMAT.md §3.11) and its crash safety (storage/salvage.py, storage/repair.py)."""

import hashlib
import os
import shutil

import pytest
from conftest import CRASHED, crash_after_step

from tank_log.errors import NeedsAttention
from tank_log.format.index import read_index
from tank_log.maintenance.indexes import IndexJobOptions, maintain_partition
from tank_log.maintenance.verify import check_partition, verify_path
from tank_log.storage.datadir import partitions_at, scan_partition
from tank_log.storage.repair import repair_base, repair_partition
from tank_log.storage.salvage import plan_salvage, salvage_tail
from tank_log.storage.segment import Segment

SALVAGE = IndexJobOptions(broker_stopped=True, salvage=True)


def _partition(base, key=("events", 2)):
    return next(p for p in partitions_at(base) if p.key == key)


def _tear(path, keep):
    with open(path, "r+b") as fh:
        fh.truncate(keep)


def _torn(fixture_copy, scenario):
    """A_multi events/2 with one torn segment; returns (base, partition dir, torn segment path)."""
    base = fixture_copy("A_multi")
    part = _partition(base)
    seg = {
        "active": part.active,
        "active-at-0": part.active,
        "middle-ro": part.ro[-2],
        "middle-ro-at-0": part.ro[1],
    }[scenario]
    bundles = list(Segment(seg.path).bundles())
    cut_bundle = bundles[0] if scenario.endswith("at-0") else bundles[-1]
    _tear(seg.path, cut_bundle.offset + 7)
    return base, part.path, seg.path


def _messages(pdir):
    part = scan_partition(pdir, "events", 2)
    return [(m.seq, m.value) for s in part.segments for m in s.messages()]


def _logs_digest(pdir):
    """The segment logs of a partition (names and bytes); indexes and `.`-files left out."""
    h = hashlib.sha256()
    for n in sorted(os.listdir(pdir)):
        if not n.startswith(".") and n.endswith(("log", "ilog")):
            h.update(n.encode() + b"\0" + open(os.path.join(pdir, n), "rb").read())
    return h.hexdigest()


def _aborts(base):
    return {(p.code, os.path.basename(p.path)) for p in verify_path(base) if p.aborts}


def _errors(base):
    return sorted((p.code, os.path.basename(p.path)) for p in verify_path(base) if p.severity == "error")


def _salvage_in_child(pdir, k):
    """A salvage that dies right after file operation number k."""

    def run(hook):
        part = scan_partition(pdir, "events", 2)
        seg = next(s for s in part.segments if check_partition_has_torn(s))
        salvage_tail(plan_salvage(seg, part.ro, part.active), on_step=hook)

    return crash_after_step(k, run)


def check_partition_has_torn(seg):
    walk = seg.bundles()
    for _ in walk:
        pass
    return walk.tail.torn_bytes > 0


@pytest.mark.parametrize("scenario", ["active", "middle-ro", "active-at-0", "middle-ro-at-0"])
def test_crash_at_every_salvage_step_then_repair(fixture_copy, tmp_path, scenario):
    """Every intermediate state of a salvage adds no problem the broker aborts on; after `repair` the partition
    holds the messages it held (every complete bundle), and is either as before or fully salvaged and clean."""
    base, pdir, _ = _torn(fixture_copy, scenario)
    original_logs, original_messages = _logs_digest(pdir), _messages(pdir)
    original_aborts, original_errors = _aborts(base), _errors(base)
    ref = str(tmp_path / "ref")
    shutil.copytree(base, ref)
    ref_pdir = os.path.join(ref, "events", "2")
    steps = []
    part = scan_partition(ref_pdir, "events", 2)
    seg = next(s for s in part.segments if check_partition_has_torn(s))
    salvage_tail(plan_salvage(seg, part.ro, part.active), on_step=steps.append)
    assert _errors(ref) == [] and _messages(ref_pdir) == original_messages
    salvaged_logs = _logs_digest(ref_pdir)
    assert len(steps) >= 4
    outcomes = set()
    for k in range(1, len(steps) + 1):
        run = str(tmp_path / f"k{k}")
        shutil.copytree(base, run)
        run_pdir = os.path.join(run, "events", "2")
        assert _salvage_in_child(run_pdir, k) == CRASHED, f"step {k} ({steps[k - 1]}) did not crash"
        assert _aborts(run) <= original_aborts, (k, steps[k - 1], _aborts(run))
        repair_partition(run_pdir)
        assert _messages(run_pdir) == original_messages, (k, steps[k - 1])
        logs = _logs_digest(run_pdir)
        assert logs in (original_logs, salvaged_logs), (k, steps[k - 1])
        if logs == salvaged_logs:
            outcomes.add("salvaged")
            assert _errors(run) == [], (k, steps[k - 1], _errors(run))
        else:
            outcomes.add("original")  # step 1 may already have fixed index problems of the torn segment
            assert set(_errors(run)) <= set(original_errors), (k, steps[k - 1])
        assert _aborts(run) <= original_aborts
        assert not repair_partition(run_pdir).has_work, (k, steps[k - 1])  # repair is idempotent
    assert outcomes == {"original", "salvaged"}


def test_the_reported_kill_state_is_repaired(fixture_copy):
    """Killed after the active log was cut at a bundle start that the index still holds (entry == size):
    `verify` reports index-past-eof (the broker aborts at open); `repair` now drops the entry."""
    base = fixture_copy("A_multi")
    part = _partition(base)
    entries = read_index(part.active.index_path)
    assert len(entries) >= 2
    _tear(part.active.path, entries[-1][1])
    assert ("index-past-eof", os.path.basename(part.active.index_path)) in _aborts(base)
    res = repair_partition(part.path)
    assert res.indexes_trimmed and res.has_work
    assert read_index(part.active.index_path) == entries[:-1]
    assert _errors(base) == []
    assert not repair_partition(part.path).has_work


def test_an_ro_segment_cut_but_not_renamed_is_renamed_by_repair(fixture_copy):
    """A salvage killed between the cut and the rename of an RO segment is finished by repair."""
    base, pdir, path = _torn(fixture_copy, "middle-ro")
    part = scan_partition(pdir, "events", 2)
    seg = next(s for s in part.segments if s.path == path)
    steps = []

    def stop_after_cut(step):
        steps.append(step)
        if step == "log cut":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        salvage_tail(plan_salvage(seg, part.ro, part.active), on_step=stop_after_cut)
    assert "name-last" in {c for c, _ in _errors(base)}
    res = maintain_partition(scan_partition(pdir, "events", 2), SALVAGE)
    assert res.status == "fixed", res
    assert res.repair and res.repair["salvages_finished"]
    assert _errors(base) == []


def test_mid_file_corruption_is_never_cut(fixture_copy):
    """One bit flip in the length varint of the 2nd bundle of events/1's active segment (byte 776)."""
    base = fixture_copy("A_multi")
    part = _partition(base, ("events", 1))
    path = part.active.path
    data = bytearray(open(path, "rb").read())
    assert data[776] == 0x0F
    data[776] = 0x8F
    open(path, "wb").write(bytes(data))
    codes = {p.code for p in check_partition(part)}
    assert "mid-file-corruption" in codes and "torn-tail" not in codes
    res = maintain_partition(part, SALVAGE)
    assert res.status == "needs-attention"
    assert "salvaged" not in [a["action"] for a in res.actions]
    assert open(path, "rb").read() == bytes(data)
    with pytest.raises(NeedsAttention, match="mid-file corruption"):
        plan_salvage(part.active, part.ro, part.active)


def test_torn_first_bundle_of_an_active_only_partition(fixture_copy):
    """A torn tail inside the first bundle: salvaged to an empty active segment (legal without RO data)."""
    base = fixture_copy("A_multi")
    part = _partition(base)
    for s in part.ro:
        os.unlink(s.path)
        os.unlink(s.index_path)
    first = next(Segment(part.active.path).bundles())
    _tear(part.active.path, first.offset + 5)
    part = scan_partition(part.path, "events", 2)
    res = maintain_partition(part, SALVAGE)
    assert res.status == "fixed", res
    assert os.path.getsize(part.active.path) == 0
    assert not os.path.exists(part.active.index_path)
    assert _errors(base) == []


def test_torn_first_bundle_with_ro_data_reactivates_the_last_ro(fixture_copy):
    base, pdir, path = _torn(fixture_copy, "active-at-0")
    messages = _messages(pdir)
    last_ro = scan_partition(pdir, "events", 2).ro[-1]
    res = maintain_partition(scan_partition(pdir, "events", 2), SALVAGE)
    assert res.status == "fixed", res
    (salvaged,) = [a for a in res.actions if a["action"] == "salvaged"]
    assert salvaged["reactivated"] == last_ro.file_name
    after = scan_partition(pdir, "events", 2)
    assert after.active.base == last_ro.base and not os.path.exists(path)
    assert _messages(pdir) == messages and _errors(base) == []


def test_an_ro_segment_torn_in_its_first_bundle_is_removed(fixture_copy):
    base, pdir, path = _torn(fixture_copy, "middle-ro-at-0")
    res = maintain_partition(scan_partition(pdir, "events", 2), SALVAGE)
    assert res.status == "fixed", res
    assert not os.path.exists(path) and _errors(base) == []
    side = [n for n in os.listdir(pdir) if n.startswith(f".{os.path.basename(path)}.torn-at-0")]
    assert len(side) == 1 and os.path.getsize(os.path.join(pdir, side[0])) == 7


def test_our_temporaries_in_the_base_directory_are_reported_and_removed(fixture_copy):
    """A `.cleanup.log` rewrite killed midway leaves `..cleanup.log.tank-log-*.tmp` in the base."""
    base = fixture_copy("A_multi")
    temp = os.path.join(base, "..cleanup.log.tank-log-0123456789ab.tmp")
    open(temp, "wb").write(b"partial")
    assert "leftover-temporary" in {p.code for p in verify_path(base)}
    assert repair_base(base, dry_run=True) == [temp] and os.path.exists(temp)
    assert repair_base(base) == [temp] and not os.path.exists(temp)
    assert "leftover-temporary" not in {p.code for p in verify_path(base)}
