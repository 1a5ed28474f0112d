"""A model-based check of the whole product: produce, the broker's life, our maintenance and the export, in random
seeded interleavings, against a model of every partition's log and of the table.

    python bench/model_check.py --seed 7 --examples 20 --steps 30      # a long run (--minutes N: bounded in time)
    python bench/model_check.py --engine spark --minutes 30           # ... with Delta append tables on engine spark
    python bench/model_check.py --short                                # the suite's run (tests/test_model_check.py)
    python bench/model_check.py --short-spark                          # the suite's Spark run

Each example draws an export configuration (format × mode × partition_by × retention's guard × engine × value format
× in the driver or on executors, `in_driver_max_bytes`; what the export refuses is not drawn: Iceberg and latest
tables on delta-rs/pyiceberg, latest tables with binary or utf8 values) and then a sequence of steps (hypothesis'
rule-based state machine):

- **produce**: bundles with sparse seqs, far and repeated timestamps, keyless and binary keys, empty, binary and JSON
  values (tombstones), through the library's appender, which rolls as the broker does (§2.4);
- **the broker's life**: its own retention by the segments' names (§5) on the topic that has it, and a restart
  (the partitions opened again); with `TANK_BIN`/`TANK_CLI`, the real broker started on a copy of the base path
  serves every partition as the model has it;
- **our maintenance**: compaction (`tank-log compact --force`), retention with and without `keep_unexported`, repair,
  a compaction killed at a random file operation and the repair after it; retention SIGKILLed right after a random
  file operation (`killed_job`), then run again;
- **the export**: in this process (the job's `prepare` and `execute`; those that need Spark on the run's one Spark
  session, created when first needed and stopped at the end); in a process of its own SIGKILLed while it holds
  before its commit, or dying at its crash hook (engine spark: after one partition's commit), then run again;
  `--continuous` (its own process and Spark) until the table holds the log, then SIGTERM;
- **other engines** on the table: delta-rs OPTIMIZE and VACUUM; delta-spark OPTIMIZE, VACUUM and DELETE (the
  deleted rows leave the model's table, and the audit must name exactly those still on disk as missing);
- **damage**, on a copy of the base path: a bundle cut out, duplicated or truncated in an RO segment; every writer
  that reads the partition must refuse it (exit non-zero, the partition unchanged; retention that deletes the
  segment must name the damage), and an export into a new table holds nothing of it but produced messages (damage
  no reader can see without checksums, a cut before a sparse bundle, is skipped and counted);
- **the import** of the table into a fresh base path, then `--append` into it after more exports: exactly the
  table's messages (served by the real broker when `TANK_BIN` and `TANK_CLI` are set); either SIGKILLed right after
  a random file operation, then (after `tank-log repair` or not) run again with `--append`, as the import guide
  tells the operator.

After every step the invariants hold, checked with readers we did not write where there is one:

1. every message on disk is the one produced at its seq (nothing renumbered or altered);
2. every produced message missing from disk was removed by a rule we ran or the broker's retention, and legally:
   compaction only removes a keyed message with a later one of its key, or a keyless empty one; retention only whole
   segments from the front, and with the guard nothing the table has not received; an export after messages were
   deleted before it read them names the loss (data-loss, exit 1), except compaction's in a latest table;
3. the table holds exactly the messages exported (append: each once, less what another engine deleted; latest: the
   latest live message of each key), as DuckDB, delta-rs or pyiceberg, and delta-spark (once Spark runs) read it;
4. `tank-log audit` finds nothing unaccounted (after a DELETE: exactly the deleted rows still on disk).

It prints the seed, the steps, the combinations covered and `violations: 0`; a violation fails with the shortest
sequence of steps that breaks (hypothesis shrinks it). Profiles (`--profile`): `full`; `nospark` (the suite's
`--short`: no option or step that needs Spark); `spark` (`--short-spark`: every example exports through Spark from
its first step, whatever the draws; at most 5 exports (each with news), imports and delta-spark steps an example,
no continuous export; the steps that need no Spark beyond produce, the export and the import are left to the other
runs).
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
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

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
JSON_SCHEMA = "id long"  # --value-format json: values b'{"id": N}' decode, the others are kept in raw_value
COVERED: Counter[str] = Counter()  # what the run exercised, printed at the end


@dataclass
class Profile:
    """Which option values and steps a run draws from: `spark` = whether steps that need Spark (engine spark, JSON
    values, exports on executors, the continuous export, delta-spark on the table) may be drawn, `only_spark` = every
    example's export needs Spark (the suite's short Spark run)."""

    spark: bool = True
    only_spark: bool = False
    max_kills: int = 1_000_000  # exports killed per run (at most one per example; each costs a process's start)
    max_jobs: int = 1_000_000  # exports, imports and delta-spark steps per example (seconds each with Spark)
    continuous: bool = True  # the continuous export (a process and a Spark of its own: tens of seconds a step)
    kills: int = 0


PROFILE = Profile()
PROFILES = {
    "full": Profile(),
    "nospark": Profile(spark=False, max_kills=3),
    "spark": Profile(only_spark=True, max_jobs=5, continuous=False),
}


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
    """One example's export configuration: format × mode × partition_by × retention's guard × engine × value format
    × in the driver or on executors (`export.in_driver_max_bytes`)."""

    fmt: str
    mode: str
    partition_by: str
    guard: bool
    engine: str = "deltalake"
    values: str = "binary"
    in_driver: bool = True

    def __str__(self) -> str:
        where = "driver" if self.runs_in_driver else "executors"
        return (
            f"{self.fmt}/{self.mode}/by={self.partition_by or '-'}/guard={'on' if self.guard else 'off'}/"
            f"{self.engine}/{self.values}/{where}"
        )

    @property
    def runs_in_driver(self) -> bool:
        """`job.in_driver`: delta-rs (or pyiceberg) with binary or utf8 values, within the size."""
        return self.in_driver and self.engine == "deltalake" and self.values != "json"

    @property
    def needs_spark(self) -> bool:
        return not self.runs_in_driver

    @property
    def importable(self) -> bool:
        """The import takes append tables of binary or utf8 values (a json table holds no producer bytes)."""
        return self.mode == "append" and self.values != "json"

    def normalized(self) -> Combo:
        """The combination the export takes: Iceberg commits through pyiceberg, latest tables MERGE on delta-rs with
        binary or utf8 values (`latest.check_mode`, `plan._check_format`)."""
        engine, values = self.engine, self.values
        if self.fmt == "iceberg" or self.mode == "latest":
            engine = "deltalake"
        if self.mode == "latest" and values == "json":
            values = "utf8"
        return Combo(self.fmt, self.mode, self.partition_by, self.guard, engine, values, self.in_driver)


PROFILE_ENGINES = ["deltalake", "spark"]  # the engines drawn with Spark: `--engine spark` narrows it


def _choices(spark: list[Any], plain: list[Any]) -> st.SearchStrategy[Any]:
    """The values a dimension draws from: with Spark (`PROFILE.spark`) all, without only `plain`, drawn when the
    run starts (the profile is set by then)."""
    return st.deferred(lambda: st.sampled_from(spark if PROFILE.spark else plain))


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


_SESSION: list[Any] = []  # the run's one Spark session: created lazily, stopped at the end (`run`)


def shared_spark(ctx: Any) -> Any:
    """The run's Spark session (Delta's jars and SQL extension loaded), for the exports that need Spark and for
    delta-spark on the table. A job started through its `main` (the import, retention) stops the Spark it finds, as
    in production: then the next use starts it again (counted)."""
    from tank_spark.context import spark_session

    if _SESSION and _SESSION[0].sparkContext._jsc is not None:
        return _SESSION[0]
    COVERED["spark session started" if not _SESSION else "spark session started again (a job's main stopped it)"] += 1
    _SESSION[:] = [spark_session(ctx, delta=True)]
    _SESSION[0].conf.set("spark.sql.shuffle.partitions", "2")  # tables of a few hundred rows: not 200 tasks a stage
    return _SESSION[0]


def stop_shared_spark() -> None:
    if _SESSION:
        from tank_spark.context import stop_spark

        if _SESSION[0].sparkContext._jsc is not None:
            stop_spark(_SESSION[0])
        _SESSION.clear()


def _context(job_name: str, add_options: Any, *args: str) -> tuple[Any, Any]:
    """A job's parsed flags and context, as its `main` builds them."""
    from tank_spark.context import build_context
    from tank_spark.job_options import job_parser

    parser = job_parser(job_name, "")
    add_options(parser)
    ns = parser.parse_args(["--master", "local[1]", *args])
    return ns, build_context(job_name, ns)


