"""The fleet soak's own measurements (bench/fleet.py): a checker that misreads is worse than none."""

import json
import os
import subprocess
import sys
import time

from conftest import load_fleet

CHILD = "import time; b = bytearray({mb} << 20); b[::4096] = b'\\1' * len(b[::4096]); time.sleep(0.6)"


def test_a_runs_peak_rss_is_its_own_not_the_soaks():
    """wait4's ru_maxrss of a child started by a large process reads as large as that process (Linux counts the
    address space before the exec): the soak, whose checker had grown to 907 MiB, flagged every small run of a night
    as past its bound. The peak is the run's own tree's, within a few MiB either way."""
    fleet = load_fleet()
    grown = bytearray(600 << 20)
    grown[::4096] = b"\1" * len(grown[::4096])
    del grown
    assert fleet._hwm_kib(os.getpid()) > 600 << 10

    out = {}
    grandchild = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {CHILD.format(mb=150)!r}])"
    for mb, code in ((20, CHILD.format(mb=20)), (200, CHILD.format(mb=200)), (150, grandchild)):
        ran = fleet.Ran("x", "h", [], spawner_hwm_kib=fleet._hwm_kib(os.getpid()))
        proc = subprocess.Popen([sys.executable, "-c", code])
        while True:
            pid, _, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            ran.sampled_kib = max(ran.sampled_kib, fleet._tree_hwm_kib(proc.pid))
            time.sleep(0.05)
        assert usage.ru_maxrss > 600 << 10  # what the soak read before
        out[mb] = fleet._peak_rss_kib(ran, usage.ru_maxrss) >> 10
    assert all(mb <= peak < mb + 60 for mb, peak in out.items()), out  # 150: a grandchild's, its parent is small


def test_every_configuration_a_job_reads_leaves_the_brokers_own_retention_unguarded(tmp_path):
    """With the real broker, each host's `raw` topic keeps its own retention (the broker deletes at its rolls,
    unguarded). A configuration that guarded it (keep_unexported set for all topics) made the window's maintain job
    exit 1 as needs-attention on it (broker_retention_problem), while the other topics must stay guarded. Checked for
    each host's configuration and for the one of all hosts (the window's), with the product's own checks: every
    guarded topic passes broker_retention_problem, every topic a configuration names is held by every host it may
    run on, and each host's export records the source its window runs guard by."""
    from tank_log.jobs.config import load_job_config
    from tank_log.jobs.planning import select_partitions
    from tank_log.jobs.window import window_source
    from tank_log.maintenance.retention import broker_retention_problem
    from tank_log.storage.datadir import scan_data_dir

    fleet_mod = load_fleet()
    args = fleet_mod.parse_args(["--hosts", "3", "--workdir", str(tmp_path)])
    args.tank, args.tank_cli = sys.executable, sys.executable  # real hosts (no broker is started here)
    fleet = fleet_mod.Fleet(args)
    fleet.sampling_done.set()
    fleet.s3 = {"endpoint": "http://127.0.0.1:9"}
    for h in fleet.hosts:
        h.create()
        with open(h.config, "w") as fh:
            json.dump(fleet.job_config(h), fh)
    with open(fleet.hosts_file, "w") as fh:
        json.dump({**fleet.job_config(), "brokers": [h.broker_entry(1.0) for h in fleet.hosts]}, fh)
    shared = load_job_config(fleet.hosts_file)

    sources = []
    for h, broker in zip(fleet.hosts, shared.brokers, strict=True):
        own = load_job_config(h.config)
        for config in (own, shared):
            named = {**config.compaction.topics, **config.retention.topics}
            select_partitions([h.base], named_in_config=named)  # a job refuses a topic its data dirs do not hold
            parts = scan_data_dir(h.base).partitions()
            guarded = {p.topic for p in parts if config.retention.guard_of(p.topic) is not None}
            problems = [broker_retention_problem(p.topic, p.config) for p in parts if p.topic in guarded]
            assert problems == [None] * len(problems), problems
            assert set(h.topics) - guarded == h.broker_retention == {"raw"}, (h.name, guarded)  # the rest guarded
        assert own.export.source == window_source(broker) == h.name  # the export records what its guard reads
        sources.append(own.export.source)
    assert len(set(sources)) == len(fleet.hosts)  # two hosts' `raw/0` are two partitions of the table


