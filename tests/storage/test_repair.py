"""Repair of interrupted compactions (docs/FORMAT.md §6.4 "Recommended recovery"), broker-made leftovers."""

import json
import os
import subprocess
import sys

import pytest
from conftest import copy_tree, data_dir, killed_roll, tree_digest

from tank_log.format.bundle import Message
from tank_log.format.index import read_index
from tank_log.maintenance.verify import check_partition
from tank_log.storage.datadir import scan_partition
from tank_log.storage.repair import repair_partition
from tank_log.storage.writer import write_segment


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


CLI = [sys.executable, "-m", "tank_log.tools.cli"]


def _cli(*args):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300)


def _dumped_seqs(path):
    r = _cli("dump", str(path))
    assert r.returncode == 0, r.stderr
    return [json.loads(line)["seq"] for line in r.stdout.splitlines()]


@pytest.mark.parametrize("empty_active", [False, True], ids=["no-active", "empty-active"])
def test_repair_makes_the_last_ro_segment_active_again_after_a_killed_roll(tmp_path, empty_active):
    """A broker killed inside its roll leaves RO segments without a non-empty active segment; its next append would
    hide them all (§2.6, §9 rule 4). verify says so in one line; repair renames the last RO segment back to the
    active name its roll took it from (§2.5 step 2 undone, the index keeping its name), so the layout is the one
    §9 rules 3–4 ask for: RO segments, then a non-empty active segment right after the last RO `last`."""
    d = tmp_path / "base" / "t" / "0"
    msgs = killed_roll(d, empty_active=empty_active)
    part = scan_partition(str(d), "t", 0)
    assert len(part.ro) >= 3
    last_ro = part.ro[-1]
    r = _cli("verify", str(tmp_path / "base"))
    assert r.returncode == 1
    (line,) = r.stdout.splitlines()
    assert line == (
        f"error: {d}: [no-active] RO segments without a non-empty active segment: the broker hides all RO data "
        f"after the next append (§9 rule 4)"
    )
    assert _dumped_seqs(d) == [m.seq for m in msgs]
    before = sorted(os.listdir(d))
    r = _cli("repair", str(d), "--dry-run")
    assert r.returncode == 0 and sorted(os.listdir(d)) == before
    assert json.loads(r.stdout)["active_restored"] == f"{last_ro.file_name} -> {last_ro.base}_{last_ro.ts}.log"

    r = _cli("repair", str(d))
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert report["active_restored"] == f"{last_ro.file_name} -> {last_ro.base}_{last_ro.ts}.log"
    if empty_active:
        assert sorted(os.path.basename(p) for p in report["removed"]) == [f"{len(msgs) + 1}.index"] + [
            n for n in before if n.endswith(".log")
        ]
    else:
        assert report["removed"] == []
    after = scan_partition(str(d), "t", 0)
    assert [s.file_name for s in after.ro] == [s.file_name for s in part.ro[:-1]]
    assert after.active is not None and after.active.file_name == f"{last_ro.base}_{last_ro.ts}.log"
    assert after.active.size == last_ro.size > 0 and after.active.base == after.ro[-1].last + 1
    assert read_index(after.active.index_path)[0] == (0, 0)
    assert set(os.listdir(d)) == {s.file_name for s in after.segments} | {
        os.path.basename(s.index_path) for s in after.segments
    }
    assert check_partition(after) == []
    r = _cli("verify", str(tmp_path / "base"))
    assert r.returncode == 0 and r.stdout == ""
    assert _dumped_seqs(d) == [m.seq for m in msgs]
    assert not repair_partition(d).has_work


def test_repair_leaves_a_last_ro_segment_with_a_torn_tail_and_says_why(tmp_path):
    """The broker truncates a torn tail of its active segment at open (§3.11): made active, the bytes would go. Such
    a segment stays as it is, and repair says why the layout is left."""
    d = tmp_path / "t" / "0"
    killed_roll(d)
    last_ro = scan_partition(str(d), "t", 0).ro[-1]
    with open(last_ro.path, "ab") as fh:
        fh.write(b"\x40\x00\x01")
    before = tree_digest(str(d))
    r = _cli("repair", str(d))
    assert r.returncode == 1 and json.loads(r.stdout)["problems"] == repair_partition(d).problems
    res = repair_partition(d)
    assert not res.has_work and res.active_restored is None
    (problem,) = res.problems
    assert problem.startswith("RO segments without a non-empty active segment") and "[torn-tail]" in problem
    assert tree_digest(str(d)) == before
    assert {p.code for p in check_partition(scan_partition(str(d), "t", 0))} == {"no-active", "torn-tail"}


