"""Whether the compiled core runs, or the pure-Python code it speeds up. Both give the same bytes, columns and errors.

The compiled core is one module per concern, each beside the pure-Python code it speeds up, each with a `.pyi`:
`format/_codec.pyx` (the walk, decode, encoders and Arrow gather), `tools/_dump_lines.pyx` (`tank-log dump`'s JSON
lines) and `maintenance/compaction/_key_map.pyx` (compaction's key map). `pip install` builds them when a C compiler
is there; they run when all of them were built.

Set TANK_LOG_PURE_PYTHON=1 to force the pure-Python code (it is read at import, so it reaches Spark's Python
workers through their environment); `use_pure` switches within a process, for tests and benchmarks.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.machinery import EXTENSION_SUFFIXES

PURE_ENV = "TANK_LOG_PURE_PYTHON"
MODULES = ("tank_log.format._codec", "tank_log.tools._dump_lines", "tank_log.maintenance.compaction._key_map")


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tank_log/
_failed: set[str] = set()  # compiled modules that were built but did not import


def available() -> bool:
    """Whether the compiled core was built (whatever is in use). Looked up as files, not imported: importing
    compaction's module would import all of compaction into every `tank-log dump`."""
    if _failed:
        return False
    for module in MODULES:
        stem = os.path.join(_PACKAGE_DIR, *module.split(".")[1:])
        if not any(os.path.isfile(stem + suffix) for suffix in EXTENSION_SUFFIXES):
            return False
    return True


def failed(module: str) -> None:
    """A compiled module was built but does not import (built for another Python): the pure-Python code runs."""
    _failed.add(module)


_compiled: bool | None = None  # decided at the first call


def compiled() -> bool:
    """Whether the compiled core runs (else the pure-Python code)."""
    global _compiled
    if _compiled is None:
        _compiled = os.environ.get(PURE_ENV, "") in ("", "0") and available()
    return _compiled and not _failed


def name() -> str:
    """ "native" or "pure": which core runs (for logs and benchmark reports)."""
    return "native" if compiled() else "pure"


@contextmanager
def use_pure(pure: bool = True) -> Iterator[None]:
    """Run the block on the pure-Python core (or, with pure=False, on the compiled one, which must be built)."""
    global _compiled
    saved = compiled()
    if not pure and not available():
        raise RuntimeError("tank-log's compiled core is not built (pip install needs Cython and a C compiler)")
    _compiled = not pure
    try:
        yield
    finally:
        _compiled = saved
