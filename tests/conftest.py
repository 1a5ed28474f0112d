"""Shared test helpers: fixture locations (copied from ../shared/fixtures, written by the real broker) and dumps."""

from __future__ import annotations

import base64
import gzip
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

import pytest

from tank_log.tools import standin_broker as standin_module

# tests marked `alone` run with no other test beside them; in xdist workers, each worker's slowest tests start first
pytest_plugins = ["run_locks", "slowest_first"]

logging.getLogger("py4j").setLevel(logging.WARNING)  # no "Closing down clientserver connection" after pytest exits

# Every Spark driver JVM the tests start (in process, job subprocesses, spark-submit) compiles with C1 only: it only
# schedules tasks here, and skipping C2 start-up compilation makes a job run ~2 s faster on 2 busy cores
# (bench/RESULTS.md, "Spark's fixed costs"). When Spark tests run, the drivers also map a class-data archive (built
# once per Spark installation, `tank_spark/class_archive.py`: ~4 s less per SparkSession start) and start no web UI.
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1")

# Delta on Spark rebuilds a table's state in 50 tasks by default. Our local drivers ask for 2 (`tank_spark.jars.
# configure`); the sessions the docs' examples build themselves get 2 from here (the drivers' system properties), as
# on a host whose spark-defaults.conf says so: the docs' read of one table through s3a took 74 s, then 36 s (load 16).
DELTA_SNAPSHOT_PARTITIONS = ("spark.databricks.delta.snapshotPartitions", "2")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)  # the repository
FIXTURES = os.path.join(HERE, "data", "fixtures")


def load_script(relpath: str):
    """A script of the checkout that is not in a package (bench/, scripts/) as a registered module, for its tests."""
    import importlib.util

    name = os.path.splitext(os.path.basename(relpath))[0]
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, relpath))
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_fleet():
    """bench/fleet.py (the fleet soak) as a module: its short mode and its checker are tested."""
    return load_script(os.path.join("bench", "fleet.py"))


# every data directory with its ground-truth dump
DATASETS = {
    "A_multi": "A_multi",
    "B2_compaction_live": "B2_compaction_live",
    "B_before": "B_compaction_restart/before",
    "B_after": "B_compaction_restart/after",
    "C_misc": "C_misc",
    "C_before_roll": "C_misc/before_roll",
    "E_before": "E_compaction_exact/before",
    "E_after": "E_compaction_exact/after",
    "M_mirror": "M_mirror",
}


def data_dir(name: str) -> str:
    return os.path.join(FIXTURES, DATASETS[name], "data")


def dump_path(name: str) -> str:
    return os.path.join(FIXTURES, DATASETS[name], "dump.jsonl.gz")


def duckdb_with(*extensions: str):  # type: ignore[no-untyped-def]
    """A DuckDB connection with `extensions` loaded from their PyPI packages (`duckdb-extension-<name>`), autoinstall
    and autoload off: nothing is downloaded, and an engine nobody here wrote reads our tables."""
    import glob
    import importlib

    import duckdb

    con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
    for name in extensions:
        package = os.path.dirname(importlib.import_module(f"duckdb_extension_{name}").__file__ or "")
        (path,) = glob.glob(os.path.join(package, "extensions", "*", f"{name}.duckdb_extension"))
        con.execute(f"LOAD '{path}'")
    return con


def load_dump_lines(name: str) -> dict[tuple[str, int], list[str]]:
    """Raw dump lines grouped by (topic, partition), in file order (seq order per partition)."""
    out: dict[tuple[str, int], list[str]] = defaultdict(list)
    with gzip.open(dump_path(name), "rt") as fh:
        for line in fh:
            o = json.loads(line)
            out[(o["topic"], o["partition"])].append(line.rstrip("\n"))
    return dict(out)


def load_dump(name: str) -> dict[tuple[str, int], list[tuple[int, int, bytes | None, bytes]]]:
    """(seq, ts, key or None, value) per partition."""
    out: dict[tuple[str, int], list] = {}
    for key, lines in load_dump_lines(name).items():
        rows = []
        for line in lines:
            o = json.loads(line)
            rows.append((o["seq"], o["ts"], base64.b64decode(o["key_b64"]) or None, base64.b64decode(o["value_b64"])))
        out[key] = rows
    return out


