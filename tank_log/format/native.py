"""Whether the compiled core runs, or the pure-Python code it speeds up. Both give the same bytes, columns and errors.

The compiled core is one module per concern, each beside the pure-Python code it speeds up, each with a `.pyi`:
`format/_codec.pyx` (the walk, decode, encoders and Arrow gather), `tools/_dump_lines.pyx` (`tank-log dump`'s JSON
lines), `maintenance/compaction/_key_map.pyx` (compaction's key map), `values/_avro_fast.pyx` and
`values/_protobuf_fast.pyx` (Avro and Protobuf values to typed columns). `pip install` builds them when a C compiler
is there; they run when all of them were built.

Each concern's home module declares its implementations once, as a `Choice` of a pure-Python object and a compiled
one with the same typed interface (`decode.WALKER`, `bundle.ENCODER`, `arrow.GATHER`, `dump.LINES`,
`key_state.KEYS`); its callers use the one picked (`choice.impl`), never this module.

Set TANK_LOG_PURE_PYTHON=1 to force the pure-Python code (it is read at import, so it reaches Spark's Python
workers through their environment); `use_pure` switches within a process, for tests and benchmarks.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.machinery import EXTENSION_SUFFIXES
from typing import Generic, TypeVar

T = TypeVar("T")

PURE_ENV = "TANK_LOG_PURE_PYTHON"
MODULES = (
    "tank_log.format._codec",
    "tank_log.tools._dump_lines",
    "tank_log.maintenance.compaction._key_map",
    "tank_log.values._avro_fast",
    "tank_log.values._protobuf_fast",
)


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
    _pick_all()


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
    _pick_all()
    try:
        yield
    finally:
        _compiled = saved
        _pick_all()


class Choice(Generic[T]):
    """One concern's implementation in use (`impl`): the compiled one when the compiled core runs, else the pure one.

    Picked when declared; picked again only when the core changes (`use_pure`, a compiled module that fails to
    import). `compiled` makes the compiled object (called only when the compiled core runs)."""

    def __init__(self, pure: T, compiled: Callable[[], T]) -> None:
        self.pure = pure
        self._make_compiled = compiled
        self._compiled: T | None = None
        self.impl = pure
        _pickers.append(self._pick)
        self._pick()

    def _pick(self) -> None:
        if not compiled():
            self.impl = self.pure
            return
        if self._compiled is None:
            self._compiled = self._make_compiled()
        self.impl = self._compiled


_pickers: list[Callable[[], None]] = []  # every Choice's


def _pick_all() -> None:
    for pick in _pickers:
        pick()
