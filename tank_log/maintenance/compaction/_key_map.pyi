"""Types of compaction's compiled key state (`_key_map.pyx`); the pure-Python contract is in key_state.py."""

from collections.abc import Iterator
from typing import TypeAlias

import numpy as np

from tank_log.format._codec import CodecSpec

Data: TypeAlias = bytes | bytearray | memoryview | np.ndarray

class KeyMap:
    """Exact key → the ordinal of its latest message, for compaction's first pass (docs/FORMAT.md §6.2)."""

    budget: int
    def __init__(self, budget: int, wide: bool = False) -> None: ...
    def __len__(self) -> int: ...
    @property
    def wide(self) -> bool: ...
    @property
    def nbytes(self) -> int: ...
    def add(self, data: Data, key_off: np.ndarray, key_len: np.ndarray, ords: np.ndarray) -> int: ...
    def add_sets(
        self,
        walked: Data,
        set_offsets: np.ndarray,
        ends: np.ndarray,
        flags: np.ndarray,
        counts: np.ndarray,
        firsts: np.ndarray,
        lasts: np.ndarray,
        first_ord: int,
        codecs: tuple[CodecSpec, ...],
        marked: np.ndarray,
    ) -> int: ...
    def mark(self, bits: np.ndarray) -> None: ...
    def records(self) -> Iterator[bytes]: ...

def key_hashes(data: Data, key_off: np.ndarray, key_len: np.ndarray) -> np.ndarray: ...
def pack_records(data: Data, key_off: np.ndarray, key_len: np.ndarray, ords: np.ndarray, rows: np.ndarray) -> bytes: ...
def unpack_records(data: Data) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]: ...
