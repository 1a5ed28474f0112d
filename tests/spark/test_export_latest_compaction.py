"""A latest table of a `cleanup` partition after compaction: compaction removes superseded seqs, also the log's first
ones, so the log may start past what the table holds; every key of a missing seq has a later message in the log, so
the export reports no loss (status exported, exit 0) and the table holds the latest message of every key. Messages
the broker's retention deleted before they were exported stay a loss in a latest table too (data-loss, exit 1)."""

import contextlib
import json
import os

import pytest

from tank_log.format.bundle import Message
from tank_log.lakehouse import TableLocation
from tank_log.storage.appender import PartitionAppender

pytestmark = pytest.mark.spark
TS = 1_790_000_000_000


def export(tmp_path, name, *argv):
    """The export job in this process, in the driver (these partitions are small): (exit code, report)."""
    from tank_spark.export.job import main

    report = tmp_path / f"{name}.json"
    code = main(["--master", "local[1]", "--report", str(report), *argv])
    return code, json.loads(report.read_text())


def produce(pdir, n, tag):
    """n messages over keys k0..k2 (incompressible values), appended as the broker does (1 KiB segments: a roll
    every few messages)."""
    ap = PartitionAppender(pdir)
    first = ap.last + 1
    ap.append([Message(s, TS, b"k%d" % (s % 3), tag + bytes((s * 7 + j * j) % 251 for j in range(300))) for s in
               range(first, first + n)])  # fmt: skip
    return ap.last


def partition(base, topic, config):
    os.makedirs(os.path.join(base, topic, "0"))
    with open(os.path.join(base, topic, "config"), "w") as fh:
        fh.write(config + "log.segment.bytes=1kb\n")
    return os.path.join(base, topic, "0")


def rows(uri):
    table = TableLocation.of(uri).existing().to_pyarrow_dataset().to_table().to_pylist()
    return sorted((r["key"], r["seq"], r["value"]) for r in table)


def test_compaction_below_a_latest_tables_seq_is_no_loss(tmp_path):
    from tank_log.storage.datadir import scan_data_dir
    from tank_log.tools.cli import main as tank_log

    base, uri = str(tmp_path / "base"), str(tmp_path / "table")
    kv = partition(base, "kv", "log.cleanup.policy=cleanup\n")
    produce(kv, 6, b"a")
    flags = ["--data-dir", base, "--table", uri, "--mode", "latest"]
    code, rep = export(tmp_path, "first", *flags)
    assert code == 0 and rep["partitions"][0]["to_seq"] == 6
    last = max(produce(kv, 6, b"b") for _ in range(4))  # 7..30, RO segments and an active one
    assert tank_log(["compact", "--force", "--broker-stopped", base]) == 0
    (part,) = scan_data_dir(base).partitions()
    assert part.segments[0].base > 7  # the log starts past the table's seq 6: 7.. were superseded

    code, rep = export(tmp_path, "after", *flags)
    (p,) = rep["partitions"]
    assert code == 0, p
    assert p["status"] == "exported" and "lost_messages" not in p and "lost_before_export" not in rep["summary"]
    # the latest message of every key: what the log holds, nothing lost
    latest = {}
    for seg in part.segments:
        for m in seg.messages():
            latest[m.key] = (m.key, m.seq, m.value)
    assert rows(uri) == sorted(latest.values()) and max(s for _, s, _ in latest.values()) == last
    assert tank_log(["audit", "--table", uri, base]) == 0


def test_retention_before_a_latest_export_is_still_a_loss(tmp_path):
    """The broker's own retention on a `delete` partition: keys it deleted may have had no later message."""
    base, uri = str(tmp_path / "base"), str(tmp_path / "table")
    ev = partition(base, "ev", "")
    produce(ev, 6, b"a")
    flags = ["--data-dir", base, "--table", uri, "--mode", "latest"]
    assert export(tmp_path, "first", *flags)[0] == 0
    for _ in range(4):
        produce(ev, 6, b"b")
    ro = sorted((f for f in os.listdir(ev) if f.endswith(".ilog")), key=lambda f: int(f.split("-")[0]))
    for f in ro[:-2]:  # as `log.retention.segments.count=2` at a roll (§5): the front segments and their indexes
        os.unlink(os.path.join(ev, f))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(ev, f.split("-")[0] + ".index"))
    code, rep = export(tmp_path, "after", *flags)
    (p,) = rep["partitions"]
    assert code == 1 and p["status"] == "data-loss" and p["lost_first_seq"] == 7, p


def test_an_export_data_loss_is_counted_and_alerts(tmp_path):
    """The export's metrics file counts the partition's data-loss event (which the shipped TankLogDataLoss alert
    watches: promtool fires it on the file's series) and the messages lost, per table, over all runs."""
    import re
    import shutil
    import subprocess

    import yaml

    from tank_log.metrics import read_samples

    base, uri = str(tmp_path / "base"), str(tmp_path / "table")
    ev = partition(base, "ev", "")
    produce(ev, 6, b"a")
    prom = tmp_path / "export.prom"
    flags = ["--data-dir", base, "--table", uri, "--metrics-file", str(prom)]
    assert export(tmp_path, "first", *flags)[0] == 0
    for _ in range(4):
        produce(ev, 6, b"b")
    ro = sorted((f for f in os.listdir(ev) if f.endswith(".ilog")), key=lambda f: int(f.split("-")[0]))
    for f in ro[:-2]:  # the broker's own retention
        os.unlink(os.path.join(ev, f))
    code, rep = export(tmp_path, "gap", *flags)
    (p,) = rep["partitions"]
    assert code == 1 and p["status"] == "data-loss"
    lost = f'tank_log_export_lost_messages{{partition="0",table="{uri}",topic="ev"}}'
    events = 'tank_log_retention_data_loss_events{partition="0",topic="ev"}'
    got = read_samples(str(prom))
    assert got[lost] == p["lost_messages"] > 0 and got[events] == 1
    assert export(tmp_path, "next", *flags)[0] == 0  # up to date: the totals carry over
    again = read_samples(str(prom))
    assert again[lost] == p["lost_messages"] and again[events] == 1

    rules = os.path.join(os.path.dirname(__file__), "..", "..", "conf", "prometheus", "tank-log-alerts.yml")
    with open(rules) as fh:
        (rule,) = [r for g in yaml.safe_load(fh)["groups"] for r in g["rules"] if r.get("alert") == "TankLogDataLoss"]
    labels = {"instance": "h1:9100", "job": "node", "partition": "0", "topic": "ev"}
    series = "tank_log_retention_data_loss_events{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
    want = {**labels, "severity": "critical"}
    expanded = {k: re.sub(r"{{ \$labels\.(\w+) }}", lambda m: want.get(m.group(1), ""), v)
                for k, v in rule["annotations"].items()}  # fmt: skip
    test = {
        "rule_files": [os.path.abspath(rules)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": series, "values": f"_x30 {got[events]:g}x60"}],
                "alert_rule_test": [
                    {"eval_time": "20m", "alertname": "TankLogDataLoss", "exp_alerts": []},
                    {
                        "eval_time": "45m",
                        "alertname": "TankLogDataLoss",
                        "exp_alerts": [{"exp_labels": want, "exp_annotations": expanded}],
                    },
                ],  # fmt: skip
            }
        ],
    }
    path = tmp_path / "loss.test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool is not on the PATH: scripts/setup.sh installs it (Debian's prometheus)"
    r = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "export found" in rule["annotations"]["description"]  # the alert says what the export found
