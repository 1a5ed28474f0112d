"""The maintenance writers never launder damage: compaction, salvage, repair, maintain and retention read through
the readers' completeness check, refuse what they cannot trust (file, offset, seqs) and write nothing, or name what
they cut. On the real broker's fixtures, damaged as an operator's disk or a killed broker damages them."""

import glob
import json
import os
import subprocess
import sys

import pytest
from conftest import copy_tree, data_dir, tree_digest

from tank_log.maintenance.compaction import CompactionOptions, compact_partition
from tank_log.storage.datadir import scan_data_dir

TANK_LOG = os.path.join(os.path.dirname(sys.executable), "tank-log")


def keyed_copy(tmp_path, name: str) -> str:
    """A copy of a fixture's base path whose topic `kv` is compacted (its `config` says cleanup)."""
    base = copy_tree(data_dir(name), str(tmp_path / name))
    cfg = os.path.join(base, "kv", "config")
    with open(cfg) as fh:
        lines = [ln for ln in fh.read().splitlines() if not ln.startswith("log.cleanup.policy")]
    with open(cfg, "w") as fh:
        fh.write("\n".join([*lines, "log.cleanup.policy=cleanup"]) + "\n")
    return base


def one(base: str, pattern: str) -> str:
    (path,) = glob.glob(os.path.join(base, "kv", "0", pattern))
    return path


def duplicate(path: str, start: int, stop: int) -> None:
    """Bytes start..stop (a whole bundle) copied after themselves."""
    data = open(path, "rb").read()
    with open(path, "wb") as fh:
        fh.write(data[:stop] + data[start:stop] + data[stop:])


def truncate(path: str, size: int) -> None:
    with open(path, "r+b") as fh:
        fh.truncate(size)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([TANK_LOG, *args], capture_output=True, text=True, timeout=120)


