"""What a maintenance operation did to one partition, and the one wrapper every operation runs in.

`Status` is the closed set of per-partition outcomes the library, the Spark jobs and the Airflow DAGs agree on (a
`StrEnum`, so reports keep their plain strings). `run_on_partition` takes the lock (not in dry runs), turns every
expected condition into a status with a reason, and records the duration: one home instead of one per operation.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any, TypeVar

from tank_log.errors import NeedsAttention, PartitionLocked, PartitionLooksLive, TankFormatError, describe_error
from tank_log.storage.holders import foreign, held_reason, partition_holders
from tank_log.storage.locking import PartitionLock

log = logging.getLogger(__name__)


class Status(StrEnum):
    """Outcome of one partition in a run (the `status` of its report entry)."""

    PENDING = "pending"
    COMPACTED = "compacted"  # compaction replaced segments
    DELETED = "deleted"  # retention deleted segments
    KEPT = "kept"  # retention: past the limits, but deleting would be unsafe (§9 rule 4)
    CLEAN = "clean"  # index maintenance: nothing wrong
    FIXED = "fixed"  # index maintenance: everything found was fixed
    EXPORTED = "exported"
    IMPORTED = "imported"  # Delta → TANK: the partition was written (or continued)
    MAINTAINED = "maintained"  # maintenance: every step done (see each step's status)
    UP_TO_DATE = "up-to-date"  # export: nothing new
    NOTHING_TO_DO = "nothing-to-do"
    DRY_RUN = "dry-run"
    SKIPPED = "skipped"  # not touched: locked, not selected, policy
    NEEDS_ATTENTION = "needs-attention"  # a problem no job fixes automatically
    FAILED = "failed"
    DATA_LOSS = "data-loss"  # retention deleted data the lakehouse had not received (past its max_holdback)
    INTERRUPTED = "interrupted"  # the run was stopped (Ctrl-C, SIGTERM) before this partition finished

    @property
    def failing(self) -> bool:
        """Whether this outcome makes a run exit 1."""
        return self in FAILING


FAILING = frozenset({Status.FAILED, Status.NEEDS_ATTENTION, Status.DATA_LOSS})


@dataclass
class PartitionOutcome:
    """Fields every operation reports for a partition; operations extend it with their own figures."""

    topic: str
    partition: int
    path: str
    status: Status = Status.PENDING
    reason: str = ""
    repair: dict[str, Any] | None = None
    duration_s: float = 0.0
    error: str | None = None
    held_by: list[str] | None = None  # other processes holding the partition (storage/holders.py)

    def to_dict(self) -> dict[str, Any]:
        """The report entry (plain JSON types)."""
        out = asdict(self)
        out["status"] = str(self.status)
        return out


Outcome = TypeVar("Outcome", bound=PartitionOutcome)


def run_on_partition(
    path: str, job: str, outcome: Outcome, body: Callable[[Outcome], None], *, dry_run: bool
) -> Outcome:
    """Run `body(outcome)` on the partition directory `path`, under its lock unless `dry_run`.

    First, another process holding the partition (the broker serving its base path, a file open or mapped,
    `storage/holders.py`) → skipped, naming it (a dry run reports it in `held_by` and proceeds). Another tank-log run
    is no such holder: the partition lock decides (it holds the lock → skipped, "locked: another tank-log run (pid N,
    job) holds it", no failure and not held by the broker). Then expected
    conditions become a status, never an exception: locked → skipped; NeedsAttention → needs-attention;
    bad data, a live partition or an OSError (errno and file) → failed with the reason. Anything else is a bug:
    failed with "internal error", traceback logged.
    """
    t0 = time.monotonic()
    held = foreign(partition_holders(path))
    if held:
        outcome.held_by = [str(h) for h in held]
        if not dry_run:  # verified, not trusted: even with --broker-stopped (§9 rule 1)
            outcome.status = Status.SKIPPED
            outcome.reason = held_reason(held)
            log.warning("%s of %s skipped: %s", job, path, outcome.reason)
            outcome.duration_s = round(time.monotonic() - t0, 3)
            return outcome
    try:
        if dry_run:  # read-only: no lock file, the tree stays byte-identical
            body(outcome)
        else:
            with PartitionLock(path, job):
                body(outcome)
    except PartitionLocked as err:
        outcome.status, outcome.reason = Status.SKIPPED, f"locked: {err}"
        log.info("%s of %s skipped: %s", job, path, err)
    except NeedsAttention as err:
        outcome.status, outcome.reason = Status.NEEDS_ATTENTION, str(err)
    except (TankFormatError, PartitionLooksLive) as err:
        outcome.status, outcome.error = Status.FAILED, str(err)
    except OSError as err:  # the environment (full disk, read-only mount, permissions): one line, no traceback
        outcome.status, outcome.error = Status.FAILED, describe_error(err)
        log.error("%s of %s failed: %s", job, path, outcome.error)
    except Exception as err:  # a bug: reported as such, with the traceback in the log; never fatal for the run
        log.exception("%s of %s: internal error", job, path)
        outcome.status, outcome.error = Status.FAILED, f"internal error: {type(err).__name__}: {err}"
    outcome.duration_s = round(time.monotonic() - t0, 3)
    return outcome
