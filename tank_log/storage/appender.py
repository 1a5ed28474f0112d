"""Appending to a live partition the way the broker's produce path does (docs/FORMAT.md §2.3–§2.5, §4.3).

Each `append` writes one bundle to the active segment `<base>_<createdTS>.log` (opened `O_APPEND`) and, by the
append rule, an index entry to `<base>.index`. Before an append, a non-empty active segment larger than
`log.segment.bytes` (strictly) is rolled: renamed to `<base>-<last>_<mtime>.ilog`, its index keeping its name, and
the bundle starts a new active segment named after its first seq. The age and index-size roll triggers of §2.4
are not modelled. For producers in tests, demos and tools that feed a partition while readers run; no other writer
(the broker) may append to the same partition meanwhile.

Unlike the broker, it rolls only where seqs continue: a bundle whose first seq jumps past the counter goes into the
active segment even when a roll is due (the gap then lies inside a segment, as a sparse bundle), and the roll waits
for a bundle that continues the counter. The broker rolls at the jump, leaving the gap right before the new active
segment, and aborts on the first fetch inside it (§4.4, §11 item 23).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from tank_log.format.bundle import Message, encode_bundle, frame, is_contiguous
from tank_log.format.index import REL_SEQ_LIMIT, encode_index
from tank_log.format.names import format_active_name, format_index_name, format_ro_name
from tank_log.storage.datadir import last_complete_seq, rescan_partition
from tank_log.storage.fsutil import fsync_dir
from tank_log.storage.writer import BundlePolicy


class PartitionAppender:
    """Appends bundles to one partition directory; `fsync` makes every append durable before it returns."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        segment_bytes: int | None = None,
        index_interval: int | None = None,
        policy: BundlePolicy | None = None,
        fsync: bool = False,
    ):
        self.path = os.fspath(path)
        os.makedirs(self.path, exist_ok=True)
        topic, pid = os.path.basename(os.path.dirname(self.path)), os.path.basename(self.path)
        part = rescan_partition(self.path, topic, int(pid) if pid.isdigit() else 0)  # with its topic's config
        self.segment_bytes = part.config.segment_bytes if segment_bytes is None else segment_bytes
        self.index_interval = part.config.index_interval_bytes if index_interval is None else index_interval
        self.policy = policy or BundlePolicy()
        self.fsync = fsync
        self.last = last_complete_seq(part) or 0  # the broker's lastAssignedSeqNum (0: seqs start at 1, §2.3)
        self.rolls = 0
        self._active = part.active.path if part.active is not None else None
        self._base = part.active.base if part.active is not None else None
        self._size = part.active.size if part.active is not None else 0
        self._since_entry: int | None = 0  # 0 after an open: the next entry only after > interval bytes (§4.3)

    @property
    def next_seq(self) -> int:
        return self.last + 1

    def append(self, messages: Sequence[Message]) -> None:
        """Write `messages` as one bundle (sparse when their seqs do not continue the counter, §3.6).

        Raises:
            ValueError: no messages; seqs not increasing above the partition's last seq; or seqs that would leave a
                gap before the active segment (no active segment to hold it, or one 2**31 seqs past its base).
        """
        if not messages:
            raise ValueError("an append needs at least one message")
        prev = self.last
        for m in messages:
            if m.seq <= prev:
                raise ValueError(f"{self.path}: seq {m.seq} does not follow {prev}")
            prev = m.seq
        continues = messages[0].seq == self.last + 1
        if self._active is None:  # §2.4 rule 1
            if self.last and not continues:
                raise ValueError(
                    f"{self.path}: seq {messages[0].seq} does not continue {self.last} and there is no active segment "
                    f"to hold the gap: the new active segment would follow a seq gap, on which the broker aborts (§4.4)"
                )
            self.roll(messages[0].seq)
        elif continues and self._size > 0:
            assert self._base is not None
            beyond = messages[-1].seq - self._base >= REL_SEQ_LIMIT  # §4.6: roll early rather than overflow
            if self._size > self.segment_bytes or beyond:  # §2.4 rule 4 (rule 2: size 0 never rolls)
                self.roll(messages[0].seq)
        assert self._base is not None and self._active is not None
        if messages[-1].seq - self._base >= REL_SEQ_LIMIT:  # a bundle this wide, or a jump where no roll may go
            raise ValueError(
                f"{self.path}: seq {messages[-1].seq} is 2**31 or more past the active segment's base {self._base} "
                f"(§4.6), and a new segment may only start where seqs continue (§4.4)"
            )
        expected = self._base if self._size == 0 else self.last + 1
        sparse = not is_contiguous(messages, expected)
        framed = frame(encode_bundle(messages, sparse=sparse, codec=self.policy.snappy))
        offset = self._size
        self._write(self._active, framed)
        if self._since_entry is None or self._since_entry > self.index_interval:
            entry = encode_index([(messages[0].seq - self._base, offset)])
            self._write(os.path.join(self.path, format_index_name(self._base)), entry)
            self._since_entry = 0
        self._since_entry += len(framed)
        self._size += len(framed)
        self.last = messages[-1].seq

    def roll(self, first_seq: int) -> None:
        """Make the active segment immutable (§2.5) and start a new one whose base is `first_seq` (§2.3)."""
        if self._active is not None and self._base is not None:
            mtime = int(os.stat(self._active).st_mtime)
            os.rename(self._active, os.path.join(self.path, format_ro_name(self._base, self.last, mtime)))
            self.rolls += 1
        index = os.path.join(self.path, format_index_name(first_seq))
        if os.path.exists(index) and os.path.getsize(index):
            raise ValueError(f"{index}: a stale index for the new active segment (the broker would append to it)")
        self._active = os.path.join(self.path, format_active_name(first_seq, int(time.time())))
        open(self._active, "ab").close()
        open(index, "ab").close()
        fsync_dir(self.path)
        self._base, self._size, self._since_entry = first_seq, 0, None  # a new segment indexes its first bundle

    def _write(self, path: str, data: bytes) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o664)
        try:
            os.write(fd, data)
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
