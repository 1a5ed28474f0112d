"""Survivors → output segments (temporary files, rolled past the segment size), with their name timestamps."""

from __future__ import annotations

import os

from tank_log.format.bundle import Message
from tank_log.format.index import REL_SEQ_LIMIT
from tank_log.format.messages import MessageColumns
from tank_log.format.names import name_ts_from_message_ts
from tank_log.maintenance.compaction.options import CompactionOptions
from tank_log.storage.writer import SegmentWriter, WrittenSegment


class OutputSegments:
    """Streams survivors into output segments (rolled past `segment_bytes`), tracking name timestamps."""

    def __init__(self, directory: str, options: CompactionOptions, segment_bytes: int, index_interval: int):
        self.directory = directory
        self.options = options
        self.segment_bytes = segment_bytes
        self.index_interval = index_interval
        self.done: list[WrittenSegment] = []
        self.writer: SegmentWriter | None = None
        self.input_ts: int | None = None
        self.newest_ts = 0

    def _ensure(self) -> SegmentWriter:
        if self.writer is None:
            self.writer = SegmentWriter(self.directory, policy=self.options.policy, index_interval=self.index_interval)
            self.newest_ts = 0
        return self.writer

    def _roll_before(self, last_seq: int) -> None:
        """Start a new segment when `last_seq` would not fit the index's relative seq (< 2**31, §4.6): inputs can
        span more (a seq jump in a sparse bundle), outputs never need a _64 index."""
        w = self.writer
        if w is not None and w.first_seq is not None and last_seq - w.first_seq >= REL_SEQ_LIMIT:
            w.flush_bundle()
            self.close_current()

    def add(self, m: Message) -> None:
        self._roll_before(m.seq)
        self._ensure().add(m)
        self.newest_ts = max(self.newest_ts, m.ts)
        self._maybe_roll()

    def add_columns(self, cols: MessageColumns) -> None:
        """`add` of every row, in bulk (SegmentWriter.add_columns: the same bundles, segments and bytes)."""
        i, n = 0, len(cols)
        while i < n:
            w = self._ensure()
            taken = w.add_columns(cols.slice(i, n), stop_past_size=self.segment_bytes)
            if taken:
                self.newest_ts = max(self.newest_ts, int(cols.ts[i : i + taken].max()))
            i += taken
            if i < n or w.size > self.segment_bytes:  # rolled past the size, or the index cannot hold the next seq
                self.close_current()

    def add_bundle(self, framed: bytes, first: int, last: int, count: int, sparse: bool, max_ts: int) -> None:
        self._roll_before(last)
        w = self._ensure()
        w.add_bundle(framed, first, last, count, sparse=sparse)
        self.newest_ts = max(self.newest_ts, max_ts)
        self._maybe_roll()

    def _maybe_roll(self) -> None:
        if self.writer is not None and self.writer.size > self.segment_bytes:
            self.close_current()

    def close_current(self) -> None:
        if self.writer is None:
            return
        # name ts: the newest input absorbed (§6.3); legacy inputs without ts: from the newest message's, if plausible
        self.writer.ts = self.input_ts if self.input_ts is not None else name_ts_from_message_ts(self.newest_ts)
        written = self.writer.finish()
        if written is not None:
            self.done.append(written)
        self.writer = None

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.abort()
        for w in self.done:
            for p in (w.log_path, w.index_path):
                if os.path.exists(p):
                    os.unlink(p)
