"""Write the Grafana dashboard of tank-log's metrics, conf/grafana/tank-log.json (plain JSON, importable: Dashboards →
New → Import, then pick the Prometheus data source for its DS_PROMETHEUS input).

Run: python conf/grafana/dashboard.py          (rewrites tank-log.json)
     python conf/grafana/dashboard.py --check  (exit 1 if tank-log.json is not what this script writes)

The panels read what node_exporter's textfile collector exposes from the jobs' --metrics-file and from
`tank-log stats --export-table TABLE --metrics-file` (tank_log/metrics.py), with Prometheus' default
honor_labels: false (the tank-log job is the `exported_job` label); every metric they name is checked against files
the jobs wrote (tests/alerts/).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "tank-log.json")
DS = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
SEL = 'instance=~"$instance"'
WIDTH = 24


def panel(
    title: str,
    targets: list[tuple[str, str]],
    *,
    kind: str = "timeseries",
    unit: str = "short",
    width: int = 12,
    height: int = 8,
    description: str = "",
    thresholds: list[tuple[float | None, str]] | None = None,
) -> dict[str, Any]:
    steps = [{"color": c, "value": v} for v, c in (thresholds or [(None, "green")])]
    out: dict[str, Any] = {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DS,
        "gridPos": {"w": width, "h": height},
        "fieldConfig": {
            "defaults": {"unit": unit, "thresholds": {"mode": "absolute", "steps": steps}},
            "overrides": [],
        },
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": DS, "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(targets)
        ],
    }
    if kind == "timeseries":
        out["options"] = {"legend": {"displayMode": "table", "placement": "right", "calcs": ["lastNotNull", "max"]}}
    if kind == "table":
        for t in out["targets"]:
            t.update(instant=True, format="table")
        out["transformations"] = [{"id": "organize", "options": {"excludeByName": {"Time": True, "__name__": True}}}]
    return out


def row(title: str) -> dict[str, Any]:
    return {"type": "row", "title": title, "collapsed": False, "gridPos": {"w": WIDTH, "h": 1}, "panels": []}


def panels() -> list[dict[str, Any]]:
    by_part = "{{instance}} {{topic}}/{{partition}}"
    return [
        row("Alerts and runs"),
        panel(
            "Firing tank-log alerts",
            [('ALERTS{alertname=~"TankLog.*", alertstate="firing"}', "{{alertname}}")],
            kind="table",
            width=24,
            height=6,
            description="conf/prometheus/tank-log-alerts.yml",
        ),
        panel(
            "Time since the last successful run",
            [(f"time() - tank_log_job_last_success_timestamp_seconds{{{SEL}}}", "{{instance}} {{exported_job}}")],
            kind="bargauge",
            unit="s",
            description="Per host and job; the nightly jobs alert past 26 h (TankLogJobNotSucceeding).",
            thresholds=[(None, "green"), (86400, "orange"), (93600, "red")],
        ),
        panel(
            "Last run ok",
            [(f"tank_log_job_last_run_ok{{{SEL}}}", "{{instance}} {{exported_job}}")],
            kind="stat",
            description="1: the job's last run ended with status ok.",
            thresholds=[(None, "red"), (1, "green")],
        ),
        panel(
            "Partitions of the last run by status",
            [(f"sum by (instance, exported_job, status) (tank_log_job_partitions{{{SEL}}})", "")],
            kind="table",
            description="needs-attention, failed and data-loss make a run exit 1; see its report.",
        ),
        panel(
            "Run duration",
            [(f"tank_log_job_duration_seconds{{{SEL}}}", "{{instance}} {{exported_job}}")],
            unit="s",
        ),
        row("Export to the lakehouse"),
        panel(
            "Export lag: age of the oldest unexported message",
            [(f"tank_log_export_lag_seconds{{{SEL}}}", by_part)],
            unit="s",
            description="From `tank-log stats --export-table`; alerts past 26 h (TankLogExportLagging).",
            thresholds=[(None, "green"), (93600, "red")],
        ),
        panel(
            "Export lag: messages the table has not received",
            [(f"tank_log_export_lag_messages{{{SEL}}}", by_part)],
        ),
        row("Retention and its lakehouse guard"),
        panel(
            "Bytes kept back for the table, and their bound",
            [
                (f"tank_log_retention_kept_unexported_bytes{{{SEL}}}", f"kept {by_part}"),
                (f"tank_log_retention_holdback_limit_bytes{{{SEL}}}", f"bound {by_part}"),
            ],
            unit="bytes",
            description="Past max_holdback_size retention deletes anyway (data-loss); alerts past half of it "
            "(TankLogHoldbackNearBound).",
        ),
        panel(
            "Data-loss events (all runs)",
            [(f"tank_log_retention_data_loss_events{{{SEL}}}", by_part)],
            kind="stat",
            description="Partitions whose unexported data retention deleted past max_holdback (TankLogDataLoss).",
            thresholds=[(None, "green"), (1, "red")],
        ),
        row("Partitions"),
        panel(
            "Dirty ratio of cleanup partitions",
            [(f"tank_log_partition_dirty_ratio{{{SEL}}}", by_part)],
            unit="percentunit",
            description="Read-only bytes past the .cleanup.log mark ÷ read-only bytes; nightly compaction brings it "
            "down (TankLogNotCompacted when it has not for 26 h).",
        ),
        panel(
            "Bytes by topic",
            [(f"sum by (instance, topic) (tank_log_partition_bytes{{{SEL}}})", "{{instance}} {{topic}}")],
            unit="bytes",
        ),
        panel(
            "Messages by topic",
            [(f"sum by (instance, topic) (tank_log_partition_messages{{{SEL}}})", "{{instance}} {{topic}}")],
        ),
        panel(
            "Segments by topic",
            [(f"sum by (instance, topic) (tank_log_partition_segments{{{SEL}}})", "{{instance}} {{topic}}")],
        ),
        panel(
            "Unreadable partitions and torn tails",
            [
                (f"tank_log_partition_read_error{{{SEL}}} > 0", f"unreadable {by_part}"),
                (f"tank_log_partition_torn_bytes{{{SEL}}} > 0", f"torn bytes {by_part}"),
            ],
            kind="table",
            description="A torn tail is bytes after the last complete bundle (`tank-log verify`, index maintenance "
            "with salvage).",
        ),
    ]


def layout(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ids and positions: left to right, wrapping at the grid's width; a row starts a line."""
    x = y = line_h = 0
    for i, p in enumerate(items, 1):
        w, h = p["gridPos"]["w"], p["gridPos"]["h"]
        if p["type"] == "row" or x + w > WIDTH:
            x, y, line_h = 0, y + line_h, 0
        p["id"], p["gridPos"] = i, {"x": x, "y": y, "w": w, "h": h}
        x, line_h = x + w, max(line_h, h)
        if p["type"] == "row":
            x, y, line_h = 0, y + h, 0
    return items