def test_the_table_check_tells_hosts_same_named_partitions_apart_by_source(tmp_path):
    """Every real host has a `raw` topic: its rows in the one table are told apart by their `source` (the host's
    name), never counted as another host's. The same seq of `raw/0` from two hosts is two rows, once each; a second
    row of one host's seq, and a row of a source no host has, are exactly-once violations."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from tank_log.tools.standin_broker import fleet_message

    fleet_mod = load_fleet()
    args = fleet_mod.parse_args(["--hosts", "2", "--workdir", str(tmp_path)])
    args.tank, args.tank_cli = sys.executable, sys.executable
    location = str(tmp_path / "table")

    class LocalFleet(fleet_mod.Fleet):
        table = location  # type: ignore[assignment]
        storage_options: dict[str, str] = {}  # type: ignore[assignment]

    fleet = LocalFleet(args)
    fleet.sampling_done.set()

    def write(rows):
        cols = ["source", "topic", "partition", "seq", "key", "value"]
        batch = [(s, "raw", 0, q, *fleet_message("raw", 0, q, False)) for s, q in rows]
        types = [pa.string(), pa.string(), pa.int32(), pa.int64(), pa.binary(), pa.binary()]
        data = pa.table(
            {c: pa.array([r[i] for r in batch], t) for i, (c, t) in enumerate(zip(cols, types, strict=True))}
        )
        write_deltalake(location, data, mode="append")

    write([("h0", 1), ("h0", 2), ("h1", 1), ("h1", 2)])
    fleet.read_table(full=False)
    assert not fleet.violations
    assert fleet.parts[("h0", "raw", 0)].in_table[1:3].all() and fleet.parts[("h1", "raw", 0)].in_table[1:3].all()
    write([("h1", 2), ("h9", 3)])
    fleet.read_table(full=False)
    assert fleet.violations == {"exactly_once": 2}, fleet.repro
    assert {(r["host"], r["what"]) for r in fleet.repro} == {
        ("h1", "raw/0 seq 2 in the table twice"),
        ("h9", "raw/0 seq 3: in the table as of 'h9'"),
    }


def test_a_continuous_export_that_stopped_is_counted_and_started_again(tmp_path):
    """A real host's continuous export stopped on night 0 at the first seqs its broker's own retention deleted
    unread (DataLost), and the soak said nothing: every later night ran without it. One that stopped is counted
    with its last error line and started again, as a supervisor would; one still running is left alone."""
    fleet_mod = load_fleet()
    fleet = fleet_mod.Fleet(fleet_mod.parse_args(["--hosts", "2", "--workdir", str(tmp_path)]))
    fleet.sampling_done.set()
    os.makedirs(tmp_path / "logs")
    restarted = []
    fleet.start_continuous = lambda h: restarted.append(h.name)
    said = "print('2026-11-29 05:05:48,434 ERROR tank_log.job: export_delta failed: DataLost'); raise SystemExit(1)"
    stopped, _ = fleet.spawn("continuous", fleet.hosts[0], [sys.executable, "-c", said])
    running, _ = fleet.spawn("continuous", fleet.hosts[1], [sys.executable, "-c", "import time; time.sleep(30)"])
    fleet.continuous.update(h0=stopped, h1=running)
    stopped.wait()
    try:
        assert fleet.restart_stopped_continuous() == 1
    finally:
        running.kill()
        running.wait()
    assert [(s["host"], s["code"], s["error"][-29:]) for s in fleet.continuous_stops] == [
        ("h0", 1, "export_delta failed: DataLost")
    ]
    assert restarted == ["h0"] and not fleet.violations
