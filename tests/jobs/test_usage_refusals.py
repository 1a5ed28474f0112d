"""Bad input is a usage error (exit 2) in one line naming the file, flag or key and the rule, found before any work
is done, never a traceback."""

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, many_small_partitions

from tank_log.storage.cleanup_marks import read_cleanup_log

CLI = [sys.executable, "-m", "tank_log.tools.cli"]


def _job(name, *args):
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "jobs", f"{name}.py"), *args], capture_output=True, text=True, env=env
    )


def _one_line_usage_error(r, *words):
    assert r.returncode == 2, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    for w in words:
        assert w in last, last
    return last


def test_a_deeply_nested_or_non_utf8_config_is_a_usage_error_naming_the_file(tmp_path):
    deep = tmp_path / "deep.yaml"
    deep.write_text("retention:\n  topics: " + "[" * 5000 + "]" * 5000 + "\n")
    _one_line_usage_error(
        subprocess.run([*CLI, "config", "check", str(deep)], capture_output=True, text=True), str(deep), "nested"
    )
    nested = tmp_path / "nested.yaml"
    nested.write_text("retention:\n  topics:\n" + "".join("  " * (i + 2) + f"a{i}:\n" for i in range(40)))
    _one_line_usage_error(
        subprocess.run([*CLI, "config", "check", str(nested)], capture_output=True, text=True),
        str(nested),
        "nested deeper than",
    )
    binary = tmp_path / "latin1.yaml"
    binary.write_bytes(b"retention:\n  time_basis: \xff\xfe\n")
    _one_line_usage_error(
        subprocess.run([*CLI, "config", "check", str(binary)], capture_output=True, text=True), str(binary), "not UTF-8"
    )


BILLION_LAUGHS = "retention:\n  topics:\n    t: &a0 {max_age: 1day}\n" + "".join(
    f"    t{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]\n" for i in range(1, 10)
)


@pytest.mark.parametrize("where", ["cli", "job"])
def test_a_yaml_alias_bomb_is_refused_in_bounded_time(tmp_path, where):
    """Ten lines whose aliases expand to 9**9 values (ran for hours at 100 % CPU): refused in one line naming the file
    and the rule, exit 2, in the time the text takes to read; an alias inside its own anchor too."""
    import time

    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BILLION_LAUGHS)
    assert len(BILLION_LAUGHS.splitlines()) == 12
    base = many_small_partitions(tmp_path / "base", 1)
    t0 = time.monotonic()
    if where == "cli":
        r = subprocess.run([*CLI, "config", "check", str(bomb)], capture_output=True, text=True, timeout=120)
    else:
        r = _job("compact", "--data-dir", base, "--config", str(bomb), "--dry-run")
    assert time.monotonic() - t0 < 60
    _one_line_usage_error(r, str(bomb), "aliases expand it to more than 100,000 values")
    loop = tmp_path / "loop.yaml"
    loop.write_text("retention:\n  topics: &t {x: *t}\n")
    _one_line_usage_error(
        subprocess.run([*CLI, "config", "check", str(loop)], capture_output=True, text=True, timeout=120),
        str(loop),
        "alias inside its own anchor",
    )


def test_anchors_and_merge_keys_of_a_real_config_still_work(tmp_path):
    """What anchors are for: one topic's settings shared by others (aliases and `<<` merge keys)."""
    from tank_log.jobs.config import load_job_config

    conf = tmp_path / "job.yaml"
    conf.write_text(
        "compaction:\n"
        "  topics:\n"
        "    sessions: &kv {policy: cleanup, tombstone_retention: 7days}\n"
        "    carts: *kv\n"
        "    users: {<<: *kv, tombstone_retention: 1day}\n"
        "retention:\n"
        "  topics:\n" + "".join(f"    t{i}: &r{i} {{max_age: 3days, max_bytes: 1gb}}\n" for i in range(200))
    )
    cfg = load_job_config(conf)
    topics = cfg.compaction.topics
    assert topics["carts"] == topics["sessions"] and topics["carts"].tombstone_retention_ms == 7 * 86400_000
    assert topics["users"].policy == "cleanup" and topics["users"].tombstone_retention_ms == 86400_000
    assert len(cfg.retention.topics) == 200


def test_a_table_path_under_a_file_is_a_usage_error(tmp_path):
    base = many_small_partitions(tmp_path / "base", 1)
    (tmp_path / "file").write_text("x")
    for job, extra in (("export_delta", ["--data-dir", base]), ("import_delta", ["--data-dir", str(tmp_path / "n")])):
        r = _job(job, *extra, "--table", str(tmp_path / "file" / "sub"))
        _one_line_usage_error(r, f"{tmp_path / 'file'} is not a directory")


def test_topics_naming_no_topic_is_a_usage_error_not_every_topic(tmp_path):
    base = many_small_partitions(tmp_path / "base", 1)
    r = subprocess.run([*CLI, "compact", base, "--topics", ",", "--dry-run"], capture_output=True, text=True)
    _one_line_usage_error(r, "names no topic")
    _one_line_usage_error(_job("compact", "--data-dir", base, "--topics", ",", "--dry-run"), "names no topic")


