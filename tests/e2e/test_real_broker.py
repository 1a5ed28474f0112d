"""What our writers leave, served by the real TANK broker (TANK_BIN, TANK_CLI; skipped without them): every partition
consumed through `tank-cli` equals `tank-log dump` of the same directory, the broker opens every partition without
aborting (the open-time scan and recovery of docs/FORMAT.md §2.6, §11 items 16, 23, 24) and stops cleanly.

Covered: the appender's output with seq gaps, the import's output (jobs/import_delta.py from a Delta table the export
wrote, also appended across a seq gap), `tank-log compact` output, `tank-log maintain` output on the fixtures and
`tank-log repair` output after a broker killed inside its roll.
The helpers (start, stop, consume, produce, dump) are in tests/real_broker.py.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import DATASETS, copy_tree, data_dir, killed_roll, run_job_script
from real_broker import Consumed, RealBroker, binaries, consume_all, dump, free_port, partitions, served_copy

from tank_log.format.bundle import Message, SnappyPolicy
from tank_log.maintenance.verify import verify_path
from tank_log.storage.appender import PartitionAppender
from tank_log.storage.datadir import partitions_at
from tank_log.storage.writer import BundlePolicy, write_segment

BINARIES = binaries()
pytestmark = pytest.mark.skipif(isinstance(BINARIES, str), reason=str(BINARIES))
TANK_LOG = os.path.join(os.path.dirname(sys.executable), "tank-log")


def broker(base) -> RealBroker:
    assert not isinstance(BINARIES, str)
    return RealBroker(*BINARIES, base)


def assert_same(where: tuple[str, int], got: list[Consumed], want: list[Consumed]) -> None:
    if got == want:
        return
    i = next((i for i, (g, w) in enumerate(zip(got, want, strict=False)) if g != w), min(len(got), len(want)))
    raise AssertionError(
        f"{where[0]}/{where[1]}: the broker served {len(got)} messages, tank-log dump has {len(want)}; first "
        f"difference at #{i}: broker {got[i] if i < len(got) else None}, dump {want[i] if i < len(want) else None}"
    )


def serve_and_compare(base: str, tmp_path, *, produce: bool = False, name: str = "served") -> int:
    """Serve a copy of `base` with the real broker; every partition it registers, consumed from its first
    available seq, equals `tank-log dump` of `base`. With `produce`, one message then goes through the broker's
    produce path into every partition: it gets the next seq after ours, and a consume from the start still sees
    everything (no RO data hidden, §11 item 16). The broker must stop cleanly. Returns the messages compared."""
    want = dump(base)
    served = served_copy(base, tmp_path / name)
    compared = 0
    with broker(served) as b:
        seen = set()
        for where, got in consume_all(b):
            assert_same(where, got, want.get(where, []))
            seen.add(where)
            compared += len(got)
        assert set(want) <= seen, f"partitions the broker does not register: {sorted(set(want) - seen)}"
        if produce:
            for topic, partition in partitions(served):
                old = want.get((topic, partition), [])
                nxt = old[-1].seq + 1 if old else 1
                value = b"oracle %s/%d" % (topic.encode(), partition)
                b.produce(topic, partition, b"oracle", value)
                (new,) = b.consume(topic, partition, start=nxt)
                assert (new.seq, new.key, new.value) == (nxt, b"oracle", value), (topic, partition, new)
                assert_same((topic, partition), b.consume(topic, partition), [*old, new])
    assert b.returncode == 0, f"the broker exited {b.returncode} at SIGINT:\n{b.log()[-3000:]}"
    assert "Assertion" not in b.log() and "corrupt" not in b.log().lower(), b.log()[-3000:]
    return compared


def msgs(lo: int, hi: int, *, keys: int = 7, step: int = 1) -> list[Message]:
    return [
        Message(s, 1_800_000_000_000 + s, b"k%d" % (s % keys), b"value %d " % s + b"x" * 40)
        for s in range(lo, hi + 1, step)
    ]


def test_the_broker_aborts_on_a_gap_before_the_active_segment(tmp_path):
    """The oracle's own rule (§4.4, §11 item 23), which the tests below rely on: RO 1-6, then the active segment at
    107. The gap between two RO segments is skipped, the one before the active segment aborts the broker."""
    part = tmp_path / "base" / "t" / "0"
    os.makedirs(part)
    for first, last, active in ((1, 6, False), (101, 106, False), (207, 212, True)):
        write_segment(part, msgs(first, last), active=active, ts=1_800_000_000)
    assert [p.code for p in verify_path(str(tmp_path / "base"))] == ["gap-before-active"]
    with broker(served_copy(tmp_path / "base", tmp_path / "served")) as b:
        with pytest.raises(AssertionError, match=r"abs_seqnum >= f->baseSeqNum"):
            b.consume("t", 0)
    assert b.returncode == -6  # SIGABRT


def test_repair_restores_the_active_segment_a_killed_roll_left_out(tmp_path):
    """A broker killed inside its roll (§2.5) leaves RO segments without an active segment (partition 0) or with a
    0-byte one (partition 1, which the broker deletes at open, §2.6). Served as is, the broker's first append hides
    every RO message (§11 item 16): the oracle. After `tank-log repair` (the last RO segment made active again) it
    serves every message as dumped, gives a produced message the next seq and keeps all older data visible."""
    base = tmp_path / "base"
    n = {p: len(killed_roll(base / "rolled" / str(p), empty_active=p == 1)) for p in (0, 1)}
    assert {p.code for p in verify_path(str(base)) if p.severity == "error"} == {"no-active"}
    want = dump(base)
    assert {k: len(v) for k, v in want.items()} == {("rolled", p): n[p] for p in n}
    with broker(served_copy(base, tmp_path / "as-left")) as b:
        for p in n:
            assert_same(("rolled", p), b.consume("rolled", p), want[("rolled", p)])
            b.produce("rolled", p, b"oracle", b"hides the rest")
            assert [m.seq for m in b.consume("rolled", p)] == [n[p] + 1]  # every RO message hidden
    r = subprocess.run([TANK_LOG, "repair", str(base)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert [json.loads(line)["active_restored"] is not None for line in r.stdout.splitlines()] == [True, True]
    assert verify_path(str(base)) == []
    assert dump(base) == want
    assert serve_and_compare(str(base), tmp_path, produce=True) == sum(n.values())


def test_the_appenders_output_with_seq_gaps(tmp_path):
    """Jumps where a roll is due (the layout that aborted the broker), a jump at every bundle, Snappy and plain
    bundles, keyed and keyless messages: served as dumped; the broker continues every partition's seqs."""
    base = tmp_path / "base"
    seq = 1
    a0 = PartitionAppender(base / "gaps" / "0", segment_bytes=600, index_interval=128)
    a1 = PartitionAppender(base / "gaps" / "1", segment_bytes=600, policy=BundlePolicy(snappy=SnappyPolicy.ALWAYS))
    a2 = PartitionAppender(base / "gaps" / "2", segment_bytes=600)
    for b in range(60):
        bundle = msgs(seq, seq + 4, keys=3 + b % 5)
        a0.append(bundle)
        a2.append([Message(m.seq, m.ts, None, m.value) for m in bundle])
        seq += 5 + (1000 if b % 2 else 0)
    for lo in range(1, 60_000, 997):
        a1.append(msgs(lo, lo + 30, step=3))
    assert a0.rolls >= 5 and a2.rolls >= 5 and a1.rolls == 0
    assert verify_path(str(base)) == []
    assert serve_and_compare(str(base), tmp_path, produce=True) == 60 * 5 * 2 + 61 * 11