def export_job(*args: str) -> tuple[int, str]:
    """The export job's own `prepare` and `execute` in this process (what its `main` runs once Spark started), on the
    run's one Spark session when the export needs Spark (`job.needs_spark`; none when it runs in the driver): its
    exit code (`exits.exit_code`, 2 for a refusal) and its report's partitions and summary as JSON."""
    from tank_log.errors import JobConfigError, UsageError
    from tank_log.jobs.exits import exit_code
    from tank_spark.export import job

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            ns, ctx = _context("export_delta", job.add_options, *args)
            prepared = job._prepare(ctx, ns)
            spark = shared_spark(ctx) if job.needs_spark(ctx, prepared) else None
            results, summary = job.execute(ctx, prepared, spark)
        except (JobConfigError, UsageError) as err:
            return 2, f"export refused: {err}"
        except Exception as err:
            return 1, f"export failed: {type(err).__name__}: {err}\n{traceback.format_exc()[-3000:]}"
    return exit_code(results), json.dumps({"partitions": results, "summary": summary}, default=str)


def export_process(args: list[str], env: dict[str, str], log: str | None = None) -> subprocess.Popen[bytes]:
    """The export job's `main` in a process of its own (its own Spark when it needs one), in its own process group
    (a kill reaches the JVM too); its stderr to `log` when given."""
    code = "import sys; from tank_spark.export.job import main; sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, **env, "PYTHONPATH": ROOT}
    return subprocess.Popen(
        [sys.executable, "-c", code, "--master", "local[1]", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE if log is None else open(log, "wb"),  # noqa: SIM115 (the child's: closed at exit)
        start_new_session=True,
    )


def import_job(*args: str) -> tuple[int, str]:
    from tank_spark.import_delta import main

    return quiet_call(main, "--master", "local[1]", *args)


def retention_job(*args: str) -> tuple[int, str]:
    from tank_spark.retention import main

    return quiet_call(main, "--master", "local[1]", *args)


FILE_OPS = ("rename", "replace", "unlink", "remove", "rmdir", "mkdir", "link", "truncate", "ftruncate", "fsync")
JOBS = {"import": "tank_spark.import_delta", "retention": "tank_spark.retention"}


def killed_job(job: str, k: int, env: dict[str, str], *args: str) -> tuple[bool, int, str]:
    """A job's `main` in a process of its own (its own process group), SIGKILLed right after its k-th file operation
    (`die_at_file_op`): whether it was killed, its exit code, its stderr. For the jobs with no step hook of their
    own, as compaction's `on_step` is used in `compact_killed_then_repaired`."""
    code = f"import sys; sys.path.insert(0, {HERE!r}); import model_check; sys.exit(model_check.die_at_file_op())"
    done = subprocess.run(
        [sys.executable, "-c", code, JOBS[job], str(k), "--master", "local[1]", *args],
        env={**os.environ, **env, "PYTHONPATH": ROOT},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        timeout=600,
        check=False,
    )
    err = done.stderr.decode(errors="replace")
    return done.returncode == -signal.SIGKILL, done.returncode, err


def die_at_file_op() -> int:
    """`killed_job`'s child: `sys.argv[1:]` = module, k, the job's flags. The job's module imported first, then
    every file operation of `os` (FILE_OPS: what a crash-safe protocol's steps are made of) counted, and the process
    group SIGKILLed right after the k-th: a kill at a random point of the job's mutations, with no clean-up (k=0:
    none, each operation traced to stderr as `file op N: NAME ARGS`)."""
    import importlib

    module, k, args = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    job = importlib.import_module(module)
    count = [0]

    def counted(fn: Any) -> Any:
        def op(*a: Any, **kw: Any) -> Any:
            out = fn(*a, **kw)
            count[0] += 1
            if k == 0:  # a trace: which operation is which k
                print(f"file op {count[0]}: {fn.__name__} {' '.join(map(str, a))}", file=sys.stderr, flush=True)
            if count[0] == k:
                os.killpg(os.getpgrp(), signal.SIGKILL)
            return out

        return op

    for name in FILE_OPS:
        setattr(os, name, counted(getattr(os, name)))
    return int(job.main(args))


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
        self.deleted: dict[tuple[str, int], set[int]] = {}  # rows another engine deleted from the table (seqs)
        self.restored: str | None = None  # a base path the import restored the table into
        self.restored_model: dict[tuple[str, int], dict[int, Msg]] = {}  # what it must hold
        self.kills = 0  # exports killed in this example
        self.jobs = 0  # exports, imports and delta-spark steps in this example (`PROFILE.max_jobs`)
        self.last_read: tuple[Any, ...] | None = None  # the table's files and rows every engine read last
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
        engine=_choices(PROFILE_ENGINES, ["deltalake"]),
        values=_choices(["binary", "utf8", "json"], ["binary", "utf8"]),
        in_driver=_choices([True, False], [True]),
    )
    def configure(
        self, fmt: str, mode: str, partition_by: str, guard: bool, engine: str, values: str, in_driver: bool
    ) -> None:
        combo = Combo(fmt, mode, partition_by, guard, engine, values, in_driver).normalized()
        if PROFILE.only_spark and not combo.needs_spark:
            combo = Combo(fmt, mode, partition_by, guard, engine, values, False).normalized()
        self.combo = combo
        COVERED[f"combo {self.combo}"] += 1
        retention: dict[str, Any] = {
            "topics": {GUARDED: {"segments_count": 2}, BROKERS_OWN: {"keep_unexported": False}}
        }
        if guard:
            retention["keep_unexported"] = {"table": self.table, "max_holdback_size": 0, "max_holdback_age": 0}
        with open(self.config, "w") as fh:
            json.dump({"data_dirs": [self.base], "broker_stopped": True, "retention": retention,
                       "export": {"table": self.table, "format": fmt}}, fh)  # fmt: skip
        if PROFILE.only_spark:  # every example of the Spark profile exports through Spark at least once, whatever
            self._first_spark_export()  # the draws (they change with hypothesis' version: a seed alone cannot)

    def _first_spark_export(self) -> None:
        """A message on the first partition, exported with the example's combination (one that needs Spark)."""
        where = min((t, p) for t, (_, n) in TOPICS.items() for p in range(n))
        self.produce(where, [(0, [(NOW_MS, KEYS[0], b'{"id": 7}')])])
        self.export()

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
                        st.sampled_from([b"", b"v", b"\x00\xff" * 40, b"x" * 300, b'{"id": 7}', b'{"id": -1}']),
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

    @precondition(lambda self: not PROFILE.only_spark)
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

    @precondition(lambda self: not PROFILE.only_spark)
    @rule()
    def compact(self) -> None:
        before = self._disk()
        code, out = tank_log("compact", "--force", "--broker-stopped", self.base)
        self._expect(code == 0, f"compact exited {code}: {out[-2000:]}")
        self._removed_by_compaction(before, self._disk())
        COVERED["compact"] += 1

    @precondition(lambda self: not PROFILE.only_spark)  # the Spark profile's few steps go to the Spark-based ones
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

    @precondition(lambda self: not PROFILE.only_spark)
    @rule()
    def retention(self) -> None:
        before = self._disk()
        code, out = retention_job("--data-dir", self.base, "--config", self.config, "--broker-stopped")
        self._expect(code == 0, f"retention exited {code}: {out[-2000:]}")
        self._retained(before, self._disk())
        COVERED["retention guarded" if self.combo and self.combo.guard else "retention"] += 1

    @precondition(lambda self: not PROFILE.only_spark)
    @rule(k=st.integers(min_value=1, max_value=12))
    def retention_killed_then_run_again(self, k: int) -> None:
        """Retention (`jobs/retention.py`, with the example's guard or without) SIGKILLed right after its k-th file
        operation: what it deleted is a legal prefix (`_retained`), and the next run finishes the plan, exit 0; the
        real broker serves the log as the model has it."""
        before = self._disk()
        args = ["--data-dir", self.base, "--config", self.config, "--broker-stopped"]
        killed, code, err = killed_job("retention", k, {}, *args)
        self._expect(killed or code == 0, f"retention (not killed) exited {code}: {err[-2000:]}")
        guarded = "guarded" if self.combo and self.combo.guard else "unguarded"
        COVERED[f"retention killed ({guarded})" if killed else "retention finished before its kill"] += 1
        self._retained(before, self._disk())
        before = self._disk()
        code, out = retention_job(*args)
        self._expect(code == 0, f"retention after a kill exited {code}: {out[-2000:]}")
        self._retained(before, self._disk())
        if killed:
            self._served_as_the_model("the log after a killed retention")

    def _retained(self, before: dict[tuple[str, int], dict[int, Msg]],
                  after: dict[tuple[str, int], dict[int, Msg]]) -> None:  # fmt: skip
        """Retention removed only whole prefixes of the topics it limits, with the guard nothing the table has not
        received; what it removed is recorded in the model."""
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

    # ---- damage --------------------------------------------------------------------------------------------------

    @precondition(lambda self: not PROFILE.only_spark)
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
            for t, p, seq, key, value in _duckdb_rows(table, self.combo.fmt, self.combo.values):
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
        c = self.combo
        args = ["--data-dir", self.base, "--table", self.table, "--format", c.fmt, "--mode", c.mode]
        args += ["--source", "model", f"--partition-by={c.partition_by}", "--engine", c.engine]
        args += ["--value-format", c.values, "--in-driver-max-bytes", "1gb" if c.in_driver else "0"]
        return [*args, "--value-schema", JSON_SCHEMA] if c.values == "json" else args

    @precondition(
        lambda self: self.combo is not None and self._room() and (self._unexported() or not PROFILE.only_spark)
    )
    @rule()
    def export(self) -> None:
        self.jobs += 1
        disk = self._disk()
        code, out = export_job(*self._export_args())
        self._exported(disk, code, out, "export")
        COVERED[f"export {self.combo}"] += 1

    def _exported(self, disk: dict[tuple[str, int], dict[int, Msg]], code: int, out: str, what: str) -> None:
        """Check an export's exit against the model (a loss before the export is named: data-loss, exit 1) and
        record what the table now holds: every message on disk above what it held."""
        lost = [w for w, seqs in disk.items() if self._lost_before_export(w, seqs)]
        if lost:  # messages deleted before they were exported: the export names the loss, exit 1
            self._expect(code == 1 and "data-loss" in out, f"{what} over {lost}'s loss exited {code}: {out[-2000:]}")
            COVERED[f"{what} named messages deleted before they were exported"] += 1
        else:
            self._expect(code == 0, f"{what} {self.combo} exited {code}: {out[-2000:]}")
        self._record_exported(disk)

    def _record_exported(self, disk: dict[tuple[str, int], dict[int, Msg]]) -> None:
        for where, seqs in disk.items():
            held = self.recorded.get(where, 0)
            new = {s: self.logs[where].produced[s] for s in seqs if s > held}
            self.exported.setdefault(where, {}).update(new)
            if seqs:
                self.recorded[where] = max(held, max(seqs))

    @precondition(
        lambda self: (
            self.combo is not None
            and not self.kills
            and PROFILE.kills < PROFILE.max_kills
            and self._unexported()
            and self._room()
        )
    )
    @rule(how=st.sampled_from(["sigkill-before-commit", "crash-hook"]))
    def export_killed_then_run_again(self, how: str) -> None:
        """An export in a process of its own, SIGKILLed while it holds before its commit (its files written), or
        dying at the crash hook (engine spark: after its first partition's commit, before the others'); then the
        export again: every message once (`table_is_what_was_exported`)."""
        self.jobs += 1
        from tank_spark.export.hooks import CRASH, HOLD_BEFORE_COMMIT

        self.kills += 1  # once per example: a process of its own costs seconds
        PROFILE.kills += 1
        disk = self._disk()
        hold = os.path.join(self.work, "hold")
        env = {HOLD_BEFORE_COMMIT: hold} if how.startswith("sigkill") else {CRASH: "before-commit"}
        proc = export_process(self._export_args(), env)
        deadline = time.monotonic() + 600
        while proc.poll() is None and not os.path.exists(hold + ".ready") and time.monotonic() < deadline:
            time.sleep(0.05)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
        killed = proc.returncode in (-signal.SIGKILL, 137)
        if not killed:  # nothing to commit: it ended on its own
            self._expect(proc.returncode in (0, 1), f"export (not killed) exited {proc.returncode}: {err[-2000:]!r}")
        for f in (hold, hold + ".ready"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f)
        COVERED[f"export killed ({how})" if killed else "export ended before its kill point (nothing to do)"] += 1
        code, out = export_job(*self._export_args())
        if killed and any(self._lost_before_export(w, seqs) for w, seqs in disk.items()):
            # the killed run may have committed past the loss (and named it in a report nobody read)
            self._expect(code in (0, 1), f"export after a kill exited {code}: {out[-2000:]}")
            self._record_exported(disk)
        else:
            self._exported(disk, code, out, "export after a kill")
        COVERED[f"export after a kill {self.combo}"] += 1

    @precondition(
        lambda self: (
            PROFILE.spark
            and PROFILE.continuous
            and self.combo is not None
            and (self.combo.fmt, self.combo.mode, self.combo.engine) == ("delta", "append", "deltalake")
        )
    )
    @rule()
    def export_continuously(self) -> None:
        """`--continuous` (a Structured Streaming query, its own process and Spark) until the table holds what is
        on disk, then SIGTERM: exit 0, every message once; the batch export and it take turns on the table."""
        disk = self._disk()
        checkpoint = tempfile.mkdtemp(dir=self.work, prefix="checkpoint-")
        args = [*self._export_args(), "--continuous", "--checkpoint", checkpoint, "--trigger-interval", "1s"]
        log = checkpoint + ".log"
        proc = export_process([*args, "--on-data-loss", "skip"], {}, log)
        want = {w: max(seqs) for w, seqs in disk.items() if seqs}
        deadline = time.monotonic() + 600
        caught_up = False
        while proc.poll() is None and time.monotonic() < deadline:
            with open(log, "rb") as fh:
                streaming = b"continuous export: streaming into" in fh.read()  # SIGTERM stops it cleanly from here
            caught_up = streaming and self._table_holds(want)
            if caught_up:
                break
            time.sleep(0.5)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=300)
        with open(log, "rb") as fh:
            err = fh.read()
        self._expect(proc.returncode == 0 and caught_up, f"the continuous export exited {proc.returncode} "
                     f"(caught up: {caught_up}): {err[-3000:]!r}")  # fmt: skip
        self._record_exported(disk)
        COVERED["export continuous"] += 1

    def _room(self) -> bool:
        """Whether this example may run one more export, import or delta-spark step (`PROFILE.max_jobs`)."""
        return self.jobs < PROFILE.max_jobs

    def _unexported(self) -> bool:
        """Whether the model has messages above what the table holds (an export has something to commit)."""
        return any(log.last > self.recorded.get(where, 0) for where, log in self.logs.items())

    def _table_holds(self, want: dict[tuple[str, int], int]) -> bool:
        from tank_log.errors import TankLogError
        from tank_log.lakehouse import ExportedSeqs

        try:
            seqs = ExportedSeqs(self.table, source="model")
            return all((seqs.last_seq(*where) or 0) >= last for where, last in want.items())
        except TankLogError:  # not created yet
            return False

    @precondition(lambda self: self.combo is not None and self.combo.importable and self.recorded and self._room())
    @rule()
    def import_into_a_fresh_base(self) -> None:
        """The table imported into a new base path holds exactly the table's messages, each at its seq; with
        `TANK_BIN`/`TANK_CLI`, the real broker serves exactly them. It stays, for `import_appending`."""
        self.jobs += 1
        assert self.combo is not None
        restored = tempfile.mkdtemp(dir=self.work, prefix="restored-")
        args = ["--data-dir", restored, "--table", self.table, "--format", self.combo.fmt]
        code, out = import_job(*args)
        self._expect(code == 0, f"import of {self.combo} exited {code}: {out[-2000:]}")
        if self.restored is not None:
            shutil.rmtree(self.restored)
        self.restored, self.restored_model = restored, self._table_messages()
        self._check_restored("the import")
        COVERED[f"import {self.combo.fmt}"] += 1

    @precondition(
        lambda self: self.combo is not None and self.combo.importable and self.restored is not None and self._room()
    )
    @rule()
    def import_appending(self) -> None:
        """`import --append` into the base path restored before: only the table's rows above each partition's last
        seq are added (what was exported since, here)."""
        self.jobs += 1
        assert self.combo is not None and self.restored is not None
        args = ["--data-dir", self.restored, "--table", self.table, "--format", self.combo.fmt, "--append"]
        code, out = import_job(*args)
        self._expect(code == 0, f"import --append of {self.combo} exited {code}: {out[-2000:]}")
        for where, msgs in self._table_messages().items():
            had = self.restored_model.get(where, {})
            top = max(had, default=0)
            self.restored_model[where] = {**had, **{s: m for s, m in msgs.items() if s > top}}
        self._check_restored("import --append")
        COVERED[f"import --append {self.combo.fmt}"] += 1

    @precondition(lambda self: self.combo is not None and self.combo.importable and self.recorded and self._room())
    @rule(append=st.booleans(), k=st.sampled_from(range(1, 61)), then=st.sampled_from(["rerun", "repair"]))
    def import_killed_then_run_again(self, append: bool, k: int, then: str) -> None:
        """The import SIGKILLed right after its k-th file operation (k in 1..60: an import of the model's four
        partitions makes ~60 file operations, its commit point half way), into a fresh base path or (`append`, once
        a base path was restored) with `--append` into the restored one; then what the import guide tells the
        operator (an import interrupted after its commit point is finished, one interrupted before it removed, by
        the next import or by `tank-log repair BASE`; run it again with `--append`): the import again with
        `--append`, after `tank-log repair` when `then="repair"`. The base path holds exactly the table's messages,
        and the real broker serves them. (Without `--append`, a rerun refuses the partitions the killed run
        committed: `exists …: pass --append to continue it`, exit 1.)"""
        self.jobs += 1
        assert self.combo is not None
        append = append and self.restored is not None
        target = self.restored if append else tempfile.mkdtemp(dir=self.work, prefix="restored-")
        assert target is not None
        args = ["--data-dir", target, "--table", self.table, "--format", self.combo.fmt]
        args += ["--append"] if append else []
        what = "import --append" if append else "import"
        killed, code, err = killed_job("import", k, {}, *args)
        self._expect(killed or code == 0, f"{what} (not killed) exited {code}: {err[-2000:]}")
        COVERED[f"{what} killed, then {then}" if killed else f"{what} finished before its kill"] += 1
        if then == "repair":
            code, out = tank_log("repair", target)
            self._expect(code == 0, f"repair after a killed {what} exited {code}: {out[-2000:]}")
        code, out = import_job(*args, *([] if append else ["--append"]))
        self._expect(code == 0, f"{what} after a kill ({then}) exited {code}: {out[-2000:]}")
        if append:
            for where, msgs in self._table_messages().items():
                had = self.restored_model.get(where, {})
                top = max(had, default=0)
                self.restored_model[where] = {**had, **{s: m for s, m in msgs.items() if s > top}}
        else:
            if self.restored is not None:
                shutil.rmtree(self.restored)
            self.restored, self.restored_model = target, self._table_messages()
        self._check_restored(f"{what} after a kill")

    def _check_restored(self, what: str) -> None:
        assert self.restored is not None
        got = _messages_on_disk(self.restored)
        for where in set(got) | set(self.restored_model):
            have, want = got.get(where, {}), self.restored_model.get(where, {})
            self._expect(have == want, f"{where}: {what} wrote {len(have)} messages, the model {len(want)} "
                         f"({_first_difference(have, want)})")  # fmt: skip
        served = _served_by_the_real_broker(self.restored)
        if served is not None:
            for where, msgs in self.restored_model.items():
                self._expect(served.get(where, {}) == msgs, f"{where}: the real broker serves {what}'s base path "
                             f"otherwise ({_first_difference(served.get(where, {}), msgs)})")  # fmt: skip
            COVERED[f"{what} served by the real broker"] += 1
        if not any(self.deleted.values()):  # rows deleted from the table since: on disk, rightly unaccounted
            assert self.combo is not None
            args = ["--table", self.table, "--format", self.combo.fmt, "--source", "model", "--json"]
            code, out = tank_log("audit", *args, self.restored)
            self._expect(code == 0, f"audit of {what}'s base path exited {code}: {out[-2000:]}")
            COVERED[f"{what}: the audit accounted for everything"] += 1

    @precondition(lambda self: _real_broker() is not None)
    @rule()
    def the_real_broker_serves_the_log(self) -> None:
        """The real TANK broker, started on a copy of the base path, serves every partition as the model has it."""
        self._served_as_the_model()

    def _served_as_the_model(self, what: str = "the log") -> None:
        """With `TANK_BIN`/`TANK_CLI`: the real broker serves every partition as it is on disk (which
        `log_is_the_model` checks against the model)."""
        served = _served_by_the_real_broker(self.base)
        if served is None:
            return
        for where, msgs in self._disk().items():
            self._expect(served.get(where, {}) == msgs, f"{where}: the real broker serves "
                         f"{_first_difference(served.get(where, {}), msgs)}")  # fmt: skip
        COVERED[f"the real broker served {what}"] += 1

    @precondition(
        lambda self: not PROFILE.only_spark and self.combo is not None and self.combo.fmt == "delta" and self.recorded
    )
    @rule()
    def optimize_and_vacuum_by_delta_rs(self) -> None:
        from deltalake import DeltaTable

        table = DeltaTable(self.table)
        table.optimize.compact()
        table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
        COVERED["delta-rs optimize+vacuum"] += 1

    @precondition(
        lambda self: (
            PROFILE.spark and self.combo is not None and self.combo.fmt == "delta" and self.recorded and self._room()
        )
    )
    @rule(op=st.sampled_from(["optimize", "delete", "vacuum"]), pick=st.integers(min_value=0, max_value=2))
    def delta_spark_on_the_table(self, op: str, pick: int) -> None:
        """delta-spark (the run's Spark session) on the table: OPTIMIZE, VACUUM with no retention, or (append
        tables) DELETE of every third seq of a topic — rows the model then expects gone, and the audit missing."""
        self.jobs += 1
        from tank_spark.export import job

        assert self.combo is not None
        _, ctx = _context("export_delta", job.add_options, "--data-dir", self.base, "--table", self.table)
        spark = shared_spark(ctx)
        table = f"delta.`{self.table}`"
        if op == "delete" and self.combo.mode == "append":
            topic = sorted(TOPICS)[pick]
            where = f"topic = '{topic}' AND seq % 3 = 0"
            rows = spark.sql(f"SELECT partition, seq FROM {table} WHERE {where}").collect()
            spark.sql(f"DELETE FROM {table} WHERE {where}")
            for r in rows:
                self.deleted.setdefault((topic, int(r.partition)), set()).add(int(r.seq))
            COVERED["delta-spark DELETE"] += 1
        elif op == "vacuum":
            spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
            spark.sql(f"VACUUM {table} RETAIN 0 HOURS")
            COVERED["delta-spark VACUUM"] += 1
        else:
            spark.sql(f"OPTIMIZE {table}")
            COVERED["delta-spark OPTIMIZE"] += 1

    def _lost_before_export(self, where: tuple[str, int], on_disk: dict[int, Msg]) -> bool:
        """Whether messages after what the table holds are gone from before the log's start (`PartitionPlan.lost`):
        removed by retention (the broker's or ours) or, for an append table, by compaction. A latest table of a
        `cleanup` partition loses nothing to compaction (every key's latest message stays)."""
        assert self.combo is not None
        if where not in self.recorded or not on_disk:
            return False
        if self.combo.mode == "latest" and TOPICS[where[0]][0].startswith("log.cleanup.policy=cleanup"):
            return False
        held, start = self.recorded[where], min(on_disk)
        return any(held < s < start for s in self.logs[where].removed)

    def _table_messages(self) -> dict[tuple[str, int], dict[int, Msg]]:
        """What an append table holds: every message exported, less the rows another engine deleted."""
        return {
            where: {s: m for s, m in msgs.items() if s not in self.deleted.get(where, set())}
            for where, msgs in self.exported.items()
        }

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
        """Every engine reads the model's rows (DuckDB, delta-rs or pyiceberg, and delta-spark once the run's Spark
        session is up), and `tank-log audit` finds nothing unaccounted but the rows another engine deleted."""
        if self.combo is None or not self.recorded:
            return
        want: Counter[Row] = Counter()
        if self.combo.mode == "append":
            for (topic, p), msgs in self._table_messages().items():
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
        readers = {"DuckDB": _duckdb_rows, "delta-rs/pyiceberg": _library_rows}
        if _SESSION and _SESSION[0].sparkContext._jsc is not None and self.combo.fmt == "delta":
            readers["delta-spark"] = lambda table, fmt, values: _spark_rows(_SESSION[0], table, values)
        read_before = (_table_files(self.table), sorted(want.items()), sorted(readers))
        if read_before == self.last_read:  # the same files, the same rows: every engine read them after the last step
            readers = {}
        self.last_read = read_before
        for name, read in readers.items():
            got = Counter(read(self.table, self.combo.fmt, self.combo.values))
            if got != want:
                extra, lacking = got - want, want - got
                raise Violation(f"{name} reads {sum(got.values())} rows, the model {sum(want.values())}: extra "
                                f"{sorted(extra)[:3]}, lacking {sorted(lacking)[:3]}")  # fmt: skip
            COVERED[f"table read by {name}"] += 1
        args = ["--table", self.table, "--format", self.combo.fmt, "--source", "model", "--json", self.base]
        code, out = tank_log("audit", *args)
        if not any(self.deleted.values()):
            self._expect(code == 0, f"audit: {out[-2000:]}")
            return
        disk = self._disk()
        report = json.loads(out[out.index("{") :])
        for p in report["partitions"]:
            where = (p["topic"], p["partition"])
            expected = {s for s in self.deleted.get(where, set()) if s in disk.get(where, {})}
            missing = {s for lo, hi in p["missing"]["ranges"] for s in range(lo, hi + 1)}
            complete = p["missing"]["runs"] == len(p["missing"]["ranges"])
            self._expect(
                p["missing"]["count"] == len(expected) and (missing == expected or not complete),
                f"audit after a DELETE: {where} missing {p['missing']}, deleted on disk {sorted(expected)[:20]}",
            )
            self._expect(p["unaccounted"] == len(expected), f"audit after a DELETE: {where}: {p}")
        self._expect(code == (1 if any(p["unaccounted"] for p in report["partitions"]) else 0), f"audit: {out[-999:]}")
        COVERED["audit named the rows delta-spark deleted"] += 1

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
    found = _real_broker()
    if found is None:
        return None
    from real_broker import RealBroker, consume_all, served_copy

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


