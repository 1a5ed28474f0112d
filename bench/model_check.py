"""A model-based check of the whole product: produce, the broker's life, our maintenance and the export, in random
seeded interleavings, against a model of every partition's log and of the table.

    python bench/model_check.py --seed 7 --examples 20 --steps 30      # a long run
    python bench/model_check.py --short                                # the suite's run (tests/test_model_check.py)

Each example draws an export configuration (format × mode × partition_by × retention's guard) and
then a sequence of steps (hypothesis' rule-based state machine):

- **produce**: bundles with sparse seqs, far and repeated timestamps, keyless and binary keys, empty and binary
  values (tombstones), through the library's appender, which rolls as the broker does (§2.4);
- **the broker's life**: its own retention by the segments' names (§5) on the topic that has it, and a restart
  (the partitions opened again; the real broker is the oracle of `tests/e2e/test_broker_afterlife.py`);
- **our maintenance**: compaction (`tank-log compact --force`), retention with and without `keep_unexported`, repair,
  a compaction killed at a random file operation and the repair after it;
- **the export** (in the driver, delta-rs or pyiceberg), and **other engines** on the table (delta-rs OPTIMIZE and
  VACUUM; DuckDB reading it);
- **damage**, on a copy of the base path: a bundle cut out, duplicated or truncated in an RO segment; every writer
  that reads the partition must refuse it (exit non-zero, the partition unchanged; retention that deletes the
  segment must name the damage), and an export into a new table holds nothing of it but produced messages (damage
  no reader can see without checksums, a cut before a sparse bundle, is skipped and counted);
- **the import** of the table into a fresh base path: exactly the exported messages (served by the real broker
  when `TANK_BIN` and `TANK_CLI` are set).

After every step the invariants hold, checked with readers we did not write where there is one (DuckDB for the
table):

1. every message on disk is the one produced at its seq (nothing renumbered or altered);
2. every produced message missing from disk was removed by a rule we ran or the broker's retention, and legally:
   compaction only removes a keyed message with a later one of its key, or a keyless empty one; retention only whole
   segments from the front, and with the guard nothing the table has not received;
3. the table holds exactly the messages exported (append: each once; latest: the latest live message of each key);
4. `tank-log audit` finds nothing unaccounted.

It prints the seed, the steps, the combinations covered and `violations: 0`; a violation fails with the shortest
sequence of steps that breaks (hypothesis shrinks it).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from hypothesis import HealthCheck, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule  # noqa: E402

from tank_log.format.bundle import Message  # noqa: E402
from tank_log.storage.appender import PartitionAppender  # noqa: E402

MAX_TS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z: the latest ts a table's timestamp holds
NOW_MS = 1_790_000_000_000
TOPICS = {  # topic → (config, partitions)
    "kv": ("log.cleanup.policy=cleanup\nlog.segment.bytes=1kb\n", 2),
    "ev": ("log.segment.bytes=1kb\n", 1),
    "raw": ("log.segment.bytes=1kb\nlog.retention.segments.count=2\n", 1),
}
GUARDED = "ev"  # the topic our retention deletes from (its limits in the job config, none in its broker config)
BROKERS_OWN = "raw"  # the topic whose retention is the broker's own (unguarded)
KEYS = [b"k%d" % i for i in range(6)] + [bytes([0, 255, i]) for i in range(3)]
COVERED: Counter[str] = Counter()  # what the run exercised, printed at the end


class Violation(AssertionError):
    """An invariant that does not hold."""


@dataclass(frozen=True)
class Msg:
    ts: int
    key: bytes | None
    value: bytes


@dataclass
class Log:
    """The model of one partition: every message produced, and the seqs rules removed (and which rule)."""

    produced: dict[int, Msg] = field(default_factory=dict)
    removed: dict[int, str] = field(default_factory=dict)
    last: int = 0


@dataclass(frozen=True)
class Combo:
    """One example's export configuration."""

    fmt: str
    mode: str
    partition_by: str
    guard: bool

    def __str__(self) -> str:
        return f"{self.fmt}/{self.mode}/by={self.partition_by or '-'}/guard={'on' if self.guard else 'off'}"