def test_compact_output(tmp_path):
    """`tank-log compact` on the fixtures the broker compacted itself (B before, E before, as `cleanup` topics), and
    on a partition whose compacted range ends in messages the broker drops (keyless empty: its own compaction then
    leaves a gap before the active segment, §11 item 23), with the options that drop more (tombstones by age,
    keyless messages)."""
    base = str(tmp_path / "base")
    os.makedirs(base)
    for name in ("B_before", "E_before"):
        (topic,) = [t for t in os.listdir(data_dir(name)) if not t.startswith(".")]
        copy_tree(os.path.join(data_dir(name), topic), os.path.join(base, f"{name}__{topic}"))
        with open(os.path.join(base, f"{name}__{topic}", "config"), "a") as fh:
            fh.write("\nlog.cleanup.policy=cleanup\n")
    for topic in ("lastdrop", "options"):
        app = PartitionAppender(os.path.join(base, topic, "0"), segment_bytes=700)
        for lo in range(1, 400, 8):
            ms = msgs(lo, lo + 5, keys=5)
            ms.append(Message(lo + 6, 1_000, b"k1", b""))  # an old tombstone
            ms.append(Message(lo + 7, 1_000, None, b""))  # keyless, empty: the range's last in every segment
            app.append(ms)
        with open(os.path.join(base, topic, "config"), "w") as fh:
            fh.write("log.cleanup.policy=cleanup\nlog.segment.bytes=700\n")
    before = dump(base)
    for args in (
        ["--topics", "B_before__kv,E_before__kv,lastdrop"],
        ["--topics", "options", "--drop-keyless", "--tombstone-retention", "1days"],
    ):
        r = subprocess.run(
            [TANK_LOG, "compact", base, "--broker-stopped", "--force", *args],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    after = dump(base)
    for where in before:
        assert len(after[where]) < len(before[where]), f"{where}: nothing compacted"
    for part in partitions_at(base, ["lastdrop", "options"]):
        assert part.active is not None and part.ro and part.active.base == part.ro[-1].last + 1
    assert verify_path(base) == []
    assert serve_and_compare(base, tmp_path) == sum(len(v) for v in after.values())


def test_maintain_output_on_the_fixtures(tmp_path):
    """Every fixture's topics in one base path: served as dumped before, and after `tank-log maintain` (repair,
    index checks, compaction of the `cleanup` topics, retention)."""
    base = str(tmp_path / "base")
    os.makedirs(base)
    for name in DATASETS:
        for topic in os.listdir(data_dir(name)):
            if os.path.isdir(os.path.join(data_dir(name), topic)) and not topic.startswith("."):
                copy_tree(os.path.join(data_dir(name), topic), os.path.join(base, f"{name}__{topic}"))
    assert serve_and_compare(base, tmp_path, name="before") > 50_000
    before = dump(base)
    r = subprocess.run(
        [TANK_LOG, "maintain", base, "--broker-stopped", "--force"], capture_output=True, text=True, timeout=900
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    after = dump(base)
    assert after != before  # it compacted something
    assert serve_and_compare(base, tmp_path, name="after") == sum(len(v) for v in after.values())


@pytest.mark.slow
@pytest.mark.spark
def test_import_output(tmp_path):
    """jobs/import_delta.py from a Delta table jobs/export_delta.py wrote (A_multi's `events`, `seqgap`, `small`),
    then --append after new messages that continue the counter and after a seq gap: served as dumped; the broker
    continues every partition's seqs."""
    src = copy_tree(data_dir("A_multi"), str(tmp_path / "src"))
    table, dst = str(tmp_path / "table"), str(tmp_path / "dst")
    exp = ["--data-dir", src, "--table", table, "--topics", "events,seqgap,small"]
    imp = ["--data-dir", dst, "--table", table]
    for job, args in (("export_delta", exp), ("import_delta", imp)):
        r = run_job_script(job, *args, where="driver")
        assert r.returncode == 0, r.stderr[-3000:]
    # what the broker does at a roll, then new messages: continuing the counter (events), after a gap (seqgap)
    for part in partitions_at(src, ["events", "seqgap"]):
        a = part.active
        assert a is not None
        last = max(m.seq for m in a.messages())
        os.rename(a.path, os.path.join(part.path, f"{a.base}-{last}_{a.name.ts}.ilog"))
        first = last + (1 if part.topic == "events" else 100)
        new = [Message(first + i, 1_800_000_000_000 + i, b"k", b"appended-%d" % i) for i in range(12)]
        write_segment(part.path, new, active=True, ts=1_800_000_000)
    for job, args in (("export_delta", exp), ("import_delta", [*imp, "--append"])):
        r = run_job_script(job, *args, where="driver")
        assert r.returncode == 0, r.stderr[-3000:]
    assert verify_path(dst) == []
    want = {k: v for k, v in dump(src).items() if k[0] in ("events", "seqgap", "small")}
    assert dump(dst) == want
    shutil.rmtree(src)
    assert serve_and_compare(dst, tmp_path, produce=True) == sum(len(v) for v in want.values())


def test_demo_data(tmp_path):
    """`tank-log demo` (what the getting-started tour serves): served as dumped. (No produce: the demo's segments
    are days old, so the broker's next append rolls by age and its retention deletes them, §2.4, §5.)"""
    base = str(tmp_path / "demo")
    r = subprocess.run([TANK_LOG, "demo", base], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert serve_and_compare(base, tmp_path) > 1000


def test_maintain_output_after_damage(tmp_path):
    """What `tank-log maintain --salvage` leaves after damage the broker itself would exit or abort on: a torn
    active tail (§3.11: exit at the partition's open), missing and 0-byte RO indexes (§4.2, §4.5), an index entry
    past the end of the active log (§2.6), and an interrupted compaction's `.cleaned` output (§6.4)."""
    base = str(tmp_path / "base")
    os.makedirs(base)
    for topic in ("small", "events"):
        copy_tree(os.path.join(data_dir("A_multi"), topic), os.path.join(base, topic))
    copy_tree(os.path.join(data_dir("C_misc"), "restarted"), os.path.join(base, "restarted"))
    small, events, restarted = (partitions_at(base, [t])[0] for t in ("small", "events", "restarted"))
    assert small.active is not None and restarted.active is not None and len(small.ro) >= 3
    with open(small.active.path, "ab") as fh:
        fh.write(b"\x40\x00\x01")  # a bundle of 64 bytes cut after 2
    os.unlink(small.ro[0].index_path)
    open(small.ro[1].index_path, "wb").close()
    with open(restarted.active.index_path, "ab") as fh:
        fh.write((399).to_bytes(4, "little") + (restarted.active.size + 100).to_bytes(4, "little"))
    ro = events.ro[0]
    shutil.copy(ro.path, os.path.join(events.path, f"{ro.base}-0_0.ilog.cleaned"))
    want = dump(base)  # the messages (dump reads past the damage)
    r = subprocess.run(
        [TANK_LOG, "maintain", base, "--broker-stopped", "--salvage"], capture_output=True, text=True, timeout=900
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert verify_path(base) == []
    assert dump(base) == want
    assert serve_and_compare(base, tmp_path, produce=True) == sum(len(v) for v in want.values())


def test_the_fleet_host_supervisor(tmp_path):
    """tests/real_broker.py run as a fleet host (bench/fleet.py --tank): it produces through the broker, the broker
    rolls and compacts its `cleanup` topic itself, SIGINT stops both cleanly, and at the next start every message
    is served as produced."""
    from tank_log.tools.standin_broker import fleet_message

    assert not isinstance(BINARIES, str)
    base = tmp_path / "host"
    for topic, policy in (("cdc", "cleanup"), ("ev", "delete")):
        for p in range(2):
            os.makedirs(base / topic / str(p))
        (base / topic / "config").write_text(f"log.cleanup.policy={policy}\nlog.segment.bytes=4096\n")
    pidfile, log = str(tmp_path / "host.pid"), str(tmp_path / "broker.log")
    cmd = [sys.executable, os.path.join(os.path.dirname(__file__), "..", "real_broker.py"), "-p", str(base)]
    cmd += ["--tank", BINARIES[0], "--tank-cli", BINARIES[1], "--pidfile", pidfile, "--log", log, "--produce"]
    for run in (1, 2):
        proc = subprocess.Popen([*cmd, "--port", str(free_port()), "--rate", "400"], stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 30
            while sum(os.path.getsize(f) for f in glob.glob(f"{base}/*/0/*.*log")) < 40_000 * run:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()[-3000:]
                time.sleep(0.2)
            os.kill(proc.pid, signal.SIGINT)
            assert proc.wait(30) == 0
            assert proc.stderr.read() == b""  # nothing served other than produced (checked at each start)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        tank_pid = int(open(pidfile + ".tank").read())
        assert not os.path.exists(f"/proc/{tank_pid}") or "Z" in open(f"/proc/{tank_pid}/stat").read().split()[2]
    served = dump(base)
    for (topic, p), got in served.items():
        assert got and all((m.key, m.value) == fleet_message(topic, p, m.seq, topic == "cdc") for m in got)
        if topic == "ev":
            assert [m.seq for m in got] == list(range(1, got[-1].seq + 1))
    (cdc,) = partitions_at(str(base), ["cdc"])[:1]
    assert len(cdc.ro) >= 1 and any(b.sparse for s in cdc.ro for b in s.bundles())  # the broker's compaction
    assert "Assertion" not in open(log).read()


def test_the_fleet_host_supervisor_holds_still_when_paused_and_names_a_sigkill(tmp_path):
    """What the fleet's checks rely on: while PIDFILE.pause exists the host produces nothing (PIDFILE.paused says
    so), so its files hold still and `verify` reads no roll in progress (the broker renames the active segment,
    applies its retention, then creates the next one, docs/FORMAT.md §2.5: a live roll is a moment without an active
    segment); once the pause is gone it produces again; a SIGKILL of the broker makes it exit 3, saying so."""
    assert not isinstance(BINARIES, str)
    base = tmp_path / "host"
    os.makedirs(base / "raw" / "0")
    config = "log.cleanup.policy=delete\nretention.segments.count=2\nlog.segment.bytes=1024\n"
    (base / "raw" / "config").write_text(config)
    pidfile = str(tmp_path / "host.pid")
    cmd = [sys.executable, os.path.join(os.path.dirname(__file__), "..", "real_broker.py"), "-p", str(base)]
    cmd += ["--tank", BINARIES[0], "--tank-cli", BINARIES[1], "--pidfile", pidfile, "--produce", "--rate", "200"]
    proc = subprocess.Popen([*cmd, "--port", str(free_port())], stderr=subprocess.PIPE)

    def files() -> dict[str, int]:
        return {f: os.path.getsize(f) for f in glob.glob(f"{base}/raw/0/*")}

    try:
        deadline = time.monotonic() + 30
        while len(glob.glob(f"{base}/raw/0/*.ilog")) < 2:  # rolling, and its retention deleting
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()[-3000:]
            time.sleep(0.1)
        open(pidfile + ".pause", "w").close()
        while not os.path.exists(pidfile + ".paused"):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        still = files()
        for _ in range(10):
            assert [str(p) for p in verify_path(str(base)) if p.severity == "error"] == []
            time.sleep(0.1)
        assert files() == still
        os.unlink(pidfile + ".pause")
        while files() == still:
            assert time.monotonic() < deadline + 10
            time.sleep(0.05)
        os.kill(int(open(pidfile + ".tank").read()), signal.SIGKILL)
        assert proc.wait(30) == 3
        assert b"the broker was SIGKILLed" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_fleet_host_supervisor_says_why_the_broker_would_not_start(tmp_path):
    """A broker that exits on what it finds (a torn tail of an active segment, §3.11: at the partition's first open
    here; before it listens when it opens the partition at its start, as the fleet saw for compacted ones) makes the
    host's supervisor exit 1 with a line saying so and the broker's output, never a traceback (the fleet waits for
    those words, then salvages)."""
    assert not isinstance(BINARIES, str)
    base = tmp_path / "host"
    os.makedirs(base / "ev" / "0")
    (base / "ev" / "config").write_text("log.cleanup.policy=delete\n")
    with broker(base) as b:
        for i in range(3):
            b.produce("ev", 0, b"k%d" % i, b"v%d" % i)
    (active,) = glob.glob(f"{base}/ev/0/*.log")
    with open(active, "rb") as fh:
        head = fh.read(8)
    with open(active, "ab") as fh:
        fh.write(head)  # a bundle's first bytes: its end is past the end of the file
    cmd = [sys.executable, os.path.join(os.path.dirname(__file__), "..", "real_broker.py"), "-p", str(base)]
    cmd += ["--tank", BINARIES[0], "--tank-cli", BINARIES[1], "--port", str(free_port()), "--produce"]
    done = subprocess.run(cmd, capture_output=True, timeout=60, check=False)
    assert done.returncode == 1, done.stderr.decode()[-2000:]
    assert done.stderr.startswith(b"the broker failed: "), done.stderr.decode()[-2000:]
    assert b"Traceback" not in done.stderr and b"Likely corrupt" in done.stderr