Row = tuple[str, int, int, bytes | None, bytes]


def _value_of(values: str, value: Any, raw: Any) -> bytes:
    """The producer's bytes of a row: `raw_value` when the value did not decode, else the value (utf8: its text,
    json: the model's one field, as produced), a tombstone's nulls as empty bytes."""
    if raw is not None:
        return bytes(raw)
    if value is None:
        return b""
    if values == "binary":
        return bytes(value)
    if values == "utf8":
        return str(value).encode()
    return b'{"id": %d}' % value


def _value_columns(values: str) -> tuple[str, str]:
    return {"binary": ("value", "NULL"), "utf8": ("value", "raw_value"), "json": ("id", "raw_value")}[values]


def _table_files(table: str) -> list[tuple[str, int, int]]:
    """Every file of a table's directory (path, size, mtime): equal lists, the same table for every reader."""
    files = []
    for d, _, names in os.walk(table):
        for n in names:
            st_ = os.stat(os.path.join(d, n))
            files.append((os.path.join(d, n), st_.st_size, st_.st_mtime_ns))
    return sorted(files)


def _duckdb_rows(table: str, fmt: str, values: str = "binary") -> list[Row]:
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
    value, raw = _value_columns(values)
    rows = con.execute(f"SELECT topic, partition, seq, key, {value}, {raw} FROM {source}").fetchall()
    return [(t, int(p), int(s), bytes(k) if k is not None else None, _value_of(values, v, r))
            for t, p, s, k, v, r in rows]  # fmt: skip


