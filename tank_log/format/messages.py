"""The messages of the format as Python values (`Message`) and, for bulk work, as numpy columns over one buffer
(`MessageColumns`): what the decoder produces and the encoders, writers and readers take (docs/FORMAT.md §3)."""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np


def tombstones(keyed: np.ndarray, value_len: np.ndarray) -> np.ndarray:
    """Which messages are tombstones: a key and an empty value (docs/FORMAT.md §6.2). Compaction keeps one as its
    key's latest value; a current-state table deletes the key. `keyed`: bool per message; `value_len`: lengths."""
    marked: np.ndarray = np.asarray(keyed, dtype=bool) & (np.asarray(value_len) == 0)
    return marked


class Message(NamedTuple):
    """One message. `key` None (or b"") means no key; `ts` is the producer's u64 (ms by convention, §3.7)."""

    seq: int
    ts: int
    key: bytes | None
    value: bytes


@dataclass
class MessageColumns:
    """Decoded messages of a BundleTable as numpy columns; keys/values are (offset, length) into `data`."""

    seq: np.ndarray  # uint64
    ts: np.ndarray  # uint64
    key_off: np.ndarray  # int64, -1 = no key
    key_len: np.ndarray  # int64
    val_off: np.ndarray  # int64
    val_len: np.ndarray  # int64
    bundle: np.ndarray  # int64: index of the message's bundle in the table
    data: bytes

    def __len__(self) -> int:
        return len(self.seq)

    def slice(self, start: int, stop: int) -> MessageColumns:
        """Rows [start, stop) (views, not copies)."""
        return self.take(slice(start, stop))

    def take(self, rows: np.ndarray | builtins.slice) -> MessageColumns:
        """The rows at the indices, bool mask or slice `rows` (a slice gives views)."""
        return MessageColumns(
            self.seq[rows],
            self.ts[rows],
            self.key_off[rows],
            self.key_len[rows],
            self.val_off[rows],
            self.val_len[rows],
            self.bundle[rows],
            self.data,
        )

    @classmethod
    def from_messages(cls, messages: list[Message]) -> MessageColumns:
        """Columns of Python messages (keys and values copied into one buffer): for callers that hold messages."""
        data, key_off, val_off, at = [], [], [], 0
        for m in messages:
            if m.key is None:
                key_off.append(-1)
            else:
                key_off.append(at)
                data.append(m.key)
                at += len(m.key)
            val_off.append(at)
            data.append(m.value)
            at += len(m.value)
        i64 = np.int64
        return cls(
            np.array([m.seq for m in messages], np.uint64),
            np.array([m.ts for m in messages], np.uint64),
            np.array(key_off, i64),
            np.array([0 if m.key is None else len(m.key) for m in messages], i64),
            np.array(val_off, i64),
            np.array([len(m.value) for m in messages], i64),
            np.zeros(len(messages), i64),
            b"".join(data),
        )

    def key(self, i: int) -> bytes | None:
        off = int(self.key_off[i])
        return None if off < 0 else self.data[off : off + int(self.key_len[i])]

    def value(self, i: int) -> bytes:
        off = int(self.val_off[i])
        return self.data[off : off + int(self.val_len[i])]
