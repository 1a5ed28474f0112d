"""What happens to our files afterwards is part of the contract: after each writer of ours — `tank-log compact`,
`tank-log maintain --salvage`, `tank-log repair`, the import into a fresh base and with `--append` — the broker lives
on with the result. It serves it, takes new messages through its produce path until it rolls its active segment
(a small `log.segment.bytes`, docs/FORMAT.md §2.4), applies its own retention at each roll with the config we left
(§5: by the segment NAME's ts, §2.2, §11.6), is restarted, takes more, and is restarted again. The same life is lived
by the original base. Then, per partition:

- every message we wrote that the original still serves after its life is served after ours, as `tank-log dump`
  of what we wrote has it (nothing deleted sooner than the original would have been);
- nothing is served that we did not write or the life did not produce;
- every message the life produced into the original is served after ours too.

The broker is the real one when TANK_BIN and TANK_CLI name it (tests/real_broker.py), else the stand-in's `--life`
(tank_log/tools/standin_broker.py), a model of the broker's rolls and retention (no compaction at a roll); the real
broker is the oracle.

The original base: a `delete` topic `ev` with `log.retention.secs=30days` whose partitions hold what a broker
really holds — a front segment past its retention (the life deletes it from the original too), segments rolled days
ago holding messages whose ts are far older (a mirrored or replayed backlog: ages go by the name, not the messages),
an active segment older than the roll age (§2.4 rule 6) and a partition whose own `config` keeps data 120 days
(§1.5) — and a `cleanup` topic `kv` (no retention; the real broker compacts it at its rolls, §6).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import run_job_script
from real_broker import Consumed, RealBroker, binaries, dump, free_port, partitions, served_copy

from tank_log.format.bundle import Message
from tank_log.maintenance.verify import verify_path
from tank_log.storage.datadir import partitions_at
from tank_log.storage.writer import write_segment
from tank_log.tools.standin_broker import fleet_message

BINARIES = binaries()
REAL = not isinstance(BINARIES, str)
TANK_LOG = os.path.join(os.path.dirname(sys.executable), "tank-log")
STANDIN = [sys.executable, "-m", "tank_log.tools.standin_broker"]
DAY = 86400
PRODUCED = 60  # per partition and run: about 3 rolls at log.segment.bytes=2048 (the fleet's messages are ~80 bytes)
BUNDLE = 10

Served = dict[tuple[str, int], list[Consumed]]


def _msgs(lo: int, hi: int, ts_s: int, *, keys: int = 40, tag: bytes = b"") -> list[Message]:
    return [
        Message(s, ts_s * 1000 + s, b"k%d" % (s % keys), b"%svalue %d " % (tag, s) + b"x" * 60)
        for s in range(lo, hi + 1)
    ]


def original(base: str, now: int) -> str:
    """The original base path (see the module's docstring): ev/0..2 and kv/0."""
    ev, kv = os.path.join(base, "ev"), os.path.join(base, "kv")
    for p in range(3):
        os.makedirs(os.path.join(ev, str(p)))
    os.makedirs(os.path.join(kv, "0"))
    with open(os.path.join(ev, "config"), "w") as fh:
        fh.write("log.cleanup.policy=delete\nlog.retention.secs=30days\nlog.segment.bytes=2048\n")
    with open(os.path.join(kv, "config"), "w") as fh:
        fh.write("log.cleanup.policy=cleanup\nlog.segment.bytes=2048\n")
    with open(os.path.join(ev, "2", "config"), "w") as fh:
        fh.write("log.retention.secs=120days\n")
    layout: dict[str, list[tuple[int, int, int, int, bool]]] = {  # first, last, name ts, message ts, active
        "ev/0": [
            (1, 60, now - 40 * DAY, now - 40 * DAY, False),  # past retention: the life deletes it
            (61, 200, now - 3 * DAY, now - 90 * DAY, False),  # a backlog mirrored 3 days ago
            (201, 300, now - 2 * DAY, now - 2 * DAY, False),
            (301, 340, now - DAY, now - DAY, True),
        ],
        "ev/1": [
            (1, 100, now - 10 * DAY, now - 10 * DAY, False),
            (101, 150, now - 8 * DAY, now - 8 * DAY, True),  # older than the roll age: the first append rolls it
        ],
        "ev/2": [  # kept 120 days by the partition's own config
            (1, 120, now - 45 * DAY, now - 90 * DAY, False),
            (121, 240, now - 35 * DAY, now - 80 * DAY, False),
            (241, 260, now - 3600, now - 70 * DAY, True),
        ],
        "kv/0": [
            (1, 150, now - 5 * DAY, now - 5 * DAY, False),
            (151, 300, now - 2 * DAY, now - 2 * DAY, False),
            (301, 330, now - 3600, now - 3600, True),
        ],
    }
    for where, segments in layout.items():
        for first, last, name_ts, msg_ts, active in segments:
            write_segment(
                os.path.join(base, where),
                _msgs(first, last, msg_ts),
                active=active,
                ts=name_ts,
                index_interval=512,
            )
    assert verify_path(base) == []
    return base


def live(base: str, into: str, *, real: bool = REAL) -> Served:
    """The broker's life on a copy of `base` at `into` (see the module's docstring): what it serves at the end. On
    the real broker when given, else on the stand-in's `--life`."""
    life = served_copy(base, into)
    if real:
        assert not isinstance(BINARIES, str)
        for _ in range(2):
            with RealBroker(*BINARIES, life) as b:
                for topic, p in partitions(life):
                    old = b.consume(topic, p)  # a client reads it all (the broker then counts RO sizes, §5, §11.14)
                    nxt = old[-1].seq + 1 if old else 1
                    for first in range(nxt, nxt + PRODUCED, BUNDLE):
                        pairs = [fleet_message(topic, p, s, topic == "kv") for s in range(first, first + BUNDLE)]
                        b.produce_bundle(topic, p, pairs)
            assert b.returncode == 0, f"the broker exited {b.returncode} at SIGINT:\n{b.log()[-3000:]}"
        with RealBroker(*BINARIES, life) as b:
            served = {(t, p): b.consume(t, p) for t, p in partitions(life)}
        assert b.returncode == 0, b.log()[-3000:]
        return served
    events = into + ".events"
    for run in range(2):
        cmd = [*STANDIN, "-p", life, "--port", str(free_port()), "--events", events, "--name", str(run)]
        cmd += ["--produce", "--life", "--messages", str(PRODUCED), "--bundle", str(BUNDLE), "--rate", "100000"]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 60
            while f"produced {run}" not in (open(events).read() if os.path.exists(events) else ""):
                assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
                assert time.monotonic() < deadline, (
                    f"the stand-in did not produce {PRODUCED} messages per partition in 60 s"
                )
                time.sleep(0.05)
            proc.send_signal(signal.SIGINT)
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return dump(life)


def check_afterlife(what: str, original_base: str, ours: str, tmp: str) -> dict[str, int]:
    """Live the original and what `what` wrote (`ours`), and hold ours to the contract (the module's docstring).
    Returns counts: messages written, kept by the original's life, kept by ours."""
    written = dump(ours)
    cleanup = {p.topic for p in partitions_at(original_base) if p.config.cleanup_policy == "cleanup"}
    first = live(original_base, os.path.join(tmp, "life-original"))
    after = live(ours, os.path.join(tmp, f"life-{what}"))
    problems, counts = [], {"written": 0, "original": 0, "ours": 0}
    for where in sorted(set(first) | set(after) | set(written)):
        files = sorted(os.listdir(os.path.join(tmp, f"life-{what}", where[0], str(where[1]))))
        problems += [
            f"{where[0]}/{where[1]}: {p}; left: {files}"
            for p in afterlife_problems(
                what, where, written.get(where, []), first.get(where, []), after.get(where, []), where[0] in cleanup
            )
        ]
        kept = {m.seq for m in first.get(where, [])}
        served = {m.seq for m in after.get(where, [])}
        counts["written"] += len(written.get(where, []))
        counts["original"] += len([m for m in written.get(where, []) if m.seq in kept])
        counts["ours"] += len([m for m in written.get(where, []) if m.seq in served])
    assert not problems, "\n".join(problems)
    return counts


def afterlife_problems(
    what: str,
    where: tuple[str, int],
    written: list[Consumed],
    original: list[Consumed],
    ours: list[Consumed],
    cleanup: bool,
) -> list[str]:
    """One partition held to the contract: `written` (dump of what `what` wrote), what the original's life and
    ours serve at the end. In a `cleanup` topic the broker compacts at its rolls when it sees fit (§6): a message it
    no longer serves is accounted for when a later message with the same key is served (its rule, §6.2)."""
    wrote = {m.seq: m for m in written}
    last = max(wrote, default=0)
    ours_by_seq = {m.seq: m for m in ours}
    newest = {m.key: m.seq for m in ours if m.key} if cleanup else {}
    kept = {m.seq for m in original}

    def gone(m: Consumed) -> bool:
        got = ours_by_seq.get(m.seq)
        if got is not None and (got == m or (m.seq > last and (got.key, got.value) == (m.key, m.value))):
            return False  # produced messages: same seq, key and value (their ts is the life's clock)
        return not (m.key and newest.get(m.key, 0) > m.seq)

    out = []
    lost = [s for s, m in wrote.items() if s in kept and gone(m)]
    if lost:
        out.append(
            f"{len(lost)} of the {len(wrote)} messages {what} wrote are gone after the broker's life although the "
            f"original's life keeps them (seqs {_ranges(lost)})"
        )
    alien = [
        m.seq
        for m in ours
        if (wrote.get(m.seq) != m if m.seq <= last else (m.key, m.value) != fleet_message(*where, m.seq, cleanup))
    ]
    if alien:
        out.append(f"seqs {_ranges(alien)} served, neither as {what} wrote them nor as produced")
    produced_lost = [m.seq for m in original if m.seq > last and gone(m)]
    if produced_lost:
        out.append(
            f"seqs {_ranges(produced_lost)} produced during the life are served after the original's life, not "
            f"after the life of what {what} wrote"
        )
    return out


def _ranges(seqs: list[int]) -> str:
    out: list[list[int]] = []
    for s in sorted(seqs):
        if out and s == out[-1][1] + 1:
            out[-1][1] = s
        else:
            out.append([s, s])
    return ", ".join(f"{a}..{b}" if a != b else str(a) for a, b in out[:8]) + (" ..." if len(out) > 8 else "")


def test_the_life_deletes_by_the_name_and_keeps_the_rest(tmp_path):
    """The life itself (the oracle's rules the tests below rely on): on the original, the broker deletes ev/0's front
    segment (named 40 days ago, past `log.retention.secs=30days`) at its first roll and keeps everything else,
    though ev/0's 61..200 and all of ev/2 hold messages 70–90 days old (ages go by the name, §2.2, §5); ev/1's week-old
    active segment rolls at the first append (§2.4 rule 6); every produced message is served."""
    base = original(str(tmp_path / "base"), int(time.time()))
    written = dump(base)
    served = live(base, str(tmp_path / "life"))
    for where, msgs in written.items():
        if where[0] == "kv" and REAL:
            continue  # the real broker compacts it at its rolls (§6)
        got = served[where]
        kept = msgs[60:] if where == ("ev", 0) else msgs
        assert got[: len(kept)] == kept, where
        last = msgs[-1].seq
        assert [m.seq for m in got[len(kept) :]] == list(range(last + 1, last + 1 + 2 * PRODUCED)), where
    ev1 = partitions_at(str(tmp_path / "life"), ["ev"])[1]
    assert "101-150_" in " ".join(s.file_name for s in ev1.ro)  # rolled by age at the first append


@pytest.mark.skipif(not REAL, reason=str(BINARIES))
def test_the_stand_in_lives_as_the_broker(tmp_path):
    """The stand-in's `--life` is a model; the real broker the oracle: the same life on the original leaves the same
    messages of every `delete` topic (the produced ones compared by seq, key and value: their ts is the clock's)."""
    base = original(str(tmp_path / "base"), int(time.time()))
    model = live(base, str(tmp_path / "standin"), real=False)
    oracle = live(base, str(tmp_path / "broker"), real=True)
    assert set(model) == set(oracle)
    for where in model:
        if where[0] != "kv":  # the stand-in does not compact (§6)
            got = [(m.seq, m.key, m.value) for m in model[where]]
            assert got == [(m.seq, m.key, m.value) for m in oracle[where]], where


def test_compaction(tmp_path):
    """`tank-log compact --force --broker-stopped` of the `cleanup` topic, and of the `delete` topic through the job
    config's override (compact a topic the broker keeps by retention): its outputs must not age sooner than the
    segments they replace."""
    now = int(time.time())
    base = original(str(tmp_path / "original"), now)
    ours = served_copy(base, tmp_path / "compacted")
    config = tmp_path / "job.yaml"
    config.write_text("compaction:\n  topics:\n    ev:\n      policy: cleanup\n")
    for args in (["--topics", "kv"], ["--topics", "ev", "--config", str(config)]):
        r = subprocess.run(
            [TANK_LOG, "compact", ours, "--force", "--broker-stopped", *args],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    written = dump(ours)
    assert all(len(written[w]) < len(m) for w, m in dump(base).items()), "nothing compacted"
    check_afterlife("compaction", base, ours, str(tmp_path))


def test_salvage(tmp_path):
    """`tank-log maintain --salvage --broker-stopped` after damage the broker itself exits or aborts on (a torn
    active tail, §3.11; a missing and a 0-byte RO index, §4.5; an interrupted compaction's `.cleaned`, §6.4); it
    also runs our retention and compaction with the topics' config. The original: the base before the damage."""
    base = original(str(tmp_path / "original"), int(time.time()))
    ours = served_copy(base, tmp_path / "salvaged")
    ev0, ev2 = partitions_at(ours, ["ev"])[0], partitions_at(ours, ["ev"])[2]
    assert ev0.active is not None and ev2.active is not None
    with open(ev0.active.path, "ab") as fh:
        fh.write(b"\x40\x00\x01")  # a bundle of 64 bytes cut after 2
    os.unlink(ev0.ro[1].index_path)
    open(ev2.ro[0].index_path, "wb").close()
    ro = ev2.ro[1]
    with open(ro.path, "rb") as src, open(os.path.join(ev2.path, f"{ro.base}-0_0.ilog.cleaned"), "wb") as dst:
        dst.write(src.read())
    r = subprocess.run(
        [TANK_LOG, "maintain", ours, "--broker-stopped", "--salvage"], capture_output=True, text=True, timeout=900
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert verify_path(ours) == []
    check_afterlife("salvage", base, ours, str(tmp_path))


def test_repair(tmp_path):
    """`tank-log repair` after a broker killed inside its roll (§2.5): ev/1's active segment renamed RO and no next
    one, ev/2's renamed and a 0-byte next one. The original: the base as the kill left it (the broker hides its RO
    data after the first append, until a restart re-opens the partition, §11.16)."""
    base = original(str(tmp_path / "original"), int(time.time()))
    for p, empty_active in ((1, False), (2, True)):
        part = partitions_at(base, ["ev"])[p]
        a = part.active
        assert a is not None
        last, mtime = max(m.seq for m in a.messages()), int(os.stat(a.path).st_mtime)
        os.rename(a.path, os.path.join(part.path, f"{a.base}-{last}_{mtime}.ilog"))
        if empty_active:
            for name in (f"{last + 1}_{mtime}.log", f"{last + 1}.index"):
                open(os.path.join(part.path, name), "wb").close()
    ours = served_copy(base, tmp_path / "repaired")
    r = subprocess.run([TANK_LOG, "repair", ours], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert verify_path(ours) == []
    check_afterlife("repair", base, ours, str(tmp_path))


@pytest.mark.slow
@pytest.mark.spark
def test_import_into_a_fresh_base_and_with_append(tmp_path):
    """jobs/import_delta.py (in the driver) from a Delta table jobs/export_delta.py wrote of the original: into a
    fresh base, then, after the original rolled and took new messages, with `--append`. The import restores each
    topic's config; its segments must not age sooner than the original's (a restore is no older than what it
    restores)."""
    now = int(time.time())
    src = original(str(tmp_path / "original"), now)
    table, dst = str(tmp_path / "table"), str(tmp_path / "restored")
    exp = ["--data-dir", src, "--table", table]
    for job, args in (("export_delta", exp), ("import_delta", ["--data-dir", dst, "--table", table])):
        r = run_job_script(job, *args, where="driver")
        assert r.returncode == 0, r.stderr[-3000:]
    assert dump(dst) == dump(src)
    check_afterlife("the import", src, dst, str(tmp_path / "fresh"))

    for part in partitions_at(src, ["ev", "kv"]):  # the broker's roll, then new messages continuing the counter
        a = part.active
        assert a is not None
        last = max(m.seq for m in a.messages())
        os.rename(a.path, os.path.join(part.path, f"{a.base}-{last}_{now - 3600}.ilog"))
        write_segment(part.path, _msgs(last + 1, last + 30, now - 60 * DAY, tag=b"new "), active=True, ts=now - 600)
    for job, args in (("export_delta", exp), ("import_delta", ["--data-dir", dst, "--table", table, "--append"])):
        r = run_job_script(job, *args, where="driver")
        assert r.returncode == 0, r.stderr[-3000:]
    assert dump(dst) == dump(src)
    check_afterlife("the import --append", src, dst, str(tmp_path / "appended"))