def quiet_call(fn: Any, *args: Any) -> tuple[int, str]:
    """Run a command's `main` in this process: its exit code and what it wrote to stdout and stderr."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = fn(list(args))
        except SystemExit as ex:
            code = ex.code if isinstance(ex.code, int) else 2
    return int(code or 0), out.getvalue()


def tank_log(*args: str) -> tuple[int, str]:
    from tank_log.tools.cli import main

    return quiet_call(main, *args)


def export_job(*args: str) -> tuple[int, str]:
    from tank_spark.export.job import main

    return quiet_call(main, "--master", "local[1]", *args)


def import_job(*args: str) -> tuple[int, str]:
    from tank_spark.import_delta import main

    return quiet_call(main, "--master", "local[1]", *args)


def retention_job(*args: str) -> tuple[int, str]:
    from tank_spark.retention import main

    return quiet_call(main, "--master", "local[1]", *args)


class ProductMachine(RuleBasedStateMachine):
    """One example: a base path, a table, and the model of both."""

    def __init__(self) -> None:
        super().__init__()
        self.work = tempfile.mkdtemp(prefix="tank-model-")
        self.base = os.path.join(self.work, "base")
        self.table = os.path.join(self.work, "table")
        self.logs: dict[tuple[str, int], Log] = {}
        self.exported: dict[tuple[str, int], dict[int, Msg]] = {}  # what the table must hold (append)
        self.recorded: dict[tuple[str, int], int] = {}
        self.combo: Combo | None = None
        self.config = os.path.join(self.work, "job.yaml")
        for topic, (config, n) in TOPICS.items():
            os.makedirs(os.path.join(self.base, topic))
            with open(os.path.join(self.base, topic, "config"), "w") as fh:
                fh.write(config)
            for p in range(n):
                os.makedirs(os.path.join(self.base, topic, str(p)))
                self.logs[(topic, p)] = Log()

    def teardown(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)

    # ---- the example's configuration ---------------------------------------------------------------------------

    @initialize(
        fmt=st.sampled_from(["delta", "iceberg"]),
        mode=st.sampled_from(["append", "latest"]),
        partition_by=st.sampled_from(["", "topic,date", "topic,partition", "partition,date"]),
        guard=st.booleans(),
    )
    def configure(self, fmt: str, mode: str, partition_by: str, guard: bool) -> None:
        self.combo = Combo(fmt, mode, partition_by, guard)
        COVERED[f"combo {self.combo}"] += 1
        retention: dict[str, Any] = {
            "topics": {GUARDED: {"segments_count": 2}, BROKERS_OWN: {"keep_unexported": False}}
        }
        if guard:
            retention["keep_unexported"] = {"table": self.table, "max_holdback_size": 0, "max_holdback_age": 0}
        with open(self.config, "w") as fh:
            json.dump({"data_dirs": [self.base], "broker_stopped": True, "retention": retention,
                       "export": {"table": self.table, "format": fmt}}, fh)  # fmt: skip

    # ---- produce -----------------------------------------------------------------------------------------------

    @rule(
        where=st.sampled_from(sorted((t, p) for t, (_, n) in TOPICS.items() for p in range(n))),
        bundles=st.lists(
            st.tuples(
                st.sampled_from([0, 0, 0, 1, 37]),  # seqs skipped before the bundle (a sparse bundle)
                st.lists(
                    st.tuples(
                        st.sampled_from([NOW_MS, NOW_MS, 0, 32_503_680_000_000, MAX_TS]),  # ts: repeated, 1970, 3000
                        st.sampled_from([None, *KEYS]),
                        st.sampled_from([b"", b"v", b"\x00\xff" * 40, b"x" * 300]),
                    ),
                    min_size=1,
                    max_size=8,
                ),
            ),
            min_size=1,
            max_size=6,
        ),
    )
    def produce(self, where: tuple[str, int], bundles: list[tuple[int, list[tuple[int, bytes | None, bytes]]]]) -> None:
        log = self.logs[where]
        appender = PartitionAppender(os.path.join(self.base, *map(str, where)))
        assert appender.last == log.last or not log.produced, (appender.last, log.last)
        for skip, messages in bundles:
            if appender.last == 0 or not os.listdir(appender.path):
                skip = 0  # the first bundle of a partition starts at seq 1
            first = appender.last + 1 + skip
            batch = [Message(first + i, ts, key, value) for i, (ts, key, value) in enumerate(messages)]
            try:
                appender.append(batch)
            except ValueError:  # a gap where no active segment can hold it: the producer's refusal, not ours
                COVERED["produce refused (gap with no active segment)"] += 1
                continue
            for m in batch:
                log.produced[m.seq] = Msg(m.ts, m.key, m.value)
            log.last = batch[-1].seq
            COVERED["produce sparse" if skip else "produce"] += 1

    # ---- the broker's life ---------------------------------------------------------------------------------------

    @rule(retain=st.booleans())
    def broker_life(self, retain: bool) -> None:
        """The broker opens every partition again (§2.6: a 0-byte active segment is deleted); with `retain`, it applies
        its own retention to the topic whose config has limits, by the segments' names (§5), as at a roll."""
        from tank_log.maintenance.retention import RetentionRules, plan_retention
        from tank_log.storage.datadir import scan_data_dir

        for part in scan_data_dir(self.base).partitions():
            if part.active is not None and part.active.size == 0:
                os.unlink(part.active.path)
            if retain and part.topic == BROKERS_OWN:
                rules = RetentionRules.from_config(part.config)
                for seg, _ in plan_retention(part, rules, time.time()):
                    first, last = seg.base, seg.last
                    for f in (seg.path, seg.index_path):
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(f)
                    log = self.logs[part.key]
                    for s in list(log.produced):
                        if first <= s <= (last or first):
                            log.removed.setdefault(s, "broker retention")
                    COVERED["broker retention deleted a segment"] += 1
        COVERED["broker life"] += 1

    # ---- our maintenance -----------------------------------------------------------------------------------------

    @rule()
    def compact(self) -> None:
        before = self._disk()
        code, out = tank_log("compact", "--force", "--broker-stopped", self.base)
        self._expect(code == 0, f"compact exited {code}: {out[-2000:]}")
        self._removed_by_compaction(before, self._disk())
        COVERED["compact"] += 1

    @rule(k=st.integers(min_value=1, max_value=6))
    def compact_killed_then_repaired(self, k: int) -> None:
        """A compaction killed (os._exit, no clean-up) after its k-th file operation, then `repair`."""
        from tank_log.maintenance.compaction.compact import compact_partition
        from tank_log.maintenance.compaction.options import CompactionOptions
        from tank_log.storage.datadir import scan_partition

        before = self._disk()
        where = ("kv", k % 2)
        path = os.path.join(self.base, *map(str, where))
        pid = os.fork()
        if pid == 0:
            count = [0]

            def hook(step: str) -> None:
                count[0] += 1
                if count[0] == k:
                    os._exit(77)

            try:
                part = scan_partition(path, *where)
                compact_partition(part, CompactionOptions(force=True, broker_stopped=True), base_path=self.base,
                                  on_step=hook)  # fmt: skip
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        COVERED["compaction killed" if os.WEXITSTATUS(status) == 77 else "compaction finished before the kill"] += 1
        code, out = tank_log("repair", self.base)
        self._expect(code == 0, f"repair after a killed compaction exited {code}: {out[-2000:]}")
        self._removed_by_compaction(before, self._disk())

    @rule()
    def retention(self) -> None:
        before = self._disk()
        code, out = retention_job("--data-dir", self.base, "--config", self.config, "--broker-stopped")
        self._expect(code == 0, f"retention exited {code}: {out[-2000:]}")
        after = self._disk()
        for where, seqs in before.items():
            gone = sorted(set(seqs) - set(after[where]))
            if not gone:
                continue
            limited = where[0] in (GUARDED, BROKERS_OWN)
            self._expect(limited, f"{where}: retention removed {gone[:5]}… of a topic it does not limit")
            left = sorted(after[where])
            self._expect(not left or gone[-1] < left[0], f"{where}: retention removed seqs after kept ones")
            if self.combo is not None and self.combo.guard and where[0] == GUARDED:
                held = self.recorded.get(where, 0)
                self._expect(
                    gone[-1] <= held, f"{where}: retention with the guard removed {gone[-1]} > exported {held}"
                )
            for s in gone:
                self.logs[where].removed[s] = "retention"
        COVERED["retention guarded" if self.combo and self.combo.guard else "retention"] += 1

    # ---- damage --------------------------------------------------------------------------------------------------

    @rule(kind=st.sampled_from(["cut", "duplicate", "truncate"]), pick=st.integers(min_value=0, max_value=1000))
    def damage_is_refused(self, kind: str, pick: int) -> None:
        """Damage one RO segment of a copy of the base path: every writer that reads the damaged partition refuses it
        (exit non-zero) and leaves it as it is, and an export into a new table holds nothing of it that is not the
        model's message at its seq."""
        from tank_log.storage.datadir import scan_data_dir

        base, table, config = self._copy_world()
        segments = [s for p in scan_data_dir(base).partitions() for s in p.ro]
        candidates = [(s, *_bundles(s.path)) for s in segments]
        candidates = [c for c in candidates if len(c[1]) >= 2]
        if not candidates:
            return self._discard(base)
        seg, bundles, sparse = candidates[pick % len(candidates)]
        original = open(seg.path, "rb").read()
        i = pick % (len(bundles) - 1)
        if kind in ("cut", "duplicate") and any(sparse[i + 1 :]):
            # a later sparse bundle carries its own first seq, so the segment still ends at its name's last seq:
            # the seqs cut out look like a producer's gap and a repeated bundle numbers its copy into it; unless an
            # index entry falls on a shifted bundle, nothing on disk tells this from what a producer writes (no
            # checksums, §11.18): not damage a reader can see
            COVERED[f"damage {kind} before a sparse bundle (undetectable, skipped)"] += 1
            return self._discard(base)
        start, end = bundles[i], bundles[i + 1]
        damaged = {
            "cut": original[:start] + original[end:],
            "duplicate": original[:end] + original[start:end] + original[end:],
            "truncate": original[:start],
        }[kind]
        with open(seg.path, "wb") as fh:
            fh.write(damaged)
        part_dir = os.path.dirname(seg.path)
        topic, pid = os.path.basename(os.path.dirname(part_dir)), int(os.path.basename(part_dir))
        snapshot = _tree(part_dir)
        export = [a.replace(self.base, base).replace(self.table, table) for a in self._export_args()]
        report = os.path.join(os.path.dirname(base), "retention.json")
        runs = {
            "compact": lambda: tank_log("compact", "--force", "--broker-stopped", base),
            "maintain": lambda: tank_log("maintain", "--broker-stopped", "--force", base),
            "retention": lambda: retention_job(
                "--data-dir", base, "--config", config, "--broker-stopped", "--report", report
            ),  # fmt: skip
            "export": lambda: export_job(*export),
        }
        reads = {"compact": {"kv"}, "maintain": set(TOPICS), "export": set(TOPICS)}  # what each run reads in full
        for name, run in runs.items():
            if name == "export" and self.combo is None:
                continue
            code, out = run()
            if name == "retention":  # reads only what it deletes: a damaged segment it deletes is named
                if not os.path.exists(seg.path):
                    named = os.path.basename(seg.path) in _damage_named(report)
                    self._expect(named, f"retention deleted {seg.path} ({kind} bundle) without naming the damage")
                    COVERED[f"damage {kind}: retention named what it deleted"] += 1
                continue
            if name == "maintain" and not os.path.exists(seg.path):  # its retention step deleted the segment
                named = os.path.basename(seg.path) in out and "damage" in out
                self._expect(named, f"maintain deleted {seg.path} ({kind} bundle) without naming the damage")
                COVERED[f"damage {kind}: maintain's retention named what it deleted"] += 1
                return self._discard(base)
            if topic in reads[name]:  # a run that reads the damaged partition refuses it
                self._expect(code != 0, f"{name} exited 0 over a {kind} bundle in {seg.path}: {out[-1500:]}")
                COVERED[f"damage {kind}: {name} refused"] += 1
            self._expect(_tree(part_dir) == snapshot, f"{name} changed {part_dir} over a {kind} bundle")
        if self.combo is not None and os.path.isdir(table):
            produced = self.logs[(topic, pid)].produced
            seen: Counter[int] = Counter()
            for t, p, seq, key, value in _duckdb_rows(table, self.combo.fmt):
                if (t, p) != (topic, pid):
                    continue
                seen[seq] += 1
                m = produced.get(seq)
                wrote = f"the export over a {kind} bundle wrote seq {seq} as {key!r}/{value[:20]!r}, produced {m}"
                self._expect(m is not None and (m.key, m.value) == (key, value), wrote)
            self._expect(max(seen.values(), default=1) == 1, f"the export over a {kind} bundle duplicated rows")
        self._discard(base)

    def _discard(self, base: str) -> None:
        shutil.rmtree(os.path.dirname(base))

    def _copy_world(self) -> tuple[str, str, str]:
        """A copy of the base path, a new table and the job configuration naming the copy (its retention guard still
        reads the real table), for a step whose effects are checked and then thrown away."""
        scratch = tempfile.mkdtemp(dir=self.work, prefix="copy-")
        base, table = os.path.join(scratch, "base"), os.path.join(scratch, "table")
        shutil.copytree(self.base, base)
        config = os.path.join(scratch, "job.yaml")
        with open(self.config) as src, open(config, "w") as dst:
            dst.write(src.read().replace(self.base, base))
        return base, table, config

    # ---- the export and other engines ------------------------------------------------------------------------------

    def _export_args(self) -> list[str]:
        assert self.combo is not None
        args = ["--data-dir", self.base, "--table", self.table, "--format", self.combo.fmt, "--mode", self.combo.mode]
        return [*args, "--source", "model", f"--partition-by={self.combo.partition_by}"]

    @precondition(lambda self: self.combo is not None)
    @rule()
    def export(self) -> None:
        disk = self._disk()
        code, out = export_job(*self._export_args())
        lost = [w for w, seqs in disk.items() if self._lost_before_export(w, seqs)]
        if lost:  # the broker deleted messages the table never got: the export names the loss, exit 1
            self._expect(code == 1 and "data-loss" in out, f"export over {lost}'s loss exited {code}: {out[-2000:]}")
            COVERED["export named the broker's deletion of unexported messages"] += 1
        else:
            self._expect(code == 0, f"export {self.combo} exited {code}: {out[-2000:]}")
        for where, seqs in disk.items():
            held = self.recorded.get(where, 0)
            new = {s: self.logs[where].produced[s] for s in seqs if s > held}
            self.exported.setdefault(where, {}).update(new)
            if seqs:
                self.recorded[where] = max(held, max(seqs))
        COVERED[f"export {self.combo}"] += 1

    @precondition(lambda self: self.combo is not None and self.combo.mode == "append" and self.recorded)
    @rule()
    def import_into_a_fresh_base(self) -> None:
        """The table imported into a new base path holds exactly the exported messages, each at its seq; with
        `TANK_BIN`/`TANK_CLI`, the real broker serves exactly them."""
        assert self.combo is not None
        restored = tempfile.mkdtemp(dir=self.work, prefix="restored-")
        args = ["--data-dir", restored, "--table", self.table, "--format", self.combo.fmt]
        code, out = import_job(*args)
        self._expect(code == 0, f"import of {self.combo} exited {code}: {out[-2000:]}")
        got = _messages_on_disk(restored)
        for where, msgs in self.exported.items():
            self._expect(got.get(where, {}) == msgs, f"{where}: the import wrote {len(got.get(where, {}))} messages, "
                         f"the table holds {len(msgs)} ({_first_difference(got.get(where, {}), msgs)})")  # fmt: skip
        served = _served_by_the_real_broker(restored)
        if served is not None:
            for where, msgs in self.exported.items():
                self._expect(served.get(where, {}) == msgs, f"{where}: the real broker serves the restore otherwise "
                             f"({_first_difference(served.get(where, {}), msgs)})")  # fmt: skip
            COVERED["import served by the real broker"] += 1
        shutil.rmtree(restored)
        COVERED[f"import {self.combo.fmt}"] += 1

    @precondition(lambda self: self.combo is not None and self.combo.fmt == "delta" and self.recorded)
    @rule()
    def optimize_and_vacuum_by_delta_rs(self) -> None:
        from deltalake import DeltaTable

        table = DeltaTable(self.table)
        table.optimize.compact()
        table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
        COVERED["delta-rs optimize+vacuum"] += 1

    def _lost_before_export(self, where: tuple[str, int], on_disk: dict[int, Msg]) -> bool:
        """Whether the broker deleted messages above the table's recorded seq (none exported) that nothing can
        export any more, and no export has named yet."""
        held = self.recorded.get(where, 0)
        log = self.logs[where]
        gone = [s for s, why in log.removed.items() if s > held and why == "broker retention" and s not in on_disk]
        return bool(gone)

    # ---- the invariants ------------------------------------------------------------------------------------------

    @invariant()
    def log_is_the_model(self) -> None:
        for where, seqs in self._disk().items():
            log = self.logs[where]
            for seq, msg in seqs.items():
                self._expect(
                    log.produced.get(seq) == msg, f"{where} seq {seq}: on disk {msg}, produced {log.produced.get(seq)}"
                )
            for seq in set(log.produced) - set(seqs):
                self._expect(seq in log.removed, f"{where}: seq {seq} is gone from disk and no rule removed it")

    @invariant()
    def table_is_what_was_exported(self) -> None:
        if self.combo is None or not self.recorded:
            return
        rows = _duckdb_rows(self.table, self.combo.fmt)
        want: Counter[tuple[str, int, int, bytes | None, bytes]] = Counter()
        if self.combo.mode == "append":
            for (topic, p), msgs in self.exported.items():
                for seq, m in msgs.items():
                    want[(topic, p, seq, m.key, m.value)] += 1
        else:
            for (topic, p), msgs in self.exported.items():
                latest: dict[bytes, tuple[int, Msg]] = {}
                for seq in sorted(msgs):
                    m = msgs[seq]
                    if m.key is not None:
                        latest[m.key] = (seq, m)
                for seq, m in latest.values():
                    if m.value:
                        want[(topic, p, seq, m.key, m.value)] += 1
        got = Counter(rows)
        if got != want:
            extra, lacking = got - want, want - got
            raise Violation(f"DuckDB reads {sum(got.values())} rows, the model {sum(want.values())}: extra "
                            f"{sorted(extra)[:3]}, lacking {sorted(lacking)[:3]}")  # fmt: skip
        code, out = tank_log("audit", "--table", self.table, "--format", self.combo.fmt, "--source", "model", self.base)
        self._expect(code == 0, f"audit: {out[-2000:]}")

    # ---- helpers -------------------------------------------------------------------------------------------------

    def _expect(self, ok: bool, what: str) -> None:
        if not ok:
            raise Violation(what)

    def _disk(self) -> dict[tuple[str, int], dict[int, Msg]]:
        return _messages_on_disk(self.base)

    def _removed_by_compaction(self, before: dict[tuple[str, int], dict[int, Msg]],
                               after: dict[tuple[str, int], dict[int, Msg]]) -> None:  # fmt: skip
        """Compaction removes a keyed message only when a later message of its key exists, a keyless one only when
        it is empty (§6.2); everything it keeps is unchanged (checked by `log_is_the_model`)."""
        for where, msgs in before.items():
            gone = set(msgs) - set(after[where])
            latest = {m.key: s for s, m in sorted(msgs.items()) if m.key is not None}
            for s in gone:
                m = msgs[s]
                legal = (m.key is not None and latest[m.key] > s) or (m.key is None and not m.value)
                self._expect(legal, f"{where}: compaction removed seq {s} ({m}), a survivor")
                self.logs[where].removed[s] = "compaction"
            if gone:
                COVERED["compaction removed messages"] += 1


