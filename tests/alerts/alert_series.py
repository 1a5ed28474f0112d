"""The fleet's recorded metric files (bench/record_alert_series.py) as promtool's input series, and what each alert
must do on them, derived from what the fleet ran (the runs' times and exit codes, the maintain reports), not from the
metric files.

Time: the fleet compresses nights into about a minute each. Each of its nights (and its set-up) maps linearly onto a
day of 86,400 simulated seconds, from 0 at the set-up's start, so that the rules' day-sized thresholds apply. The
clock readings in the files (`*_timestamp_seconds`) and the ages measured against the clock (the export lag: the
age of the oldest unexported message when `stats` ran) are mapped through the same map; every other value is as
recorded. Scraping: every SCRAPE_S, node_exporter's textfile collector shows each host's files as they were then,
with the target's labels (instance, job="node") and the files' own `job` label as `exported_job` (Prometheus'
default honor_labels: false).
"""

from __future__ import annotations

import bisect
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

DAY = 86_400.0
SCRAPE_S = 120  # node_exporter scraped every 2 simulated minutes (within the 5 min lookback)
THRESHOLD_S = 26 * 3600.0  # the rules' 26 h
EVERY_S = 3 * 3600  # besides the settled points of each night, the alerts are checked every 3 simulated hours
SLACK_S = 3600.0  # an oracle closer than this to a threshold does not decide: that (eval time, alert) is not asserted
SEVERITY = {
    "TankLogExportLagging": "warning",
    "TankLogJobNotSucceeding": "warning",
    "TankLogDataLoss": "critical",
    "TankLogPartitionsNeedAttention": "warning",
    "TankLogNotCompacted": "warning",
    "TankLogHoldbackNearBound": "warning",
}
JOB_OF_RUN = {"export": "export_delta", "maintain": "maintain", "cli-maintain": "tank-log maintain"}


