"""The jobs' YAML configuration: validated at load with clear errors, broker units."""

import glob
import json
import os

import pytest
from conftest import ROOT

from tank_log.errors import JobConfigError
from tank_log.jobs.compaction import options_for
from tank_log.jobs.config import load_job_config, parse_job_config


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "conf", "*.yaml"))))
def test_shipped_examples_load(path):
    cfg = load_job_config(path)
    assert cfg.data_dirs or cfg.brokers


def test_units_and_overrides():
    cfg = parse_job_config(
        {
            "data_dirs": "/x",
            "live_window": "2min",
            "compaction": {
                "bundle_bytes": "128kb",
                "min_compaction_lag": "1h+30min",
                "snappy": "ALWAYS",
                "key_state_budget": "64mb",
                "topics": {"t": {"policy": "cleanup", "tombstone_retention": "7days"}},
            },
            "retention": {"time_basis": "message", "topics": {"c": {"max_age": 3600, "max_bytes": "1gb"}}},
        }
    )
    assert cfg.data_dirs == ("/x",) and cfg.live_window_s == 120
    assert cfg.compaction.bundle_bytes == 131072 and cfg.compaction.min_compaction_lag_ms == 5400_000
    assert cfg.compaction.snappy == "always" and cfg.compaction.key_state_budget == 64 << 20
    assert options_for("t", cfg.compaction, cfg, dry_run=False).key_state_budget == 64 << 20
    assert cfg.compaction.topics["t"].tombstone_retention_ms == 7 * 86400_000
    assert (
        cfg.retention.topics["c"].limits["max_age_s"] == 3600
        and cfg.retention.topics["c"].limits["max_bytes"] == 1 << 30
    )


@pytest.mark.parametrize(
    "doc,needle",
    [
        ({"data_dir": ["/x"]}, "unknown key(s) data_dir"),
        ({"compaction": {"bundle_bytes": "1GB"}}, "compaction.bundle_bytes"),
        ({"compaction": {"topics": {"t": {"policy": "compact"}}}}, "compaction.topics.t.policy"),
        ({"compaction": {"topics": {"t": {"ttl": "1d"}}}}, "compaction.topics.t: unknown key(s) ttl"),
        ({"retention": {"topics": {"t": {"max_age": "5m"}}}}, "retention.topics.t.max_age"),
        ({"retention": {"topics": {"t": {"segments_count": 1}}}}, "0 or >= 2"),
        ({"retention": {"time_basis": "mtime"}}, "retention.time_basis"),
        ({"broker_stopped": "yes"}, "broker_stopped"),
        ({"compaction": {"segment_bytes": "8gb"}}, "4 GiB"),
        ({"spark": {"cores": 4}}, "spark: unknown key(s) cores"),
        ({"data_dirs": [1, 2]}, "data_dirs"),
    ],
)
def test_bad_configs_name_the_key(doc, needle):
    with pytest.raises(JobConfigError) as e:
        parse_job_config(doc)
    assert needle in str(e.value)


def test_file_errors(tmp_path):
    with pytest.raises(JobConfigError, match="not found"):
        load_job_config(tmp_path / "nope.yaml")
    (tmp_path / "bad.yaml").write_text("a: [1, 2\n")
    with pytest.raises(JobConfigError, match="not valid YAML"):
        load_job_config(tmp_path / "bad.yaml")


def test_relative_paths_are_relative_to_the_config_file(tmp_path, monkeypatch):
    """`data_dirs: [demo-data]` broke unless the worker ran from the repository."""
    conf = tmp_path / "etc" / "job.yaml"
    conf.parent.mkdir()
    conf.write_text("data_dirs: [../data, /abs/tank, ~/tank]\nexport: {table: lake/t}\n")
    monkeypatch.chdir("/")
    cfg = load_job_config(str(conf))
    assert cfg.data_dirs == (str(tmp_path / "data"), "/abs/tank", os.path.expanduser("~/tank"))
    assert cfg.export.table == str(tmp_path / "etc" / "lake" / "t")
    conf.write_text("export: {table: 's3://bucket/t'}\n")
    assert load_job_config(str(conf)).export.table == "s3://bucket/t"
    assert load_job_config(os.path.join(ROOT, "conf", "local.yaml")).data_dirs == (os.path.join(ROOT, "demo-data"),)


def test_the_in_driver_export_limit_is_a_size():
    assert parse_job_config({}).export.in_driver_max_bytes == 128 << 20  # default: small exports in the driver
    assert parse_job_config({"export": {"in_driver_max_bytes": 0}}).export.in_driver_max_bytes == 0  # executors
    assert parse_job_config({"export": {"in_driver_max_bytes": "256mb"}}).export.in_driver_max_bytes == 256 << 20
    with pytest.raises(JobConfigError, match="in_driver_max_bytes"):
        parse_job_config({"export": {"in_driver_max_bytes": "lots"}})


def test_the_export_source_is_a_name():
    assert parse_job_config({}).export.source is None  # the host's name, at run time
    assert parse_job_config({"export": {"source": "broker-7.eu"}}).export.source == "broker-7.eu"
    for bad in ("", "a:b", "two words", "x@y", 7):
        with pytest.raises(JobConfigError, match="source"):
            parse_job_config({"export": {"source": bad}})


