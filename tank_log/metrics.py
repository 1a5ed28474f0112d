"""Prometheus metrics of the data and of every run, in the text exposition format, for node_exporter's textfile
collector (prometheus_client writes the file under a temporary name and renames it into place, so the collector
never reads half a file).

- `stats_registry`: per partition, from `tank-log stats` (bytes, segments, messages, last seq, the dirty ratio of
  `cleanup` partitions, and with an export table the export lag in messages and in seconds);
- `report_registry`: per run, from a job's report (last run and last success timestamps, duration, exit status,
  partitions by status, bytes kept back by `retention.keep_unexported` and their bound, data-loss events, which
  include an export's data-loss, and the messages an export found lost). Counters and the last success survive the
  runs that do not set them: they are carried over from the file being replaced.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Gauge, write_to_textfile
from prometheus_client.parser import text_string_to_metric_families

if TYPE_CHECKING:
    from tank_log.tools.stats import PartitionStats

PARTITION = ("topic", "partition")
NS = "tank_log"


def stats_registry(rows: Iterable[PartitionStats], table: str | None = None) -> CollectorRegistry:
    """The per-partition gauges of `tank-log stats`; the export lag ones when `table` was given."""
    reg = CollectorRegistry()
    g = {
        "bytes": Gauge(f"{NS}_partition_bytes", "Bytes of the partition's segment files", PARTITION, registry=reg),
        "segments": Gauge(f"{NS}_partition_segments", "Segments (RO and active)", PARTITION, registry=reg),
        "messages": Gauge(f"{NS}_partition_messages", "Messages in the partition", PARTITION, registry=reg),
        "last_seq": Gauge(f"{NS}_partition_last_seq", "The partition's last complete seq", PARTITION, registry=reg),
        "torn": Gauge(f"{NS}_partition_torn_bytes", "Bytes after the last complete bundle", PARTITION, registry=reg),
        "dirty": Gauge(
            f"{NS}_partition_dirty_ratio",
            "Dirty ratio of a cleanup partition: RO bytes after its .cleanup.log mark ÷ RO bytes (§6.1)",
            PARTITION,
            registry=reg,
        ),
        "error": Gauge(f"{NS}_partition_read_error", "1 when the partition could not be read", PARTITION, registry=reg),
    }
    lag_labels = (*PARTITION, "table")
    lag_msgs = lag_s = None
    if table is not None:
        lag_msgs = Gauge(
            f"{NS}_export_lag_messages", "Messages the Delta table has not received", lag_labels, registry=reg
        )
        lag_s = Gauge(
            f"{NS}_export_lag_seconds",
            "Age of the oldest message the Delta table has not received (0: none)",
            lag_labels,
            registry=reg,
        )
    for r in rows:
        labels = (r.topic, str(r.partition))
        g["bytes"].labels(*labels).set(r.bytes)
        g["segments"].labels(*labels).set(r.segments)
        g["messages"].labels(*labels).set(r.messages)
        g["torn"].labels(*labels).set(r.torn_bytes)
        g["error"].labels(*labels).set(1 if r.error else 0)
        if r.last_seq is not None:
            g["last_seq"].labels(*labels).set(r.last_seq)
        if r.dirty_ratio is not None:
            g["dirty"].labels(*labels).set(r.dirty_ratio)
        if lag_msgs is not None and lag_s is not None and r.export_lag_messages is not None:
            lag_msgs.labels(*labels, table).set(r.export_lag_messages)
            lag_s.labels(*labels, table).set(r.export_lag_seconds or 0)
    return reg


def report_registry(report: dict[str, Any], previous: dict[str, float] | None = None) -> CollectorRegistry:
    """The gauges of one run's report. `previous`: the samples of the file being replaced (`read_samples`), whose
    last success and data-loss total carry over."""
    previous = previous or {}
    job = str(report.get("job"))
    reg = CollectorRegistry()
    now = time.time()
    Gauge(f"{NS}_job_last_run_timestamp_seconds", "When the job's last run ended", ["job"], registry=reg).labels(
        job
    ).set(now)
    success = Gauge(
        f"{NS}_job_last_success_timestamp_seconds", "When the job's last successful run ended", ["job"], registry=reg
    )
    key = f'{NS}_job_last_success_timestamp_seconds{{job="{job}"}}'
    if report.get("status") == "ok":
        success.labels(job).set(now)
    elif key in previous:
        success.labels(job).set(previous[key])
    Gauge(f"{NS}_job_duration_seconds", "Duration of the job's last run", ["job"], registry=reg).labels(job).set(
        float(report.get("duration_s") or 0)
    )
    Gauge(f"{NS}_job_last_run_ok", "1 when the job's last run ended with status ok", ["job"], registry=reg).labels(
        job
    ).set(1 if report.get("status") == "ok" else 0)
    by_status = Gauge(f"{NS}_job_partitions", "Partitions of the last run by status", ["job", "status"], registry=reg)
    for status, n in ((report.get("summary") or {}).get("by_status") or {}).items():
        by_status.labels(job, status).set(n)
    entries = [_retention_entry(p) for p in report.get("partitions") or []]
    kept = Gauge(
        f"{NS}_retention_kept_unexported_bytes",
        "Bytes retention keeps back because the Delta table has not received them",
        [*PARTITION, "table"],
        registry=reg,
    )
    bound = Gauge(
        f"{NS}_retention_holdback_limit_bytes",
        "The bound on the bytes retention keeps back for the Delta table (max_holdback_size), where it keeps some",
        [*PARTITION, "table"],
        registry=reg,
    )
    loss = Gauge(
        f"{NS}_retention_data_loss_events",
        "Partitions whose unexported data retention deleted (ours past max_holdback, or the broker's before the "
        "export read it: the export's data-loss), over all runs",
        PARTITION,
        registry=reg,
    )
    _salvage_gauge(report, previous, reg)
    _export_loss_gauge(report, previous, reg)
    _bad_records_gauges(report, previous, reg)
    events = carried(previous, f"{NS}_retention_data_loss_events", PARTITION)  # every partition's, also untouched
    for p in entries:
        if p is None:
            continue
        labels: tuple[str, ...] = (str(p.get("topic")), str(p.get("partition")))
        if p.get("kept_unexported"):
            held = p["kept_unexported"]
            kept.labels(*labels, held["table"]).set(held["bytes"])
            if held.get("max_bytes"):
                bound.labels(*labels, held["table"]).set(held["max_bytes"])
        if p.get("status") == "data-loss":
            events[labels] = events.get(labels, 0) + 1
    for where, n in events.items():
        loss.labels(*where).set(n)
    return reg


def carried(previous: dict[str, float], name: str, labels: tuple[str, ...]) -> dict[tuple[str, ...], float]:
    """The samples of `name` in the file being replaced (`read_samples`), by their `labels` values: what a total
    over all runs starts from (also for the partitions this run did not touch)."""
    out: dict[tuple[str, ...], float] = {}
    prefix = name + "{"
    for key, value in previous.items():
        if key.startswith(prefix):
            named = dict(pair.split("=", 1) for pair in key[len(prefix) : -1].split(","))
            values = tuple(named[n].strip('"') for n in labels)
            out[values] = out.get(values, 0) + value
    return out


def _salvage_gauge(report: dict[str, Any], previous: dict[str, float], reg: CollectorRegistry) -> None:
    """What salvage cut per partition, over all runs (carried over from the file being replaced): the cuts, and the
    messages they lost where known (an RO segment's name says how many; a torn active bundle's count is unknown).
    Every cut is named in the log and the report too (`salvaged` actions: file, seqs, count, side file)."""
    names = {"messages": f"{NS}_salvage_cut_messages", "cuts": f"{NS}_salvage_cuts"}
    gauges = {
        "messages": Gauge(
            names["messages"],
            "Messages salvage cut from torn RO tails (kept in side files), over all runs",
            PARTITION,
            registry=reg,
        ),
        "cuts": Gauge(
            names["cuts"], "Torn tails salvage cut (kept in side files), over all runs", PARTITION, registry=reg
        ),
    }
    now = {what: carried(previous, name, PARTITION) for what, name in names.items()}
    for entry in report.get("partitions") or []:
        step = (entry.get("steps") or {}).get("indexes") if "steps" in entry else entry
        for action in (step or {}).get("actions") or []:
            if action.get("action") == "salvaged":
                labels = (str(entry.get("topic")), str(entry.get("partition")))
                now["cuts"][labels] = now["cuts"].get(labels, 0) + 1
                now["messages"][labels] = now["messages"].get(labels, 0) + int(action.get("messages_cut") or 0)
    for what, gauge in gauges.items():
        for where, n in now[what].items():
            gauge.labels(*where).set(n)


def _export_loss_gauge(report: dict[str, Any], previous: dict[str, float], reg: CollectorRegistry) -> None:
    """The messages an export found in neither its table nor the log (deleted before they were exported: status
    data-loss, `lost_messages`), per partition and table, over all runs (carried over from the file being
    replaced). The partition's data-loss event is counted in `retention_data_loss_events`, which alerts."""
    name = f"{NS}_export_lost_messages"
    gauge = Gauge(
        name,
        "Messages the export found in neither the table nor the log (deleted before they were exported), over all runs",
        [*PARTITION, "table"],
        registry=reg,
    )
    table = str((report.get("summary") or {}).get("table"))
    now = carried(previous, name, (*PARTITION, "table"))
    for entry in report.get("partitions") or []:
        if entry.get("status") == "data-loss" and entry.get("lost_messages"):
            where: tuple[str, ...] = (str(entry.get("topic")), str(entry.get("partition")), table)
            now[where] = now.get(where, 0) + int(entry["lost_messages"])
    for where, n in now.items():
        gauge.labels(*where).set(n)