@dataclass
class Recording:
    path: str
    manifest: dict[str, Any]
    bounds: list[float] = field(default_factory=list)
    lag_topics: str = "all"  # "delete": only the lag of delete-policy partitions is given to promtool

    @classmethod
    def load(cls, path: str) -> Recording:
        with open(os.path.join(path, "manifest.json")) as fh:
            manifest = json.load(fh)
        return cls(path, manifest, manifest["bounds"])

    def sim(self, t: float) -> float:
        """A wall-clock time of the run → simulated seconds (each night one day)."""
        b = self.bounds
        i = min(max(bisect.bisect_right(b, t) - 1, 0), len(b) - 2)
        return (i + (t - b[i]) / (b[i + 1] - b[i])) * DAY

    @property
    def end_s(self) -> float:
        return (len(self.bounds) - 1) * DAY

    def instance(self, host: str) -> str:
        return f"{host}:9100"

    def runs(self, what: str | None = None, host: str | None = None) -> list[dict[str, Any]]:
        return [
            r
            for r in self.manifest["runs"]
            if (what is None or r["what"] == what) and (host is None or r["host"] == host)
        ]

    # ---- the files as scraped -------------------------------------------------------------------------------------

    def file_samples(self, event: dict[str, Any]) -> dict[tuple[tuple[str, str], ...], float]:
        """One recorded file's samples (labels as scraped, values in simulated time)."""
        with open(os.path.join(self.path, "files", event["file"])) as fh:
            text = fh.read()
        out = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = {("exported_job" if k == "job" else k): v for k, v in s.labels.items()}
                labels.update(__name__=s.name, instance=self.instance(event["host"]), job="node")
                value = s.value
                if s.name.endswith("_timestamp_seconds"):
                    value = self.sim(value)
                elif s.name == "tank_log_export_lag_seconds" and value > 0:
                    value = self.sim(event["t"]) - self.sim(event["t"] - value)
                out[tuple(sorted(labels.items()))] = value
        return out

    def scraped(self) -> dict[tuple[tuple[str, str], ...], list[float | None]]:
        """Every series at every scrape (None: not exposed then)."""
        n = int(self.end_s // SCRAPE_S) + 1
        events = sorted(self.manifest["events"], key=lambda e: e["t"])
        series: dict[tuple[tuple[str, str], ...], list[float | None]] = {}
        current: dict[tuple[str, str], dict[tuple[tuple[str, str], ...], float]] = {}
        i = 0
        for k in range(n):
            while i < len(events) and self.sim(events[i]["t"]) <= k * SCRAPE_S:
                e = events[i]
                current[(e["host"], e["name"])] = self.file_samples(e)
                i += 1
            for samples in current.values():
                for key, value in samples.items():
                    series.setdefault(key, [None] * n)[k] = value
        return series

    def input_series(self, only: str | None = None) -> list[dict[str, str]]:
        """promtool's input series: every scraped series, or only those of the metric `only`, of the partitions
        `lag_topics` says."""
        delete = {tp for topics in self.manifest["topics"].values() for tp, cleanup in topics.items() if not cleanup}
        out = []
        for key, values in sorted(self.scraped().items()):
            labels = dict(key)
            name = labels.pop("__name__")
            if only is not None and (name != only or (self.lag_topics == "delete" and labels["topic"] not in delete)):
                continue
            selector = name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
            out.append({"series": selector, "values": _notation(values)})
        return out

    # ---- when to look, and what must fire then -------------------------------------------------------------------

    def eval_times(self) -> list[float]:
        """Every EVERY_S from the first night on, and twice a night: once every host's `stats` after the exports has
        run, and at the end of the night (its last `stats`), a scrape and more later; only when no run ended in the
        two scrapes before (what the last scrape showed is what the runs left)."""
        ends = sorted(self.sim(r["end"]) for r in self.manifest["runs"])
        stats = self.runs("stats")
        out = [
            float(t)
            for t in range(int(DAY), int(self.end_s), EVERY_S)
            if not any(t - 2 * SCRAPE_S < e <= t for e in ends)
        ]
        for night in range(len(self.bounds) - 2):
            night_stats = sorted(self.sim(r["end"]) for r in stats if r["night"] == night)
            hosts = len(self.manifest["hosts"])
            for batch in (night_stats[:hosts], night_stats[hosts:]):
                if not batch:
                    continue
                t = (batch[-1] // SCRAPE_S + 2) * SCRAPE_S
                if not any(batch[-1] < e <= t for e in ends):
                    out.append(t)
        return sorted(set(out))

    def expected(self, alert: str, t: float) -> list[dict[str, str]] | None:
        """The alerts `alert` fires at simulated time `t` (their labels), or None when what the fleet ran does not
        decide (a time within SLACK_S of a threshold)."""
        out: list[dict[str, str]] = []
        for host in self.manifest["hosts"]:
            got = getattr(self, "_" + alert)(host, t)
            if got is None:
                return None
            out += got
        return sorted(out, key=lambda a: sorted(a.items()))

    def _last(self, what: str, host: str, t: float, ok: bool = False) -> dict[str, Any] | None:
        done = [r for r in self.runs(what, host) if self.sim(r["end"]) < t and (not ok or r["code"] == 0)]
        return done[-1] if done else None

    def _labels(self, host: str, **labels: Any) -> dict[str, str]:
        return {"instance": self.instance(host), "job": "node", **{k: str(v) for k, v in labels.items()}}

    def _partitions(self, host: str, cleanup: bool | None = None) -> Iterator[tuple[str, int]]:
        for topic, is_cleanup in self.manifest["topics"][host].items():
            if cleanup is None or is_cleanup == cleanup:
                for p in (0, 1):
                    yield topic, p

    def _TankLogExportLagging(self, host: str, t: float) -> list[dict[str, str]] | None:
        """The lag of a partition, as the last `stats` before `t` measured it, lies below its time minus the start of
        the last successful export before it, and above its time minus the end of that export, or of a later
        maintain run that deleted the oldest unexported messages (data-loss) or compacted the partition (survivors
        all date from before it). A `stats` run that failed (a partition it could not read) decides nothing.
        `lag_topics` limits the partitions (the rest are not in the series given to promtool)."""
        stats = self._last("stats", host, t)
        if stats is None:
            return []
        export = self._last("export", host, self.sim(stats["start"]), ok=True)
        if export is None or stats["code"] != 0:
            return None
        out = []
        for topic, p in self._partitions(host, cleanup=None if self.lag_topics == "all" else False):
            newest = self.sim(export["end"])
            for m in self._maintain_runs(host, self.sim(stats["start"])):
                entry = [e for e in m.get("partitions", []) if (e["topic"], e["partition"]) == (topic, p)]
                if (
                    self.sim(m["end"]) > newest
                    and entry
                    and (entry[0]["deleted_unexported"] or entry[0]["compaction"] == "compacted")
                ):
                    newest = self.sim(m["end"])
            low = self.sim(stats["start"]) - newest
            high = self.sim(stats["end"]) - self.sim(export["start"])
            if low > THRESHOLD_S + SLACK_S:
                table = self.manifest.get("table", "s3://fleet/events")
                out.append(self._labels(host, topic=topic, partition=p, table=table))
            elif high > THRESHOLD_S - SLACK_S:
                return None
        return out

    def _TankLogJobNotSucceeding(self, host: str, t: float) -> list[dict[str, str]] | None:
        out = []
        for what, job in JOB_OF_RUN.items():
            runs = [r for r in self.runs(what, host) if self.sim(r["end"]) < t]
            if not runs:
                continue
            last_ok = self._last(what, host, t, ok=True)
            if last_ok is None:
                continue  # never succeeded: no last-success series
            age = t - self.sim(last_ok["end"])
            if age > THRESHOLD_S + SLACK_S:
                out.append(self._labels(host, exported_job=job))
            elif age > THRESHOLD_S - SLACK_S:
                return None
        return out

    def _maintain_runs(self, host: str, t: float) -> list[dict[str, Any]]:
        return [
            r
            for r in self.manifest["runs"]
            if r["host"] == host and r["what"] in ("maintain", "cli-maintain") and self.sim(r["end"]) < t
        ]

    def _TankLogDataLoss(self, host: str, t: float) -> list[dict[str, str]] | None:
        lost: dict[tuple[str, int], float] = {}
        for r in self._maintain_runs(host, t):
            for p in r.get("partitions", []):
                if p["deleted_unexported"]:
                    lost[(p["topic"], p["partition"])] = self.sim(r["end"])
        out = []
        for (topic, p), when in sorted(lost.items()):
            if t - when < DAY - SLACK_S:
                out.append(self._labels(host, topic=topic, partition=p))
            elif t - when < DAY + SLACK_S:
                return None
        return out

    def _last_report(self, host: str, t: float) -> dict[str, Any] | None:
        """The last maintain run that wrote its metrics (one that was not killed)."""
        runs = [r for r in self._maintain_runs(host, t) if not r["killed"]]
        return runs[-1] if runs else None

    def _TankLogPartitionsNeedAttention(self, host: str, t: float) -> list[dict[str, str]] | None:
        r = self._last_report(host, t)
        if r is None or not any(p["status"] == "needs-attention" for p in r["partitions"]):
            return []
        return [self._labels(host, exported_job=JOB_OF_RUN[r["what"]], status="needs-attention")]

    def _TankLogHoldbackNearBound(self, host: str, t: float) -> list[dict[str, str]] | None:
        r = self._last_report(host, t)
        if r is None:
            return []
        table = self.manifest.get("table", "s3://fleet/events")
        return [
            self._labels(host, topic=p["topic"], partition=p["partition"], table=table)
            for p in r["partitions"]
            if p["max_bytes"] and p["kept_bytes"] > 0.5 * p["max_bytes"]
        ]

    def _TankLogNotCompacted(self, host: str, t: float) -> list[dict[str, str]] | None:
        """A maintain run that compacted a cleanup partition (its report says so) lowers its dirty ratio: the first
        `stats` after it shows less than the one before (the partitions append all day), when that `stats` could read
        the partition (one that failed may have missed it: the drop is then uncertain). The rule fires when no drop
        was scraped in the last 26 h (and the series is older than that); the partitions are dirty by then."""
        stats = [r for r in self.runs("stats", host) if self.sim(r["end"]) + SCRAPE_S <= t]
        if not stats:
            return []
        out = []
        for topic, p in self._partitions(host, cleanup=True):
            certain, uncertain = [], []
            for m in self._maintain_runs(host, t):
                compacted = [e for e in m["partitions"] if (e["topic"], e["partition"]) == (topic, p)]
                after = [s for s in stats if s["start"] > m["end"]]
                if after and compacted and compacted[0]["compaction"] == "compacted":
                    (certain if after[0]["code"] == 0 else uncertain).append(self.sim(after[0]["end"]))
            since = t - max(certain, default=self.sim(stats[0]["end"]))
            if since < THRESHOLD_S - SLACK_S:
                continue
            if since > THRESHOLD_S + SLACK_S and not any(u > t - THRESHOLD_S - SLACK_S for u in uncertain):
                out.append(self._labels(host, topic=topic, partition=p))
            else:
                return None
        return out


def _notation(values: list[float | None]) -> str:
    """promtool's expanding notation: runs of one value as `v+0xN`, of missing samples as `_xN`."""
    out: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[i]:
            j += 1
        run = j - i + 1
        if values[i] is None:
            out.append("_" if run == 1 else f"_x{run}")
        else:
            v = repr(float(values[i]))  # type: ignore[arg-type]
            out.append(v if run == 1 else f"{v}+0x{run - 1}")
        i = j + 1
    return " ".join(out)