def dashboard() -> dict[str, Any]:
    return {
        "__inputs": [
            {
                "name": "DS_PROMETHEUS",
                "label": "Prometheus",
                "description": "The Prometheus that scrapes the broker hosts' node_exporter",
                "type": "datasource",
                "pluginId": "prometheus",
                "pluginName": "Prometheus",
            }
        ],
        "__requires": [
            {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.0.0"},
            {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
        ],
        "title": "tank-log",
        "uid": "tank-log",
        "description": "TANK's on-disk data and the tank-log jobs that maintain and export it",
        "tags": ["tank-log", "tank"],
        "timezone": "utc",
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "1m",
        "time": {"from": "now-7d", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "instance",
                    "label": "host",
                    "type": "query",
                    "datasource": DS,
                    "query": {"query": "label_values(tank_log_partition_bytes, instance)", "refId": "instance"},
                    "definition": "label_values(tank_log_partition_bytes, instance)",
                    "refresh": 2,
                    "includeAll": True,
                    "multi": True,
                    "allValue": ".*",
                    "current": {},
                }
            ]
        },
        "annotations": {"list": []},
        "panels": layout(panels()),
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 if the committed JSON differs from what it writes")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        with open(OUT, encoding="utf-8") as fh:
            if fh.read() != text:
                print(f"{OUT} is not what {__file__} writes: run it", file=sys.stderr)
                return 1
        return 0
    sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
    from tank_log.storage.fsutil import atomic_write

    atomic_write(OUT, text.encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