def _messages_on_disk(base: str) -> dict[tuple[str, int], dict[int, Msg]]:
    """Every partition's messages on disk, by seq (our reader)."""
    from tank_log.storage.datadir import scan_data_dir

    out: dict[tuple[str, int], dict[int, Msg]] = {}
    for part in scan_data_dir(base).partitions():
        msgs: dict[int, Msg] = {}
        for seg in part.segments:
            for m in seg.messages():
                msgs[m.seq] = Msg(m.ts, m.key or None, m.value)
        out[part.key] = msgs
    return out


def _served_by_the_real_broker(base: str) -> dict[tuple[str, int], dict[int, Msg]] | None:
    """What the real TANK broker serves of (a copy of) `base`, as its client reads it; None without TANK_BIN and
    TANK_CLI."""
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
    from real_broker import RealBroker, binaries, consume_all, served_copy

    found = binaries()
    if isinstance(found, str):
        return None
    copy = served_copy(base, tempfile.mkdtemp(prefix="served-") + "/base")
    try:
        with RealBroker(*found, copy) as broker:
            return {
                where: {c.seq: Msg(c.ts, c.key or None, c.value) for c in consumed}
                for where, consumed in consume_all(broker)
            }
    finally:
        shutil.rmtree(os.path.dirname(copy), ignore_errors=True)


