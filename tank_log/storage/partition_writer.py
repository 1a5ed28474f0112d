"""Writing a fresh partition directory as the broker would lay it out (docs/FORMAT.md §2.4, Appendix B): segments
rolled past `segment_bytes`, the last one active, each written by `writer.SegmentWriter`."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import replace

import numpy as np

from tank_log.format.bundle import (
    Message,
)
from tank_log.format.index import DEFAULT_INDEX_INTERVAL
from tank_log.format.messages import MessageColumns
from tank_log.format.names import name_ts_from_message_ts
from tank_log.storage.writer import BEYOND_INDEX_REACH, BundlePolicy, SegmentWriter, WrittenSegment, commit


def write_partition(
    directory: str | os.PathLike[str],
    messages: Iterable[Message],
    *,
    segment_bytes: int = 1 << 30,
    with_active: bool = True,
    policy: BundlePolicy = BundlePolicy(),
    index_interval: int = DEFAULT_INDEX_INTERVAL,
    first_segment_ro: bool = False,
) -> list[WrittenSegment]:
    """Write messages into a fresh partition directory as the broker would lay them out (`PartitionWriter`)."""
    writer = PartitionWriter(
        directory,
        segment_bytes=segment_bytes,
        with_active=with_active,
        policy=policy,
        index_interval=index_interval,
        first_segment_ro=first_segment_ro,
    )
    try:
        for m in messages:
            writer.add(m)
        return writer.finish()
    except BaseException:
        writer.abort()
        raise


class PartitionWriter:
    """Messages, one by one (`add`) or as columns (`add_columns`, the same bytes in bulk), into a fresh partition
    directory as the broker would lay them out: RO segments rolled once larger than `segment_bytes` (§2.4), the rest
    as the active segment (`with_active`) or one more RO segment.

    A segment is only rolled where the next message continues the counter, so no boundary — in particular the one
    before the active segment (§4.4, §9 rule 3) — has a seq gap; very sparse input makes larger segments.
    `first_segment_ro`: the messages follow existing segments with a seq gap, so the first segment is rolled at the
    first place the counter continues (the gap then precedes an RO segment, never the active one).
    Name timestamps (§2.2): `name_ts` for every segment when given (an import's clock: `staging.stage_partition`);
    else RO = newest message ts in seconds (≈ mtime at roll), active = its first message's.
    Finished segments are committed (renamed into place) as they roll; `abort` drops the open one.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        segment_bytes: int = 1 << 30,
        with_active: bool = True,
        policy: BundlePolicy = BundlePolicy(),
        index_interval: int = DEFAULT_INDEX_INTERVAL,
        first_segment_ro: bool = False,
        name_ts: int | None = None,
    ):
        self.directory = os.fspath(directory)
        self.name_ts = name_ts
        os.makedirs(self.directory, exist_ok=True)
        self.segment_bytes = segment_bytes
        self.with_active = with_active
        self.policy = policy
        self.index_interval = index_interval
        self.first_segment_ro = first_segment_ro
        self.done: list[WrittenSegment] = []
        self._writer: SegmentWriter | None = None
        self._newest = self._first_ts = 0
        self._roll_due = False

    def add(self, m: Message) -> None:
        """Raises:
        ValueError: what `SegmentWriter.add` refuses.
        """
        w = self._writer
        if w is not None and self._roll_due and m.seq == w.expected_next:
            self._roll()
        w = self._open(m.ts)
        w.add(m)
        self._newest = max(self._newest, m.ts)
        self._update_roll_due()

    def add_columns(self, cols: MessageColumns) -> None:
        """`add` of every row, in bulk: bundles encoded from the columns (`SegmentWriter.add_columns`).

        Raises:
            ValueError: what `SegmentWriter.add_columns` refuses, or a seq 2**31 or more past its segment's first
                (§4.6; `add` refuses it too).
        """
        seq, n, i = cols.seq, len(cols), 0
        while i < n:
            w = self._writer
            if w is not None and self._roll_due:
                # rows that do not continue the counter stay in this segment; roll at the first one that does
                if int(seq[i]) != w.expected_next:
                    follows = np.flatnonzero(seq[i + 1 : n] == seq[i : n - 1] + np.uint64(1))
                    j = i + 1 + int(follows[0]) if len(follows) else n
                    self._take(w, cols, i, j)
                    i = j
                    continue
                self._roll()
            w = self._open(int(cols.ts[i]))
            if self.first_segment_ro and not self.done:  # rolls at the first continuing row after the first
                self._take(w, cols, i, i + 1)
                i += 1
                continue
            taken = w.add_columns(cols.slice(i, n), stop_past_size=self.segment_bytes)
            if taken:
                self._newest = max(self._newest, int(cols.ts[i : i + taken].max()))
            i += taken
            self._update_roll_due()
            if i < n and not self._roll_due:
                raise ValueError(BEYOND_INDEX_REACH)

    def _take(self, w: SegmentWriter, cols: MessageColumns, i: int, j: int) -> None:
        """Rows [i, j) into the open segment, whatever its size."""
        if w.add_columns(cols.slice(i, j)) < j - i:
            raise ValueError(BEYOND_INDEX_REACH)
        self._newest = max(self._newest, int(cols.ts[i:j].max()))
        self._update_roll_due()

    def _open(self, ts: int) -> SegmentWriter:
        if self._writer is None:
            self._writer = SegmentWriter(self.directory, policy=self.policy, index_interval=self.index_interval)
            self._newest = self._first_ts = ts
        return self._writer

    def _update_roll_due(self) -> None:
        w = self._writer
        assert w is not None
        self._roll_due = w.size > self.segment_bytes or (self.first_segment_ro and not self.done)

    def _roll(self) -> None:
        w = self._writer
        assert w is not None
        w.ts = self._name_ts(self._newest)
        self.done.append(commit(w.finish()))  # type: ignore[arg-type]
        self._writer = None

    def finish(self) -> list[WrittenSegment]:
        """Write the last segment (active unless `with_active` is false); every segment written, in order.

        Raises:
            ValueError: `first_segment_ro` and no message continues the counter (the gap would precede the active
                segment).
        """
        if self.first_segment_ro and not self.done and self.with_active:
            raise ValueError(
                "the rows follow the existing segments with a seq gap and no two consecutive seqs to start a new "
                "active segment at: the gap would precede the active segment (§9 rule 3)"
            )
        w, self._writer = self._writer, None
        written = None if w is None else w.finish()
        if written is not None:
            written = (
                replace(written, active=True, ts=self._name_ts(self._first_ts))
                if self.with_active
                else replace(written, ts=self._name_ts(self._newest))
            )
            self.done.append(commit(written))
        return self.done

    def _name_ts(self, message_ts: int) -> int:
        return self.name_ts if self.name_ts is not None else name_ts_from_message_ts(message_ts)

    def abort(self) -> None:
        """Drop the open segment (committed ones stay: the caller owns the directory)."""
        if self._writer is not None:
            self._writer.abort()
            self._writer = None
