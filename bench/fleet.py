"""A fleet that runs for weeks, compressed in time: a soak of many broker hosts, nightly maintenance windows, exports
into one Delta table, retention with its lakehouse guard, table upkeep, and faults.

N simulated broker hosts, each a base path served by a stand-in broker (tank_log/tools/standin_broker.py) that
holds its files, listens on loopback and, while up, keeps appending keyed messages through the library's appender: a
`cleanup` topic (updates and tombstones over 300 keys) and a `delete` topic whose retention is by segment count,
size or age (by host). Every night, in this order:

1. the producers run for --night-s seconds;
2. every host's batch export commits into ONE Delta table on an S3 server on loopback (moto), all at once, each as
   its own source (`export.source`: the host's name, which its retention's guard and its window's runs read too);
   some hosts also run the continuous export all the time;
3. each host's maintenance window, one host at a time: stop → the maintain job (`--broker-stopped`, retention with
   `keep_unexported`: the export's table) → start → ready → verify. The window steps are called directly, or, on the
   --airflow-nights, the whole window runs as the DAG tank_maintenance_window under a running Airflow scheduler;
4. every 7th night and the last one, the table's upkeep (optimize: small files rewritten into larger ones).

Faults, at random but reproducible from --seed (a night's faults are drawn before it runs): SIGKILL of the maintain
job's driver mid-run (kill-job), of `tank-log maintain` run instead of the job that night (kill-cli), of a batch
export (kill-export), of the continuous export (kill-continuous), of a window step (kill-step: the stop or the
start, run as a process); a broker that refuses to stop (stubborn); a host's export off for 1-3 nights
(export-off); the maintenance on a full disk (full-disk: the host's data on a nearly full tmpfs in a private mount
namespace that night); two exports of one host at once (double-export: two batch runs, or one beside a continuous one).

After every night, six invariants, each a count of violations (the goal: 0):
  data          every message ever produced is in its host's TANK data, or in the table, or superseded by a later
                message of its key (cleanup topics: what compaction may drop), or its deletion was reported data-loss
  exactly_once  the table holds each (source, topic, partition, seq) once, with the producer's key and value, of a
                partition its source holds
  verify        `tank-log verify` finds no error on any host (the broker would serve everything), and a maintain job
                no fault touched exits 0 (as the window DAG's task must: a partition it refuses fails the window)
  processes     no process of any run is left alive once the night's work is done
  table_files   an upkeep writes at most 2 files per table partition (topic, date) and leaves fewer files than it
                found, whatever the continuous exports commit meanwhile
  rss           every job's peak RSS stays within its bound
A violation is printed with its reproduction (seed, night, host, what ran). A continuous export that stopped by itself
is started again, as a supervisor would, and counted (`continuous_stops`, with its last error line): Spark's own
failures (a Python worker that did not connect back on a loaded machine) stop it too, so it is a figure, not an
invariant. The last line is the run's summary.

With --tank and --tank-cli (binaries of a TANK build) every host is the real broker instead of the stand-in, run by
tests/real_broker.py: the messages go through the broker's produce path (`tank-cli produce`), the broker rolls and
compacts its `cleanup` topics itself, and the `delete` topics' retention moves from the topic config to the job
configuration (the broker would apply it at every roll, exported or not). At every start the broker serves every
partition once, whole (checked against what was produced); `verify` then also counts the broker's aborts, fatal
messages and messages not served as produced (logs/broker-HOST.log, logs/supervisor-HOST.log). Real mode adds:
  kill-broker   each host's broker SIGKILLed every --broker-kill-every nights while a produce is in flight (a torn
                append), then started again; the broker's recovery of it is what the next checks read
  raw topics    a third topic, `raw` on every host, whose retention is the broker's own (unguarded in every job
                configuration, the window's of all hosts too: a deleted prefix is counted apart, a hole above it is a
                data violation); the table tells the hosts' `raw` partitions apart by their rows' source
  served        a seventh invariant: after every night, producing paused, every partition consumed through the
                broker equals `tank-log dump` of the host's data (the same before and after the consume) and what
                was produced
On the --airflow-nights, each host's maintain job reads its own configuration (`brokers[].job_config`).

Run: python bench/fleet.py --hosts 8 --nights 30 --airflow-nights 3 [--seed 1] [--workdir DIR]
     python bench/fleet.py --hosts 4 --nights 20 --airflow-nights 4,10,16 --tank PATH --tank-cli PATH  (real)
     python bench/fleet.py --short      (2 hosts, 3 nights, one through Airflow: what the test suite runs)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TESTS = os.path.join(ROOT, "tests")
sys.path.insert(0, ROOT)
sys.path.insert(0, TESTS)

from conftest import free_port, kill_session, wait_for_port  # noqa: E402

from tank_log.storage.fsutil import atomic_write  # noqa: E402
from tank_log.tools import standin_broker  # noqa: E402
from tank_log.tools.standin_broker import fleet_message  # noqa: E402

PY = sys.executable
BIN = os.path.dirname(PY)
STANDIN = standin_broker.__file__
REAL = os.path.join(TESTS, "real_broker.py")  # the real broker as a host (--tank, --tank-cli)
MARK = "TANK_FLEET_RUN"  # in the environment of every process the soak starts for a night's work
RUN_ID = "TANK_FLEET_ID"  # beside it: which soak (its workdir), so a soak never counts or kills another's processes
FAULTS = (
    "kill-job",
    "kill-cli",
    "kill-export",
    "kill-continuous",
    "kill-step",
    "stubborn",
    "export-off",
    "full-disk",
    "double-export",
)
# with the real broker also: its SIGKILL while a produce is in flight (kill-broker, every few nights), and a torn
# tail left in a partition while it is stopped (the broker's own short write on a full disk, docs/FORMAT.md §3.11)
REAL_FAULTS = ("torn-tail",)
WORK_STARTS = "process(es) of the driver's"  # what a partition job logs as its partitions' work begins
WINDOW_FAULTS = ("kill-job", "kill-cli", "kill-step", "full-disk", "torn-tail")  # of a window the soak runs itself
RSS_BOUND_MIB = {"python": 700, "spark": 2500}  # a job in the driver's processes; one that starts a JVM
BUCKET = "fleet"


RETENTION = ("retention.segments.count=2", "log.retention.bytes=8192", "log.retention.secs=20")  # by host
RETENTION_JOB = ({"segments_count": 2}, {"max_bytes": 8192}, {"max_age": "20s"})  # the same, as job configuration
# the real broker's unguarded topic, on every host: its partitions are told apart by their source (the host's name)
RAW = "raw"


@dataclass
class Host:
    index: int
    work: str
    port: int = field(default_factory=free_port)
    export_off_until: int = -1  # export off through this night
    real: tuple[str, str] | None = None  # (tank, tank-cli): the real broker serves this host, not the stand-in

    @property
    def name(self) -> str:
        return f"h{self.index}"

    @property
    def base(self) -> str:
        return os.path.join(self.work, "hosts", self.name)

    @property
    def pidfile(self) -> str:
        return os.path.join(self.work, f"{self.name}.pid")

    @property
    def topics(self) -> dict[str, bool]:
        """topic → cleanup policy (with the real broker, a third topic: `broker_retention`)."""
        extra = dict.fromkeys(self.broker_retention, False)
        return {f"cdc{self.index}": True, f"ev{self.index}": False, **extra}

    @property
    def broker_retention(self) -> set[str]:
        """Topics whose retention the real broker applies itself, at its rolls: unguarded (what it deletes before
        an export read it is gone, unreported), so only a prefix of such a partition may be missing. Named the
        same on every host (`RAW`), so that the configuration of all hosts can leave it unguarded too."""
        return {RAW} if self.real else set()

    @property
    def config(self) -> str:
        """The configuration of this host's jobs."""
        return os.path.join(self.work, f"{self.name}.yaml")

    @property
    def broker_log(self) -> str:
        """The real broker's output (appended at every start), and its supervisor's."""
        return os.path.join(self.work, "logs", f"broker-{self.name}.log")

    @property
    def supervisor_log(self) -> str:
        return os.path.join(self.work, "logs", f"supervisor-{self.name}.log")

    def broker_entry(self, rate: float) -> dict[str, Any]:
        """Its `brokers:` entry (the start and stop commands of the stand-in, or of the real broker's supervisor
        tests/real_broker.py, which produces through it)."""
        flags = f"--port {self.port} --pidfile {self.pidfile} --produce --rate {rate}"
        if self.real is None:
            start = f"setsid {PY} {STANDIN} -p {self.base} {flags} --name {self.name} > /dev/null 2>&1 < /dev/null &"
        else:
            flags += f" --tank {self.real[0]} --tank-cli {self.real[1]} --log {self.broker_log}"
            start = f"setsid {PY} {REAL} -p {self.base} {flags} >> {self.supervisor_log} 2>&1 < /dev/null &"
        return {
            "name": self.name,
            "data_dirs": [self.base],
            "job_config": self.config,
            "start_command": start,
            "stop_command": f"kill -INT $(cat {self.pidfile})",
            "ready_check": f"tcp://127.0.0.1:{self.port}",
            "stop_timeout": "4s" if self.real is None else "30s",  # the real broker takes 2-5 s
            "ready_timeout": "10s",
        }

    def create(self) -> None:
        """Its topics. The real broker would apply a topic's retention itself at every roll, unexported data or not
        (docs/FORMAT.md §5): its retention is then the maintain job's alone, from the job configuration."""
        for topic, cleanup in self.topics.items():
            for p in range(2):
                os.makedirs(os.path.join(self.base, topic, str(p)))
            guarded_by_job = topic not in self.broker_retention
            retention = "" if guarded_by_job else f"\n{RETENTION[self.index % 3]}"
            policy = "log.cleanup.policy=cleanup" if cleanup else f"log.cleanup.policy=delete{retention}"
            with open(os.path.join(self.base, topic, "config"), "w") as fh:
                fh.write(f"{policy}\nlog.segment.bytes=4096\n")