def test_the_partition_jobs_in_driver_limit_is_a_size():
    assert parse_job_config({}).in_driver_max_bytes == 1 << 30  # default: runs up to 1gb in the driver's processes
    assert parse_job_config({"in_driver_max_bytes": 0}).in_driver_max_bytes == 0  # always Spark's executors
    assert parse_job_config({"in_driver_max_bytes": "2gb"}).in_driver_max_bytes == 2 << 30
    with pytest.raises(JobConfigError, match="in_driver_max_bytes"):
        parse_job_config({"in_driver_max_bytes": -1})


BROKER = {
    "name": "a",
    "data_dirs": ["/srv/a"],
    "stop_command": "systemctl stop tank",
    "start_command": "systemctl start tank",
    "ready_check": "tcp://127.0.0.1:11011",
}


def test_brokers_of_the_maintenance_window():
    """The window's broker list and options, validated at load."""
    cfg = parse_job_config(
        {
            "maintenance_window": {"rolling": True},
            "brokers": [
                {**BROKER, "stop_timeout": "2min", "queue": "host-a"},
                {**BROKER, "name": "b", "data_dirs": "/srv/b", "ready_check": "tcp://[::1]:11012"},
            ],
        }
    )
    a, b = cfg.brokers
    assert cfg.window.rolling and cfg.window.spark_master == "local[*]"
    assert a.stop_timeout_s == 120 and a.ready_timeout_s == 300 and a.queue == "host-a"
    assert a.ready_address == ("127.0.0.1", 11011) and b.ready_address == ("::1", 11012)
    assert b.data_dirs == ("/srv/b",) and b.queue is None
    two_hosts = [{**BROKER, "queue": "host-a"}, {**BROKER, "name": "b", "queue": "host-b"}]
    assert len(parse_job_config({"brokers": two_hosts}).brokers) == 2  # one path, two disks


def test_a_broker_may_name_its_own_job_config(tmp_path):
    """A broker's maintain job may read its own configuration (e.g. retention of topics only its data dirs hold: a
    job refuses a topic it cannot find); a relative path is the window config's directory's."""
    path = tmp_path / "hosts.yaml"
    brokers = [{**BROKER, "job_config": "a.yaml"}, {**BROKER, "name": "b", "data_dirs": ["/srv/b"]}]
    path.write_text(json.dumps({"brokers": brokers}))
    a, b = load_job_config(path).brokers
    assert a.job_config == str(tmp_path / "a.yaml") and b.job_config is None


@pytest.mark.parametrize(
    "brokers,needle",
    [
        ({"name": "a"}, "brokers: expected a list"),
        ([{**BROKER, "ready_check": "http://x:1"}], "brokers[0].ready_check: expected tcp://HOST:PORT"),
        ([{**BROKER, "ready_check": "tcp://x:99999"}], "port 99999 out of range"),
        ([{k: v for k, v in BROKER.items() if k != "stop_command"}], "brokers[0]: missing stop_command"),
        ([{**BROKER, "stop_timeout": "soon"}], "brokers[0].stop_timeout"),
        ([{**BROKER, "host": "x"}], "brokers[0]: unknown key(s) host"),
        ([BROKER, BROKER], "name(s) given twice: a"),
        ([BROKER, {**BROKER, "name": "b"}], "data dir(s) of two brokers on one queue (host): /srv/a"),
        ([{**BROKER, "data_dirs": []}], "brokers[0].data_dirs"),
    ],
)
def test_bad_brokers_name_the_key(brokers, needle):
    with pytest.raises(JobConfigError) as e:
        parse_job_config({"brokers": brokers})
    assert needle in str(e.value)


def test_the_json_schema_and_the_check_command(tmp_path):
    """`tank-log config schema` prints the JSON Schema of the file (YAML keys, unknown keys refused); `tank-log config
    check FILE` validates a file (exit 2 naming the key) and shows it with every default."""
    import json
    import subprocess
    import sys

    from tank_log.jobs.config import TOP_LEVEL_KEYS

    cli = [sys.executable, "-m", "tank_log.tools.cli", "config"]
    r = subprocess.run([*cli, "schema"], capture_output=True, text=True)
    schema = json.loads(r.stdout)
    assert r.returncode == 0 and set(schema["properties"]) == set(TOP_LEVEL_KEYS)
    assert schema["additionalProperties"] is False
    compaction = schema["$defs"]["CompactionSettings"]["properties"]
    assert "min_compaction_lag" in compaction and "string" in compaction["min_compaction_lag"]["type"]
    conf = tmp_path / "job.yaml"
    conf.write_text("compaction: {min_compaction_lag: 1h}\n")
    r = subprocess.run([*cli, "check", str(conf)], capture_output=True, text=True)
    shown = json.loads(r.stdout)
    assert r.returncode == 0 and shown["compaction"]["min_compaction_lag_ms"] == 3600_000
    assert shown["live_window_s"] == 300
    conf.write_text("compaction: {min_compaction_lag: soon}\n")
    r = subprocess.run([*cli, "check", str(conf)], capture_output=True, text=True)
    assert r.returncode == 2 and "compaction.min_compaction_lag" in r.stderr
