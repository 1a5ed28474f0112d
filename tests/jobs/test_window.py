"""The maintenance window's steps (tank_log.jobs.window) against real stand-in broker processes."""

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import events, standin_broker, start_standin, tree_digest

from tank_log.errors import JobConfigError, WindowStepFailed
from tank_log.jobs import window
from tank_log.jobs.config import parse_job_config
from tank_log.tools.demo import write_demo


def _broker(entry: dict):
    (b,) = parse_job_config({"brokers": [entry]}).brokers
    return b


@pytest.fixture
def base(tmp_path):
    return write_demo(str(tmp_path / "data"))


def test_stop_waits_until_nothing_holds_the_data_then_start_and_ready(tmp_path, base):
    entry = standin_broker(str(tmp_path), "a", base)
    b = _broker(entry)
    pid = start_standin(entry)
    assert [h.pid for h in window.broker_holders(b)] == [pid]
    assert not window.start(b).done  # it runs: never a second one on its data
    stopped = window.stop(b)
    assert stopped.done and window.broker_holders(b) == [] and events(tmp_path) == ["up a", "down a"]
    started = window.start(b)
    assert started.done and window.wait_ready(b).done and events(tmp_path)[-1] == "up a"
    assert window.verify(b).done
    window.stop(b)


def test_a_broker_that_will_not_stop_fails_the_step_naming_it(tmp_path, base):
    entry = standin_broker(str(tmp_path), "a", base, stubborn=True, stop_timeout="2s")
    b = _broker(entry)
    pid = start_standin(entry)
    before = tree_digest(base)
    try:
        t0 = time.monotonic()
        with pytest.raises(WindowStepFailed) as e:
            window.stop(b)
        assert 2 <= time.monotonic() - t0 < 10
        assert e.value.broker == "a" and e.value.step == "stop"
        assert f"pid {pid}" in str(e.value) and "the maintenance job does not run" in str(e.value)
        assert not window.start(b).done and tree_digest(base) == before
    finally:
        os.kill(pid, signal.SIGKILL)


def test_commands_that_fail_or_hang_and_a_broker_that_never_serves(tmp_path, base):
    entry = standin_broker(str(tmp_path), "a", base)
    b = _broker({**entry, "stop_command": "echo no such service >&2; exit 5"})
    with pytest.raises(WindowStepFailed, match=r"exited with 5: no such service"):
        window.stop(b)
    b = _broker({**entry, "start_command": "sleep 60", "ready_timeout": "1s"})
    t0 = time.monotonic()
    with pytest.raises(WindowStepFailed, match="did not return within 1 s"):
        window.start(b)
    assert time.monotonic() - t0 < 10
    with pytest.raises(WindowStepFailed, match=r"broker a: ready: tcp://127.0.0.1:\d+ not serving after 1 s"):
        window.wait_ready(b)


def test_verify_names_the_errors(tmp_path, base):
    b = _broker(standin_broker(str(tmp_path), "a", base))
    seg = sorted(f for f in os.listdir(os.path.join(base, "profiles", "0")) if f.endswith(".ilog"))[0]
    with open(os.path.join(base, "profiles", "0", seg), "r+b") as fh:
        fh.write(b"\xff" * 16)
    with pytest.raises(WindowStepFailed, match=rf"broker a: verify: 1 error\(s\): .*{seg}"):
        window.verify(b)


def test_start_repairs_what_a_killed_maintenance_left_before_the_broker_opens_it(tmp_path, base):
    """A maintenance job killed mid-compaction leaves `.cleaned`/`.swap`/`.old` files; the broker's open-time
    recovery would resurrect the `.old` inputs beside the outputs (§6.4). `start` repairs first: the broker is
    started on data with no leftover, in which every message is there once."""
    from conftest import CRASHED, crash_after_step

    from tank_log.maintenance.compaction import CompactionOptions, compact_partition
    from tank_log.maintenance.verify import verify_path
    from tank_log.storage.datadir import partitions_at

    entry = standin_broker(str(tmp_path), "a", base)
    (part,) = [p for p in partitions_at(base) if p.config.cleanup_policy == "cleanup"][:1]
    options = CompactionOptions(force=True, broker_stopped=True)
    assert crash_after_step(6, lambda hook: compact_partition(part, options, on_step=hook)) == CRASHED
    assert [p for p in verify_path(base) if p.code == "compaction-leftover"]  # what the broker would mishandle
    seen = str(tmp_path / "seen-at-start")
    b = _broker(
        {**entry, "start_command": f"find {base} -name '*.old' -o -name '*.swap' > {seen}; " + entry["start_command"]}
    )
    started = window.start(b)
    try:
        assert started.done and "repairing" in started.detail, started
        assert open(seen).read() == ""  # nothing for the broker to resurrect when it opened the data
        assert window.wait_ready(b).done and window.verify(b).done
    finally:
        window.wait_ready(b)  # it has written its pidfile: the stop finds it
        window.stop(b)