def test_an_unwritable_metrics_file_is_refused_before_the_work(tmp_path):
    base = many_small_partitions(tmp_path / "base", 2)
    (tmp_path / "file").write_text("x")
    prom = str(tmp_path / "file" / "m.prom")
    before = sorted(os.listdir(os.path.join(base, "kv", "0")))
    r = subprocess.run(
        [*CLI, "compact", base, "--broker-stopped", "--metrics-file", prom], capture_output=True, text=True
    )
    _one_line_usage_error(r, "--metrics-file", prom)
    assert r.stdout == ""  # no partition was worked on
    r = _job("compact", "--data-dir", base, "--broker-stopped", "--metrics-file", prom)
    _one_line_usage_error(r, "--metrics-file", prom)
    assert sorted(os.listdir(os.path.join(base, "kv", "0"))) == before  # nothing compacted


@pytest.mark.parametrize("budget", ["1kb", "100"])
def test_a_key_budget_too_small_to_hold_keys_is_a_usage_error(tmp_path, budget):
    conf = tmp_path / "job.yaml"
    conf.write_text(f"compaction:\n  key_state_budget: {budget}\n")
    base = many_small_partitions(tmp_path / "base", 1)
    r = subprocess.run(
        [*CLI, "compact", base, "--broker-stopped", "--config", str(conf)], capture_output=True, text=True
    )
    _one_line_usage_error(r, str(conf), "key_state_budget", "at least 64kb")


def test_a_cleanup_log_record_with_an_empty_topic_is_dropped_as_the_broker_drops_it(tmp_path):
    """The broker drops `.cleanup.log` records of topics it does not have (§1.6); no topic has an empty name. verify
    names the record (a warning, with its offset), and compaction drops it at its rewrite instead of failing on it."""
    import struct

    base = many_small_partitions(tmp_path / "base", 1)
    with open(os.path.join(base, ".cleanup.log"), "wb") as fh:
        fh.write(b"\x02kv" + struct.pack("<HQ", 0, 3) + b"\x00" + struct.pack("<HQ", 0, 5))
    r = subprocess.run([*CLI, "verify", base, "--warnings"], capture_output=True, text=True)
    assert r.returncode == 0 and ".cleanup.log @13: [cleanup-log] a record with an empty topic" in r.stdout, r.stdout
    r = subprocess.run([*CLI, "compact", base, "--broker-stopped", "--force"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    from tank_log.format.cleanup_log import parse_cleanup_log

    with open(os.path.join(base, ".cleanup.log"), "rb") as fh:
        records = parse_cleanup_log(fh.read())
    assert [r.topic for r in records] == ["kv"] and read_cleanup_log(base)[("kv", 0)] > 3  # compacted; dropped


SIGTERM_AFTER_THE_WORK = """
import os, signal, sys
from tank_log.jobs.compaction import apply_flags, plan_compaction, record_cleanup_marks
from tank_log.jobs.config import load_job_config
from tank_log.tools.cli import _run_tasks

config = apply_flags(load_job_config(None), force=True, broker_stopped=True)
tasks, left_out = plan_compaction([sys.argv[1]], None, config, dry_run=False)

def bookkeeping(results):  # the orchestrator's SIGTERM arrives just after the last partition finished
    os.kill(os.getpid(), signal.SIGTERM)
    record_cleanup_marks(results)

sys.exit(_run_tasks("compact", tasks, left_out, bookkeeping, dry_run=False, processes=1))
"""


def test_a_sigterm_after_every_partition_finished_still_ends_with_the_summary(tmp_path):
    """A stop signal that comes once the work is done does not kill the run before its bookkeeping and summary
    (it exited 143 with nothing said): the run completes, says so, and exits with its code."""
    base = many_small_partitions(tmp_path / "base", 2)
    r = subprocess.run([sys.executable, "-c", SIGTERM_AFTER_THE_WORK, base], capture_output=True, text=True)
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    assert "SIGTERM came after every partition had finished: the run is complete" in r.stderr
    assert [json.loads(x)["status"] for x in r.stdout.splitlines()] == ["compacted", "compacted"]
    assert read_cleanup_log(base) == {("kv", 0): 40, ("kv", 1): 40}  # the bookkeeping ran: the compacted range


def test_maintain_never_calls_clean_what_verify_does_not(tmp_path):
    """A topic-level problem (a config value that aborts the broker's startup, §1.5) makes `tank-log verify` exit 1;
    maintain's final verify reports it too: needs-attention, exit 1, not "clean"."""
    base = many_small_partitions(tmp_path / "base", 1)
    with open(os.path.join(base, "kv", "config"), "a") as fh:
        fh.write("log.roll.secs=5m\n")
    assert subprocess.run([*CLI, "verify", base], capture_output=True).returncode == 1
    r = subprocess.run([*CLI, "maintain", base, "--broker-stopped"], capture_output=True, text=True)
    assert r.returncode == 1, r.stderr[-3000:]
    (entry,) = [json.loads(x) for x in r.stdout.splitlines()]
    verify = entry["steps"]["verify"]
    assert verify["status"] == "needs-attention" and verify["errors"][0]["code"] == "config-value", verify