def _first_difference(got: dict[int, Msg], want: dict[int, Msg]) -> str:
    for seq in sorted(set(got) | set(want)):
        if got.get(seq) != want.get(seq):
            return f"seq {seq}: {got.get(seq)} != {want.get(seq)}"
    return "equal"


def _bundles(path: str) -> tuple[list[int], list[bool]]:
    """A segment's bundles: their file offsets and its end, and whether each is sparse (carries its own seqs)."""
    from tank_log.format.bundle import SPARSE
    from tank_log.storage.segment import Segment

    walk = Segment(path).tables()
    offsets: list[int] = []
    sparse: list[bool] = []
    for file_offset, table in walk:
        offsets += (table.offsets + file_offset).tolist()
        sparse += [bool(f & SPARSE) for f in table.flags.tolist()]
    return offsets + ([walk.tail.valid_end] if walk.tail is not None else []), sparse


def _damage_named(report: str) -> set[str]:
    """The segments a retention report names as damaged (entries with a `damage`)."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "damage" in node and "name" in node:
                found.add(str(node["name"]))
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    with open(report) as fh:
        walk(json.load(fh))
    return found


def _tree(path: str, skip: str = ".tank-log") -> dict[str, bytes]:
    """Every file under `path` by relative path, with its bytes (our lock files, `skip`, left out)."""
    out: dict[str, bytes] = {}
    for dirpath, _, names in os.walk(path):
        for n in names:
            if not n.startswith(skip):
                with open(os.path.join(dirpath, n), "rb") as fh:
                    out[os.path.relpath(os.path.join(dirpath, n), path)] = fh.read()
    return out


def _duckdb_rows(table: str, fmt: str) -> list[tuple[str, int, int, bytes | None, bytes]]:
    """The table's rows as DuckDB reads them (an engine nobody here wrote)."""
    import glob
    import importlib

    import duckdb

    con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
    for name in ("delta",) if fmt == "delta" else ("avro", "iceberg"):
        package = os.path.dirname(importlib.import_module(f"duckdb_extension_{name}").__file__ or "")
        (ext,) = glob.glob(os.path.join(package, "extensions", "*", f"{name}.duckdb_extension"))
        con.execute(f"LOAD '{ext}'")
    if fmt == "delta":
        source = f"delta_scan('{table}')"
    else:
        from tank_log.lakehouse import TableLocation

        opened: Any = TableLocation.of(table, fmt="iceberg").open()
        source = f"iceberg_scan('{opened.table.metadata_location.removeprefix('file://')}')"
    rows = con.execute(f"SELECT topic, partition, seq, key, value FROM {source}").fetchall()
    return [(t, int(p), int(s), bytes(k) if k is not None else None, bytes(v)) for t, p, s, k, v in rows]