def test_another_run_of_ours_on_the_data_is_not_taken_for_the_broker(tmp_path, base):
    """An export of ours holds its run marker in the base path for its whole run: the window's stop must not wait
    for it, and its start must not take it for a broker that still runs (the maintenance job and the export keep
    apart through the partition locks)."""
    entry = standin_broker(str(tmp_path), "a", base)
    b = _broker(entry)
    start_standin(entry)
    pidfile, marked = tmp_path / "run.pid", tmp_path / "run.held"
    code = (
        "import os, time\nfrom tank_log.storage.locking import run_marker\n"
        f"open({str(pidfile)!r}, 'w').write(str(os.getpid()))\n"
        f"with run_marker([{base!r}]):\n    open({str(marked)!r}, 'w').close()\n    time.sleep(60)\n"
    )
    # re-parented, as an export the scheduler started elsewhere: not a descendant of this process
    subprocess.run(["sh", "-c", f'setsid {sys.executable} -c "$0" > /dev/null 2>&1 < /dev/null &', code], check=True)
    try:
        deadline = time.monotonic() + 30
        while not marked.exists():
            assert time.monotonic() < deadline, "the run never held its marker"
            time.sleep(0.05)
        assert window.stop(b).done and window.broker_holders(b) == []
        started = window.start(b)
        assert started.done, started.detail
        assert window.wait_ready(b).done
    finally:
        os.kill(int(pidfile.read_text()), signal.SIGKILL)
        window.stop(b)


def test_start_fails_naming_the_partition_repair_could_not_make_active_again(tmp_path, base):
    """A broker killed inside its roll whose last RO segment repair refuses to make active (a torn tail): started on
    it, the broker's next append would hide every RO message (§9 rule 4). The start step fails in one line naming
    the partition and why, and the broker is not started."""
    from conftest import killed_roll

    from tank_log.storage.datadir import scan_partition

    d = os.path.join(base, "rolled", "0")
    killed_roll(d)
    last_ro = scan_partition(d, "rolled", 0).ro[-1]
    with open(last_ro.path, "ab") as fh:
        fh.write(b"\x40\x00\x01")
    entry = standin_broker(str(tmp_path), "a", base)
    marker = tmp_path / "started"
    b = _broker({**entry, "start_command": f"touch {marker}"})
    with pytest.raises(WindowStepFailed) as e:
        window.start(b)
    assert e.value.broker == "a" and e.value.step == "start"
    (line,) = str(e.value).splitlines()
    assert f"not started: repair left {d}: RO segments without a non-empty active segment" in line
    assert f"{last_ro.file_name} not made active" in line and "[torn-tail]" in line
    assert not marker.exists()


def test_the_window_runs_guard_by_the_brokers_name_or_its_declared_source(tmp_path):
    """The source of a broker's window runs (`--source` of its maintain job): its job config's export.source, else its
    name; a name that cannot be a source is refused in one line."""
    entry = {
        "name": "broker-a",
        "data_dirs": [str(tmp_path)],
        "stop_command": "true",
        "start_command": "true",
        "ready_check": "tcp://127.0.0.1:1",
    }
    assert window.window_source(_broker(entry)) == "broker-a"
    own = tmp_path / "replica.yaml"
    own.write_text("export: {source: cluster-1}\n")
    assert window.window_source(_broker({**entry, "job_config": str(own)})) == "cluster-1"
    assert window.window_source(_broker(entry), parse_job_config({"export": {"source": "c2"}})) == "c2"
    with pytest.raises(JobConfigError, match="brokers\\[\\].name"):
        window.window_source(_broker({**entry, "name": "broker a"}))