BAD_RECORDS = {  # report field → (metric, help): typed values that did not decode (docs/guides/typed-tables.md)
    "dead_lettered": (
        "export_dead_lettered_records",
        "Values the export wrote to the dead-letter table, over all runs",
    ),
    "skipped_bad_records": (
        "export_skipped_bad_records",
        "Values the export skipped (on_bad_record skip), over all runs",
    ),
}


def _bad_records_gauges(report: dict[str, Any], previous: dict[str, float], reg: CollectorRegistry) -> None:
    """The values an export dead-lettered or skipped, per partition and table, over all runs (carried over)."""
    table = str((report.get("summary") or {}).get("table"))
    for key, (metric, text) in BAD_RECORDS.items():
        name = f"{NS}_{metric}"
        gauge = Gauge(name, text, [*PARTITION, "table"], registry=reg)
        now = carried(previous, name, (*PARTITION, "table"))
        for entry in report.get("partitions") or []:
            if entry.get(key):
                where: tuple[str, ...] = (str(entry.get("topic")), str(entry.get("partition")), table)
                now[where] = now.get(where, 0) + int(entry[key])
        for where, n in now.items():
            gauge.labels(*where).set(n)


def _retention_entry(entry: dict[str, Any]) -> dict[str, Any] | None:
    """The retention outcome of a report entry (the entry itself, or a maintenance entry's retention step)."""
    if "steps" in entry:
        step = entry["steps"].get("retention")
        return {**step, "topic": entry.get("topic"), "partition": entry.get("partition")} if step else None
    return entry if "kept_unexported" in entry or entry.get("status") == "data-loss" else None


