"""Which codec core runs: the compiled one (`_native.pyx`, built by `pip install` when a C compiler is there) or the
pure-Python one. Both give the same bytes, columns and errors; the compiled one is chosen when it is importable.

Set TANK_LOG_PURE_PYTHON=1 to force the pure-Python core (it is read at import, so it reaches Spark's Python
workers through their environment); `use_pure` switches within a process, for tests and benchmarks.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

PURE_ENV = "TANK_LOG_PURE_PYTHON"


def _built() -> ModuleType | None:
    try:
        from tank_log.format import _native  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _native  # type: ignore[no-any-return]


_core: ModuleType | None = None if os.environ.get(PURE_ENV, "") not in ("", "0") else _built()


def core() -> ModuleType | None:
    """The compiled core in use, or None when the pure-Python code runs."""
    return _core


def name() -> str:
    """ "native" or "pure": which core runs (for logs and benchmark reports)."""
    return "pure" if _core is None else "native"


def available() -> bool:
    """Whether the compiled core was built (whatever is in use)."""
    return _built() is not None


@contextmanager
def use_pure(pure: bool = True) -> Iterator[None]:
    """Run the block on the pure-Python core (or, with pure=False, on the compiled one, which must be built)."""
    global _core
    saved = _core
    if pure:
        _core = None
    else:
        _core = _built()
        if _core is None:
            raise RuntimeError("tank-log's compiled core is not built (pip install needs Cython and a C compiler)")
    try:
        yield
    finally:
        _core = saved
