"""Types of the compiled Avro fast path (`_avro_fast.pyx`), driven by avro.py's `_FastPlan`."""

import numpy as np

def decode(
    data: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    eligible: np.ndarray,
    kind: np.ndarray,
    nullidx: np.ndarray,
    arg: np.ndarray,
    first: np.ndarray,
    nchild: np.ndarray,
    children: np.ndarray,
    valid: np.ndarray,
    vals: list[np.ndarray | None],
    offs: list[np.ndarray | None],
    bad: np.ndarray,
    err_code: np.ndarray,
    err_pos: np.ndarray,
    err_node: np.ndarray,
    err_val: np.ndarray,
) -> list[bytes | None] | None: ...
