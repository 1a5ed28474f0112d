"""Types of the compiled codec core (`_codec.pyx`), wrapped by decode.py's `CompiledWalker`, bundle.py's
`CompiledEncoder` and arrow.py's `compiled_gather`."""

from collections.abc import Callable, Sequence
from typing import TypeAlias

import numpy as np

from tank_log.format.messages import Message

Data: TypeAlias = bytes | bytearray | memoryview | np.ndarray
# per codec id 0..3: (decompress_into, max_expansion, raw_snappy), or None for a codec the format lacks
CodecSpec: TypeAlias = tuple[Callable[[memoryview, memoryview], int], int, bool] | None
Columns: TypeAlias = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]
Gathered: TypeAlias = tuple[bytes, np.ndarray, np.ndarray]

def walk(
    data: Data,
    start: int,
    next_seq: int,
    collect: bool,
    max_bytes: int | None,
    stop_seq: int | None,
    max_messages: int,
    codecs: tuple[CodecSpec, ...],
) -> tuple[Columns, Gathered | None, int, int, int, int]: ...
def snappy_raw_into(block: Data, out: bytearray | memoryview | np.ndarray) -> bool: ...
def collect(
    data: Data,
    offsets: np.ndarray,
    ends: np.ndarray,
    set_offsets: np.ndarray,
    flags: np.ndarray,
    counts: np.ndarray,
    codecs: tuple[CodecSpec, ...],
) -> Gathered | int: ...
def decode(
    data: Data,
    set_starts: np.ndarray,
    set_ends: np.ndarray,
    counts: np.ndarray,
    bundle_flags: np.ndarray,
    firsts: np.ndarray,
    lasts: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None: ...
def encode_message_set(messages: Sequence[Message], sparse: bool) -> bytes | None: ...
def encode_columns(
    data: Data,
    seq: np.ndarray,
    ts: np.ndarray,
    key_off: np.ndarray,
    key_len: np.ndarray,
    val_off: np.ndarray,
    val_len: np.ndarray,
    sparse: bool,
) -> bytes | None: ...
def encode_bundles(
    data: Data,
    seq: np.ndarray,
    ts: np.ndarray,
    key_off: np.ndarray,
    key_len: np.ndarray,
    val_off: np.ndarray,
    val_len: np.ndarray,
    bounds: np.ndarray,
    expected: int,
    snappy: int,
    compress: Callable[[bytes], bytes],
) -> tuple[bytes, np.ndarray] | None: ...
def gather_spans(data: Data, off: np.ndarray, length: np.ndarray) -> tuple[np.ndarray, bytes] | None: ...
def scan_sets(
    walked: Data,
    set_offsets: np.ndarray,
    ends: np.ndarray,
    flags: np.ndarray,
    counts: np.ndarray,
    firsts: np.ndarray,
    lasts: np.ndarray,
    codecs: tuple[CodecSpec, ...],
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int, np.ndarray, bytearray, np.ndarray, bytearray] | None: ...
