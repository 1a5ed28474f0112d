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
    assert rep["damage"][0]["code"] == "lost-segment"
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
    """RO segments without an active one, the last after a seq gap that cannot be closed (the segment before it is
    torn): `tank-log repair` refuses to make it active (the gap would abort the broker, §4.4) and exits 1; maintain's
    repair step does not call it clean."""
    from tank_log.format.bundle import Message
    from tank_log.storage.writer import write_segment

    d = tmp_path / "base" / "t" / "0"
    os.makedirs(d)
    for first in (1, 101):
        msgs = [Message(s, 1_790_000_000_000 + s, b"k", b"v%d" % s) for s in range(first, first + 6)]
        write_segment(d, msgs, ts=1_790_000_000)
    with open(d / "1-6_1790000000.ilog", "ab") as fh:
        fh.write(b"\x40\x00\x01")
    r = cli("repair", str(d))
    assert r.returncode == 1
    (problem,) = json.loads(r.stdout)["problems"]
    r = cli("maintain", "--broker-stopped", str(tmp_path / "base"))
    assert r.returncode == 1, r.stdout + r.stderr
    (rep,) = reports(r.stdout)
    step = rep["steps"]["repair"]
    assert step["status"] == "needs-attention" and problem in step["reason"]


def _resurrected(tmp_path) -> tuple[str, str, dict[str, bytes]]:
    """E compacted, then its inputs renamed back next to the outputs: what the broker's open does after a compaction
    killed in phases B-D (§6.4, §11.15). Returns the base, the partition and the inputs' bytes."""
    base = keyed_copy(tmp_path, "E_before")
    part = os.path.join(base, "kv", "0")
    inputs = {n: open(os.path.join(part, n), "rb").read() for n in os.listdir(part) if n.endswith(".ilog")}
    assert cli("compact", "--force", "--broker-stopped", base).returncode == 0
    for n, data in inputs.items():
        with open(os.path.join(part, n), "wb") as fh:
            fh.write(data)
    return base, part, inputs


def test_repair_removes_the_output_next_to_resurrected_compaction_inputs(tmp_path):
    """Overlapping RO segments whose messages prove the output redundant (every message of it in the inputs, same
    seq, ts, key, value): repair removes the output, keeps every input, names what it did; verify is clean and
    every message of the partition before compaction reads back."""
    from tank_log.storage.segment import Segment

    base, part, inputs = _resurrected(tmp_path)
    outputs = sorted(n for n in os.listdir(part) if n.endswith(".ilog") and n not in inputs)
    assert outputs
    r = cli("repair", base)
    assert r.returncode == 0, r.stdout + r.stderr
    (rep,) = reports(r.stdout)
    assert sorted(os.path.basename(p) for p in rep["removed"]) == outputs
    assert rep["overlaps_resolved"] and all(n in rep["overlaps_resolved"][0] for n in outputs)
    assert sorted(n for n in os.listdir(part) if n.endswith(".ilog")) == sorted(inputs)
    assert cli("verify", base).returncode == 0
    want = copy_tree(data_dir("E_before"), str(tmp_path / "intact"))
    seqs = [
        m.seq
        for n in sorted(inputs, key=lambda n: int(n.split("-")[0]))
        for m in Segment(os.path.join(part, n)).messages()
    ]
    intact = [
        m.seq
        for n in sorted(os.listdir(os.path.join(want, "kv", "0")))
        if n.endswith(".ilog")
        for m in Segment(os.path.join(want, "kv", "0", n)).messages()
    ]
    assert sorted(seqs) == sorted(intact)


def test_repair_names_overlaps_it_cannot_prove_and_lost_segments(tmp_path):
    """Overlapping copies that disagree on a message, or an index whose segment is gone: repair changes nothing,
    names them and exits 1; maintain's repair step says the same."""
    base, part, inputs = _resurrected(tmp_path)
    name = one(base, "7136-8058_*.ilog")  # its last message, seq 8058, is in the output too
    data = bytearray(inputs[os.path.basename(name)])
    data[-3] ^= 0x55  # a value byte of that message: the copies disagree
    with open(name, "wb") as fh:
        fh.write(data)
    before = tree_digest(base)
    r = cli("repair", base)
    assert r.returncode == 1, r.stdout + r.stderr
    (rep,) = reports(r.stdout)
    assert any("overlapping RO segments" in p and "not resolved" in p for p in rep["problems"]), rep
    assert tree_digest(base) == before

    lost = copy_tree(data_dir("E_before"), str(tmp_path / "lost"))
    os.unlink(one(lost, "1226-2349_*.ilog"))
    r = cli("repair", lost)
    assert r.returncode == 1
    (rep,) = reports(r.stdout)
    assert rep["problems"] == [
        "1226.index: an index without its segment file: seqs 1226..2349 were lost with it (restore the segment; "
        "readers refuse the partition until then)"
    ]
    r = cli("maintain", "--broker-stopped", lost)
    assert r.returncode == 1
    (rep,) = reports(r.stdout)
    assert rep["steps"]["repair"]["status"] == "needs-attention"