def read_samples(path: str) -> dict[str, float]:
    """The samples of an exposition file (`name{label="v",...}` → value; labels sorted), {} when there is none."""
    try:
        with open(path) as fh:
            text = fh.read()
    except FileNotFoundError:
        return {}
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


def check_metrics_path(path: str) -> None:
    """Refuse, before a run does its work, a metrics file it could not write at the end: its directory is created
    (as the write would) and a `.`-prefixed temporary file is created and removed in it.

    Raises:
        UsageError: naming the path and why.
    """
    import tempfile

    from tank_log.errors import UsageError, describe_error

    full = os.path.abspath(path)
    if os.path.isdir(full):
        raise UsageError(f"--metrics-file {path}: is a directory")
    try:
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with tempfile.NamedTemporaryFile(
            dir=os.path.dirname(full), prefix=f".{os.path.basename(full)}.", suffix=".probe"
        ):
            pass
    except OSError as err:
        raise UsageError(f"--metrics-file {path}: cannot be written: {describe_error(err)}") from None


def write_metrics(path: str, registry: CollectorRegistry) -> None:
    """Write the registry to `path` atomically (a temporary file renamed into place), creating its directory."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_to_textfile(path, registry)


def write_report_metrics(path: str, report: dict[str, Any]) -> None:
    """A run's metrics to `path`, carrying over what the file held (`report_registry`)."""
    write_metrics(path, report_registry(report, read_samples(path)))