def reports(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


@pytest.mark.parametrize(
    "fixture,pattern,damage,seqs",
    [
        ("E_before", "1-1225_*.ilog", lambda p: duplicate(p, 53439, 53583), (1, 1225)),
        ("B_before", "5842-6992_*.ilog", lambda p: truncate(p, 60747), (5842, 6992)),
    ],
    ids=["duplicated-bundle", "cut-at-a-bundle-boundary"],
)
def test_compaction_refuses_a_damaged_input_and_writes_nothing(tmp_path, fixture, pattern, damage, seqs):
    """A bundle duplicated (E) or a segment truncated at a bundle boundary (B) decodes without an error but
    renumbers the messages after it: compaction refuses it, names file, offset and seqs, exits 1, writes nothing."""
    base = keyed_copy(tmp_path, fixture)
    damaged = one(base, pattern)
    damage(damaged)
    before = tree_digest(base)
    r = cli("compact", "--force", "--broker-stopped", base)
    assert r.returncode == 1, r.stdout + r.stderr
    (rep,) = reports(r.stdout)
    assert rep["status"] == "needs-attention"
    assert "nothing was written" in rep["reason"] and damaged in rep["reason"]
    (hole,) = rep["damage"]
    assert hole["path"] == damaged and hole["offset"] is not None
    assert (hole["first_seq"], hole["last_seq"]) == seqs
    assert tree_digest(base) == before
    assert cli("verify", base).returncode == 1  # still visible


def test_no_nothing_to_do_over_a_hole(tmp_path):
    """Below the dirty-ratio threshold compaction reads nothing, but it still does not call a damaged partition
    "nothing-to-do": the RO segments' headers are audited first."""
    base = keyed_copy(tmp_path, "E_before")
    duplicate(one(base, "1-1225_*.ilog"), 53439, 53583)
    (part,) = scan_data_dir(base).partitions()
    res = compact_partition(part, CompactionOptions(broker_stopped=True, min_cleanable_ratio=2.0))
    assert res.status == "needs-attention", res
    assert res.damage and res.damage[0]["path"].endswith(".ilog")


def test_compaction_refuses_an_index_whose_segment_is_lost(tmp_path):
    """An RO segment file lost, its index left: its seqs are a hole the names show; compaction refuses."""
    base = keyed_copy(tmp_path, "E_before")
    lost = one(base, "1226-2349_*.ilog")
    os.unlink(lost)
    before = tree_digest(base)
    r = cli("compact", "--force", "--broker-stopped", base)
    assert r.returncode == 1, r.stdout + r.stderr
    (rep,) = reports(r.stdout)
    assert rep["damage"][0]["code"] == "orphan-index"
    assert (rep["damage"][0]["first_seq"], rep["damage"][0]["last_seq"]) == (1226, 2349)
    assert tree_digest(base) == before


def test_intact_partition_still_compacts(tmp_path):
    base = keyed_copy(tmp_path, "E_before")
    r = cli("compact", "--force", "--broker-stopped", base)
    assert r.returncode == 0, r.stdout + r.stderr
    assert reports(r.stdout)[0]["status"] == "compacted"


def test_maintain_salvage_names_what_it_cuts(tmp_path):
    """An RO segment truncated inside a bundle (a torn tail, §3.11): `maintain --salvage` cuts it, and the seqs
    and the count it cut are in the log, the report and the metrics; the bytes are kept in the side file."""
    base = copy_tree(data_dir("E_before"), str(tmp_path / "e"))
    seg = one(base, "1-1225_*.ilog")
    truncate(seg, 53500)  # 61 bytes into the bundle at 53439, whose first seq is 979
    prom = str(tmp_path / "m.prom")
    r = cli("maintain", "--salvage", "--broker-stopped", "--metrics-file", prom, base)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{seg} @53439: salvage cut 61 bytes, seqs 979..1225 (247 message(s) lost)" in r.stderr
    (rep,) = reports(r.stdout)
    (action,) = rep["steps"]["indexes"]["actions"]
    assert action["seqs_cut"] == [979, 1225] and action["messages_cut"] == 247
    assert "seqs 979..1225 (247 messages lost)" in rep["steps"]["indexes"]["reason"]
    side = os.path.join(os.path.dirname(seg), action["side_file"])
    assert os.path.getsize(side) == 61
    assert 'tank_log_salvage_cut_messages{partition="0",topic="kv"} 247.0' in open(prom).read()


def test_salvage_keeps_a_torn_segment_whose_bundles_disagree_with_its_index(tmp_path):
    """A torn tail after a duplicated bundle: cutting the tail would keep the renumbered messages as good data and
    rename the segment after them. Salvage refuses it and cuts nothing."""
    base = copy_tree(data_dir("E_before"), str(tmp_path / "e"))
    seg = one(base, "1-1225_*.ilog")
    duplicate(seg, 53439, 53583)
    truncate(seg, os.path.getsize(seg) - 20)
    before = tree_digest(base)
    r = cli("maintain", "--salvage", "--broker-stopped", base)
    assert r.returncode == 1, r.stdout + r.stderr
    (rep,) = reports(r.stdout)
    unfixed = rep["steps"]["indexes"]["unfixed"]
    assert any(u["code"] == "salvage-refused" and "nothing cut" in u["message"] for u in unfixed), unfixed
    assert tree_digest(base) == before


def test_maintain_repair_step_agrees_with_repair(tmp_path):
    """RO segments without an active one, the last after a seq gap: `tank-log repair` refuses to make it active
    (the gap would abort the broker, §4.4) and exits 1; maintain's repair step does not call it clean."""
    from tank_log.format.bundle import Message
    from tank_log.storage.writer import write_segment

    d = tmp_path / "base" / "t" / "0"
    os.makedirs(d)
    for first in (1, 101):
        msgs = [Message(s, 1_790_000_000_000 + s, b"k", b"v%d" % s) for s in range(first, first + 6)]
        write_segment(d, msgs, ts=1_790_000_000)
    r = cli("repair", str(d))
    assert r.returncode == 1
    (problem,) = json.loads(r.stdout)["problems"]
    r = cli("maintain", "--broker-stopped", str(tmp_path / "base"))
    assert r.returncode == 1, r.stdout + r.stderr
    (rep,) = reports(r.stdout)
    step = rep["steps"]["repair"]
    assert step["status"] == "needs-attention" and problem in step["reason"]
