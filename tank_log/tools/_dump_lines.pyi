"""Types of the compiled JSON lines of `tank-log dump` (`_dump_lines.pyx`)."""

import numpy as np

def json_lines(
    prefix: bytes,
    data: bytes | bytearray | memoryview | np.ndarray,
    seq: np.ndarray,
    ts: np.ndarray,
    key_off: np.ndarray,
    key_len: np.ndarray,
    val_off: np.ndarray,
    val_len: np.ndarray,
    out: bytearray | None = None,
) -> bytearray: ...