def test_repair_puts_a_seq_gap_before_the_last_ro_segment_inside_a_segment(tmp_path):
    """A gap between two RO segments is skipped by the broker, one before the active segment aborts it (§4.4): the
    last RO segment after a gap cannot simply become active. Repair merges it with the one before (the gap inside
    one segment as a sparse bundle, §3.6, bundles copied verbatim but the first after the gap), by the compaction
    file protocol, and that segment becomes active: every message reads back, verify is clean."""
    d = tmp_path / "base" / "t" / "0"
    os.makedirs(d)
    msgs = []
    for first in (1, 101):
        part = [Message(s, 1_790_000_000_000 + s, b"k", b"v%d" % s) for s in range(first, first + 6)]
        write_segment(d, part, ts=1_790_000_000)
        msgs += part
    before = tree_digest(str(d))
    dry = repair_partition(d, dry_run=True)
    assert dry.gaps_merged and tree_digest(str(d)) == before
    res = repair_partition(d)
    assert res.problems == [] and res.gaps_merged == [
        "1-6_1790000000.ilog + 101-106_1790000000.ilog -> 1-106: seq gap 7..100 inside one segment (a sparse bundle, "
        "§3.6), so that it can become active (§9 rule 4)"
    ]
    assert res.active_restored == "1-106_1790000000.ilog -> 1_1790000000.log"
    assert sorted(os.listdir(d)) == ["1.index", "1_1790000000.log"]
    part = scan_partition(str(d), "t", 0)
    assert check_partition(part) == []
    assert _dumped_seqs(tmp_path / "base") == [m.seq for m in msgs]
    got = [(m.seq, m.ts, m.key, m.value) for s in part.segments for m in s.messages()]
    assert got == [tuple(m) for m in msgs]


def test_a_merge_across_a_seq_gap_killed_at_any_step_is_finished_by_the_next_repair(tmp_path):
    """The merge replaces two segments by the compaction file protocol: killed after any file operation, the next
    repair rolls it back or forward and finishes; every message reads back, verify is clean."""
    from conftest import CRASHED, crash_after_step

    msgs = [Message(s, 1_790_000_000_000 + s, b"k", b"v%d" % s) for first in (1, 101) for s in range(first, first + 6)]

    def layout(d):
        os.makedirs(d)
        write_segment(d, msgs[:6], ts=1_790_000_000)
        write_segment(d, msgs[6:], ts=1_790_000_000)

    steps = []
    layout(tmp_path / "ref")
    repair_partition(tmp_path / "ref", on_step=steps.append)
    assert len(steps) > 8
    for k in range(1, len(steps) + 1):
        d = tmp_path / f"k{k}"
        layout(d)
        assert crash_after_step(k, lambda hook, d=d: repair_partition(d, on_step=hook)) == CRASHED
        res = repair_partition(d)
        assert res.problems == [], (k, steps[k - 1], res.problems)
        part = scan_partition(str(d), "t", 0)
        assert check_partition(part) == [], (k, steps[k - 1])
        got = [(m.seq, m.ts, m.key, m.value) for s in part.segments for m in s.messages()]
        assert got == [tuple(m) for m in msgs], (k, steps[k - 1])
        assert part.active is not None and not repair_partition(d).has_work


def test_repair_says_what_to_do_with_a_seq_gap_it_cannot_close(tmp_path):
    """The segment before the gap does not read whole: nothing is merged, and the problem says exactly what the
    operator must do."""
    d = tmp_path / "t" / "0"
    os.makedirs(d)
    for first in (1, 101):
        write_segment(
            d, [Message(s, 1_790_000_000_000 + s, b"k", b"v%d" % s) for s in range(first, first + 6)], ts=1_790_000_000
        )
    with open(d / "1-6_1790000000.ilog", "ab") as fh:
        fh.write(b"\x40\x00\x01")  # a torn tail in the segment before the gap
    before = tree_digest(str(d))
    res = repair_partition(d)
    assert not res.has_work and tree_digest(str(d)) == before
    (problem,) = res.problems
    assert "101-106_1790000000.ilog not made active: seq gap or overlap 7..100 before it (§4.4)" in problem
    assert "keep producers off 0 (the broker's next append hides seqs 1..106)" in problem
    assert "restore it and run repair again" in problem and "import it into a fresh base" in problem


def test_maintain_restores_the_active_segment_in_its_repair_step(tmp_path):
    base = tmp_path / "base"
    msgs = killed_roll(base / "t" / "0", empty_active=True)
    r = _cli("maintain", str(base), "--broker-stopped")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    part = scan_partition(str(base / "t" / "0"), "t", 0)
    assert part.active is not None and part.active.base == part.ro[-1].last + 1
    assert check_partition(part) == []
    assert _dumped_seqs(base) == [m.seq for m in msgs]


