"""The maintenance window of one broker host: stop the broker, wait until nothing holds its data, (the maintenance
job runs), start it again, wait until it serves, verify. Mutations need the broker stopped (docs/FORMAT.md §9 rule
1) and "stopped" is checked (`storage.holders`: no process has its files open or mapped or names its base path),
not trusted. The Airflow DAG `tank_maintenance_window` runs each step as a task on the broker host's queue.

Commands run through `/bin/sh -c` with the step's timeout; their output goes to a file, not a pipe, so a broker
that `start_command` leaves running in the background cannot block the step.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any

from tank_log.errors import WindowStepFailed
from tank_log.jobs.config import BrokerHost, JobConfig
from tank_log.storage.holders import Holder, foreign, holders

log = logging.getLogger("tank_log.window")

POLL_S = 0.2


@dataclass(frozen=True)
class StepResult:
    """What a window step did (`done` False: it decided not to act, `detail` says why)."""

    broker: str
    step: str
    done: bool
    detail: str
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def window_source(broker: BrokerHost, job_config: JobConfig | None = None) -> str:
    """The source (`export.source`) the window's runs on `broker` guard by: the `export.source` of the broker's own
    job config (`job_config`, loaded from `broker.job_config`) when it sets one — replicas of one partition declare
    one source so —, else the broker's name. Its export must record the same source (`--source`).

    Raises:
        JobConfigError: a name that cannot be a source.
    """
    from tank_log.lakehouse import check_source

    if job_config is None and broker.job_config:
        from tank_log.jobs.config import load_job_config

        job_config = load_job_config(broker.job_config)
    if job_config is not None and job_config.export.source:
        return job_config.export.source
    return check_source(broker.name, f"brokers[].name (the source of broker {broker.name!r}'s window runs)")


def broker_holders(broker: BrokerHost) -> list[Holder]:
    """Processes that hold the broker's data dirs, other than ours and other runs of ours (an export reading them
    holds its run marker there for its whole run; the locks keep it and the maintenance job apart): the broker
    itself while it runs."""
    return foreign(holders(broker.data_dirs, names=broker.data_dirs))


def run_command(broker: BrokerHost, step: str, command: str, timeout_s: float) -> str:
    """Run an operator's command; its output (also logged).

    Raises:
        WindowStepFailed: it exited non-zero or did not return within `timeout_s` (its process group is killed).
    """
    log.info("broker %s: %s: running `%s`", broker.name, step, command)
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", command], stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
        )
        try:
            code = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise WindowStepFailed(broker.name, step, f"`{command}` did not return within {timeout_s:.0f} s") from None
        out.seek(0)
        text = out.read()
    for line in text.splitlines():
        log.info("broker %s: %s: | %s", broker.name, step, line)
    if code != 0:
        tail = text.strip().splitlines()[-1:] or [""]
        raise WindowStepFailed(broker.name, step, f"`{command}` exited with {code}: {tail[0]}")
    return text


def stop(broker: BrokerHost) -> StepResult:
    """Run `stop_command` and wait until nothing holds the broker's data dirs.

    Raises:
        WindowStepFailed: `stop_command` failed, or something still holds the data after `stop_timeout` (named).
    """
    t0 = time.monotonic()
    run_command(broker, "stop", broker.stop_command, broker.stop_timeout_s)
    held = broker_holders(broker)
    while held and time.monotonic() - t0 < broker.stop_timeout_s:
        time.sleep(POLL_S)
        held = broker_holders(broker)
    if held:
        raise WindowStepFailed(
            broker.name,
            "stop",
            f"still held after {broker.stop_timeout_s} s, so the maintenance job does not run: "
            + "; ".join(map(str, held[:3])),
        )
    took = time.monotonic() - t0
    return StepResult(broker.name, "stop", True, f"stopped: nothing holds its data dirs after {took:.1f} s", took)


def start(broker: BrokerHost) -> StepResult:
    """Start the broker unless it still runs (it never stopped: a second one must not start on its data). First,
    `repair` its data: a maintenance job killed mid-run (a timeout, the OOM killer) can leave an interrupted
    compaction, which the broker's own open-time recovery gets wrong (it resurrects `.old` inputs beside the
    outputs, docs/FORMAT.md §6.4), and temporaries.

    Raises:
        WindowStepFailed: the repair could not finish (a partition locked by a job still running, or one that needs
            an operator: the broker is not started), or `start_command` failed or did not return within
            `ready_timeout`.
    """
    t0 = time.monotonic()
    held = broker_holders(broker)
    if held:
        return StepResult(broker.name, "start", False, f"not started: it still runs ({held[0]})", 0.0)
    repaired = repair_data(broker)
    run_command(broker, "start", broker.start_command, broker.ready_timeout_s)
    detail = f"started after repairing {', '.join(repaired)}" if repaired else "started"
    return StepResult(broker.name, "start", True, detail, time.monotonic() - t0)


def repair_data(broker: BrokerHost) -> list[str]:
    """`tank-log repair` of the broker's data dirs (it is stopped: checked by the caller); what it repaired.

    Raises:
        WindowStepFailed: a partition is locked (a job still runs on it) or needs attention, an OSError, or repair
            left a problem in a partition (named with the first problem; the others are repaired first).
    """
    from tank_log.errors import NeedsAttention, PartitionLocked, describe_error
    from tank_log.storage.datadir import partitions_at
    from tank_log.storage.locking import PartitionLock
    from tank_log.storage.repair import repair_base, repair_partition

    done: list[str] = []
    left: list[str] = []
    try:
        for d in broker.data_dirs:
            done += repair_base(d)
            for part in partitions_at(d):
                with PartitionLock(part.path, "window-start"):
                    res = repair_partition(part.path)
                if res.has_work:
                    done.append(f"{part.topic}/{part.id} ({res.action})")
                    log.warning("broker %s: start: repaired %s/%d: %s", broker.name, part.topic, part.id, res.action)
                left += [f"{part.path}: {p}" for p in res.problems]
    except (PartitionLocked, NeedsAttention, OSError) as err:
        raise WindowStepFailed(broker.name, "start", f"not started: repair failed: {describe_error(err)}") from err
    if left:  # e.g. RO segments repair could not give an active segment: the broker's next append hides them
        more = (
            f" (and {len(left) - 1} more problem(s): `tank-log repair --dry-run` lists them)" if len(left) > 1 else ""
        )
        raise WindowStepFailed(broker.name, "start", f"not started: repair left {left[0]}{more}")
    return done


def wait_ready(broker: BrokerHost) -> StepResult:
    """Wait until `ready_check` accepts connections.

    Raises:
        WindowStepFailed: not within `ready_timeout`.
    """
    host, port = broker.ready_address
    t0 = time.monotonic()
    while True:
        try:
            with socket.create_connection((host, port), timeout=2):
                took = time.monotonic() - t0
                return StepResult(broker.name, "ready", True, f"{broker.ready_check} accepts after {took:.1f} s", took)
        except OSError as err:
            if time.monotonic() - t0 >= broker.ready_timeout_s:
                raise WindowStepFailed(
                    broker.name, "ready", f"{broker.ready_check} not serving after {broker.ready_timeout_s} s: {err}"
                ) from None
            time.sleep(POLL_S)


def verify(broker: BrokerHost) -> StepResult:
    """`tank-log verify` of the broker's data dirs (read-only; fine while it serves).

    Raises:
        WindowStepFailed: errors were found (the first few named).
    """
    from tank_log.maintenance.verify import verify_path

    t0 = time.monotonic()
    problems = [p for d in broker.data_dirs for p in verify_path(d)]
    errors = [p for p in problems if p.severity == "error"]
    if errors:
        raise WindowStepFailed(
            broker.name, "verify", f"{len(errors)} error(s): " + "; ".join(str(p) for p in errors[:3])
        )
    took = time.monotonic() - t0
    return StepResult(broker.name, "verify", True, f"clean ({len(problems)} warning(s))", took)
