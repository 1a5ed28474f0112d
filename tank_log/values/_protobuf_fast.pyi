"""Types of the compiled Protobuf fast path (`_protobuf_fast.pyx`), driven by protobuf.py's `_FastPlan`."""

import numpy as np
from typing_extensions import Buffer  # bytes, or a buffer that frees its block (cython.view.array)

def decode(
    data: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    eligible: np.ndarray,
    kind: np.ndarray,
    arg: np.ndarray,
    group: np.ndarray,
    defvalid: np.ndarray,
    elem: np.ndarray,
    tfirst: np.ndarray,
    tlen: np.ndarray,
    ftab: np.ndarray,
    oneof_next: np.ndarray,
    entry: np.ndarray,
    gfirst: np.ndarray,
    gcount: np.ndarray,
    gmembers: np.ndarray,
    codes: np.ndarray,
) -> tuple[list[int], list[tuple[Buffer, Buffer, Buffer]]] | None: ...