@dataclass
class PartState:
    """What the checks know of one partition: its last seq produced, which seqs the table holds, which a later
    message of their key supersedes (a `cleanup` topic: compaction may drop them)."""

    topic: str
    partition: int
    cleanup: bool
    top: int = 0
    in_table: np.ndarray = field(default_factory=lambda: np.zeros(1, bool))
    superseded: np.ndarray = field(default_factory=lambda: np.zeros(1, bool))
    latest: dict[bytes, int] = field(default_factory=dict)

    def grow(self, seq: int) -> None:
        if seq >= len(self.in_table):
            size = max(seq + 1, 2 * len(self.in_table))
            self.in_table = np.concatenate((self.in_table, np.zeros(size - len(self.in_table), bool)))
            self.superseded = np.concatenate((self.superseded, np.zeros(size - len(self.superseded), bool)))

    def produced_upto(self, last: int) -> None:
        """Seqs up to `last` were produced (the active segment holds the last one): account the new ones."""
        self.grow(last)
        for seq in range(self.top + 1, last + 1):
            if self.cleanup:
                key = fleet_message(self.topic, self.partition, seq, True)[0]
                before = self.latest.get(key)
                if before is not None:
                    self.superseded[before] = True
                self.latest[key] = seq
        self.top = max(self.top, last)


@dataclass
class Ran:
    """One process the soak ran: what, its exit, its peak RSS."""

    what: str
    host: str
    cmd: list[str]
    code: int | None = None
    peak_rss_mib: float = 0.0
    killed: bool = False
    spawner_hwm_kib: int = 0  # the soak's own peak RSS when it started the run (see `_peak_rss_kib`)
    sampled_kib: int = 0  # the largest VmHWM sampled in its process tree while it ran


