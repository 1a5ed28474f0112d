"""Typed errors. Every problem with on-disk data is a `TankFormatError` naming the file and byte offset."""

from __future__ import annotations

import os


class TankFormatError(Exception):
    """Malformed TANK data. `path` is the file, `offset` the byte offset (or line number for text files)."""

    def __init__(self, message: str, path: str | os.PathLike | None = None, offset: int | None = None):
        super().__init__(message)
        self.message = message
        self.path = os.fspath(path) if path is not None else None
        self.offset = offset

    def located(self, path: str | os.PathLike | None, base_offset: int = 0) -> TankFormatError:
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
    """A file name with a segment/index extension that the broker would mis-parse (TANK_FORMAT.md §2.1)."""


class IndexFormatError(TankFormatError):
    """A malformed index file (TANK_FORMAT.md §4.1)."""


class ConfigError(TankFormatError):
    """A `config` line the broker would reject (TANK_FORMAT.md §1.5); `offset` is the 1-based line number."""


class CleanupLogError(TankFormatError):
    """A malformed `.cleanup.log` (TANK_FORMAT.md §1.6)."""
