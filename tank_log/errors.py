"""Every exception tank-log raises on purpose, in one place; all derive from `TankLogError`.

- `TankFormatError` and its subclasses: malformed on-disk data, always naming the file and the byte offset (or line);
- `UsageError` and `JobConfigError`: a bad command line or job configuration (jobs and the CLI exit 2);
- `PartitionLocked`, `PartitionLooksLive`, `NeedsAttention`: why a partition was not changed (reported per partition).
"""

from __future__ import annotations

import errno
import os


class TankLogError(Exception):
    """The base of every exception tank-log raises on purpose: `except TankLogError` catches any of them."""


class TankFormatError(TankLogError):
    """Malformed TANK data. `path` is the file, `offset` the byte offset (or line number for text files)."""

    def __init__(self, message: str, path: str | os.PathLike[str] | None = None, offset: int | None = None):
        super().__init__(message)
        self.message = message
        self.path = os.fspath(path) if path is not None else None
        self.offset = offset

    def located(self, path: str | os.PathLike[str] | None, base_offset: int = 0) -> TankFormatError:
        """The same error with a file path and the offset shifted by `base_offset` (buffer → file position)."""
        offset = None if self.offset is None else self.offset + base_offset
        err = type(self)(self.message, path if path is not None else self.path, offset)
        err.__cause__ = self.__cause__
        return err

    def __str__(self) -> str:
        where = self.path or "<buffer>"
        if self.offset is not None:
            where += f" @{self.offset}"
        return f"{where}: {self.message}"


class SegmentNameError(TankFormatError):
    """A file name with a segment/index extension that the broker would mis-parse (docs/FORMAT.md §2.1)."""


class IndexFormatError(TankFormatError):
    """A malformed index file (docs/FORMAT.md §4.1)."""


class CleanupLogError(TankFormatError):
    """A malformed `.cleanup.log` (docs/FORMAT.md §1.6)."""


class UnrepresentableData(TankFormatError):
    """Valid TANK data a consumer cannot hold (e.g. a u64 seq beyond Spark's long): the reader stops there, with the
    file and offset, instead of wrapping or dropping rows."""


class UsageError(TankLogError):
    """A bad command line or path given by the user: jobs and the CLI exit with code 2."""


class RunFailed(TankLogError):
    """A run stopped for a reason its message states (not a bug): jobs report it and exit with code 1."""


class JobConfigError(UsageError, ValueError):
    """A bad job configuration (YAML file or flags)."""


class NothingMatched(UsageError):
    """A run selected nothing it was asked for: an empty or non-TANK data dir, or a topic that does not exist."""


class PartitionLocked(TankLogError):
    """Another tank-log process holds the partition's lock."""


class PartitionHeld(TankLogError):
    """Another process (the broker) serves or holds the partition: nothing may change it (docs/FORMAT.md §9 rule 1)."""


class PartitionLooksLive(TankLogError, RuntimeError):
    """The partition changed too recently: mutating it needs the broker stopped (docs/FORMAT.md §9 rule 1)."""


class WindowStepFailed(TankLogError, RuntimeError):
    """A step of a broker's maintenance window failed (`tank_log.jobs.window`); the message names broker and step."""

    def __init__(self, broker: str, step: str, message: str) -> None:
        super().__init__(f"broker {broker}: {step}: {message}")
        self.broker, self.step = broker, step


class NeedsAttention(TankLogError):
    """The partition holds something no job may change automatically (e.g. a file name the broker mis-parses)."""


def describe_error(err: BaseException) -> str:
    """One line for an expected condition: an OSError names the errno and the file (`EROFS: read-only file system:
    /data/t/0/.x.tmp`), anything else is its message."""
    if isinstance(err, OSError) and err.errno is not None:
        name = errno.errorcode.get(err.errno, str(err.errno))
        where = f": {err.filename}" if err.filename else ""
        return f"{name}: {err.strerror or err}{where}".rstrip()
    return str(err)


class ImportRefused(TankLogError, ValueError):
    """Rows cannot be written into a partition as given: it exists (and appending was not asked for), the rows do not
    continue it, a partition's rows are split over tasks or out of seq order, or they would break §9 rule 3."""


class ImportAborted(TankLogError, RuntimeError):
    """A writer of an import started after the run was aborted or committed: it stages nothing."""


class ValueSchemaError(UsageError):
    """A value format's schema cannot be used: a schema file missing or malformed, a message name it does not hold,
    an unknown schema id (`tank_log.values`); the message names the file (or id) and the rule. Exit 2."""


class IncompatibleSchema(RunFailed):
    """A new schema version changes a column incompatibly (`tank_log.values.evolve`): `field` is the column's path,
    `old_type` and `new_type` the table's type and the new one. That topic's export stops (exit 1)."""

    def __init__(self, field: str, old_type: object, new_type: object) -> None:
        super().__init__(f"field {field}: {old_type} cannot become {new_type} (not a compatible schema change)")
        self.field, self.old_type, self.new_type = field, old_type, new_type