class Fleet:
    def __init__(self, args: argparse.Namespace, airflow: Any = None, hosts_file: str | None = None):
        self.args = args
        self.rng = random.Random(args.seed)
        self.work = args.workdir
        real = (args.tank, args.tank_cli) if args.tank else None
        self.hosts = [Host(i, self.work, real=real) for i in range(args.hosts)]
        self.airflow = airflow  # a running Airflow (tests/airflow_harness.Airflow) for the airflow nights
        self.hosts_file = hosts_file or os.path.join(self.work, "hosts.yaml")
        self.s3: dict[str, Any] = {}
        self.continuous: dict[str, subprocess.Popen[bytes]] = {}
        self.ran: list[Ran] = []
        self.running: dict[int, Ran] = {}  # by pid, until reaped
        self.sampling_done = threading.Event()
        threading.Thread(target=self.sample_rss, daemon=True, name="rss").start()
        self.faults: Counter[str] = Counter()
        self.violations: Counter[str] = Counter()
        self.repro: list[dict[str, Any]] = []
        self.losses: dict[tuple[str, str, int], set[int]] = {}  # by (host, topic, partition), as all below
        self.broker_kills: Counter[str] = Counter()  # SIGKILLs of a host's real broker (the supervisor says each)
        self.broker_kills_seen: Counter[str] = Counter()
        self.kills_in_flight = 0
        self.left_by_kills: Counter[str] = Counter()
        self.paused_verify: dict[str, list[Any]] = {}  # a real host's `verify` errors, taken while it was paused
        self.torn: list[str] = []  # active segments given a torn tail while their broker was stopped
        self.aborts_on_torn = 0  # starts at which the broker exited on such a tail (then salvaged, started again)
        self.expected_fatal: dict[str, list[tuple[int, int]]] = {}  # a log's byte ranges of those exits
        self.served: dict[tuple[str, str, int], np.ndarray] = {}  # the seqs each partition's broker served tonight
        self.nights: list[dict[str, Any]] = []
        self.parts = {  # a host's partition: two hosts' `RAW` topics are two partitions (their rows' source says which)
            (h.name, topic, p): PartState(topic, p, cleanup)
            for h in self.hosts
            for topic, cleanup in h.topics.items()
            for p in range(2)
        }
        self.table_files_read: set[str] = set()
        self.log_checked: dict[str, int] = {}  # a real broker's logs: bytes already checked
        self.upkeeps: list[dict[str, Any]] = []
        self.continuous_stops: list[dict[str, Any]] = []  # continuous exports that stopped by themselves

    # ---- set-up ---------------------------------------------------------------------------------------------------

    def start_s3(self) -> None:
        port = free_port()
        proc = subprocess.Popen(
            [os.path.join(BIN, "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_for_port(port, "moto_server", proc)
        self.s3 = {"endpoint": f"http://127.0.0.1:{port}", "pid": proc.pid}
        import boto3

        boto3.client("s3", endpoint_url=self.s3["endpoint"], **_credentials()).create_bucket(Bucket=BUCKET)

    @property
    def table(self) -> str:
        return f"s3://{BUCKET}/events"

    @property
    def storage_options(self) -> dict[str, str]:
        """The table's options, credentials included: every job, wherever it runs (an Airflow task too), reads them
        from the configuration."""
        return {"AWS_ENDPOINT_URL": self.s3["endpoint"], "AWS_ALLOW_HTTP": "true", **_aws_env()}

    def job_config(self, host: Host | None = None) -> dict[str, Any]:
        """The jobs' configuration (of one host's jobs, or of all): the export's table, retention's guard on it
        (bounded), compaction at once; with a host, its source (its name: the export records it, its retention's
        guard reads it, and the window's runs on it use it) and the retention of its `delete` topic (a job refuses a
        topic its data dirs do not hold, so a configuration of all hosts cannot name it). The retention of a guarded
        topic is the job's, never its topic config's: the broker would apply that itself, exported or not
        (docs/FORMAT.md §5), and the jobs refuse such a topic as needs-attention. The real broker's `RAW` topic,
        on every host, is the broker's own: unguarded in every configuration (the one of all hosts too)."""
        data_dirs = [host.base] if host else None
        hosts = [host] if host else self.hosts
        topics: dict[str, Any] = {
            t: {"keep_unexported": False} for t in set.intersection(*(h.broker_retention for h in hosts))
        }
        if host:
            topics[f"ev{host.index}"] = RETENTION_JOB[host.index % 3]
        return {
            **({"data_dirs": data_dirs} if data_dirs else {}),
            "export": {
                "table": self.table,
                "storage_options": self.storage_options,
                **({"source": host.name} if host else {}),
            },
            "retention": {
                "time_basis": "message",
                "keep_unexported": {"table": "export", "max_holdback_size": "2mb", "max_holdback_age": "10min"},
                "topics": topics,
            },
            "compaction": {"min_cleanable_ratio": 0.2},
            "maintenance_window": {"spark_master": "local[1]"},
        }

    def setup(self) -> None:
        os.makedirs(self.work, exist_ok=True)
        self.start_s3()
        for h in self.hosts:
            h.create()
            with open(self.config_of(h), "w") as fh:
                json.dump(self.job_config(h), fh)
        hosts = {**self.job_config(), "brokers": [h.broker_entry(self.args.rate) for h in self.hosts]}
        atomic_write(self.hosts_file, json.dumps(hosts).encode())  # a running dag-processor parses the DAGs
        for h in self.hosts:
            self.start_broker(h)
        time.sleep(self.args.night_s)
        # the table is created by one export before the nightly exports of every host run at once
        self.run("export", self.hosts[0], self.export_cmd(self.hosts[0]))
        for h in self.hosts[: self.args.continuous_hosts]:
            self.start_continuous(h)

    def config_of(self, h: Host) -> str:
        return h.config

    def env(self, tag: str) -> dict[str, str]:
        return {
            **os.environ,
            MARK: tag,
            RUN_ID: self.work,
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_REGION": "us-east-1",
            "SPARK_LOCAL_IP": "127.0.0.1",
        }

    def start_broker(self, h: Host) -> None:
        entry = h.broker_entry(self.args.rate)
        subprocess.run(["sh", "-c", entry["start_command"]], check=True, timeout=30)
        wait_for_port(h.port, f"stand-in {h.name}")

    # ---- running things -------------------------------------------------------------------------------------------

    def spawn(self, what: str, h: Host, cmd: list[str]) -> tuple[subprocess.Popen[bytes], Ran]:
        log = open(os.path.join(self.work, "logs", f"{len(self.ran):05d}-{what}-{h.name}.log"), "w")  # noqa: SIM115
        ran = Ran(what, h.name, cmd, spawner_hwm_kib=_hwm_kib(os.getpid()))
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env(f"{what}-{h.name}")
        )
        log.close()
        self.ran.append(ran)
        self.running[proc.pid] = ran
        return proc, ran

    def sample_rss(self) -> None:
        """Every 0.2 s, the peak RSS of each running run's process tree (a thread, for the soak's whole life)."""
        while not self.sampling_done.wait(0.2):
            for pid, ran in list(self.running.items()):
                ran.sampled_kib = max(ran.sampled_kib, _tree_hwm_kib(pid))

    def wait(
        self,
        proc: subprocess.Popen[bytes],
        ran: Ran,
        timeout: float = 600,
        kill_after: float | None = None,
        kill_from: str | None = None,
    ) -> int:
        """Its exit code and peak RSS (reaped here, with its resource usage). A fault: SIGKILL `kill_after` seconds
        after it started, or after its log first shows `kill_from` (to land in the middle of its work). A hang:
        SIGKILL after `timeout`, and a violation."""
        t0 = time.monotonic()
        log = self.log_of(self.ran.index(ran))
        while True:
            try:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            except ChildProcessError:  # reaped already: Popen.send_signal polls first, and it had died
                self.running.pop(proc.pid, None)
                ran.code = proc.returncode
                return ran.code if ran.code is not None else -1
            if pid:
                break
            if kill_from is not None and kill_from in open(log, errors="replace").read():
                t0, kill_from = time.monotonic(), None  # the delay counts from there
            elapsed = time.monotonic() - t0
            if kill_after is not None and kill_from is None and elapsed > kill_after:
                os.kill(proc.pid, signal.SIGKILL)
                ran.killed, kill_after = True, None
            elif elapsed > timeout:
                os.kill(proc.pid, signal.SIGKILL)
                self.violation("processes", ran.host, f"{ran.what} did not finish in {timeout} s", ran.cmd)
                timeout = float("inf")
            time.sleep(0.005)
        self.running.pop(proc.pid, None)
        proc.returncode = os.waitstatus_to_exitcode(status)
        ran.code, ran.peak_rss_mib = proc.returncode, _peak_rss_kib(ran, usage.ru_maxrss) / 1024
        return ran.code

    def run(
        self, what: str, h: Host, cmd: list[str], kill_after: float | None = None, kill_from: str | None = None
    ) -> int:
        proc, ran = self.spawn(what, h, cmd)
        return self.wait(proc, ran, kill_after=kill_after, kill_from=kill_from)

    def export_cmd(self, h: Host, *extra: str) -> list[str]:
        report = os.path.join(self.work, "reports", f"export-{h.name}-{len(self.ran)}.json")
        return [PY, os.path.join(ROOT, "jobs", "export_delta.py"), "--config", self.config_of(h), "--report", report]

    def start_continuous(self, h: Host) -> None:
        checkpoint = os.path.join(self.work, "checkpoints", h.name)
        cmd = [*self.export_cmd(h), "--continuous", "--trigger-interval", "2s", "--checkpoint", checkpoint]
        cmd += ["--master", "local[1]"]
        if h.broker_retention:  # what the broker deletes unread there is a loss it logs, not one that stops it
            cmd += ["--on-data-loss", "skip"]
        proc, ran = self.spawn("continuous", h, cmd)
        self.continuous[h.name] = proc
        ran.code = None

    # ---- a night --------------------------------------------------------------------------------------------------

    def plan_faults(self, night: int) -> dict[str, list[str]]:
        """Each host's faults tonight: none, or one drawn at random (`--fault-rate` per host and night)."""
        plan: dict[str, list[str]] = {h.name: [] for h in self.hosts}
        for h in self.hosts:
            if self.rng.random() < self.args.fault_rate:
                kinds = [k for k in FAULTS if k != "kill-continuous" or h.name in self.continuous]
                kinds += list(REAL_FAULTS) if h.real is not None else []
                plan[h.name].append(self.rng.choice(kinds))
        every = self.args.broker_kill_every
        for h in self.hosts:  # the real broker SIGKILLed mid-append: every host every few nights, staggered
            if h.real is not None and every and night % every == h.index % every:
                plan[h.name].append("kill-broker")
        for forced in self.args.force_fault:  # NIGHT:HOST:FAULT
            n, host, kind = forced.split(":")
            if int(n) == night:
                plan[host].append(kind)
        return plan

    def night(self, n: int) -> dict[str, Any]:
        t0 = time.monotonic()
        faults = self.plan_faults(n)
        through_airflow = n in self.args.airflow_nights and self.airflow is not None
        if through_airflow:  # the DAG runs the window's steps: only the faults around it
            faults = {h: [k for k in kinds if k not in WINDOW_FAULTS] for h, kinds in faults.items()}
        for kinds in faults.values():
            self.faults.update(kinds)
        self.produce(faults)
        self.exports(n, faults)
        self.continuous_faults(faults)
        if through_airflow:
            self.window_by_airflow(n, faults)
        else:
            for h in self.hosts:
                self.window(n, h, faults[h.name])
        upkeep = n % 7 == 6 or n == self.args.nights - 1
        if upkeep:
            self.upkeep()
        figures = self.check(n, upkeep)
        figures.update(night=n, wall_s=round(time.monotonic() - t0, 1), airflow=through_airflow)
        figures["faults"] = {h: k for h, k in faults.items() if k}
        self.nights.append(figures)
        print(json.dumps(figures), flush=True)
        return figures

    def produce(self, faults: dict[str, list[str]]) -> None:
        """The producers run for --night-s seconds; a kill-broker host's broker is SIGKILLed at a random moment of
        it, while a `tank-cli produce` of its supervisor is in flight (a torn append), and started again once its
        supervisor has exited (as an init system restarts a crashed service)."""
        t0 = time.monotonic()
        victims = sorted(
            (
                (self.rng.uniform(0.2, 0.8) * self.args.night_s, h)
                for h in self.hosts
                if "kill-broker" in faults[h.name]
            ),
            key=lambda x: x[0],
        )
        for at, h in victims:
            time.sleep(max(0.0, t0 + at - time.monotonic()))
            self.kill_broker(h)
        time.sleep(max(0.0, t0 + self.args.night_s - time.monotonic()))

    def kill_broker(self, h: Host) -> None:
        try:
            supervisor, broker = (int(open(p).read()) for p in (h.pidfile, h.pidfile + ".tank"))
        except (OSError, ValueError):
            self.violation("verify", h.name, "kill-broker: the host's broker is not running")
            return
        deadline, in_flight = time.monotonic() + 3, False
        while time.monotonic() < deadline and not in_flight:  # wait for an append in flight
            in_flight = any(" produce " in _cmdline(c) for c in _children(supervisor))
            if not in_flight:
                time.sleep(0.001)
        os.kill(broker, signal.SIGKILL)
        self.ran.append(Ran("kill-broker", h.name, ["tank", str(broker)], code=-9, killed=True))
        self.broker_kills[h.name] += 1
        self.kills_in_flight += in_flight
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and os.path.exists(f"/proc/{supervisor}") and "Z" not in _state(supervisor):
            time.sleep(0.05)
        from tank_log.maintenance.verify import verify_path

        # what the crash left, as `tank-log verify` names it (a torn tail, an index entry past the end, no active
        # segment after a roll: §3.11, §2.6, §9 rule 4); the broker recovers, or not, at its restart
        self.left_by_kills.update(p.code for p in verify_path(h.base) if p.severity == "error")
        self.start_broker(h)

    def upkeep(self) -> None:
        """The table's upkeep (optimize): the files it writes are at most 2 per table partition (topic, date), and it
        leaves the table with fewer files than it found, whatever the continuous exports commit meanwhile."""
        h = self.hosts[0]
        report = os.path.join(self.work, "reports", f"upkeep-{len(self.ran)}.json")
        cmd = [PY, os.path.join(ROOT, "jobs", "export_delta.py"), "--config", self.config_of(h), "--report", report]
        if self.run("upkeep", h, [*cmd, "--upkeep-only", "--optimize"]) != 0:
            self.violation("table_files", "all", "the upkeep failed", self.log_of(len(self.ran) - 1))
            return
        with open(report) as fh:
            (step,) = [s for s in json.load(fh)["summary"]["upkeep"] if s["operation"] == "optimize"]
        _, dirs = self.table_files()
        if step["files_written"] > 2 * dirs or step["files_after"] >= step["files_before"]:
            self.violation(
                "table_files", "all", f"optimize wrote {step['files_written']} files ({dirs} partitions)", step
            )
        self.upkeeps.append(step)

    def exports(self, n: int, faults: dict[str, list[str]]) -> None:
        running = []
        for h in self.hosts:
            kinds = faults[h.name]
            if "export-off" in kinds:
                h.export_off_until = n + self.rng.randrange(0, 3)
            if n <= h.export_off_until:
                continue
            copies = 2 if "double-export" in kinds else 1
            if h.name in self.continuous:  # a continuous host: its batch export only as the fault (beside it)
                copies -= 1
            for _ in range(copies):
                proc, ran = self.spawn("export", h, self.export_cmd(h))
                running.append((proc, ran, "kill-export" in kinds))
        for proc, ran, kill in running:  # a kill lands between the export's reads and its commit
            self.wait(proc, ran, kill_after=self.rng.uniform(0.0, 0.4) if kill else None, kill_from="read tasks")

    def continuous_faults(self, faults: dict[str, list[str]]) -> None:
        for name, proc in list(self.continuous.items()):
            if "kill-continuous" in faults[name] and proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                ran = next(r for r in reversed(self.ran) if r.what == "continuous" and r.host == name)
                ran.killed = True
                self.wait(proc, ran)
                self.start_continuous(next(h for h in self.hosts if h.name == name))  # as a supervisor would

    def window(self, n: int, h: Host, kinds: list[str]) -> None:
        """stop → maintain → start → ready → verify, each step as the DAG runs it (`tank_log.jobs.window`)."""
        stubborn = os.path.join(h.base, ".stubborn")
        if "stubborn" in kinds:
            open(stubborn, "w").close()
        try:
            stopped = self.step(h, "stop", kill="kill-step" in kinds and self.rng.random() < 0.5) == 0
        finally:
            if os.path.exists(stubborn):
                os.unlink(stubborn)
        torn = stopped and "torn-tail" in kinds and self.tear_tail(h)
        if stopped:
            self.maintain(n, h, kinds)
        logs = {path: _size(path) for path in (h.broker_log, h.supervisor_log)}
        self.step(h, "start", kill="kill-step" in kinds and stopped)
        if torn:
            self.after_torn_start(h, logs)
        if self.step(h, "ready") != 0:  # a start killed before it launched the broker: the operator starts it
            self.start_broker(h)
        self.step(h, "verify")

    def tear_tail(self, h: Host) -> bool:
        """Append the first bytes of a bundle to the active segment of one of the host's partitions, as the broker's
        own short write leaves them (§3.11): the broker exits at the partition's open on it. Whether one was torn."""
        from tank_log.storage.datadir import scan_data_dir

        actives = [p.active.path for p in scan_data_dir(h.base).partitions() if p.active and p.active.size > 16]
        if not actives:
            return False
        path = self.rng.choice(sorted(actives))
        with open(path, "rb") as fh:
            head = fh.read(self.rng.randint(6, 16))  # a bundle's length and header, not its end
        with open(path, "ab") as fh:
            fh.write(head)
        self.torn.append(path)
        return True

    def after_torn_start(self, h: Host, logs: dict[str, int]) -> None:
        """The broker started over a torn tail that is not ours: it must exit at the partition's open (what it
        prints then is no violation), the operator salvages (`tank-log maintain --salvage`) and starts it again."""
        deadline, said = time.monotonic() + 20, ""
        while time.monotonic() < deadline and not any(m in said for m in ("the broker failed", "BrokerFailed")):
            time.sleep(0.1)  # its supervisor's last words: the broker exited (at its start, or at the first open)
            with open(h.supervisor_log, "rb") as fh:
                fh.seek(logs[h.supervisor_log])
                said = fh.read().decode("utf-8", "replace")
        if not any(m in said for m in ("the broker failed", "BrokerFailed")):
            self.violation("verify", h.name, "the broker kept serving a partition with a torn tail", self.torn[-1])
            return
        time.sleep(1)  # the supervisor exits right after
        for path, start in logs.items():
            self.expected_fatal.setdefault(path, []).append((start, _size(path)))
        cmd = [os.path.join(BIN, "tank-log"), "maintain", h.base, "--broker-stopped", "--salvage"]
        cmd += ["--config", self.config_of(h), "--keep-unexported", "export"]
        if self.run("salvage", h, cmd) != 0:
            self.violation("verify", h.name, "the salvage of a torn tail failed", self.log_of(len(self.ran) - 1))
        self.record_losses(h, self.log_of(len(self.ran) - 1))
        self.aborts_on_torn += 1
        self.start_broker(h)

    def step(self, h: Host, step: str, kill: bool = False) -> int:
        code = (
            "import sys\nfrom tank_log.jobs import window\nfrom tank_log.jobs.config import load_job_config\n"
            f"(b,) = [b for b in load_job_config({self.hosts_file!r}).brokers if b.name == {h.name!r}]\n"
            f"print(window.{ {'stop': 'stop', 'start': 'start', 'ready': 'wait_ready', 'verify': 'verify'}[step] }(b))"
        )
        return self.run(f"step-{step}", h, [PY, "-c", code], kill_after=self.rng.uniform(0.05, 0.5) if kill else None)

    def maintain(self, n: int, h: Host, kinds: list[str]) -> None:
        report = os.path.join(self.work, "reports", f"maintain-{h.name}-{n}.json")
        # a kill lands within the partitions' work: up to 0.1 s after it starts
        kill = self.rng.uniform(0.0, 0.1) if {"kill-job", "kill-cli"} & set(kinds) else None
        if "kill-cli" in kinds:
            cmd = [os.path.join(BIN, "tank-log"), "maintain", h.base, "--broker-stopped", "--config", self.config_of(h)]
            cmd += ["--keep-unexported", "export"]
            self.run("cli-maintain", h, cmd, kill_after=kill, kill_from="plan ")  # its pool starts right after
            self.record_losses(h, self.log_of(len(self.ran) - 1))
            return
        job = [PY, os.path.join(ROOT, "jobs", "maintain.py"), "--config", self.config_of(h), "--broker-stopped"]
        job += ["--report", report, "--master", "local[1]"]
        if "full-disk" in kinds:
            self.full_disk(h, job)
        else:
            code = self.run("maintain", h, job, kill_after=kill, kill_from=WORK_STARTS)
            if code != 0 and kill is None and "torn-tail" not in kinds:
                self.violation("verify", h.name, f"the maintain job exited {code}", self.log_of(len(self.ran) - 1))
        self.record_losses(h, report)

    def full_disk(self, h: Host, job: list[str]) -> None:
        """The maintain job with the host's data on a full tmpfs (a private mount namespace: the mount is gone with
        it); what the job left there is the host's data afterwards."""
        stage_in, stage_out = os.path.join(self.work, "stage-in"), os.path.join(self.work, "stage-out")
        for d in (stage_in, stage_out):
            shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(h.base, stage_in, symlinks=True)
        os.makedirs(stage_out)
        size = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(stage_in) for f in fs)
        script = (
            f"mount -t tmpfs -o size={size + (4 << 20)} tmpfs {h.base} && cp -a {stage_in}/. {h.base}/ && "
            f'{PY} -c \'import os; st = os.statvfs("{h.base}"); '
            f'open("{h.base}/.filler", "wb").write(bytes(st.f_bavail * st.f_frsize))\'; '
            f"{' '.join(job)}; rc=$?; rm -f {h.base}/.filler; cp -a {h.base}/. {stage_out}/; exit $rc"
        )
        self.run("maintain-full-disk", h, ["unshare", "-rm", "sh", "-c", script])
        for name in os.listdir(h.base):
            path = os.path.join(h.base, name)
            shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)
        shutil.copytree(stage_out, h.base, dirs_exist_ok=True, symlinks=True)

    def log_of(self, i: int) -> str:
        ran = self.ran[i]
        return os.path.join(self.work, "logs", f"{i:05d}-{ran.what}-{ran.host}.log")

    def record_losses(self, h: Host, path: str) -> None:
        """Seqs deleted before the table had them, as retention reported them (data-loss): from a job's report or
        the CLI's output lines."""
        try:
            with open(path) as fh:
                text = fh.read()
        except OSError:
            return
        try:
            entries = json.loads(text).get("partitions", [])
        except ValueError:
            entries = [json.loads(line) for line in text.splitlines() if line.startswith('{"topic"')]
        for entry in entries:
            retention = entry.get("steps", {}).get("retention", {})
            for first, last in retention.get("deleted_unexported") or []:
                self.losses.setdefault((h.name, entry["topic"], entry["partition"]), set()).update(
                    range(first, last + 1)
                )

    def window_by_airflow(self, n: int, faults: dict[str, list[str]]) -> None:
        """The whole window as the DAG tank_maintenance_window, triggered by hand, under the running scheduler."""
        for name, kinds in faults.items():
            if "stubborn" in kinds:
                open(os.path.join(self.work, "hosts", name, ".stubborn"), "w").close()
        af = self.airflow
        af.api("PATCH", "dags/tank_maintenance_window", {"is_paused": False})
        run_id = af.trigger("tank_maintenance_window")
        state = af.wait("tank_maintenance_window", run_id, timeout=900)
        stubborn = [name for name, kinds in faults.items() if "stubborn" in kinds]
        for name in stubborn:
            os.unlink(os.path.join(self.work, "hosts", name, ".stubborn"))
        self.ran.append(
            Ran("airflow-window", "all", ["tank_maintenance_window", run_id], 0 if state == "success" else 1)
        )
        # a stubborn broker fails its own stop and report (maintain never runs on it); every other task succeeds
        index = {h.name: str(i) for i, h in enumerate(self.hosts)}
        allowed = {f"{step}[{index[name]}]" for name in stubborn for step in ("stop", "maintain", "report")}
        tasks = af.tasks("tank_maintenance_window", run_id)  # keys: "window_default.stop[6]", "check_config"
        wrong = [key for key, ti in tasks.items() if ti["state"] != "success" and key.split(".")[-1] not in allowed]
        if wrong or (state == "success") != (not stubborn):
            what = f"the window DAG run {run_id} ended {state}; tasks not as expected: {wrong}"
            self.violation("verify", "all", what, af.explain("tank_maintenance_window", run_id))
        reports = af.env["AIRFLOW_VAR_TANK_LOG_REPORTS"]
        for h in self.hosts:
            for report in sorted(os.listdir(reports)):
                if report.startswith(f"maintain-{h.name}-") and run_id.replace(":", "").replace("+", "_") in report:
                    self.record_losses(h, os.path.join(reports, report))

    # ---- invariants -----------------------------------------------------------------------------------------------

    def violation(self, kind: str, host: str, what: str, detail: Any = None) -> None:
        self.violations[kind] += 1
        entry = {"invariant": kind, "seed": self.args.seed, "night": len(self.nights), "host": host, "what": what}
        if detail is not None:
            entry["detail"] = detail if isinstance(detail, str) else json.dumps(detail)[:2000]
        self.repro.append(entry)
        print("VIOLATION " + json.dumps(entry), flush=True)

    def check(self, n: int, upkeep: bool) -> dict[str, Any]:
        """The night's invariants, at a cost of what TANK holds and what the night added: the table's rows are
        checked when their file is first read (after an upkeep rewrote the files, the table is read again whole)."""
        from tank_log.maintenance.verify import verify_path

        before = dict(self.violations)
        self.served.clear()
        served = sum(self.check_served(h) for h in self.hosts if h.real is not None)
        in_tank = self.read_tank()
        self.read_table(full=upkeep)
        produced = exported = compacted = deleted = reported_lost = broker_deleted = served_in_table = 0
        for h in self.hosts:
            for topic, cleanup in h.topics.items():
                for p in range(2):
                    state = self.parts[(h.name, topic, p)]
                    present = in_tank.get((h.name, topic, p), np.zeros(0, bool))
                    top = state.top
                    produced += top
                    exported += int(state.in_table[: top + 1].sum())
                    tank = np.zeros(top + 1, bool)
                    tank[: len(present)] = present[: top + 1]
                    missing = ~tank & ~state.in_table[: top + 1]
                    missing[0] = False  # seqs start at 1
                    if not cleanup:
                        deleted += int((~tank[1:]).sum())  # by retention: in the table, or reported lost
                    compacted += int((~tank & state.superseded[: top + 1]).sum())  # dropped by compaction
                    lost = np.zeros(top + 1, bool)
                    for seq in self.losses.get((h.name, topic, p), ()):
                        if seq <= top:
                            lost[seq] = True
                    reported_lost += int((missing & lost).sum())
                    missing &= ~lost
                    if topic in h.broker_retention:  # the broker's own retention: a prefix, gone unreported
                        held = np.flatnonzero(tank[1:]) + 1
                        horizon = int(held[0]) if len(held) else top + 1
                        broker_deleted += int(missing[:horizon].sum())
                        missing[:horizon] = False
                    seqs = self.served.get((h.name, topic, p))
                    if seqs is not None:
                        served_in_table += int(state.in_table[seqs[seqs <= top]].sum())
                    for seq in np.flatnonzero(missing & ~state.superseded[: top + 1] & ~lost)[:20].tolist():
                        self.violation("data", h.name, f"{topic}/{p} seq {seq}: in neither TANK nor the table")
            # a real broker's files only while its producing is paused: a roll (its rename of the active segment,
            # its retention, then the new active one, §2.5) is otherwise a moment without an active segment
            problems = self.paused_verify.pop(h.name, None) if h.real is not None else None
            if problems is None:
                problems = [p for p in verify_path(h.base) if p.severity == "error"]
            if problems:
                self.violation("verify", h.name, f"{len(problems)} error(s)", [str(p) for p in problems[:5]])
            if h.real is not None:
                self.check_real_broker(h)
        self.check_processes()
        continuous_stops = self.restart_stopped_continuous()
        files, _ = self.table_files()
        for ran in self.ran:
            kind = "spark" if ran.what == "continuous" else "python"
            if ran.peak_rss_mib > RSS_BOUND_MIB[kind] and not getattr(ran, "rss_flagged", False):
                ran.rss_flagged = True  # type: ignore[attr-defined]
                self.violation("rss", ran.host, f"{ran.what}: peak RSS {ran.peak_rss_mib:.0f} MiB", ran.cmd)
        return {
            "produced": produced,
            "exported": exported,
            "compacted_away": compacted,
            "deleted": deleted,
            "lost_reported": reported_lost,
            "deleted_by_broker_unguarded": broker_deleted,
            "served_compared": served,
            "served_in_table": served_in_table,
            "table_files": files,
            "continuous_stops": continuous_stops,
            "violations": {k: self.violations[k] - before.get(k, 0) for k in self.violations},
            "peak_rss_mib": round(max((r.peak_rss_mib for r in self.ran), default=0)),
        }

    def check_served(self, h: Host) -> int:
        """What consumers see: the host's producing paused, every partition consumed through the broker equals
        `tank-log dump` of its data dirs (taken before and after the consume, the same both times), each message as
        produced. The messages compared (their seqs kept in `served`, to count those the table holds)."""
        from real_broker import BrokerFailed, consume_from, dump, partitions

        from tank_log.maintenance.verify import verify_path

        assert h.real is not None
        pause, paused = h.pidfile + ".pause", h.pidfile + ".paused"
        if os.path.exists(paused):  # left by a supervisor that died paused
            os.unlink(paused)
        open(pause, "w").close()
        try:
            deadline = time.monotonic() + 60
            while not os.path.exists(paused):
                if time.monotonic() > deadline:
                    self.violation("served", h.name, "its supervisor did not pause producing in 60 s")
                    return 0
                time.sleep(0.05)
            for _attempt in range(3):
                before = dump(h.base)
                try:
                    got = {
                        (t, p): consume_from(h.real[1], f"127.0.0.1:{h.port}", t, p)
                        for t, p in partitions(h.base)
                        if (h.name, t, p) in self.parts
                    }
                except BrokerFailed as e:
                    self.violation("served", h.name, f"a consume failed: {e}")
                    return 0
                if dump(h.base) == before:
                    self.paused_verify[h.name] = [p for p in verify_path(h.base) if p.severity == "error"]
                    break
            else:
                self.violation("served", h.name, "its files kept changing while producing was paused")
                return 0
        finally:
            os.unlink(pause)
        compared = 0
        for (topic, p), msgs in got.items():
            want = before.get((topic, p), [])
            if msgs != want:
                i = next(
                    (i for i, (a, b) in enumerate(zip(msgs, want, strict=False)) if a != b), min(len(msgs), len(want))
                )
                what = f"{topic}/{p}: served {len(msgs)} messages, tank-log dump {len(want)}; first difference at #{i}"
                self.violation("served", h.name, what)
            cleanup = self.parts[(h.name, topic, p)].cleanup
            wrong = [m.seq for m in msgs if (m.key, m.value) != fleet_message(topic, p, m.seq, cleanup)]
            if wrong:
                self.violation("served", h.name, f"{topic}/{p} seqs {wrong[:10]}: served, not as produced")
            self.served[(h.name, topic, p)] = np.array([m.seq for m in msgs], np.int64)
            compared += len(msgs)
        return compared

    def check_real_broker(self, h: Host) -> None:
        """The real broker served everything since the last check: it neither aborted nor exited on our output, and
        what it served at each start (every partition, consumed whole) was as produced (tests/real_broker.py)."""
        from real_broker import FATAL_MARKS

        for path in (h.broker_log, h.supervisor_log):
            try:
                with open(path, "rb") as fh:
                    fh.seek(self.log_checked.get(path, 0))
                    text = fh.read()
            except OSError:
                continue
            at = self.log_checked.get(path, 0)
            self.log_checked[path] = at + len(text)
            for raw in text.splitlines(keepends=True):
                at += len(raw)
                line = raw.decode("utf-8", "replace")
                if any(a < at <= b for a, b in self.expected_fatal.get(path, [])):
                    continue  # the broker's exit on a torn tail the soak left (not ours)
                if "the broker was SIGKILLed" in line:
                    self.broker_kills_seen[h.name] += 1
                    if self.broker_kills_seen[h.name] > self.broker_kills[h.name]:
                        self.violation("verify", h.name, f"the real broker died, not by the soak: {line.strip()}")
                if any(mark in line for mark in (*FATAL_MARKS, "the broker failed", "not as produced")):
                    self.violation("verify", h.name, f"the real broker: {line.strip()[:300]}", path)

    def read_tank(self) -> dict[tuple[str, str, int], np.ndarray]:
        """Which seqs each partition holds now (bool by seq), each checked against what was produced (retention and
        compaction keep TANK's data small, so all of it every night), and the produced messages up to the last seq
        accounted (`PartState`)."""
        from tank_log.storage.datadir import rescan_partition, scan_data_dir

        out: dict[tuple[str, str, int], np.ndarray] = {}
        for h in self.hosts:
            for part in scan_data_dir(h.base).partitions():
                key = (h.name, part.topic, part.id)
                state = self.parts[key]
                for _ in range(10):  # the stand-in rolls and deletes segments meanwhile: read the partition again
                    try:
                        seqs, fresh = self._read_partition(part)
                        break
                    except FileNotFoundError:
                        part = rescan_partition(part.path, part.topic, part.id)
                else:
                    raise RuntimeError(f"{part.path}: its files kept vanishing while it was read")
                present = np.concatenate(seqs) if seqs else np.zeros(0, np.int64)
                state.produced_upto(int(present.max()) if len(present) else 0)
                for seq, k, v in fresh:
                    if (k, v) != fleet_message(part.topic, part.id, seq, state.cleanup):
                        self.violation("exactly_once", h.name, f"{part.topic}/{part.id} seq {seq}: not as produced")
                mask = np.zeros(state.top + 1, bool)
                mask[present] = True
                out[key] = mask
        return out

    @staticmethod
    def _read_partition(part) -> tuple[list[np.ndarray], list[tuple[int, bytes, bytes]]]:
        """The seqs of a partition's segments, and (seq, key, value) of each message."""
        seqs, fresh = [], []
        for seg in part.segments:
            for chunk in seg.chunks():
                c = chunk.cols
                seqs.append(c.seq.astype(np.int64))
                fresh += [(int(c.seq[i]), c.key(i) or b"", c.value(i)) for i in range(len(c))]
        return seqs, fresh

    def read_table(self, full: bool) -> None:
        """The rows of the table's files not read before (all of them after an upkeep): each (source, topic,
        partition, seq) once, as produced, and of a partition its source (the host that exported it) holds."""
        import pyarrow.dataset as ds
        from deltalake import DeltaTable

        dataset = DeltaTable(self.table, storage_options={**self.storage_options, **_aws_env()}).to_pyarrow_dataset()
        if full:
            self.table_files_read.clear()
            for state in self.parts.values():
                state.in_table[:] = False
        fragments = [f for f in dataset.get_fragments() if f.path not in self.table_files_read]
        if not fragments:
            return
        new = ds.FileSystemDataset(fragments, dataset.schema, dataset.format, dataset.filesystem)
        t = new.to_table(columns=["source", "topic", "partition", "seq", "key", "value"])
        self.table_files_read.update(f.path for f in fragments)
        for source, topic, p, seq, key, value in zip(*(t.column(c).to_pylist() for c in t.column_names), strict=True):
            found = self.parts.get((source, topic, p))
            if found is None:  # a row of another source than the host that holds the partition
                self.violation("exactly_once", str(source), f"{topic}/{p} seq {seq}: in the table as of {source!r}")
                continue
            state = found
            state.grow(seq)
            if state.in_table[seq]:
                self.violation("exactly_once", source, f"{topic}/{p} seq {seq} in the table twice")
            state.in_table[seq] = True
            if (key or b"", value) != fleet_message(topic, p, seq, state.cleanup):
                self.violation("exactly_once", source, f"{topic}/{p} seq {seq} in the table: not as produced")

    def table_files(self) -> tuple[int, int]:
        """The table's active files and its partitions (topic, date) that hold them."""
        from deltalake import DeltaTable

        files = DeltaTable(self.table, storage_options={**self.storage_options, **_aws_env()}).file_uris()
        return len(files), len({os.path.dirname(f) for f in files})

    def restart_stopped_continuous(self) -> int:
        """Continuous exports that stopped by themselves, each counted with its last error line and started again
        (as a supervisor would). How many tonight."""
        stopped = 0
        for name, proc in list(self.continuous.items()):
            if proc.poll() is None:
                continue
            ran = next(r for r in reversed(self.ran) if r.what == "continuous" and r.host == name)
            self.running.pop(proc.pid, None)
            ran.code = proc.returncode
            log = self.log_of(self.ran.index(ran))
            with open(log, errors="replace") as fh:
                errors = [line.strip() for line in fh if " ERROR tank_log" in line]
            entry = {"night": len(self.nights), "host": name, "code": proc.returncode, "log": log}
            self.continuous_stops.append({**entry, "error": errors[-1][:600] if errors else None})
            print("CONTINUOUS-STOPPED " + json.dumps(self.continuous_stops[-1]), flush=True)
            self.start_continuous(next(h for h in self.hosts if h.name == name))
            stopped += 1
        return stopped

    def check_processes(self) -> None:
        """Processes of the night's runs still alive (but the continuous exports, which run for good)."""
        keep = {p.pid for p in self.continuous.values()}
        suspects = [
            (pid, env)
            for pid, env in _marked_processes(self.work)
            if not (pid in keep or _ancestor_in(pid, keep) or _is_broker(_cmdline(pid)))  # started by a step
        ]
        if suspects:  # one that was exiting as it was listed (e.g. a Spark worker of a continuous export) is not left
            time.sleep(2)
            alive = {pid for pid, _ in _marked_processes(self.work)}
            suspects = [(pid, env) for pid, env in suspects if pid in alive and not _ancestor_in(pid, keep)]
        for pid, env in suspects:
            self.violation("processes", env.get(MARK, "?"), f"pid {pid} left alive: {_cmdline(pid)[:300]}")
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    # ---- the end --------------------------------------------------------------------------------------------------

    def teardown(self) -> None:
        self.sampling_done.set()
        for proc in self.continuous.values():
            proc.send_signal(signal.SIGTERM)
        for name, proc in self.continuous.items():
            ran = next(r for r in reversed(self.ran) if r.what == "continuous" and r.host == name)
            self.wait(proc, ran, timeout=90)
        for h in self.hosts:
            if h.real is not None:  # its supervisor stops the broker; a broker left behind is killed below
                _signal_pidfile(h.pidfile, signal.SIGINT, wait_s=30)
                _signal_pidfile(h.pidfile + ".tank", signal.SIGKILL)
            _signal_pidfile(h.pidfile, signal.SIGKILL)
        if self.s3:
            kill_session(self.s3["pid"])

    def summary(self, wall_s: float) -> dict[str, Any]:
        last = self.nights[-1] if self.nights else {}
        return {
            "summary": True,
            "seed": self.args.seed,
            "hosts": len(self.hosts),
            "nights": len(self.nights),
            "through_airflow": sum(1 for n in self.nights if n["airflow"]),
            "produced": last.get("produced", 0),
            "exported": last.get("exported", 0),
            "compacted_away": last.get("compacted_away", 0),
            "data_loss_reported": sum(len(s) for s in self.losses.values()),
            "faults": dict(self.faults),
            "faults_total": sum(self.faults.values()),
            "kills": sum(1 for r in self.ran if r.killed),
            "broker_kills": sum(self.broker_kills.values()),
            "broker_kills_with_a_produce_in_flight": self.kills_in_flight,
            "left_by_broker_kills": dict(self.left_by_kills),
            "torn_tails": len(self.torn),
            "broker_exits_on_torn_tails": self.aborts_on_torn,
            "served_compared": sum(n.get("served_compared", 0) for n in self.nights),
            "deleted_by_broker_unguarded": last.get("deleted_by_broker_unguarded", 0),
            "continuous_stops": self.continuous_stops[:20],
            "violations": {
                k: self.violations[k]
                for k in ("data", "exactly_once", "verify", "served", "processes", "table_files", "rss")
            },
            "wall_s_per_night": [n["wall_s"] for n in self.nights],
            "peak_rss_mib": {
                "python": round(max((r.peak_rss_mib for r in self.ran if r.what != "continuous"), default=0)),
                "spark": round(max((r.peak_rss_mib for r in self.ran if r.what == "continuous"), default=0)),
            },
            "upkeeps": [
                {k: u[k] for k in ("files_before", "files_removed", "files_written", "files_after")}
                for u in self.upkeeps
            ],
            "runs": len(self.ran),
            "wall_s": round(wall_s),
            "reproductions": self.repro[:20],
        }


