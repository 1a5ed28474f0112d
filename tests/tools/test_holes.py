"""No reader passes a hole silently: an RO segment truncated at a bundle boundary, a bundle cut out or duplicated,
a directory or a FIFO in place of a segment. `dump` and `stats` exited 0 with fewer (or misnumbered) messages and
nothing on stderr while `verify` reported `[name-last]` or `[not-a-file]`; they now exit 1 naming the file, offset
and seq range (storage/completeness.py)."""

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