def test_retention_names_a_damaged_segment_and_its_guard_keeps_it(tmp_path):
    """Retention counts what it deletes through the completeness check: a damaged segment past the limits is named
    in the report (its count is what its bundles hold, not its name's); with the lakehouse guard, which cannot tell
    what the table received of it, nothing is deleted."""
    from tank_log.maintenance.retention import ExportGuard, RetentionOptions, RetentionRules, apply_retention

    base = copy_tree(data_dir("E_before"), str(tmp_path / "e"))
    seg = one(base, "1-1225_*.ilog")
    duplicate(seg, 53439, 53583)
    rules = RetentionRules(segments_count=6)
    opts = RetentionOptions(broker_stopped=True)
    (part,) = scan_data_dir(base).partitions()
    before = tree_digest(base)
    guarded = apply_retention(part, rules, opts, ExportGuard("t", exported_last=10**9))
    assert guarded.status == "needs-attention" and "damaged" in guarded.reason and "nothing deleted" in guarded.reason
    assert tree_digest(base) == before
    (part,) = scan_data_dir(base).partitions()
    res = apply_retention(part, rules, opts)
    assert res.status == "deleted", res
    (entry,) = res.deleted
    assert entry["damage"]["path"] == seg and entry["damage"]["code"] == "index-data"
    assert entry["messages"] > 1225 and "1-1225" in res.reason


def test_compaction_of_an_ro_only_partition_names_the_repair(tmp_path):
    """An RO-only partition (a broker killed inside its roll): the preflight's repair makes its last segment active
    (§9 rule 4) and compaction's "nothing-to-do" says so, not only "no RO segments"."""
    from tank_log.format.bundle import Message
    from tank_log.storage.writer import write_segment

    d = tmp_path / "base" / "t" / "0"
    os.makedirs(d)
    (tmp_path / "base" / "t" / "config").write_text("log.cleanup.policy=cleanup\n")
    write_segment(
        d, [Message(s, 1_790_000_000_000 + s, b"k%d" % (s % 3), b"v") for s in range(1, 30)], ts=1_790_000_000
    )
    r = cli("compact", "--force", "--broker-stopped", str(tmp_path / "base"))
    assert r.returncode == 0, r.stdout + r.stderr
    (rep,) = reports(r.stdout)
    assert rep["status"] == "nothing-to-do" and rep["repair"]["active_restored"]
    assert rep["reason"] == (
        "no RO segments (after repair: the last RO segment made active again (1-29_1790000000.ilog -> "
        "1_1790000000.log, §9 rule 4))"
    )


@pytest.mark.slow  # ~25 s: 8 runs of the real CLI
def test_damage_sweep_short_mode(tmp_path):
    """bench/damage_sweep.py's short mode: seeded damaged copies of the fixtures, each through one writer of the
    real CLI: no run exits 0 over damage it does not name, no survivor lost or renumbered by compaction."""
    from conftest import load_script

    sweep = load_script(os.path.join("bench", "damage_sweep.py"))
    figures = sweep.sweep(seed=7, cases=8, one_writer=True, work=str(tmp_path))
    assert figures["runs"] == 8
    assert figures["laundered"] == 0 and figures["bad"] == [], figures
    assert figures["survivors_lost"] == 0 and figures["renumbered"] == 0


def test_verify_names_a_segment_lost_beside_its_index(tmp_path):
    """An RO `.ilog` lost, its index left: verify says which seqs were lost and exits 1 (it used to warn about a
    stale index and exit 0)."""
    base = copy_tree(data_dir("E_before"), str(tmp_path / "e"))
    os.unlink(one(base, "1226-2349_*.ilog"))
    r = cli("verify", base)
    assert r.returncode == 1
    assert f"error: {os.path.join(base, 'kv', '0', '1226.index')}: [lost-segment] seqs 1226..2349 lost:" in r.stdout


def test_the_tail_check_agrees_with_the_whole_walk(tmp_path):
    """What compaction does not read (a nothing-to-do, a young tail) is checked by its first bundle and its bytes
    after its last index entry: on seeded damaged copies (cuts at and inside bundles, duplicated and missing
    bundles) it finds what the whole headers walk finds, and nothing in an intact segment."""
    import random

    from conftest import load_script

    from tank_log.maintenance.damage import segment_hole, tail_hole
    from tank_log.storage.datadir import scan_partition

    sweep = load_script(os.path.join("bench", "damage_sweep.py"))
    found = 0
    for seed in range(12):
        for kind in ("cut-at-boundary", "cut-inside-bundle", "duplicate-bundle", "missing-bundle"):
            case = sweep.Case("EBA"[seed % 3], kind)
            base = sweep._prepare(case.source, str(tmp_path / f"{seed}-{kind}"))
            sweep.damage(base, case, random.Random(seed), str(tmp_path))
            part = scan_partition(os.path.join(base, case.partition), "t", 0)
            (seg,) = [s for s in part.ro if s.file_name == case.files[0]]
            whole, tail = segment_hole(seg), tail_hole(seg)
            assert (whole is None) == (tail is None), (seed, kind, whole, tail)
            found += whole is not None
            assert all(tail_hole(s) is None for s in part.ro if s is not seg)
    # 47 of 48: the other is a sparse bundle cut out between sparse bundles (A's seqgap, seed 5): each carries its
    # own seqs (§3.6), so its absence is a gap like the producer's own, which nothing on disk tells apart
    assert found == 47
