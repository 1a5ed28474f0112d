"""No reader passes a hole silently: an RO segment truncated at a bundle boundary, a bundle cut out or duplicated,
a directory or a FIFO in place of a segment. `dump` and `stats` exited 0 with fewer (or misnumbered) messages and
nothing on stderr while `verify` reported `[name-last]` or `[not-a-file]`; they now exit 1 naming the file, offset
and seq range (storage/completeness.py)."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import FIXTURES, load_script

from tank_log.storage.segment import Segment

CLI = [sys.executable, "-m", "tank_log.tools.cli"]
SEGMENT = "2829-4682_1795261032.ilog"


def _damaged(tmp_path, kind):
    """events/1 of A_multi as t/0 with its RO segment 2829-4682 damaged; returns the base path and the file."""
    pdir = tmp_path / "base" / "t" / "0"
    shutil.copytree(os.path.join(FIXTURES, "A_multi", "data", "events", "1"), pdir)
    for f in os.listdir(pdir):
        os.chmod(pdir / f, 0o644)
    path = pdir / SEGMENT
    headers = list(Segment(str(path)).bundles())
    data = path.read_bytes()
    h = headers[len(headers) // 2]
    if kind == "boundary":
        path.write_bytes(data[: headers[-3].offset])
    elif kind == "cut":
        path.write_bytes(data[: h.offset] + data[h.offset + h.size :])
    elif kind == "dup":
        path.write_bytes(data[: h.offset + h.size] + data[h.offset :])
    else:
        path.unlink()
        path.mkdir() if kind == "directory" else os.mkfifo(path)
    return str(tmp_path / "base"), str(path)


@pytest.mark.parametrize(
    ("kind", "seqs"),
    [
        ("boundary", "seqs 2829..4682"),  # the content ends at 4332: truncated, or a bundle cut out anywhere
        ("cut", "seqs 2829..4682"),  # the messages after a cut or duplicated bundle are renumbered
        ("dup", "seqs 2829..4682"),
        ("directory", "seqs 2829..4682"),
        ("fifo", "seqs 2829..4682"),
    ],
)
@pytest.mark.parametrize("command", ["dump", "stats"])
def test_dump_and_stats_fail_on_a_hole_naming_its_seqs(tmp_path, kind, seqs, command):
    base, path = _damaged(tmp_path, kind)
    r = subprocess.run([*CLI, command, base], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    (line,) = [line for line in r.stderr.splitlines() if line.startswith(f"  {path}")]
    assert seqs in line


def test_hole_sweep_dump_and_stats(tmp_path):
    """The hole sweep's small deterministic version (bench/hole_sweep.py): the first two RO segments of four fixture
    partitions (plain, dense index, sparse, compacted), truncated at and between bundle boundaries, a bundle cut out
    or duplicated (first and last bundle), a directory and a FIFO in its place: no silent loss through dump and
    stats."""
    sweep_mod = load_script(os.path.join("bench", "hole_sweep.py"))
    cases = sweep_mod.damages(max_per_segment=2, max_segments=2)
    sweep = sweep_mod.run_sweep(cases, str(tmp_path), exports=[], spark=None)
    figures = sweep.figures()
    assert sweep.failures() == []
    assert figures["dump"]["runs"] == figures["stats"]["runs"] == len(cases) == 74  # 4 undamaged controls
    assert figures["dump"]["losses"] == len(cases) - 4 and figures["dump"]["silent"] == 0
    assert figures["stats"]["silent"] == 0 and figures["invisible_to_verify"] == 0
    assert figures["dump"]["false_alarms"] == figures["stats"]["false_alarms"] == 0


LOST = "1005-2828_1795261032.ilog"  # seqs 1005..2828 of events/1


def layout_damage(tmp_path, kind):
    """events/1 of A_multi as t/0 with its segment files damaged as a broker crash or an operator leaves them;
    returns the base path and the partition directory.

    - `overlap`: the compaction of 1005-2828 and 2829-4682 into one `1005-4682` output (no message dropped) whose
      second input was resurrected next to it (FORMAT.md §6.4): two files claim seqs 2829..4682;
    - `lost`: the RO segment 1005-2828 deleted, its `1005.index` left behind."""
    pdir = tmp_path / "base" / "t" / "0"
    shutil.copytree(os.path.join(FIXTURES, "A_multi", "data", "events", "1"), pdir)
    for f in os.listdir(pdir):
        os.chmod(pdir / f, 0o644)
    if kind == "overlap":
        (pdir / "1005-4682_1795261032.ilog").write_bytes((pdir / LOST).read_bytes() + (pdir / SEGMENT).read_bytes())
    if kind != "none":
        (pdir / LOST).unlink()
    return str(tmp_path / "base"), pdir


@pytest.mark.parametrize(
    ("kind", "named", "seqs"),
    [("overlap", SEGMENT, "seqs 2829..4682"), ("lost", "1005.index", "seqs 1005..2828")],
)
def test_dump_and_stats_refuse_overlaps_and_lost_segments(tmp_path, kind, named, seqs):
    """Both exited 0: dump printed seqs 2829..4682 twice (1,854 duplicates) over an overlap, and 6,672 messages
    without a word over a lost segment. Now exit 1 naming the file and the seqs; nothing of an overlapping partition
    is printed (which file is right is for repair to decide)."""
    base, pdir = layout_damage(tmp_path, kind)
    dump = subprocess.run([*CLI, "dump", base], capture_output=True, text=True, timeout=120)
    stats = subprocess.run([*CLI, "stats", "--json", base], capture_output=True, text=True, timeout=120)
    for r in (dump, stats):
        assert r.returncode == 1, r.stderr
        assert "Traceback" not in r.stderr
        (line,) = [line for line in r.stderr.splitlines() if line.startswith(f"  {pdir / named}")]
        assert seqs in line and f"[{kind if kind == 'overlap' else 'lost-segment'}]" in line
    seqs_out = [json.loads(line)["seq"] for line in dump.stdout.splitlines()]
    assert len(seqs_out) == len(set(seqs_out))
    (row,) = json.loads(stats.stdout)
    if kind == "overlap":
        assert seqs_out == [] and row["messages"] == 0 and "[overlap]" in row["error"]
    else:  # every segment that is there is printed; the lost one's seqs are not
        assert len(seqs_out) == 8496 - 1824 and not any(1005 <= s <= 2828 for s in seqs_out)
        assert row["messages"] == 8496 - 1824


@pytest.mark.parametrize("where", ["below-first", "inside-ro", "active", "above-ro"])
def test_harmless_orphan_indexes_are_no_loss(tmp_path, where):
    """An index whose segment is gone proves nothing lost when retention's interrupted deletion (below the first
    segment, §5), the broker's compaction recovery (inside an RO range, §6.4) or a deleted 0-byte active segment
    (§2.6, §2.3) leaves it: readers still exit 0."""
    base, pdir = layout_damage(tmp_path, "none")
    if where == "below-first":
        (pdir / "1-1004_1795261032.ilog").unlink()  # 1.index stays
    elif where == "inside-ro":
        shutil.copyfile(pdir / "1005.index", pdir / "2000.index")
    elif where == "active":
        shutil.copyfile(pdir / "7377.index", pdir / "7400.index")
    else:
        (pdir / "7377_1795261032.log").unlink()  # RO only; 7377.index stays (a deleted 0-byte active one)
    for command in ("dump", "stats"):
        r = subprocess.run([*CLI, command, base], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("at", [1, -1])
@pytest.mark.parametrize("kind", ["cut", "dup"])
def test_dump_prints_nothing_of_a_segment_it_cannot_trust(tmp_path, kind, at):
    """A bundle cut out of (or duplicated in) an RO segment renumbers every message after it; dump printed those
    messages with wrong seqs on stdout before it exited 1. Now every line it prints is the ground truth's line for
    that seq, and nothing of the damaged segment is printed."""
    from conftest import load_dump_lines

    pdir = tmp_path / "base" / "t" / "0"
    shutil.copytree(os.path.join(FIXTURES, "A_multi", "data", "events", "1"), pdir)
    path = pdir / SEGMENT
    os.chmod(path, 0o644)
    headers = list(Segment(str(path)).bundles())
    data, h = path.read_bytes(), headers[at]
    cut = data[: h.offset] + data[h.offset + h.size :]
    path.write_bytes(cut if kind == "cut" else data[: h.offset + h.size] + data[h.offset :])
    r = subprocess.run([*CLI, "dump", str(tmp_path / "base")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    truth = {json.loads(line)["seq"]: line for line in load_dump_lines("A_multi")[("events", 1)]}
    lines = r.stdout.splitlines()
    seqs = [json.loads(line)["seq"] for line in lines]
    assert not any(2829 <= s <= 4682 for s in seqs)
    assert len(seqs) == 8496 - 1854
    assert [line.replace('"topic":"t","partition":0', "") for line in lines] == [
        truth[s].replace('"topic":"events","partition":1', "") for s in seqs
    ]


def test_dump_prints_no_bundle_that_zeros_run_into(tmp_path):
    """Zeros from the middle of an uncompressed bundle to the end of its RO segment (a crash that extended the file
    without writing it): dump printed that bundle's message with its value partly zeroed. The bundle before a run of
    zeros that may start inside it is not trusted: named as lost, not printed."""
    from conftest import load_dump_lines

    pdir = tmp_path / "base" / "t" / "0"
    shutil.copytree(os.path.join(FIXTURES, "A_multi", "data", "events", "0"), pdir)
    path = pdir / "1-400_1795261032.ilog"
    os.chmod(path, 0o644)
    data, h = path.read_bytes(), list(Segment(str(path)).bundles())[200]
    mid = h.offset + h.size // 2
    path.write_bytes(data[:mid] + bytes(len(data) - mid))
    r = subprocess.run([*CLI, "dump", str(tmp_path / "base")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    (line,) = [line for line in r.stderr.splitlines() if line.startswith(f"  {path}")]
    assert f"@{h.offset}" in line and f"seqs {h.first_seq}..400" in line
    truth = {json.loads(t)["seq"]: t for t in load_dump_lines("A_multi")[("events", 0)]}
    lines = r.stdout.splitlines()
    seqs = [json.loads(t)["seq"] for t in lines]
    assert seqs == [s for s in sorted(truth) if not h.first_seq <= s <= 400]
    assert [t.replace('"topic":"t","partition":0', "") for t in lines] == [
        truth[s].replace('"topic":"events","partition":0', "") for s in seqs
    ]
