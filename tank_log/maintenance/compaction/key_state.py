"""Pass 1 state: exact key → last seq, in Arrow (no digests, so no collisions)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa


class KeyState:
    """Exact key → last seq, reduced with Arrow group-by every `window` rows; memory ∝ distinct keys."""

    def __init__(self, window: int):
        self.window = window
        self.table: pa.Table | None = None
        self.pending: list[pa.Table] = []
        self.pending_rows = 0

    def add(self, keys: pa.Array, seqs: np.ndarray) -> None:
        if len(seqs):
            self.pending.append(pa.table({"key": keys, "seq": pa.array(seqs)}))
            self.pending_rows += len(seqs)
            if self.pending_rows >= self.window:
                self.reduce()

    def reduce(self) -> None:
        parts = ([self.table] if self.table is not None else []) + self.pending
        if not parts:
            return
        merged = pa.concat_tables(parts).group_by("key").aggregate([("seq", "max")])
        self.table = merged.rename_columns(["key", "seq"]).combine_chunks()
        self.pending, self.pending_rows = [], 0

    def survivor_seqs(self) -> np.ndarray:
        self.reduce()
        if self.table is None:
            return np.zeros(0, dtype=np.uint64)
        return np.sort(self.table.column("seq").to_numpy())

    @property
    def nbytes(self) -> int:
        return 0 if self.table is None else self.table.nbytes


def in_sorted(values: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    if not len(sorted_set):
        return np.zeros(len(values), dtype=bool)
    idx = np.searchsorted(sorted_set, values)
    idx[idx == len(sorted_set)] = 0
    found: np.ndarray = sorted_set[idx] == values
    return found