def run(seed: int, examples: int, steps: int) -> dict[str, Any]:
    """Run the state machine; returns the figures (raises on a violation, with the shortest failing steps)."""
    from hypothesis import seed as with_seed
    from hypothesis.stateful import run_state_machine_as_test

    logging.disable(logging.CRITICAL)
    COVERED.clear()
    random.seed(seed)
    started = time.monotonic()
    config = settings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    test = with_seed(seed)(lambda: run_state_machine_as_test(ProductMachine, settings=config))
    test()
    return {
        "seed": seed,
        "examples": examples,
        "steps_per_example": steps,
        "steps": sum(v for k, v in COVERED.items() if not k.startswith("combo")),
        "combinations": sorted(k.removeprefix("combo ") for k in COVERED if k.startswith("combo ")),
        "covered": dict(sorted(COVERED.items())),
        "violations": 0,
        "seconds": round(time.monotonic() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--examples", type=int, default=30)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--short", action="store_true", help="the suite's run: a few examples of a few steps")
    args = ap.parse_args(argv)
    examples, steps = (10, 20) if args.short else (args.examples, args.steps)
    print(f"model check: seed {args.seed}, {examples} examples of up to {steps} steps", flush=True)
    try:
        figures = run(args.seed, examples, steps)
    except Violation as err:
        print(f"violations: 1\n{err}")
        return 1
    print(json.dumps(figures, indent=2))
    print("violations: 0")
    return 0


if __name__ == "__main__":
    sys.exit(main())
