"""A problem found by a check (verify, index verification, data-directory scan), reported rather than raised."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Problem:
    """Something wrong in the data that is reported, not raised: the file, the offset, a stable code, a message."""

    path: str
    offset: int | None  # byte offset in the file (or line number for config files), None if not applicable
    code: str  # short stable identifier, e.g. "index-entry-mismatch"
    message: str
    severity: str = "error"  # "error" (the broker may crash or mis-serve) | "warning"
    aborts: bool = False  # the broker aborts or exits on it (at open or at the first read), per docs/FORMAT.md

    def __str__(self) -> str:
        where = self.path if self.offset is None else f"{self.path} @{self.offset}"
        return f"{self.severity}: {where}: [{self.code}] {self.message}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