def _library_rows(table: str, fmt: str, values: str) -> list[Row]:
    """The table's rows as its format's own library reads them (delta-rs, pyiceberg)."""
    from tank_log.lakehouse import TableLocation

    value, raw = _value_columns(values)
    columns = ["topic", "partition", "seq", "key", value] + ([raw] if raw != "NULL" else [])
    data = TableLocation.of(table, fmt=fmt).existing().to_pyarrow_dataset().to_table(columns=columns).to_pylist()
    return [(r["topic"], int(r["partition"]), int(r["seq"]), r["key"], _value_of(values, r[value], r.get(raw)))
            for r in data]  # fmt: skip


def _spark_rows(spark: Any, table: str, values: str) -> list[Row]:
    """The table's rows as delta-spark reads them."""
    value, raw = _value_columns(values)
    df = spark.read.format("delta").load(table).selectExpr("topic", "partition", "seq", "key", value, raw)
    return [(r[0], int(r[1]), int(r[2]), bytes(r[3]) if r[3] is not None else None, _value_of(values, r[4], r[5]))
            for r in df.collect()]  # fmt: skip


def _real_broker() -> tuple[str, str] | None:
    """(tank, tank-cli) when TANK_BIN and TANK_CLI name a built broker, else None."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from real_broker import binaries

    found = binaries()
    return None if isinstance(found, str) else found


def run(seed: int, examples: int, steps: int, profile: str = "full") -> dict[str, Any]:
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
    chosen = PROFILES[profile]
    PROFILE.spark, PROFILE.only_spark, PROFILE.continuous = chosen.spark, chosen.only_spark, chosen.continuous
    PROFILE.max_kills, PROFILE.max_jobs, PROFILE.kills = chosen.max_kills, chosen.max_jobs, 0
    test = with_seed(seed)(lambda: run_state_machine_as_test(ProductMachine, settings=config))
    try:
        test()
    finally:
        stop_shared_spark()
    return {
        "seed": seed,
        "profile": profile,
        "real_broker": _real_broker() is not None,
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
    ap.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default="full",
        help="full: every option and step; nospark: none that needs Spark; spark: every example's export needs Spark",
    )
    ap.add_argument("--short", action="store_true", help="the suite's run: 10 examples of 20 steps, without Spark")
    ap.add_argument(
        "--short-spark", action="store_true", help="the suite's Spark run: 2 examples of 15 steps, each needing Spark"
    )
    ap.add_argument(
        "--minutes",
        type=float,
        help="a long run bounded in time: runs of --examples examples with seeds --seed, --seed+1, ... until this "
        "many minutes have passed; the figures are their sums",
    )
    ap.add_argument(
        "--engine",
        choices=["spark"],
        help="spark: every example's export on engine spark where the export takes it (Delta append tables; Iceberg "
        "and latest tables stay on deltalake)",
    )
    args = ap.parse_args(argv)
    examples, steps, profile = args.examples, args.steps, args.profile
    if args.engine:
        if not PROFILES[profile].spark:
            ap.error(f"--engine {args.engine} needs Spark: not with --profile {profile}")
        PROFILE_ENGINES[:] = [args.engine]
    if args.minutes:
        return _timed(args.seed, examples, steps, profile, args.minutes * 60)
    if args.short:
        examples, steps, profile = 10, 20, "nospark"
    elif args.short_spark:
        examples, steps, profile = 2, 15, "spark"
    print(f"model check: seed {args.seed}, {examples} examples of up to {steps} steps, profile {profile}", flush=True)
    try:
        figures = run(args.seed, examples, steps, profile)
    except Violation as err:
        print(f"violations: 1\n{err}")
        return 1
    print(json.dumps(figures, indent=2))
    print("violations: 0")
    return 0


def _timed(seed: int, examples: int, steps: int, profile: str, seconds: float) -> int:
    """Runs with consecutive seeds until `seconds` have passed (a run under way finishes); their summed figures."""
    started = time.monotonic()
    total: Counter[str] = Counter()
    seeds: list[int] = []
    while time.monotonic() - started < seconds:
        print(f"model check: seed {seed}, {examples} examples of up to {steps} steps, profile {profile}", flush=True)
        try:
            figures = run(seed, examples, steps, profile)
        except Violation as err:
            print(f"violations: 1 (seed {seed})\n{err}")
            return 1
        total.update(figures["covered"])
        seeds.append(seed)
        print(f"seed {seed}: {figures['steps']} steps, {figures['seconds']} s", flush=True)
        seed += 1
    summary = {
        "seeds": seeds,
        "profile": profile,
        "real_broker": _real_broker() is not None,
        "examples": examples * len(seeds),
        "steps_per_example": steps,
        "steps": sum(v for k, v in total.items() if not k.startswith("combo")),
        "combinations": sorted(k.removeprefix("combo ") for k in total if k.startswith("combo ")),
        "covered": dict(sorted(total.items())),
        "violations": 0,
        "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(summary, indent=2))
    print("violations: 0")
    return 0


if __name__ == "__main__":
    sys.exit(main())