def _signal_pidfile(path: str, sig: int, wait_s: float = 0) -> None:
    """Send `sig` to the process a pidfile names, and wait up to `wait_s` for it to be gone."""
    try:
        pid = int(open(path).read())
        os.kill(pid, sig)
    except (OSError, ValueError):
        return
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}") and "Z" not in _state(pid):
        time.sleep(0.1)


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def _is_broker(cmdline: str) -> bool:
    """A host's broker (stand-in, or the real one, its supervisor and the client it produces with)."""
    return any(mark in cmdline for mark in (STANDIN, REAL, " -l 127.0.0.1:", " -b 127.0.0.1:"))


def _credentials() -> dict[str, str]:
    return {"aws_access_key_id": "test", "aws_secret_access_key": "test", "region_name": "us-east-1"}


def _aws_env() -> dict[str, str]:
    return {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1"}


def _marked_processes(run_id: str) -> list[tuple[int, dict[str, str]]]:
    """The live processes this soak started (their environment says so; another soak's on the machine are not)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                raw = fh.read()
            with open(f"/proc/{pid}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if MARK.encode() + b"=" in raw and state != "Z" and int(pid) != os.getpid():
            env = dict(kv.split("=", 1) for kv in raw.decode(errors="replace").split("\0") if "=" in kv)
            if env.get(RUN_ID) == run_id:
                out.append((int(pid), env))
    return out


def _hwm_kib(pid: int) -> int:
    """A process's peak RSS (VmHWM: its own address space's, since its exec), 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            return next((int(line.split()[1]) for line in fh if line.startswith("VmHWM:")), 0)
    except (OSError, ValueError):
        return 0