def _import_killed_after_the_seal(base):
    """A real `commit_import` appending 21..60 to t/0 (1..20), killed (os._exit, like kill -9) right after it sealed
    the active segment and before it moved the new segments in: only RO segments left, the manifest committed."""
    from conftest import CRASHED

    from tank_log.format.messages import MessageColumns
    from tank_log.storage import staging
    from tank_log.storage.partition_writer import write_partition

    def m(lo, hi):
        return [Message(s, 1_800_000_000_000 + s, None, b"v%d" % s) for s in range(lo, hi + 1)]

    d = os.path.join(base, "t", "0")
    write_partition(d, m(1, 20), segment_bytes=200)
    staging.open_import(base, "r")
    cols = [MessageColumns.from_messages(m(21, 60))]
    staged = [staging.stage_partition(base, "r", "0-0", "t", 0, cols, append=True, segment_bytes=300)]
    pid = os.fork()
    if pid == 0:
        real = staging.fsync_dir

        def fsync_then_die(path):
            real(path)
            if os.path.samefile(path, d):  # the first fsync of the partition: right after the seal's rename
                os._exit(CRASHED)

        staging.fsync_dir = fsync_then_die
        try:
            staging.commit_import(base, "r", staged)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == CRASHED
    assert not [n for n in os.listdir(d) if n.endswith(".log")]
    assert os.path.exists(os.path.join(staging.stage_root(base, "r"), staging.MANIFEST))
    return d


@pytest.mark.parametrize("path", ["repair-partition", "maintain", "preflight", "window"])
def test_an_import_killed_after_its_seal_is_finished_before_the_active_segment_is_restored(tmp_path, path):
    """An interrupted `import --append` leaves its partition with RO segments only (the seal done, the new segments
    not yet moved in). Restoring the last RO segment as active there would name it apart from the seal's source, so
    the import's recovery would move its own active segment in beside it: two `.log` files. Every path that repairs
    a partition finishes the import first; a dry run leaves the layout to it."""
    from tank_log.maintenance.preflight import SafetyOptions, preflight

    base = str(tmp_path / "base")
    d = _import_killed_after_the_seal(base)
    dry = repair_partition(d, dry_run=True)
    assert dry.active_restored is None and "the committed import .tank-import-r appends to it" in dry.problems[0]
    if path == "repair-partition":
        r = _cli("repair", d)
        assert r.returncode == 0, r.stdout + r.stderr
    elif path == "maintain":
        r = _cli("maintain", base, "--broker-stopped")
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    elif path == "preflight":
        preflight(scan_partition(d, "t", 0), "compaction", SafetyOptions(broker_stopped=True))
    else:
        from tank_log.jobs import window
        from tank_log.jobs.config import parse_job_config

        (b,) = parse_job_config(
            {
                "brokers": [
                    {
                        "name": "a",
                        "data_dirs": [base],
                        "stop_command": "true",
                        "start_command": "true",
                        "ready_check": "tcp://127.0.0.1:1",
                    }
                ]
            }
        ).brokers
        window.repair_data(b)
    assert not os.path.exists(os.path.join(base, ".tank-import-r"))
    part = scan_partition(d, "t", 0)
    assert [n for n in os.listdir(d) if n.endswith(".log")] == [part.active.file_name]
    assert part.active.base == part.ro[-1].last + 1 and check_partition(part) == []
    assert _dumped_seqs(base) == list(range(1, 61))


@pytest.mark.parametrize("left", ["log-and-index", "log", "index"])
def test_a_repair_killed_between_its_deletes_leaves_nothing_a_rerun_misses(tmp_path, monkeypatch, left):
    """Restoring the active segment deletes the broker's 0-byte active segment and its index: the index first, so a
    kill between the deletes leaves the 0-byte `.log`, which the rerun deletes. An index left alone (the deletes in
    the other order, killed between them) is deleted by the rerun too: the broker's next roll would take it over."""
    from tank_log.storage import repair

    d = tmp_path / "t" / "0"
    msgs = killed_roll(d, empty_active=True)
    n = len(msgs)
    (log,) = [f for f in os.listdir(d) if f.endswith(".log")]
    if left == "log-and-index":  # killed right after the first delete
        calls = []

        def remove_then_die(path):
            calls.append(os.path.basename(path))
            os.unlink(path)
            raise KeyboardInterrupt

        monkeypatch.setattr(repair, "remove_if_exists", remove_then_die)
        with pytest.raises(KeyboardInterrupt):
            repair_partition(d)
        monkeypatch.undo()
        assert calls == [f"{n + 1}.index"] and os.path.exists(d / log)
    else:
        os.unlink(d / (f"{n + 1}.index" if left == "log" else log))
    res = repair_partition(d)
    assert res.active_restored is not None
    after = scan_partition(str(d), "t", 0)
    assert set(os.listdir(d)) == {s.file_name for s in after.segments} | {
        os.path.basename(s.index_path) for s in after.segments
    }
    assert after.active is not None and after.active.base == after.ro[-1].last + 1 and check_partition(after) == []
    assert [m.seq for s in after.segments for m in s.messages()] == [m.seq for m in msgs]
    assert not repair_partition(d).has_work
