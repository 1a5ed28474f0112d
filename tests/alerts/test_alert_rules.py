"""The shipped alert rules (conf/prometheus/tank-log-alerts.yml) and dashboard (conf/grafana/), checked with promtool
on metric files the jobs wrote on the fleet's nights (tests/data/alerts, recorded by bench/record_alert_series.py):
on the healthy nights every alert stays silent; on the nights with faults each alert fires where and when what the
fleet ran says it must (alert_series.py derives that from the runs' times, exit codes and reports, not from the
metric files), and nowhere else."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml
from alert_series import SCRAPE_S, SEVERITY, Recording
from prometheus_client.parser import text_string_to_metric_families

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RULES = os.path.join(ROOT, "conf", "prometheus", "tank-log-alerts.yml")
DASHBOARD = os.path.join(ROOT, "conf", "grafana", "tank-log.json")
DATA = os.path.join(ROOT, "tests", "data", "alerts")
SCENARIOS = ("healthy", "faults")
PROMTOOL = shutil.which("promtool")


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None, "promtool is not on the PATH: scripts/setup.sh installs it (Debian's prometheus)"
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=300)


def rule_alerts() -> list[dict[str, object]]:
    with open(RULES) as fh:
        return [r for g in yaml.safe_load(fh)["groups"] for r in g["rules"] if "alert" in r]


def test_every_alert_is_checked():
    assert {r["alert"] for r in rule_alerts()} == set(SEVERITY)
    assert {r["alert"]: r["labels"]["severity"] for r in rule_alerts()} == SEVERITY  # type: ignore[index]


def test_the_rules_pass_promtool_check():
    r = promtool("check", "rules", RULES)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(rule_alerts())} rules found" in r.stdout


def unit_test(rec: Recording, tmp_path) -> tuple[str, dict[str, list[tuple[float, int]]]]:
    """promtool's test file for a recording: the scraped series, and per alert (eval time, alerts expected) at every
    eval time what the fleet ran decides. The export lag of a cleanup partition is undecided while its export is
    off (compaction drops its oldest unexported messages): a second group holds only the delete partitions' lag."""
    groups, decided = [], {alert: [] for alert in SEVERITY}
    for lag_topics, alerts in (("all", list(SEVERITY)), ("delete", ["TankLogExportLagging"])):
        rec.lag_topics = lag_topics
        tests = []
        for alert in alerts:
            annotations = annotations_of(alert)  # promtool compares them too
            for t in rec.eval_times():
                expected = rec.expected(alert, t)
                if expected is None:
                    continue
                decided[alert].append((t, len(expected)))
                exp = [{**labels, "severity": SEVERITY[alert]} for labels in expected]
                tests.append(
                    {
                        "eval_time": f"{int(t)}s",
                        "alertname": alert,
                        "exp_alerts": [{"exp_labels": e, "exp_annotations": expand(annotations, e)} for e in exp],
                    }
                )
        only = None if lag_topics == "all" else "tank_log_export_lag_seconds"
        groups.append({"interval": f"{SCRAPE_S}s", "input_series": rec.input_series(only), "alert_rule_test": tests})
    doc = {"rule_files": [RULES], "evaluation_interval": f"{SCRAPE_S}s", "tests": groups}
    path = tmp_path / f"{rec.manifest['scenario']}.test.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(path), decided


def annotations_of(alert: str) -> dict[str, str]:
    (rule,) = [r for r in rule_alerts() if r["alert"] == alert]
    return dict(rule["annotations"])  # type: ignore[arg-type]


@pytest.mark.slow  # a minute on a loaded machine: promtool evaluates the rules over 4-6 simulated days
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_alerts_fire_exactly_on_the_fleets_faults(scenario, tmp_path):
    rec = Recording.load(os.path.join(DATA, scenario))
    assert not any(rec.manifest["violations"].values())  # the fleet's own invariants held on those nights
    path, decided = unit_test(rec, tmp_path)
    r = promtool("test", "rules", path)
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    for alert, points in decided.items():
        assert len(points) >= 3, f"{alert}: decided at only {points}"  # most eval times decide every alert
        fired = [t for t, n in points if n]
        if scenario == "healthy":
            assert not fired, f"{alert} fires on a healthy night at {fired}"
        else:
            assert fired, f"{alert} never fires on the nights with faults"
            assert len(fired) < len(points), f"{alert} fires at every eval time"


def expand(annotations: dict[str, str], labels: dict[str, str]) -> dict[str, str]:
    """The annotations as Prometheus expands them: `{{ $labels.x }}` only (the rules use nothing else)."""
    out = {}
    for key, text in annotations.items():
        assert "$value" not in text  # promtool's expected annotations would depend on the series' values
        out[key] = re.sub(r"{{ \$labels\.(\w+) }}", lambda m: labels.get(m.group(1), ""), text)
    return out


def recorded_metric_names() -> set[str]:
    names = set()
    for scenario in SCENARIOS:
        files = os.path.join(DATA, scenario, "files")
        for name in os.listdir(files):
            with open(os.path.join(files, name)) as fh:
                for family in text_string_to_metric_families(fh.read()):
                    names.update(s.name for s in family.samples)
    return names


def named_metrics(text: str) -> set[str]:
    return set(re.findall(r"\btank_log_[a-z_]+\b", text))


def test_every_metric_a_rule_or_panel_names_is_written_by_the_jobs():
    recorded = recorded_metric_names()
    with open(RULES) as fh:
        in_rules = named_metrics(fh.read())
    with open(DASHBOARD) as fh:
        dashboard = json.load(fh)
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v.get("query", "") for v in dashboard["templating"]["list"] if v.get("type") == "query"]
    in_panels = set().union(*(named_metrics(e if isinstance(e, str) else json.dumps(e)) for e in exprs))
    assert in_rules and in_panels
    assert in_rules - recorded == set()
    assert in_panels - recorded == set()


def test_the_dashboard_takes_its_prometheus_as_an_input_and_is_generated():
    with open(DASHBOARD) as fh:
        text = fh.read()
    dashboard = json.loads(text)
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    assert dashboard["__inputs"][0]["pluginId"] == "prometheus"
    for panel in [p for p in dashboard["panels"] if p["type"] != "row"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, panel["title"]
    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "conf", "grafana", "dashboard.py"), "--check"], capture_output=True
    )
    assert r.returncode == 0, r.stderr.decode()  # the committed JSON is what the script writes


def test_the_recordings_time_map_and_promtools_notation():
    """Each night of a recording is one simulated day, monotonically; runs of equal samples are written in
    promtool's expanding notation, missing ones as `_`."""
    from alert_series import DAY, _notation

    rec = Recording.load(os.path.join(DATA, "faults"))
    b = rec.bounds
    assert [rec.sim(t) for t in b] == [i * DAY for i in range(len(b))]
    times = sorted(e["t"] for e in rec.manifest["events"])
    assert all(rec.sim(x) <= rec.sim(y) for x, y in zip(times, times[1:], strict=False))
    assert rec.sim((b[1] + b[2]) / 2) == 1.5 * DAY
    assert _notation([None, None, 1.0, 1.0, 1.0, 2.5, None]) == "_x2 1.0+0x2 2.5 _"