def _tree_hwm_kib(pid: int) -> int:
    """The largest VmHWM of a process and its descendants (children of every thread: a JVM starts its Python
    workers from other threads than its main one)."""
    best, todo = 0, [pid]
    while todo:
        p = todo.pop()
        best = max(best, _hwm_kib(p))
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as fh:
                    todo += [int(c) for c in fh.read().split()]
        except (OSError, ValueError):
            continue
    return best


def _peak_rss_kib(ran: Ran, ru_maxrss_kib: int) -> int:
    """The peak RSS of a run's process tree. wait4's ru_maxrss alone cannot say it: Linux counts in it the address
    space the child had before its exec, which under vfork is the soak's own (exec_mmap: setmax_mm_hiwater_rss), so
    once the soak's checker has grown, every run would read as large as the soak. ru_maxrss counts only when it is
    above the soak's peak at the run's start; the samples of its tree count always."""
    genuine = ru_maxrss_kib if ru_maxrss_kib > ran.spawner_hwm_kib else 0
    return max(genuine, ran.sampled_kib)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _children(pid: int) -> list[int]:
    """A process's children (of every thread)."""
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                out += [int(c) for c in fh.read().split()]
    except (OSError, ValueError):
        pass
    return out


def _ancestor_in(pid: int, pids: set[int]) -> bool:
    while pid > 1:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                pid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            return False
        if pid in pids:
            return True
    return False


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "?"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--nights", type=int, default=7)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workdir")
    ap.add_argument("--night-s", type=float, default=3.0, help="seconds the producers run before the night's work")
    ap.add_argument("--rate", type=float, default=20.0, help="messages per second per partition while a broker is up")
    ap.add_argument("--fault-rate", type=float, default=0.45, help="chance of a fault per host and night")
    ap.add_argument("--force-fault", action="append", default=[], metavar="NIGHT:HOST:FAULT")
    ap.add_argument("--airflow-nights", default="", help="nights run through Airflow, e.g. 3,10,20")
    ap.add_argument("--continuous-hosts", type=int, default=1, help="hosts that also run the continuous export")
    ap.add_argument("--short", action="store_true", help="2 hosts, 3 nights, night 1 through Airflow")
    ap.add_argument("--tank", metavar="PATH", help="the real broker (a TANK build's `tank`) serves every host")
    ap.add_argument("--tank-cli", metavar="PATH", help="its client, through which the hosts' messages are produced")
    ap.add_argument(
        "--broker-kill-every",
        type=int,
        default=3,
        metavar="N",
        help="with --tank: each host's broker SIGKILLed every N nights",
    )
    args = ap.parse_args(argv)
    if bool(args.tank) != bool(args.tank_cli):
        ap.error("--tank and --tank-cli go together")
    for flag, path in (("--tank", args.tank), ("--tank-cli", args.tank_cli)):
        if path and not (os.path.isfile(path) and os.access(path, os.X_OK)):
            ap.error(f"{flag} {path}: not an executable file")
    args.tank = args.tank and os.path.abspath(args.tank)
    args.tank_cli = args.tank_cli and os.path.abspath(args.tank_cli)
    if args.short:
        args.hosts, args.nights, args.airflow_nights = 2, 3, "1"
        args.night_s, args.continuous_hosts = min(args.night_s, 2.0), 1
    args.airflow_nights = {int(n) for n in args.airflow_nights.split(",") if n}
    return args