def copy_tree(src: str, dst: str) -> str:
    shutil.copytree(src, dst)
    for root, dirs, files in os.walk(dst):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o755)
        for f in files:
            os.chmod(os.path.join(root, f), 0o644)
    return dst


def tree_digest(path: str, *, include_lock: bool = False) -> dict[str, bytes]:
    """Every file (relative path → content) under `path`, for before/after comparisons. The per-partition lock
    file (holder info, rewritten by every mutating run) is left out unless `include_lock`."""
    out = {}
    for root, _, files in os.walk(path):
        for f in files:
            if f == ".tank-log.lock" and not include_lock:
                continue
            full = os.path.join(root, f)
            with open(full, "rb") as fh:
                out[os.path.relpath(full, path)] = fh.read()
    return out


CRASHED = 17  # the exit status of a process `crash_after_step` killed


WHERE = {"executors": ["--in-driver-max-bytes=0"], "driver": []}  # forced onto Spark; the default for small data


def run_job_script(
    job: str,
    *args: str,
    master: str = "local[2]",
    where: str = "executors",
    env_extra: dict[str, str] | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    """`python jobs/<job>.py` as an operator runs it (a real process, local Spark on `master`). On Spark's executors
    unless `where="driver"`: these fixtures are far below `in_driver_max_bytes`, the size under which a job runs in
    the driver's processes or threads by default. Later flags in `args` override these."""
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", **(env_extra or {}))
    cmd = [sys.executable, os.path.join(ROOT, "jobs", f"{job}.py"), "--master", master, *WHERE[where], *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def crash_after_step(k: int, run) -> int:
    """Fork; in the child call `run(hook)`, where `hook` (a StepHook) kills the child with os._exit — no cleanup,
    like kill -9 — right after file operation number k; return the child's exit status (CRASHED if it got there)."""
    pid = os.fork()
    if pid == 0:
        count = [0]

        def hook(step):
            count[0] += 1
            if count[0] == k:
                os._exit(CRASHED)

        try:
            run(hook)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.WEXITSTATUS(status)


CODEC_CORES = ["native", "pure"]  # the compiled codec core and the pure-Python one (tank_log.format.native)


@pytest.fixture(params=CODEC_CORES)
def codec_core(request):
    """Run the test once on each codec core: both must give the same results."""
    from tank_log.format import native

    with native.use_pure(request.param == "pure"):
        yield request.param


@pytest.fixture
def fixture_copy(tmp_path):
    """Copy a fixture data dir into tmp and return its path: fixture_copy("A_multi")."""

    def make(name: str) -> str:
        return copy_tree(data_dir(name), str(tmp_path / name))

    return make


@pytest.fixture(scope="session")
def spark():
    """One local Spark session for the in-process Spark tests (UTC, no UI), with Delta's jars, SQL extension and
    catalog (`tank_spark.jars`: those scripts/setup.sh fetched) for the cross-engine tests."""
    import sys

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    from tank_spark import jars, worker_daemon

    conf = SparkConf().setMaster("local[2]").setAppName("tank-log-tests")
    conf.set("spark.ui.enabled", "false").set("spark.ui.showConsoleProgress", "false")
    conf.set("spark.sql.session.timeZone", "UTC").set("spark.sql.shuffle.partitions", "4")
    # Delta's VACUUM lists a table in this many tasks (default 10,000: 85 s of a 2-core machine for 4 files; 12 s)
    conf.set("spark.sql.sources.parallelPartitionDiscovery.parallelism", "4")
    worker_daemon.configure(conf)  # as the jobs run
    # this JVM lives for the whole run and does real work (Delta commits, OPTIMIZE, MERGE, streaming): unlike the
    # short-lived drivers, it gains from the C2 compiler
    opts = os.environ.get("SPARK_SUBMIT_OPTS", "")
    os.environ["SPARK_SUBMIT_OPTS"] = opts.replace("-XX:TieredStopAtLevel=1", "").strip()
    try:
        SparkContext._ensure_initialized(conf=conf)  # the JVM first, as the jobs do: it maps the class archive
    finally:
        os.environ["SPARK_SUBMIT_OPTS"] = opts
    jars.configure(conf, jvm_running=True)
    session = SparkSession.builder.config(conf=conf).getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    from tank_spark.source import register

    register(session)
    yield session
    session.stop()
    # py4j's objects still collected at exit talk to a JVM that is gone, and log it at INFO to streams pytest closed:
    # through its own logger, and through the root logger (`logging.info` in py4j.java_gateway), which a job run in
    # this process may have set to INFO
    logging.getLogger("py4j").setLevel(logging.ERROR)
    logging.getLogger().setLevel(max(logging.getLogger().level, logging.WARNING))


SCRATCH = "TANK_LOG_TEST_SCRATCH"  # the run's scratch directory, inherited by every process the tests start
_SCRATCH_MADE = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    """Every process the tests start carries this run's marker in its environment; tests/reaper.py SIGKILLs those
    still running once pytest has exited, however it exited (a SIGKILLed run leaves no Airflow, broker or JVM).
    Their JVMs keep their temporary files in the run's scratch directory, not in /tmp (a SIGKILLed JVM runs no
    shutdown hook to remove them): pytest removes it when it ends, the reaper once it has ended what was left."""
    if os.environ.get("TANK_LOG_TEST_RUN"):  # a run inside a run (or an xdist worker): the outer one reaps
        return
    scratch = config.stash[_SCRATCH_MADE] = tempfile.mkdtemp(prefix="tank-log-run-")
    # java.io.tmpdir: artifacts-*, spark-submit's spark-*, the native libraries lz4-java and snappy-java unpack;
    # hadoop.tmp.dir: hadoop-<user>/s3a, S3A's upload buffers
    jvm = f"-Djava.io.tmpdir={scratch} -Dhadoop.tmp.dir={scratch}"
    os.environ.update(
        {
            SCRATCH: scratch,
            "SPARK_LOCAL_DIRS": scratch,  # Spark's local directories: spark-*, blockmgr-*
            # drivers, and through their configuration the executors of a cluster
            "SPARK_SUBMIT_OPTS": f'{os.environ["SPARK_SUBMIT_OPTS"]} {jvm} "-Dspark.executor.extraJavaOptions={jvm}"',
            # a standalone cluster's master and workers
            "SPARK_DAEMON_JAVA_OPTS": f"{os.environ.get('SPARK_DAEMON_JAVA_OPTS', '')} {jvm}".strip(),
        }
    )
    marker = f"{os.getpid()}-{time.time_ns()}"
    subprocess.Popen(
        [sys.executable, os.path.join(HERE, "reaper.py"), str(os.getpid()), marker, scratch],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    os.environ["TANK_LOG_TEST_RUN"] = marker


def pytest_unconfigure(config: pytest.Config) -> None:
    """The run's scratch directory goes when pytest ends, failed tests or not (the reaper removes what the processes
    it ends wrote since)."""
    scratch = config.stash.get(_SCRATCH_MADE, None)
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)


# Markers: `spark` (starts Spark, in-process or through a job) and `slow` (more than a few seconds). Tests under
# tests/spark and tests/e2e are both; `bash scripts/test.sh -m "not slow"` is the fast inner loop.
SLOW_ELSEWHERE = {
    "test_mutations_raise_only_format_errors",
    "test_crash_at_every_step_then_repair",
    "test_crash_at_every_salvage_step_then_repair",
    "test_two_concurrent_processes",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        folder = os.path.basename(os.path.dirname(str(item.fspath)))
        if folder in ("spark", "e2e") or "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.spark)
            item.add_marker(pytest.mark.slow)
        elif item.originalname in SLOW_ELSEWHERE:
            item.add_marker(pytest.mark.slow)


def pytest_collection_finish(session):
    """Spark tests selected: every driver maps the class-data archive (built here if this installation has none)."""
    if session.config.option.collectonly or not any(i.get_closest_marker("spark") for i in session.items):
        return
    from tank_spark.class_archive import build, default_path

    archive = default_path()  # the one the jobs map by themselves
    if not os.path.exists(archive):
        t0 = time.monotonic()
        build(archive)
        print(f"\nbuilt the Spark driver class archive {archive} in {time.monotonic() - t0:.0f}s", file=sys.stderr)
    opts = os.environ["SPARK_SUBMIT_OPTS"]
    snapshot = "-D{}={}".format(*DELTA_SNAPSHOT_PARTITIONS)
    os.environ["SPARK_SUBMIT_OPTS"] = f"{opts} -XX:SharedArchiveFile={archive} -Dspark.ui.enabled=false {snapshot}"


def many_small_partitions(base, n: int) -> str:
    """A `cleanup` topic of `n` small partitions with compactable RO segments (runs long enough to be stopped)."""
    from tank_log.format.bundle import Message
    from tank_log.storage.partition_writer import write_partition
    from tank_log.storage.writer import BundlePolicy

    msgs = [Message(s, 1_700_000_000_000 + s, b"k%d" % (s % 5), b"v%d" % s) for s in range(1, 61)]
    for pid in range(n):
        write_partition(os.path.join(base, "kv", str(pid)), msgs, segment_bytes=300, policy=BundlePolicy(5))
    with open(os.path.join(base, "kv", "config"), "w") as fh:
        fh.write("log.cleanup.policy=cleanup\n")
    return str(base)


def killed_roll(partition_dir, n: int = 400, *, empty_active: bool = False) -> list:
    """What a broker SIGKILLed inside its roll leaves (docs/FORMAT.md §2.5, §2.6): messages 1..`n` in RO segments
    and no active segment (killed between the rename of the active segment and the creation of the next one), or
    with `empty_active` a 0-byte `<n+1>_<ts>.log` and `<n+1>.index` (killed before that segment's first write).
    The name timestamps are now's: the broker's next append does not roll them by age (§2.4). Returns the messages."""
    from tank_log.format.bundle import Message
    from tank_log.storage.partition_writer import write_partition

    now_ms = int(time.time() * 1000)
    msgs = [Message(s, now_ms - n + s, b"k%d" % (s % 7), b"value %d " % s + b"x" * 40) for s in range(1, n + 1)]
    write_partition(partition_dir, msgs, segment_bytes=1024, with_active=False)
    if empty_active:
        for name in (f"{n + 1}_{now_ms // 1000}.log", f"{n + 1}.index"):
            open(os.path.join(partition_dir, name), "wb").close()
    return msgs


class Detached:
    """A process that is not our child (started through a shell that exits, so it is re-parented): our own
    descendants are never holders."""

    def __init__(self, args, env):
        self._sh = subprocess.Popen(
            ["sh", "-c", '"$@" & echo $!', "sh", *args], stdout=subprocess.PIPE, text=True, env=env
        )
        self.pid = int(self._sh.stdout.readline())
        assert self._sh.stdout.readline().strip() == "ready"
        self._sh.wait()

    def kill(self):
        os.kill(self.pid, 9)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # gone once reaped by init (or a zombie: it holds nothing)
            try:
                with open(f"/proc/{self.pid}/stat") as fh:
                    if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                        return
            except FileNotFoundError:
                return
            time.sleep(0.05)


STANDIN = standin_module.__file__  # run as a file: the fleet soak finds its brokers by this path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, what: str, proc: subprocess.Popen | None = None, timeout: float = 60) -> None:
    """Until a loopback port accepts connections (fail if `proc` exits first or after `timeout`)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert (proc is None or proc.poll() is None) and time.monotonic() < deadline, f"{what} did not start"
            time.sleep(0.05)


def wait_for_hold(ready, proc: subprocess.Popen, log=None, timeout: float = 300) -> None:
    """Until a run held at a hook (`TANK_LOG_EXPORT_HOLD` and its kin: the run creates `ready`, PATH.ready, when it
    gets there) reaches it; fail with the end of its log if it exits first. `log` is a file the run writes; without
    it, the run's piped stderr. `timeout` only bounds a hang: the run's speed decides nothing."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(ready):
        if proc.poll() is not None:
            raise AssertionError(f"the run exited ({proc.returncode}) before its hold ({ready}):\n{_log_of(proc, log)}")
        if time.monotonic() > deadline:
            raise AssertionError(f"the run did not reach its hold ({ready}) in {timeout} s")
        time.sleep(0.05)


def _log_of(proc: subprocess.Popen, log) -> str:
    """The end of a finished run's log: the file `log`, else its piped stderr (text or bytes)."""
    if log is not None:
        try:
            with open(log, errors="replace") as fh:
                return fh.read()[-3000:]
        except OSError as err:
            return f"(no log: {err})"
    err = proc.communicate()[1] or ""
    return (err if isinstance(err, str) else err.decode(errors="replace"))[-3000:]


def standin_broker(work, name: str, base: str, *, stubborn: bool = False, stop_timeout: str = "20s") -> dict:
    """A `brokers:` entry whose stop/start commands manage a stand-in broker (tank_log/tools/standin_broker.py) serving
    `base` on a free loopback port; its up/down events go to `work/events`. `start_standin` starts it."""
    port, pidfile, events = free_port(), os.path.join(work, f"{name}.pid"), os.path.join(work, "events")
    flags = f"--port {port} --name {name} --pidfile {pidfile} --events {events}" + (" --stubborn" if stubborn else "")
    return {
        "name": name,
        "data_dirs": [base],
        "start_command": f"setsid {sys.executable} {STANDIN} -p {base} {flags} > /dev/null 2>&1 < /dev/null &",
        "stop_command": f"kill -INT $(cat {pidfile})",
        "ready_check": f"tcp://127.0.0.1:{port}",
        "stop_timeout": stop_timeout,
        "ready_timeout": "20s",
    }


def start_standin(entry: dict) -> int:
    """Start a stand-in broker with its `start_command` (re-parented: not our descendant); its pid once it serves."""
    subprocess.run(["sh", "-c", entry["start_command"]], check=True, timeout=30)
    wait_for_port(int(entry["ready_check"].rsplit(":", 1)[1]), f"stand-in {entry['name']}")
    pidfile = entry["stop_command"].split("$(cat ")[1].rstrip(")")
    return int(open(pidfile).read())


def events(work) -> list[str]:
    """The stand-ins' up/down events in order, as `up a` / `down b`."""
    path = os.path.join(work, "events")
    return [" ".join(line.split()[:2]) for line in open(path)] if os.path.exists(path) else []


@pytest.fixture(scope="session")
def s3_server():
    """A real S3-API server on loopback (moto in server mode), stopped by pid at the end: its endpoint and the
    credentials' environment."""
    port = free_port()
    proc = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for_port(port, "moto_server", proc)
    env = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1"}
    try:
        yield {"endpoint": f"http://127.0.0.1:{port}", "env": env}
    finally:
        os.kill(proc.pid, 9)
        proc.wait()


def new_bucket(s3_server, name: str) -> None:
    import boto3

    boto3.client("s3", endpoint_url=s3_server["endpoint"], **_boto_credentials(s3_server)).create_bucket(Bucket=name)


def _boto_credentials(s3_server) -> dict:
    env = s3_server["env"]
    return {
        "aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
        "region_name": env["AWS_REGION"],
    }


def signal_thread(pid: int, tid: int, sig: int) -> None:
    """Send `sig` to one thread of a process (tgkill; the main thread's tid is the pid): a signal sent to the process
    reaches whichever of its threads the kernel picks."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.tgkill(pid, tid, sig) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def session_processes(sid: int) -> list[str]:
    """The live processes of session `sid` (a run started with `start_new_session=True` has its pid as sid), as
    `pid command line`; zombies hold nothing and are left out (init reaps them when it gets to it)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            if fields[0] == "Z" or int(fields[3]) != sid:
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                command = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
            out.append(f"{pid} {command}")
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
    return out


def wait_session_gone(sid: int, timeout: float) -> tuple[float, list[str]]:
    """Wait up to `timeout` for every process of session `sid` to end: (seconds waited, what is still alive)."""
    start = time.monotonic()
    while (left := session_processes(sid)) and time.monotonic() - start < timeout:
        time.sleep(0.05)
    return time.monotonic() - start, left


def kill_session(sid: int) -> None:
    """SIGKILL every process left of session `sid` (a test's cleanup, pass or fail)."""
    for line in session_processes(sid):
        try:
            os.kill(int(line.split()[0]), 9)
        except ProcessLookupError:
            pass