def main(argv: list[str] | None = None, airflow: Any = None, hosts_file: str | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    args.workdir = args.workdir or tempfile.mkdtemp(prefix="tank-fleet-")
    for d in ("logs", "reports", "checkpoints"):
        os.makedirs(os.path.join(args.workdir, d), exist_ok=True)
    fleet = Fleet(args, airflow, hosts_file)
    own_airflow = None
    signal.signal(signal.SIGTERM, _stopped)  # stopped: every process it started is stopped too
    t0 = time.monotonic()
    try:
        fleet.setup()
        if args.airflow_nights and airflow is None:
            own_airflow = fleet.airflow = start_airflow(fleet)
        for n in range(args.nights):
            fleet.night(n)
    finally:
        fleet.teardown()
        if own_airflow is not None:
            own_airflow.stop()
    out = fleet.summary(time.monotonic() - t0)
    print(json.dumps(out), flush=True)
    return out


def _stopped(*_: object) -> None:
    """SIGTERM: unwind through the tear-down once (a second SIGTERM, e.g. from `timeout`, must not cut it short)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(143)


def start_airflow(fleet: Fleet) -> Any:
    from airflow_harness import airflow_env, start_services

    work = os.path.join(fleet.work, "airflow")
    os.makedirs(work, exist_ok=True)
    port = free_port()
    env = airflow_env(work, port, config=fleet.hosts_file, hosts=fleet.hosts_file, **_aws_env())
    env["AIRFLOW_VAR_TANK_LOG_REPORTS"] = os.path.join(fleet.work, "reports")
    return start_services(work, port, env)


if __name__ == "__main__":
    main()
